"""Which loader reads a file: its suffix, then its first line.

A ``.json`` file is Shaper's own format. Otherwise the first line decides: a Gavel trace has
no header, so a first line that parses as a Gavel job line (:func:`looks_like_gavel`) is
Gavel; any other first line is read as a CSV header, and the first format in
:data:`FORMATS` whose identifying columns it has wins. A file that matches none is refused
with what its first line holds and what each known format looks like, so that the fix
(``--kind``, or the right file) is plain from the message alone. A directory, a missing
file, a gzip file and bytes that are not UTF-8 are refused as the loaders refuse them
(:func:`~sim.traces.common.first_line`); a UTF-8 byte-order mark is skipped.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from sim.traces.common import TraceError, TraceInput, first_line
from sim.traces.gavel import FIELDS as GAVEL_FIELDS
from sim.traces.gavel import looks_like_gavel

# How much of an unrecognised first line the error message repeats.
SHOWN_FIELDS = 12
SHOWN_CHARS = 40


@dataclass(frozen=True, slots=True)
class TraceFormat:
    kind: str
    # Header columns that identify the format (empty: recognised another way).
    columns: tuple[str, ...]
    looks: str


FORMATS = (
    TraceFormat(
        "philly", ("timestamp", "duration", "num_gpus"), "CSV: timestamp, duration, num_gpus"
    ),
    TraceFormat(
        "pollux", ("application", "num_replicas"), "CSV: name, time, application, num_replicas"
    ),
    TraceFormat(
        "alibaba",
        ("num_gpu", "gpu_milli"),
        "pod list CSV: cpu_milli, memory_mib, num_gpu, gpu_milli, …; node list via --nodes",
    ),
    TraceFormat(
        "native",
        ("submit_s", "gpus", "duration_s"),
        "CSV: id, submit_s, gpus, duration_s, …; or .json",
    ),
    TraceFormat(
        "gavel",
        (),
        f"no header, {len(GAVEL_FIELDS)} tab-separated fields: {', '.join(GAVEL_FIELDS)}",
    ),
)


def known_formats() -> str:
    return "; ".join(f"{fmt.kind} ({fmt.looks})" for fmt in FORMATS)


def _shown(fields: list[str]) -> list[str]:
    cut = [f if len(f) <= SHOWN_CHARS else f[: SHOWN_CHARS - 1] + "…" for f in fields]
    return cut if len(cut) <= SHOWN_FIELDS else [*cut[:SHOWN_FIELDS], "…"]


def detect_kind(path: str | Path) -> str:
    path = Path(path)
    if path.suffix == ".json":
        return "native"
    first = first_line(path)
    if not first.strip():
        raise TraceError(
            f"cannot tell the trace format of {path}: its first line is empty; known formats: "
            f"{known_formats()}; pass --kind",
            about=TraceInput.kind,
        )
    if looks_like_gavel(first):
        return "gavel"
    header = [column.strip() for column in next(csv.reader([first]), [])]
    for fmt in FORMATS:
        if fmt.columns and set(fmt.columns) <= set(header):
            return fmt.kind
    fields = first.rstrip("\r\n").split("\t") if "\t" in first else header
    raise TraceError(
        f"cannot tell the trace format of {path}: its first line has the fields "
        f"{_shown(fields)}; known formats: {known_formats()}; pass --kind",
        about=TraceInput.kind,
    )
