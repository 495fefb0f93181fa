"""The dashboard's static files with ``SHAPER_WEB_PRECOMPRESSED`` (``app.core.static``): the
built scripts and styles answered with their precompressed copies where the request
accepts them, and each with how long it may be kept."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from starlette.applications import Starlette
from starlette.routing import Mount

from app.core.config import Settings
from app.core.static import DashboardStaticFiles, accepted
from app.main import WEB_DIR, create_app

SCRIPT = b"export const x = 1;\n" * 200
HASHED = "chunk-AB12CD34.js"


@pytest.fixture
def static(tmp_path: Path) -> TestClient:
    for name in ("main.js", HASHED, "app.css"):
        (tmp_path / name).write_bytes(SCRIPT)
        (tmp_path / f"{name}.gz").write_bytes(gzip.compress(SCRIPT, 9))
        # Not Brotli's output (no Brotli in the virtualenv): the bytes sent are compared.
        (tmp_path / f"{name}.br").write_bytes(b"brotli:" + SCRIPT[:100])
    (tmp_path / "favicon.svg").write_text("<svg/>")
    (tmp_path / "favicon.svg.gz").write_bytes(gzip.compress(b"<svg/>"))
    app = Starlette(routes=[Mount("/s", DashboardStaticFiles(directory=tmp_path))])
    return TestClient(app)


def _get(client: TestClient, path: str, **headers: str) -> tuple[httpx.Response, bytes]:
    """The answer and its body as sent (not decoded)."""
    with client.stream("GET", path, headers=headers) as response:
        return response, b"".join(response.iter_raw())


def test_the_copy_the_request_accepts_with_its_encoding(static: TestClient, tmp_path: Path) -> None:
    for accept, coding, suffix in [
        ("gzip, deflate, br", "br", ".br"),
        ("gzip, deflate", "gzip", ".gz"),
        ("br;q=0, gzip", "gzip", ".gz"),
    ]:
        response, sent = _get(static, "/s/main.js", **{"Accept-Encoding": accept})
        assert response.status_code == 200
        assert response.headers["content-encoding"] == coding, accept
        assert response.headers["content-type"] == "text/javascript; charset=utf-8"
        assert response.headers["vary"] == "Accept-Encoding"
        assert sent == (tmp_path / f"main.js{suffix}").read_bytes()
        assert int(response.headers["content-length"]) == len(sent)
    assert gzip.decompress(_get(static, "/s/main.js", **{"Accept-Encoding": "gzip"})[1]) == SCRIPT
    plain, sent = _get(static, "/s/main.js", **{"Accept-Encoding": "identity"})
    assert "content-encoding" not in plain.headers
    assert sent == SCRIPT
    css, sent = _get(static, "/s/app.css", **{"Accept-Encoding": "gzip"})
    assert css.headers["content-type"] == "text/css; charset=utf-8"
    assert css.headers["content-encoding"] == "gzip"
    assert gzip.decompress(sent) == SCRIPT
    # Only scripts and styles: another file is served as it is.
    icon, sent = _get(static, "/s/favicon.svg", **{"Accept-Encoding": "gzip"})
    assert "content-encoding" not in icon.headers and sent == b"<svg/>"


def test_a_copy_older_than_its_file_is_not_used(static: TestClient, tmp_path: Path) -> None:
    changed = b"export const x = 2;\n"
    (tmp_path / "main.js").write_bytes(changed)
    later = (tmp_path / "main.js.gz").stat().st_mtime + 5
    os.utime(tmp_path / "main.js", (later, later))
    response, sent = _get(static, "/s/main.js", **{"Accept-Encoding": "gzip, br"})
    assert "content-encoding" not in response.headers
    assert sent == changed


def test_hashed_names_are_kept_a_year_the_others_asked_about_again(static: TestClient) -> None:
    hashed = static.get(f"/s/{HASHED}", headers={"Accept-Encoding": "gzip"})
    assert hashed.headers["cache-control"] == "public, max-age=31536000, immutable"
    named = static.get("/s/main.js", headers={"Accept-Encoding": "gzip"})
    assert named.headers["cache-control"] == "no-cache"
    # Asked about again: unchanged, a 304 without the body.
    again = static.get(
        "/s/main.js",
        headers={"Accept-Encoding": "gzip", "If-None-Match": named.headers["etag"]},
    )
    assert again.status_code == 304 and again.content == b""
    # The gzip copy and the plain file are different bodies: different tags.
    plain = static.get("/s/main.js", headers={"Accept-Encoding": "identity"})
    assert plain.headers["etag"] != named.headers["etag"]


def test_accept_encoding_parsing() -> None:
    assert accepted("gzip, deflate, br") == {"gzip", "deflate", "br"}
    assert accepted("br;q=0, GZIP;q=0.5") == {"gzip"}
    assert accepted("") == set()
    assert accepted("gzip;q=nonsense") == {"gzip"}


@pytest.mark.parametrize("precompressed", [True, False])
def test_the_app_serves_the_built_bundle(precompressed: bool) -> None:
    """Through the whole application (its gzip middleware too): the body decodes to the
    built file, compressed once."""
    built = WEB_DIR / "static" / "dist" / "main.js"
    assert built.exists(), "the dashboard is not built: run `make web` (make test does)"
    client = TestClient(create_app(Settings(environment="test", web_precompressed=precompressed)))
    response = client.get("/static/dist/main.js", headers={"Accept-Encoding": "gzip"})
    assert response.status_code == 200
    assert response.headers["content-encoding"] == "gzip"
    assert response.content == built.read_bytes()
    if precompressed:
        assert response.headers["cache-control"] == "no-cache"
        assert int(response.headers["content-length"]) == len(Path(f"{built}.gz").read_bytes())
    else:
        assert "cache-control" not in response.headers
