"""What every trace loader shares: the options to window, scale and subsample a trace, the
error a loader raises and the check of a CSV header, the homogeneous cluster of a trace
without nodes, and the step from a list of jobs to a :class:`Workload`."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path

import numpy as np

from sim.workload import BlockJob, GpuModel, Node, Service, Transfer, Workload

HOUR = 3600.0
# The first bytes of a gzip file: a compressed trace is refused with how to decompress it.
GZIP_MAGIC = b"\x1f\x8b"


class TraceInput(StrEnum):
    """Which input a :class:`TraceError` is about, so that a front end can point at the
    argument to fix (the CLI maps each to its option)."""

    trace = "trace"
    nodes = "nodes"
    kind = "kind"
    cluster = "cluster"
    options = "options"  # how the trace is shaped: window, scales, subsample, limits


class TraceError(ValueError):
    """A trace the loaders cannot use, with what was wrong and where (file, line, column)."""

    def __init__(self, message: str, *, about: TraceInput = TraceInput.trace) -> None:
        super().__init__(message)
        self.about = about


def require_header(
    path: str | Path, fieldnames: Sequence[str] | None, columns: Sequence[str], *, source: str = ""
) -> None:
    """Refuse a CSV whose header lacks any of ``columns``, naming the missing ones (sorted)
    and the ones found; ``source`` (e.g. ``"a Philly trace"``) says what the file is not."""
    found = list(fieldnames or ())
    missing = set(columns) - set(found)
    if missing:
        not_source = f"not {source}, " if source else ""
        raise TraceError(f"{path}: {not_source}missing columns {sorted(missing)} (found {found})")


def check_file(path: Path, about: TraceInput) -> None:
    """Refuse a path that is not a readable trace file before opening it, so that a
    directory or a missing file is named rather than raised as an ``OSError``."""
    if path.is_dir():
        raise TraceError(f"{path} is a directory; pass the trace file itself", about=about)
    if not path.is_file():
        raise TraceError(f"{path}: no such file", about=about)


def _refuse_gzip(path: Path, start: bytes, about: TraceInput) -> None:
    if start.startswith(GZIP_MAGIC):
        raise TraceError(
            f"{path} is gzip-compressed; decompress it first (gunzip -k {path}) and pass the "
            "decompressed file",
            about=about,
        )


def _decode(path: Path, data: bytes, about: TraceInput) -> str:
    """UTF-8 text, without the byte-order mark a spreadsheet may write first."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise TraceError(
            f"{path} is not UTF-8 text (byte {exc.start} is {data[exc.start : exc.start + 1]!r}); "
            "save it as UTF-8 CSV",
            about=about,
        ) from exc


def read_text(path: str | Path, *, about: TraceInput = TraceInput.trace) -> str:
    """A trace file's text: a directory, a missing file, a gzip file or bytes that are not
    UTF-8 are refused by name; a UTF-8 byte-order mark is dropped."""
    path = Path(path)
    check_file(path, about)
    data = path.read_bytes()
    _refuse_gzip(path, data[:2], about)
    return _decode(path, data, about)


def first_line(path: str | Path, *, about: TraceInput = TraceInput.trace) -> str:
    """The first line of a trace file, refused as :func:`read_text` refuses a whole file
    (reads one line only: format detection must not read a large trace twice)."""
    path = Path(path)
    check_file(path, about)
    with open(path, "rb") as handle:
        raw = handle.readline()
    _refuse_gzip(path, raw[:2], about)
    return _decode(path, raw, about)


def csv_rows(
    path: str | Path, *, about: TraceInput = TraceInput.trace
) -> tuple[list[str], Iterator[tuple[int, dict[str, str]]]]:
    """A CSV's header (names stripped) and its rows with their line numbers.

    Blank lines are skipped; a row with more or fewer fields than the header is refused
    with its line (``csv.DictReader`` would fill ``None`` or drop the extra fields, which
    then read as empty values); so is a header that names a column twice. CRLF line ends
    and a byte-order mark read as plain CSV. Columns may come in any order, and columns a
    loader does not use are ignored.
    """
    reader = csv.reader(io.StringIO(read_text(path, about=about), newline=""))
    header = [column.strip() for column in next(reader, [])]
    twice = sorted({column for column in header if header.count(column) > 1})
    if twice:
        raise TraceError(f"{path}:1: the header names {twice} more than once", about=about)

    def rows() -> Iterator[tuple[int, dict[str, str]]]:
        for values in reader:
            if not values:
                continue
            if len(values) != len(header):
                raise TraceError(
                    f"{path}:{reader.line_num}: {len(values)} fields, but the header has "
                    f"{len(header)} ({', '.join(header)}); every row needs one value per column "
                    "(an empty value is allowed)",
                    about=about,
                )
            yield reader.line_num, dict(zip(header, values, strict=True))

    return header, rows()


def number(
    value: object, field: str, *, at_least: float | None = None, above: float | None = None
) -> float:
    """``value`` as a finite number (not NaN or infinite), at least ``at_least`` or above
    ``above``; the ``ValueError`` names ``field`` and what it must be, for the loader to
    prefix with the file and line."""
    bound = "" if at_least is None else f" >= {at_least:g}"
    bound = bound if above is None else f" > {above:g}"
    expected = f"{field} must be a finite number{bound}, not {value!r}"
    if isinstance(value, bool):
        raise ValueError(expected)
    try:
        parsed = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(expected) from None
    if not math.isfinite(parsed):
        raise ValueError(expected)
    if (at_least is not None and parsed < at_least) or (above is not None and parsed <= above):
        raise ValueError(expected)
    return parsed


def whole(value: object, field: str, *, at_least: int = 0) -> int:
    """``value`` as a whole number (``"4"``, ``4`` or ``4.0``, not ``1.5`` or ``true``) of at
    least ``at_least``; the ``ValueError`` names ``field``."""
    expected = f"{field} must be a whole number >= {at_least}, not {value!r}"
    try:
        parsed = number(value, field)
    except ValueError:
        raise ValueError(expected) from None
    if not parsed.is_integer() or parsed < at_least:
        raise ValueError(expected)
    return int(parsed)


def refuse_duplicate_ids(
    path: str | Path,
    ids: Iterable[tuple[str, int]],
    *,
    what: str = "job id",
    unit: str = "line",
    about: TraceInput = TraceInput.trace,
) -> None:
    """Refuse a trace in which two jobs (or nodes) share an id: the second would overwrite
    the first in every per-job result. ``ids`` are (id, position) pairs, the position a
    ``unit`` (a CSV's line, a JSON list's index)."""
    first: dict[str, int] = {}
    for name, position in ids:
        if name in first:
            where = f"{path}:{position}" if unit == "line" else f"{path}: {unit} {position}"
            raise TraceError(
                f"{where}: {what} {name!r} is also that of {unit} {first[name]}; "
                f"each {what} must be unique",
                about=about,
            )
        first[name] = position


def refuse_no_rows(
    path: str | Path, rows: int, *, why: str = "the file has no rows after its header"
) -> None:
    """Refuse a trace without a single row: a replay of nothing is not a result."""
    if rows == 0:
        raise TraceError(f"{path}: no jobs: {why}")


@dataclass(frozen=True, slots=True)
class Elasticity:
    """Elastic training for a replay (``TraceOptions.elastic``): every checkpointable job
    may run on ``low`` × its size (at least 1 GPU) to ``high`` × its size GPUs, at
    ``(GPUs / size) ** scaling`` times its speed on its own size (``BlockJob``). The size
    the trace gives stays the size it asks: what the baselines run it at."""

    low: float = 0.5
    high: float = 2.0
    scaling: float = 0.8

    def __post_init__(self) -> None:
        if not 0 < self.low <= 1 <= self.high:
            raise ValueError(f"elastic: need 0 < low <= 1 <= high, not {self.low}, {self.high}")
        if not 0 < self.scaling <= 1:
            raise ValueError(f"elastic: scaling must be in (0, 1], not {self.scaling}")

    @classmethod
    def parse(cls, text: str) -> Elasticity:
        """``"LOW,HIGH,SCALING"``, e.g. ``"0.5,2,0.8"``."""
        parts = [p.strip() for p in text.split(",")]
        if len(parts) != 3:
            raise ValueError(f"elastic: expected LOW,HIGH,SCALING (e.g. 0.5,2,0.8), not {text!r}")
        try:
            low, high, scaling = (float(p) for p in parts)
        except ValueError:
            raise ValueError(f"elastic: LOW,HIGH,SCALING must be numbers, not {text!r}") from None
        return cls(low, high, scaling)

    def apply(self, job: BlockJob) -> BlockJob:
        if not job.checkpointable:
            return job
        return replace(
            job,
            min_gpus=max(1, math.floor(job.gpus * self.low)),
            max_gpus=max(job.gpus, math.ceil(job.gpus * self.high)),
            scaling=self.scaling,
        )


@dataclass(frozen=True, slots=True)
class TraceOptions:
    """How to cut and shape a trace before replaying it.

    * ``window_start_h`` / ``window_end_h``: keep jobs submitted in this window (hours from
      the first submission of the trace); times are re-based to the window's start.
    * ``subsample``: keep each job with this probability (seeded).
    * ``max_jobs``: keep at most this many jobs (the earliest, after subsampling).
    * ``load_scale``: divide inter-arrival times by this (2.0 = twice the arrival rate).
    * ``duration_scale``: multiply every job's run time by this.
    * ``horizon_h``: simulated horizon; default = the last arrival (the arrival window).
    * ``gpus`` / ``gpus_per_node``: the size of the cluster to replay on, for traces without
      a node list (Philly, Pollux, Gavel, our own CSV without nodes); ``None`` = the
      source's published setup (see :mod:`sim.traces.cluster`). ``gpu_model``: the model of
      a homogeneous cluster (Gavel brings its own three models).
    * ``checkpointable`` / ``checkpoint_interval_h`` / ``image_gb``: what the trace does not
      say about checkpointing: by default every job can be checkpointed (Shaper's agent
      checkpoints transparently) with a 20 GB image.
    * ``elastic``: make every checkpointable job elastic training (:class:`Elasticity`);
      None: the jobs are as rigid as the trace says.
    """

    window_start_h: float = 0.0
    window_end_h: float | None = None
    subsample: float = 1.0
    max_jobs: int | None = None
    load_scale: float = 1.0
    duration_scale: float = 1.0
    horizon_h: float | None = None
    gpus: int | None = None
    gpus_per_node: int | None = None
    gpu_model: str = "V100"
    checkpointable: bool = True
    checkpoint_interval_h: float = 0.0
    image_gb: float = 20.0
    seed: int = 0
    replan_interval_min: float = 30.0
    services: tuple[Service, ...] = field(default_factory=tuple)
    elastic: Elasticity | None = None

    def with_(self, **changes: object) -> TraceOptions:
        return replace(self, **changes)  # type: ignore[arg-type]


def node_sizes(*, gpus: int, gpus_per_node: int) -> list[int]:
    """``gpus`` GPUs in nodes of ``gpus_per_node``; the last node holds what is left."""
    full, rest = divmod(gpus, gpus_per_node)
    return [gpus_per_node] * full + ([rest] if rest else [])


def homogeneous_cluster(
    *, gpus: int, gpus_per_node: int, gpu_model: str
) -> tuple[dict[str, GpuModel], list[Node]]:
    nodes = [
        Node(name=f"node-{index:04d}", gpu_model=gpu_model, gpus=size)
        for index, size in enumerate(node_sizes(gpus=gpus, gpus_per_node=gpus_per_node))
    ]
    return {gpu_model: GpuModel(name=gpu_model)}, nodes


def check_options(options: TraceOptions) -> None:
    """Refuse options that would shape a trace into garbage (a load scale of 0 divides by
    zero, a negative one reverses time), naming the CLI option to fix."""
    checks = (
        ("--load-scale", options.load_scale, 0.0, False),
        ("--duration-scale", options.duration_scale, 0.0, False),
        ("--subsample", options.subsample, 0.0, False),
        ("--window-start-h", options.window_start_h, 0.0, True),
        ("--replan-min", options.replan_interval_min, 0.0, False),
    )
    for flag, value, bound, inclusive in checks:
        ok = math.isfinite(value) and (value >= bound if inclusive else value > bound)
        if not ok:
            sign = ">=" if inclusive else ">"
            raise TraceError(
                f"{flag} must be a finite number {sign} {bound:g}, not {value}",
                about=TraceInput.options,
            )
    if options.subsample > 1:
        raise TraceError(
            f"--subsample is a probability, at most 1, not {options.subsample}",
            about=TraceInput.options,
        )
    end = options.window_end_h
    if end is not None and not (math.isfinite(end) and end > options.window_start_h):
        raise TraceError(
            f"--window-end-h must be after --window-start-h ({options.window_start_h:g}), "
            f"not {end}",
            about=TraceInput.options,
        )
    if options.max_jobs is not None and options.max_jobs < 1:
        raise TraceError(
            f"--max-jobs must be at least 1, not {options.max_jobs}", about=TraceInput.options
        )
    horizon = options.horizon_h
    if horizon is not None and not (math.isfinite(horizon) and horizon > 0):
        raise TraceError(
            f"--horizon-h must be a finite number > 0, not {horizon}", about=TraceInput.options
        )


def shape_jobs(jobs: list[BlockJob], options: TraceOptions) -> list[BlockJob]:
    """Window, subsample, rescale, re-base submit times to 0, and make jobs elastic
    (``options.elastic``). A window, subsample or limit that keeps no job is refused: the
    replay would run an empty cluster."""
    check_options(options)
    if not jobs:
        return []
    jobs = sorted(jobs, key=lambda j: (j.submit_time, j.id))
    origin = jobs[0].submit_time
    start = origin + options.window_start_h * HOUR
    end = None if options.window_end_h is None else origin + options.window_end_h * HOUR
    kept = [j for j in jobs if j.submit_time >= start and (end is None or j.submit_time < end)]
    if options.subsample < 1.0:
        rng = np.random.default_rng(options.seed)
        keep = rng.random(len(kept)) < options.subsample
        kept = [j for j, k in zip(kept, keep, strict=True) if k]
    if options.max_jobs is not None:
        kept = kept[: options.max_jobs]
    if not kept:
        span_h = (jobs[-1].submit_time - origin) / HOUR
        raise TraceError(
            f"no job is left of the trace's {len(jobs)} after --window-start-h "
            f"{options.window_start_h:g}, --window-end-h {options.window_end_h}, --subsample "
            f"{options.subsample:g}: its jobs arrive over {span_h:.3g} h from the first",
            about=TraceInput.options,
        )
    base = kept[0].submit_time
    shaped = [
        replace(
            job,
            submit_time=(job.submit_time - base) / options.load_scale,
            work=max(1.0, job.work * options.duration_scale),
        )
        for job in kept
    ]
    elastic = options.elastic
    return shaped if elastic is None else [elastic.apply(job) for job in shaped]


def make_workload(
    name: str,
    jobs: list[BlockJob],
    options: TraceOptions,
    *,
    gpu_models: dict[str, GpuModel],
    nodes: list[Node],
    description: str = "",
) -> Workload:
    total = sum(n.gpus for n in nodes)
    # A job larger than the whole cluster could never run; it is left out (and counted).
    fitting = [j for j in jobs if j.gpus <= total]
    if jobs and not fitting:
        raise TraceError(
            f"every one of the trace's {len(jobs)} jobs asks for more GPUs than the replay "
            f"cluster's {total} (the smallest asks {min(j.gpus for j in jobs)}), so none "
            "could run; replay on a larger cluster (--gpus, or the nodes the trace lists)",
            about=TraceInput.cluster,
        )
    if len(fitting) < len(jobs):
        description += f" ({len(jobs) - len(fitting)} jobs larger than the cluster left out)"
    horizon = options.horizon_h * HOUR if options.horizon_h is not None else None
    if horizon is None:
        horizon = max((j.submit_time for j in fitting), default=0.0) or HOUR
    return Workload(
        name=name,
        gpu_models=gpu_models,
        nodes=nodes,
        jobs=fitting,
        services=list(options.services),
        horizon=horizon,
        transfer=Transfer(),
        replan_interval=options.replan_interval_min * 60.0,
        description=description,
        seed=options.seed,
    )
