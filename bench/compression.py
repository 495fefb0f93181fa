"""Response compression: the dashboard's large reads, gzipped at each level, bytes and
milliseconds, to choose ``app.main.GZIP_LEVEL``.

Seeds the cluster of ``bench.dashboard`` (``--nodes`` × 8 GPUs, every GPU held and
measured: 1,250 nodes, 10,000 GPUs) on SQLite, serves the application under uvicorn, reads
``GET /nodes/map``, ``GET /overview`` and a page of ``GET /jobs`` once plain, then times
gzip at each level on the payload in this process (median of ``--repeats``), and the read
over HTTP plain and gzipped as the dashboard gets it (the server's level).

    python -m bench.compression [--nodes 1250] [--jobs 20000] [--repeats 9]
"""

from __future__ import annotations

import argparse
import gzip
import os
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime

import httpx
from rich.console import Console
from rich.table import Table

from bench.api import served
from bench.dashboard import GPUS_PER_NODE, _sqlite, seed

LEVELS = (1, 5, 6, 9)
console = Console(width=140)  # the paths whole


def median_ms(work: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        work()
        times.append(1000 * (time.perf_counter() - started))
    return statistics.median(times)


def http_ms(http: httpx.Client, path: str, encoding: str, repeats: int) -> tuple[float, int]:
    """Median milliseconds of the read and the bytes on the wire."""
    headers = {"Accept-Encoding": encoding}
    http.get(path, headers=headers).raise_for_status()
    times, wire = [], 0
    for _ in range(repeats):
        started = time.perf_counter()
        with http.stream("GET", path, headers=headers) as response:
            response.raise_for_status()
            wire = sum(len(chunk) for chunk in response.iter_raw())
        times.append(1000 * (time.perf_counter() - started))
    return statistics.median(times), wire


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1250, help="nodes of the cluster")
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs in all")
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    paths = ("/api/v1/nodes/map?cluster=big", "/api/v1/overview", "/api/v1/jobs?limit=100")
    with _sqlite() as url:
        token = seed(url, {"big": (args.nodes, args.jobs)}, datetime.now(UTC))
        with (
            served(url, workers=1) as base,
            httpx.Client(
                base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=120
            ) as http,
        ):
            bodies = {
                p: http.get(p, headers={"Accept-Encoding": "identity"}).content for p in paths
            }
            over_http = {
                (p, e): http_ms(http, p, e, args.repeats)
                for p in paths
                for e in ("identity", "gzip")
            }

    levels = Table(title=f"gzip in process ({args.nodes * GPUS_PER_NODE:,} GPUs, medians)")
    levels.add_column("read")
    levels.add_column("plain KiB", justify="right")
    for level in LEVELS:
        levels.add_column(f"level {level}: KiB / ms", justify="right")
    for path, body in bodies.items():
        cells = []
        for level in LEVELS:
            size = len(gzip.compress(body, compresslevel=level))
            ms = median_ms(lambda: gzip.compress(body, compresslevel=level), args.repeats)  # noqa: B023
            cells.append(f"{size / 1024:,.1f} / {ms:.1f}")
        levels.add_row(path, f"{len(body) / 1024:,.1f}", *cells)
    console.print(levels)
    wire = Table(title="over HTTP, the server's level (medians, loopback)")
    wire.add_column("read")
    wire.add_column("plain: KiB / ms", justify="right")
    wire.add_column("gzip: KiB / ms", justify="right")
    for path in paths:
        plain, zipped = over_http[(path, "identity")], over_http[(path, "gzip")]
        wire.add_row(
            path,
            f"{plain[1] / 1024:,.1f} / {plain[0]:.0f}",
            f"{zipped[1] / 1024:,.1f} / {zipped[0]:.0f}",
        )
    console.print(wire)
    console.print(
        f"load average (1 min) at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    )


if __name__ == "__main__":
    main()
