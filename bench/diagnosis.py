"""Why idle at 10,000 GPUs: ``app.diagnosis.service.diagnose`` called directly (the work of
``GET /api/v1/diagnosis``, without HTTP) on the dashboard bench's database.

The database is ``bench.dashboard``'s (its ``seed``): ``big``, ``--nodes`` × 8 GPUs (1,250:
10,000 GPUs), and ``small``, a tenth of it (1,000 GPUs); ``--jobs`` jobs in all (the
issue's 100,000), every GPU held by a running job that started a minute before the seed's
``now`` and measured then, the rest pending, submitted over the 15 hours before. So a
window of the last day replays about 900 changes of the queue over GPUs that are all free
until that last minute: every change asks the whole queue of every node.

Prints, per cluster and window (``--hours``, each ending at the seed's ``now``): the
window's intervals of constant state (change points, bucket boundaries included), the
distinct states the diagnosis classified, and the time per call (median of
``--repeats`` calls, after one warm-up call). Figures only: nothing here asserts a time.

    python -m bench.diagnosis --diagnosis [--nodes 1250] [--jobs 100000] [--hours 1,24]
        [--repeats 3] [--db PATH]

``--db PATH`` keeps the SQLite database at PATH (seeded when it does not exist yet, with
its ``now`` beside it in PATH.now) so that a second run, e.g. before and after a change,
reads the same one; without it a scratch one is seeded and dropped.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from rich.console import Console
from rich.table import Table
from sqlmodel import Session

from app.core import migrate
from app.core.db import make_engine
from app.diagnosis import service
from app.diagnosis.history import replay
from bench.dashboard import GPUS_PER_NODE, seed

console = Console()


def states(session: Session, cluster: str, since: datetime, until: datetime) -> tuple[int, int]:
    """The window's intervals and the distinct states among them (what is classified)."""
    window = service.window_of(session=session, cluster=cluster, since=since, until=until)
    intervals, distinct, last = 0, 0, None
    for _, _, state in replay(session, window):
        intervals += 1
        distinct += state is not last
        last = state
    return intervals, distinct


def timed(url: str, cluster: str, since: datetime, until: datetime, repeats: int) -> float:
    """Median seconds of one diagnose() call, each in a fresh session."""
    engine = make_engine(url)
    times = []
    try:
        for attempt in range(repeats + 1):
            with Session(engine) as session:
                started = time.perf_counter()
                service.diagnose(session=session, cluster=cluster, since=since, until=until)
                if attempt:  # the first call warms the caches (SQLite's pages, imports)
                    times.append(time.perf_counter() - started)
    finally:
        engine.dispose()
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--diagnosis", action="store_true", help="the why-idle case (default)")
    parser.add_argument("--nodes", type=int, default=1250, help="nodes of the big cluster")
    parser.add_argument("--jobs", type=int, default=100_000, help="jobs in all")
    parser.add_argument("--hours", default="1,24", help="window lengths, ending at the seed")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--db", type=Path, help="SQLite file to keep and reuse")
    args = parser.parse_args()
    clusters = {
        "small": (max(1, args.nodes // 10), args.jobs - args.jobs * 10 // 11),
        "big": (args.nodes, args.jobs * 10 // 11),
    }
    with tempfile.TemporaryDirectory(prefix="shaper-bench-diagnosis-") as scratch:
        path = args.db or Path(scratch) / "shaper.db"
        stamp = path.with_name(path.name + ".now")
        url = f"sqlite:///{path}"
        if not path.exists():
            migrate.upgrade(url)
            now = datetime.now(UTC)
            # The dashboard's seed registers big first; the ids do not matter here.
            seed(url, {"big": clusters["big"], "small": clusters["small"]}, now)
            stamp.write_text(now.isoformat())
        now = datetime.fromisoformat(stamp.read_text())
        hours = [float(h) for h in args.hours.split(",") if h]
        table = Table(title=f"diagnose() per call, in-process (SQLite, medians of {args.repeats})")
        for column in ("cluster", "GPUs", "jobs", "window h", "intervals", "states", "s / call"):
            table.add_column(column, justify="left" if column == "cluster" else "right")
        engine = make_engine(url)
        try:
            for cluster, (n_nodes, n_jobs) in clusters.items():
                for h in hours:
                    since = now - timedelta(hours=h)
                    with Session(engine) as session:
                        intervals, distinct = states(session, cluster, since, now)
                    seconds = timed(url, cluster, since, now, args.repeats)
                    console.print(f"  {cluster}, {h:g} h: {seconds:.2f} s")
                    table.add_row(
                        cluster,
                        f"{n_nodes * GPUS_PER_NODE:,}",
                        f"{n_jobs:,}",
                        f"{h:g}",
                        f"{intervals:,}",
                        f"{distinct:,}",
                        f"{seconds:.2f}",
                    )
        finally:
            engine.dispose()
        console.print(table)


if __name__ == "__main__":
    main()
