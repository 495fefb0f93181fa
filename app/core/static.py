"""The dashboard's static files: its built scripts and styles (``web/static/dist``, written
by ``web/frontend/build.mjs``) as their precompressed copies, and how long a browser may
keep each.

``make web`` writes beside each built ``.js`` and ``.css`` a ``.br`` (Brotli, quality 11)
and a ``.gz`` (gzip -9). A request that accepts one is answered with it, ``Content-Encoding``
set (so the gzip middleware passes it through instead of compressing the file again at its
level 1, on every request) and ``Vary: Accept-Encoding``. A copy older than its file (a
file changed without ``make web``) is not used. Brotli is preferred where the browser
offers it (Chromium offers it over HTTPS only).

A file whose name carries its content's hash (esbuild's ``chunk-XXXXXXXX.js``,
``chart-XXXXXXXX.js``) never changes under that name: kept a year, ``immutable``. The others
(``app.js``, ``main.js``, a page's file, ``app.css``, whose names stay across builds) are
``no-cache``: kept, but asked about again (``If-None-Match``: a 304 without the body when
unchanged), so that a new build is seen at the next load.
"""

from __future__ import annotations

import os
import re
from os import PathLike
from pathlib import Path

from starlette.datastructures import Headers
from starlette.responses import FileResponse, Response
from starlette.staticfiles import NotModifiedResponse, StaticFiles
from starlette.types import Scope

# esbuild's default chunk names: "[name]-[hash]" with an 8-character base-32 hash.
HASHED = re.compile(r"-[A-Z0-9]{8}\.(js|css)$")
IMMUTABLE = "public, max-age=31536000, immutable"
REVALIDATE = "no-cache"
# Encodings in the order preferred, with the suffix of their copies.
ENCODINGS = (("br", ".br"), ("gzip", ".gz"))
COMPRESSED_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8"}


def accepted(accept_encoding: str) -> set[str]:
    """The codings ``Accept-Encoding`` accepts (``q=0`` refuses one)."""
    codings: set[str] = set()
    for part in accept_encoding.split(","):
        name, *params = (piece.strip() for piece in part.split(";"))
        weight = next((p[2:] for p in params if p.startswith("q=")), "1")
        try:
            refused = float(weight) == 0
        except ValueError:
            refused = False
        if name and not refused:
            codings.add(name.lower())
    return codings


class DashboardStaticFiles(StaticFiles):
    """``StaticFiles`` that answers the built scripts and styles with their precompressed
    copies and says how long each may be kept (the module's docstring)."""

    def file_response(
        self,
        full_path: PathLike[str] | str,
        stat_result: os.stat_result,
        scope: Scope,
        status_code: int = 200,
    ) -> Response:
        request_headers = Headers(scope=scope)
        path = Path(full_path)
        media_type = COMPRESSED_TYPES.get(path.suffix)
        if media_type is None:
            return super().file_response(full_path, stat_result, scope, status_code)
        response: Response | None = None
        codings = accepted(request_headers.get("accept-encoding", ""))
        for coding, suffix in ENCODINGS:
            if coding not in codings:
                continue
            copy = path.with_name(path.name + suffix)
            try:
                copied = copy.stat()
            except OSError:
                continue
            if copied.st_mtime < stat_result.st_mtime:
                continue  # older than its file: not what the file now holds
            response = FileResponse(
                copy,
                status_code=status_code,
                stat_result=copied,
                media_type=media_type,
                headers={"Content-Encoding": coding},
            )
            break
        if response is None:
            response = FileResponse(
                full_path, status_code=status_code, stat_result=stat_result, media_type=media_type
            )
        response.headers["Vary"] = "Accept-Encoding"
        response.headers["Cache-Control"] = IMMUTABLE if HASHED.search(path.name) else REVALIDATE
        if self.is_not_modified(response.headers, request_headers):
            return NotModifiedResponse(response.headers)
        return response
