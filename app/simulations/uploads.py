"""A trace uploaded to POST /simulations: a multipart/form-data body parsed as it streams in.

The file part is written straight to disk, under a name the server picks, and counted as
it arrives: past ``max_bytes`` the upload is refused (413) there and then, never read
whole into memory. It is written as ``<name>.part`` and renamed once complete, and every
refusal or failure (a bad body, the limit, the client gone) removes what was written, so
no half-written trace is ever left to replay. The client's file name is kept only to be
shown (``shown_name``); it is never part of a path.

The form around it is bounded as it is read, not only by the upload's total: its parts
(``MAX_PARTS``), each part's headers (``MAX_PART_HEADERS``, ``MAX_PART_HEADER_BYTES``) and
each field's value (``MAX_FIELD_BYTES``), so that no part of it is held in memory beyond a
few KiB. How many uploads are received at once is the route's to bound
(``app.simulations.runs.upload_slot``); an upload that sends nothing for ``idle_timeout_s``
is refused (408), so that a stalled client does not keep its place.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import anyio
import anyio.to_thread
from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header

from app.core.errors import Invalid, PayloadTooLarge, RequestTimeout

TRACE_FIELD = "trace"
# Form fields beside the file: few and short (a policy list, numbers).
MAX_FIELDS = 32
MAX_FIELD_BYTES = 1024
# The parts a form may have (the trace and its fields), counted as each begins; the
# headers of one part and their bytes (names and values: a browser sends two short ones,
# and a file name of 255 characters percent-encoded is under 2 KiB). Each refused (413) as
# soon as it is passed, before the rest is read or anything is kept of it. Under
# python-multipart's own limits (8 headers, 4 KiB a line, in the versions that have them),
# whose refusals are answered the same.
MAX_PARTS = MAX_FIELDS + 1
MAX_PART_HEADERS = 6
MAX_PART_HEADER_BYTES = 4096
# The room the multipart framing and the fields take beside the file's own bytes.
FORM_OVERHEAD_BYTES = MAX_FIELDS * (MAX_FIELD_BYTES + 256)
MAX_SHOWN_NAME = 64


def sent_name(filename: str) -> str:
    """The last component of the client's file name, for messages: no path, no control
    characters, at most ``MAX_SHOWN_NAME`` characters."""
    base = re.split(r"[/\\]", filename)[-1]
    return "".join(c for c in base if c.isprintable())[:MAX_SHOWN_NAME] or "the trace"


def shown_name(filename: str) -> str:
    """The client's file name as a run shows it: its last component's stem, in letters,
    digits, ``.``, ``_`` and ``-`` only (each other character one ``_``)."""
    base = re.split(r"[/\\]", filename)[-1]
    stem = base.rsplit(".", 1)[0] if "." in base.lstrip(".") else base
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "_", stem).strip("._-")
    return cleaned[:MAX_SHOWN_NAME] or "trace"


@dataclass
class ReceivedForm:
    fields: dict[str, list[str]]
    # The trace written to disk, complete; None when the body had no file part.
    trace: Path | None = None
    filename: str = ""
    size: int = 0


@dataclass
class _Part:
    headers: dict[bytes, bytes] = field(default_factory=dict)
    name: str = ""
    value: bytearray = field(default_factory=bytearray)
    file: BinaryIO | None = None


class _Receiver:
    """The parser's callbacks: fields into memory, the trace onto disk."""

    def __init__(self, folder: Path, max_bytes: int) -> None:
        self.folder = folder
        self.max_bytes = max_bytes
        self.form = ReceivedForm(fields={})
        self.part = _Part()
        self.header_field = bytearray()
        self.header_value = bytearray()
        self.partial: Path | None = None
        self.count = 0
        self.parts = 0
        self.headers = 0
        self.header_bytes = 0
        self.in_header = False

    def on_part_begin(self) -> None:
        self.part = _Part()
        self.headers = 0
        self.header_bytes = 0
        self.in_header = False
        self.parts += 1
        if self.parts > MAX_PARTS:
            raise PayloadTooLarge(
                f"more than {MAX_PARTS} parts in the form: the trace file and at most "
                f"{MAX_FIELDS} fields",
                field="body",
                details={"limit": MAX_PARTS, "too_large": "parts"},
            )

    def headers_too_large(self) -> PayloadTooLarge:
        return PayloadTooLarge(
            f"the headers of part {self.parts} of the form are too large: at most "
            f"{MAX_PART_HEADERS} headers and {MAX_PART_HEADER_BYTES} bytes of them a part",
            field="body",
            details={
                "limit": MAX_PART_HEADER_BYTES,
                "headers_limit": MAX_PART_HEADERS,
                "too_large": "part_headers",
            },
        )

    def _count_header(self, size: int) -> None:
        self.header_bytes += size
        if self.header_bytes > MAX_PART_HEADER_BYTES:
            raise self.headers_too_large()

    def on_header_field(self, data: bytes, start: int, end: int) -> None:
        if not self.in_header:  # a header begins (its name may come in pieces)
            self.in_header = True
            self.headers += 1
            if self.headers > MAX_PART_HEADERS:
                raise self.headers_too_large()
        self._count_header(end - start)
        self.header_field += data[start:end]

    def on_header_value(self, data: bytes, start: int, end: int) -> None:
        self._count_header(end - start)
        self.header_value += data[start:end]

    def on_header_end(self) -> None:
        self.in_header = False
        self.part.headers[bytes(self.header_field).lower()] = bytes(self.header_value)
        self.header_field.clear()
        self.header_value.clear()

    def on_headers_finished(self) -> None:
        disposition, options = parse_options_header(
            self.part.headers.get(b"content-disposition", b"")
        )
        if disposition != b"form-data" or b"name" not in options:
            raise Invalid("a part of the form has no name (Content-Disposition)", field="body")
        self.part.name = options[b"name"].decode("utf-8", "replace")
        if b"filename" not in options:
            self.count += 1
            if self.count > MAX_FIELDS:
                raise Invalid(f"more than {MAX_FIELDS} form fields", field="body")
            return
        if self.part.name != TRACE_FIELD:
            raise Invalid(
                f"unknown file field {self.part.name!r}: the trace is sent as {TRACE_FIELD!r}",
                field=self.part.name,
            )
        if self.partial is not None:
            raise Invalid("one trace file per run", field=TRACE_FIELD)
        self.form.filename = options[b"filename"].decode("utf-8", "replace")
        # Only ".json" tells the loaders anything (Shaper's JSON); the rest read the first line.
        suffix = ".json" if self.form.filename.lower().endswith(".json") else ".csv"
        self.folder.mkdir(parents=True, exist_ok=True)
        self.partial = self.folder / f"{uuid.uuid4().hex}{suffix}.part"
        self.part.file = open(self.partial, "xb")  # noqa: SIM115 (closed in on_part_end)

    def on_part_data(self, data: bytes, start: int, end: int) -> None:
        if self.part.file is None:
            self.part.value += data[start:end]
            if len(self.part.value) > MAX_FIELD_BYTES:
                raise Invalid(f"over {MAX_FIELD_BYTES} bytes", field=self.part.name)
            return
        self.form.size += end - start
        if self.form.size > self.max_bytes:
            raise PayloadTooLarge(
                f"the trace is over {self.max_bytes / 2**20:g} MiB "
                "(SHAPER_SIM_UPLOAD_MAX_MB); replay it with `shaper sim replay`",
                field=TRACE_FIELD,
            )
        self.part.file.write(data[start:end])

    def on_part_end(self) -> None:
        if self.part.file is not None:
            self.part.file.close()
            self.part.file = None
            return
        value = self.part.value.decode("utf-8", "replace")
        self.form.fields.setdefault(self.part.name, []).append(value)

    def close(self) -> None:
        if self.part.file is not None:
            self.part.file.close()


async def receive(
    chunks: AsyncIterator[bytes],
    *,
    content_type: str,
    folder: Path,
    max_bytes: int,
    idle_timeout_s: float,
) -> ReceivedForm:
    """Parse a multipart/form-data body from ``chunks``: its fields, and its ``trace`` file
    written into ``folder``. Refuses (and leaves nothing behind) a body that is not one, a
    trace over ``max_bytes`` (``PayloadTooLarge``), a body over that plus the form's room,
    a body that sends nothing for ``idle_timeout_s`` (``RequestTimeout``)."""
    _, options = parse_options_header(content_type)
    boundary = options.get(b"boundary")
    if not boundary:
        raise Invalid("multipart/form-data without a boundary", field="body")
    receiver = _Receiver(folder, max_bytes)
    parser = MultipartParser(
        boundary,
        {
            "on_part_begin": receiver.on_part_begin,
            "on_header_field": receiver.on_header_field,
            "on_header_value": receiver.on_header_value,
            "on_header_end": receiver.on_header_end,
            "on_headers_finished": receiver.on_headers_finished,
            "on_part_data": receiver.on_part_data,
            "on_part_end": receiver.on_part_end,
        },
    )
    total = 0
    try:
        async for chunk in _until_idle(chunks, idle_timeout_s):
            total += len(chunk)
            if total > max_bytes + FORM_OVERHEAD_BYTES:
                raise PayloadTooLarge(
                    f"request body over the trace limit of {max_bytes / 2**20:g} MiB "
                    "(SHAPER_SIM_UPLOAD_MAX_MB) and its form",
                    field=TRACE_FIELD,
                )
            # The callbacks write to disk: off the event loop.
            await anyio.to_thread.run_sync(parser.write, chunk)
        parser.finalize()
        if receiver.part.file is not None:
            raise Invalid("the body ends inside the trace file", field=TRACE_FIELD)
    except MultipartParseError as exc:
        receiver.close()
        _remove(receiver.partial)
        if str(exc).startswith("Maximum header"):  # the parser's own limits, met first
            raise receiver.headers_too_large() from exc
        raise Invalid(f"not a valid multipart/form-data body: {exc}", field="body") from exc
    except BaseException:
        receiver.close()
        _remove(receiver.partial)
        raise
    if receiver.partial is not None:
        complete = receiver.partial.with_suffix("")
        receiver.partial.rename(complete)
        receiver.form.trace = complete
    return receiver.form


async def _until_idle(chunks: AsyncIterator[bytes], idle_timeout_s: float) -> AsyncIterator[bytes]:
    """``chunks``, each waited for at most ``idle_timeout_s``: a client that stops sending
    halfway holds an upload place (and leaves a file the hourly sweep would take from under
    it) until refused here."""
    iterator = aiter(chunks)
    while True:
        try:
            with anyio.fail_after(idle_timeout_s):
                chunk = await anext(iterator)
        except StopAsyncIteration:
            return
        except TimeoutError:
            raise RequestTimeout(
                f"nothing of the body came for {idle_timeout_s:g} s "
                "(SHAPER_SIM_UPLOAD_IDLE_TIMEOUT_S): what came is dropped; send it again",
                field="body",
                details={"idle_timeout_s": idle_timeout_s},
            ) from None
        yield chunk


def _remove(path: Path | None) -> None:
    if path is not None:
        with suppress(OSError):
            path.unlink()
