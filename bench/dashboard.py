"""Dashboard page load at 10,000 GPUs: the cluster map and the fleet overview in a real
Chromium against the real application, beside the same at 1,000 GPUs.

One database (SQLite, the embedded default, or PostgreSQL with ``--backend postgres``)
holds two clusters: ``big``, ``--nodes`` × 8 GPUs (1,250: 10,000 GPUs), and ``small``, a
tenth of it (1,000 GPUs), the baseline. Every GPU is held by a running job (1, 2, 4 or 8
GPUs each, teams ``team-0`` … ``team-16``) and measured a minute ago (utilization and
memory), so every cell of the map is coloured, banded and titled; ``--jobs`` jobs in all
(the issue's 100,000), those beyond the running ones pending. The application runs under
uvicorn in a process of its own; Debian's Chromium loads the dashboard.

Prints, per cluster: ``GET /nodes/map`` timed alone (median of ``--repeats`` reads from
this process) and its payload; then, in the browser (median of ``--repeats`` loads), the
same read as the page saw it, the time from choosing the map to its first rows painted
(first render) and to every row drawn. The map is chosen once the overview is drawn and
the page quiet: by then the page has fetched the map's code in idle time (main.ts), so the
first render waits for the read, not for ``map.js``. For the overview: the first
contentful paint and the cards drawn on a fresh load (the first animation frame with them,
noted by the page itself: nothing of Playwright's runs in the page before it) with when
``main.js`` was in and when ``GET /overview`` left and was answered, and the view drawn
again when navigated to, beside ``GET /overview`` alone. Then every other page
(``--views``), each navigated to from the page before it, first (its code fetched too) and
again: the time until the view stopped changing, taken apart into its code's fetch, the
time with one of its API reads outstanding and the rest (the page's own script and layout,
mostly), beside each read timed alone from this process (median ms, body bytes, gzip-1
bytes as the server sends them). Figures only: nothing here asserts a time.

    python -m bench.dashboard [--nodes 1250] [--jobs 100000] [--repeats 3] [--backend sqlite]
        [--views jobs,job,actions,policies,simulations,federation,forecasts]

The server takes the bench's environment (``SHAPER_WEB_PRECOMPRESSED=true`` for the
precompressed, cached static files). Why idle (``idle``) is not among the default views: its
``GET /diagnosis`` did not answer within minutes at this size until 2026-12-05 (now about
1.2 s in-process for a day, ``python -m bench.diagnosis``); ``--views …,idle`` times it.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import httpx
from playwright.sync_api import Page, Request, sync_playwright
from rich.console import Console
from rich.table import Table
from sqlmodel import Session

from app.clusters import service as cluster_service
from app.clusters.models import ClusterCreate
from app.core import migrate
from app.core.db import make_engine
from app.gpu_models import service as gpu_model_service
from app.main import GZIP_LEVEL, GZIP_MIN_BYTES
from app.telemetry import service as telemetry_service
from app.tokens import service as token_service
from app.tokens.models import ApiTokenCreate
from bench.api import served
from bench.ingest import MODELS
from bench.scratch_db import DEFAULT_DSN, scratch_database

GPUS_PER_NODE = 8
TEAMS = 17
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
BUNDLE = Path(__file__).resolve().parents[1] / "web" / "static" / "dist" / "app.js"
console = Console()

# Chooses the map of one cluster and waits for it to be painted: the first rows (the
# frame after they were put in, a task later), then every row. Times are the page's own
# clock from the choice; the read is the page's resource timing of GET /nodes/map.
MAP_LOAD_JS = """
async (cluster) => {
  const view = document.querySelector("#gpu-map");
  const painted = () => new Promise((done) => requestAnimationFrame(() => setTimeout(done, 0)));
  const until = async (holds) => { while (!holds()) await new Promise(requestAnimationFrame); };
  delete view.dataset.drawn;
  delete view.dataset.cluster;
  performance.clearResourceTimings();
  const chooser = document.querySelector("#node-cluster");
  chooser.value = cluster;
  const started = performance.now();
  if (location.hash === "#nodes") chooser.dispatchEvent(new Event("change"));
  else location.hash = "#nodes";
  await until(() => view.dataset.cluster === cluster && view.dataset.drawn);
  await painted();
  const first = performance.now() - started;
  await until(() => view.dataset.drawn === "all");
  await painted();
  const all = performance.now() - started;
  const read = performance.getEntriesByType("resource")
    .find((e) => e.name.includes("/nodes/map?"));
  const cells = view.querySelectorAll(".gpu").length;
  return { first, all, read: read ? read.duration : null, cells };
}
"""

# Before the page's own scripts, on a fresh load: the page's clock at the first animation
# frame (the one that paints them) in which the overview's cards and figures are there, said
# on the console. The bench waits for that message and asks nothing of the page until then:
# a query (wait_for_function) would put Playwright's own script into the page while it loads.
CARDS_MARK = "shaper-bench: cards drawn at"
CARDS_DRAWN_JS = """
(() => {
  const drawn = () => document.querySelectorAll("#cluster-cards .card").length >= %d
    && document.querySelector("#fleet-figures [data-figure]");
  const look = () => drawn()
    ? console.debug(`%s ${performance.now()}`)
    : requestAnimationFrame(look);
  requestAnimationFrame(look);
})();
"""

# Before the page's own scripts: counts the fetches under way (the API's reads).
FETCHES_JS = """
(() => {
  const open = { count: 0 };
  window.__shaperBenchFetches = open;
  const fetch = window.fetch.bind(window);
  window.fetch = (...args) => {
    open.count++;
    const done = () => { open.count--; };
    const answer = fetch(...args);
    answer.then(done, done);
    return answer;
  };
})();
"""

# Navigates to a view and waits until it stopped changing: nothing under <main> changed and
# no fetch was under way for QUIET ms. Its time: the animation frame after the last change
# under <main>, from the navigation. Then what was fetched meanwhile (resource timing): the
# page's code and the API's reads, with their times from the navigation and their bytes.
QUIET_MS = 250
VIEW_LOAD_JS = """
async ([hash, quiet]) => {
  const main = document.querySelector("main");
  const open = window.__shaperBenchFetches;
  performance.clearResourceTimings();
  const started = performance.now();
  let changed = started, drawn = started;
  const observer = new MutationObserver(() => {
    const at = performance.now();
    changed = at;
    requestAnimationFrame(() => { if (changed === at) drawn = performance.now(); });
  });
  observer.observe(main, { subtree: true, childList: true, attributes: true, characterData: true });
  location.hash = hash;
  let calm = performance.now();
  while (performance.now() - calm < quiet || performance.now() - changed < quiet) {
    await new Promise((done) => setTimeout(done, 10));
    if (open.count > 0) calm = performance.now();
  }
  observer.disconnect();
  const fetched = performance.getEntriesByType("resource").map((e) => ({
    path: new URL(e.name).pathname + new URL(e.name).search,
    start: e.startTime - started, end: e.responseEnd - started,
    bytes: e.encodedBodySize, decoded: e.decodedBodySize,
  }));
  return { drawn: drawn - started, fetched };
}
"""

# A fresh load's parts, from its resource timing (once its cards are drawn).
FRESH_PARTS_JS = """
() => {
  const first = (path) => performance.getEntriesByType("resource")
    .find((e) => new URL(e.name).pathname === path);
  const main = first("/static/dist/main.js"), read = first("/api/v1/overview");
  return { "main.js in": main?.responseEnd, "overview asked": read?.startTime,
           "overview in": read?.responseEnd };
}
"""

# Navigates to the overview (already signed in) and waits for its cards painted.
OVERVIEW_AGAIN_JS = """
async (clusters) => {
  const cards = document.querySelector("#cluster-cards");
  const painted = () => new Promise((done) => requestAnimationFrame(() => setTimeout(done, 0)));
  cards.innerHTML = "";
  const started = performance.now();
  location.hash = "#overview";
  while (cards.querySelectorAll(".card").length < clusters) {
    await new Promise(requestAnimationFrame);
  }
  await painted();
  return performance.now() - started;
}
"""


def fleet_snapshot(
    n_nodes: int, n_jobs: int, now: datetime, rng: random.Random, prefix: str
) -> dict[str, Any]:
    """Every GPU held by a running job and measured a minute before ``now``; the jobs
    beyond the running ones pending."""
    nodes: list[dict[str, Any]] = []
    jobs: list[dict[str, Any]] = []
    samples: list[dict[str, Any]] = []
    at = (now - timedelta(minutes=1)).isoformat()

    def new_job(state: str, gpus: int) -> dict[str, Any]:
        j = len(jobs)
        return {
            "external_id": f"{prefix}-{j}",
            "name": f"train-{j}",
            "team": f"team-{j % TEAMS}",
            "kind": "training",
            "priority": rng.randint(0, 100),
            "gpus_requested": gpus,
            "submit_time": (now - timedelta(minutes=2 + j % 900)).isoformat(),
            "state": state,
        }

    for i in range(n_nodes):
        name = f"node-{i:05d}"
        model = MODELS[i % len(MODELS)]
        nodes.append({"name": name, "gpu_model": model, "gpu_count": GPUS_PER_NODE,
                      "cpu_cores": 128, "memory_mib": 1_048_576})  # fmt: skip
        index = 0
        while index < GPUS_PER_NODE:
            gpus = min(rng.choice([1, 2, 4, 8]), GPUS_PER_NODE - index)
            job = new_job("running", gpus)
            job["start_time"] = at
            job["allocations"] = [{"node": name, "gpu_indices": list(range(index, index + gpus))}]
            jobs.append(job)
            index += gpus
        for gpu in range(GPUS_PER_NODE):
            samples.append({"at": at, "metric": "gpu_util", "node": name, "gpu_index": gpu,
                            "value": round(rng.random(), 3)})  # fmt: skip
            samples.append({"at": at, "metric": "gpu_mem_used_gib", "node": name,
                            "gpu_index": gpu, "value": round(rng.uniform(4, 60), 1)})  # fmt: skip
    while len(jobs) < n_jobs:
        jobs.append(new_job("pending", rng.choice([1, 2, 4, 8])))
    return {"kind": "snapshot", "connector_session": "bench", "seq": 1,
            "nodes": nodes, "jobs": jobs, "samples": samples}  # fmt: skip


def seed(url: str, clusters: dict[str, tuple[int, int]], now: datetime) -> str:
    """The clusters (name: nodes, jobs) through the ingest path; returns a viewer token."""
    engine = make_engine(url)
    rng = random.Random(7)
    try:
        with Session(engine, expire_on_commit=False) as session:
            gpu_model_service.ensure_default_catalogue(session=session)
            for name, (n_nodes, n_jobs) in clusters.items():
                started = time.perf_counter()
                gpus = n_nodes * GPUS_PER_NODE
                console.print(
                    f"seeding {name}: {n_nodes:,} nodes, {gpus:,} GPUs, {n_jobs:,} jobs …"
                )
                cluster_service.register_cluster(
                    session=session, cluster_in=ClusterCreate(name=name), now=now
                )
                snapshot = fleet_snapshot(n_nodes, n_jobs, now, rng, prefix=name)
                running = sum(j["state"] == "running" for j in snapshot["jobs"])
                push = telemetry_service.parse_push(json.dumps(snapshot).encode())
                telemetry_service.ingest(session=session, cluster_name=name, push=push, now=now)
                console.print(
                    f"  {running:,} running, {n_jobs - running:,} pending, "
                    f"{len(snapshot['samples']):,} samples in {time.perf_counter() - started:.1f} s"
                )
            token = token_service.create_token(
                session=session,
                token_in=ApiTokenCreate(name="bench-viewer", scopes=["viewer"]),
                now=now,
            ).token
            session.commit()
    finally:
        engine.dispose()
    return token


@contextmanager
def _sqlite() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="shaper-bench-") as scratch:
        url = f"sqlite:///{Path(scratch) / 'shaper.db'}"
        migrate.upgrade(url)
        yield url


def api_alone(base: str, token: str, path: str, repeats: int) -> tuple[float, int, int]:
    """Median milliseconds of ``path`` read by this process, its body's bytes, and those
    at the server's gzip level (app.main.GZIP_LEVEL; none below its GZIP_MIN_BYTES)."""
    times, size, sent = [], 0, 0
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}) as http:
        http.get(path, timeout=120).raise_for_status()  # the first read warms the worker
        for _ in range(repeats):
            started = time.perf_counter()
            response = http.get(path, timeout=120)
            times.append(1000 * (time.perf_counter() - started))
            response.raise_for_status()
            size = len(response.content)
    sent = len(gzip.compress(response.content, GZIP_LEVEL)) if size >= GZIP_MIN_BYTES else size
    return statistics.median(times), size, sent


def quiet_waiter(page: Page, quiet_ms: int = 100) -> Callable[[], None]:
    """A function that waits until every request of ``page`` has been answered (or has
    failed) and none was made for ``quiet_ms`` (a reply that leads to another read)."""
    open_requests: set[Request] = set()
    page.on("request", lambda request: open_requests.add(request))
    page.on("requestfinished", lambda request: open_requests.discard(request))
    page.on("requestfailed", lambda request: open_requests.discard(request))

    def answered() -> None:
        quiet = 0
        while quiet < quiet_ms:
            page.wait_for_timeout(20)
            quiet = 0 if open_requests else quiet + 20

    return answered


# The views timed after the overview and the map (--views), by their address.
VIEWS = ["jobs", "job", "actions", "policies", "simulations", "federation", "forecasts"]


def _covered(spans: list[tuple[float, float]]) -> float:
    """Milliseconds covered by at least one of ``spans``."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def view_figures(got: dict[str, Any]) -> dict[str, float]:
    """One view's load taken apart: drawn; its code's fetch; the time with an API read
    under way; the rest (neither: the page's script, layout, paint); bytes fetched."""
    fetched = got["fetched"]
    code = [(f["start"], f["end"]) for f in fetched if f["path"].endswith(".js")]
    api = [(f["start"], f["end"]) for f in fetched if f["path"].startswith("/api/")]
    return {
        "drawn": float(got["drawn"]),
        "code": _covered(code),
        "api": _covered(api),
        "rest": max(0.0, float(got["drawn"]) - _covered(code + api)),
        "bytes": float(sum(f["bytes"] for f in fetched)),
    }


def browser_figures(
    base: str, token: str, clusters: list[str], repeats: int, views: dict[str, str]
) -> tuple[
    dict[str, dict[str, float]],
    dict[str, float],
    dict[str, dict[str, dict[str, float]]],
    dict[str, set[str]],
]:
    """Per cluster the map's medians (read, first render, all drawn); the overview's; per
    view (name: address) its medians, first visit and again (view_figures), and the API
    paths it read."""
    maps: dict[str, dict[str, list[float]]] = {c: {} for c in clusters}
    overview: dict[str, list[float]] = {}
    pages: dict[str, dict[str, dict[str, list[float]]]] = {
        v: {"first": {}, "again": {}} for v in views
    }
    reads: dict[str, set[str]] = {v: set() for v in views}

    def add(into: dict[str, list[float]], name: str, value: float) -> None:
        into.setdefault(name, []).append(value)

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=CHROMIUM,
            args=["--headless", "--no-sandbox", "--disable-gpu",
                  "--disable-background-networking", "--disable-component-update",
                  "--no-first-run"],
        )  # fmt: skip
        for attempt in range(repeats):
            context = chromium.new_context(viewport={"width": 1280, "height": 900})
            context.add_init_script(CARDS_DRAWN_JS % (len(clusters), CARDS_MARK))
            context.add_init_script(FETCHES_JS)
            page: Page = context.new_page()
            answered = quiet_waiter(page)
            # The fresh load's overview, on the page's clock from the navigation's start.
            with page.expect_console_message(
                lambda message: message.text.startswith(CARDS_MARK), timeout=120_000
            ) as said:
                page.goto(f"{base}/#token={token}", wait_until="commit")
            drawn = said.value.text.rsplit(" ", 1)[1]
            # The rest of the page (the chart, the replay) read before the map is timed.
            answered()
            paint = page.evaluate(
                "() => performance.getEntriesByName('first-contentful-paint')[0]?.startTime"
            )
            add(overview, "cards", float(drawn))
            add(overview, "first paint", float(paint or 0))
            # The same load taken apart: when main.js was in, when GET /overview left and
            # when its reply was in (the page's resource timing, from the navigation).
            for name, value in page.evaluate(FRESH_PARTS_JS).items():
                add(overview, name, float(value or 0))
            for cluster in clusters:
                got = page.evaluate(MAP_LOAD_JS, cluster)
                console.print(
                    f"  load {attempt + 1}/{repeats} {cluster}: {got['cells']:,} cells, "
                    f"first render {got['first']:.0f} ms, all {got['all']:.0f} ms"
                )
                for name in ("read", "first", "all"):
                    add(maps[cluster], name, float(got[name] or 0))
            add(overview, "again", float(page.evaluate(OVERVIEW_AGAIN_JS, len(clusters))))
            answered()
            # Each view from the one before it: first its code comes too, then again.
            for visit in ("first", "again"):
                for name, address in views.items():
                    got = page.evaluate(VIEW_LOAD_JS, [address, QUIET_MS])
                    reads[name] |= {
                        f["path"].removeprefix("/api/v1")
                        for f in got["fetched"]
                        if f["path"].startswith("/api/")
                    }
                    for key, value in view_figures(got).items():
                        add(pages[name][visit], key, value)
                    console.print(
                        f"  load {attempt + 1}/{repeats} {name} ({visit}): "
                        f"drawn {got['drawn']:.0f} ms"
                    )
            # The server idle again before the next fresh load: a read abandoned by a
            # closed page would still be worked out, beside that load's.
            answered()
            context.close()
        chromium.close()
    return (
        {c: {k: statistics.median(v) for k, v in m.items()} for c, m in maps.items()},
        {k: statistics.median(v) for k, v in overview.items()},
        {
            name: {
                visit: {k: statistics.median(v) for k, v in figures.items()}
                for visit, figures in visits.items()
            }
            for name, visits in pages.items()
        },
        reads,
    )


def views_tables(
    pages: dict[str, dict[str, dict[str, float]]],
    reads: dict[str, set[str]],
    alone: dict[str, tuple[float, int, int]],
    repeats: int,
) -> tuple[Table, Table]:
    """Per view, first visit and again: drawn and its parts; then its reads timed alone."""
    table = Table(title=f"Other views, each navigated to from the one before ({repeats} loads)")
    for column in ("view", "visit", "drawn ms", "code ms", "API ms", "rest ms", "KiB fetched"):
        table.add_column(column, justify="left" if column in ("view", "visit") else "right")
    for name, visits in pages.items():
        for visit, f in visits.items():
            table.add_row(
                name if visit == "first" else "",
                visit,
                *(f"{f[k]:.0f}" for k in ("drawn", "code", "api", "rest")),
                f"{f['bytes'] / 1024:,.1f}",
            )
    calls = Table(title=f"Their API reads, each alone from this process (medians of {repeats})")
    for column in ("view", "GET /api/v1…", "ms", "body KiB", "sent KiB"):
        calls.add_column(
            column,
            justify="left" if column in ("view", "GET /api/v1…") else "right",
            overflow="fold",
        )
    for name in pages:
        for i, path in enumerate(sorted(reads[name], key=lambda path: -alone[path][0])):
            ms, size, sent = alone[path]
            kib = (f"{size / 1024:,.1f}", f"{sent / 1024:,.1f}")
            shown = path if len(path) <= 60 else f"{path[:59]}…"  # a list of 50 job ids
            calls.add_row(name if i == 0 else "", shown, f"{ms:.0f}", *kib)
    return table, calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1250, help="nodes of the big cluster")
    parser.add_argument("--jobs", type=int, default=100_000, help="jobs in all")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--backend", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--dsn", default=DEFAULT_DSN)
    parser.add_argument(
        "--views",
        default=",".join(VIEWS),
        help="the other views timed, by address (idle: Why idle; empty: none)",
    )
    args = parser.parse_args()
    if not Path(CHROMIUM).exists() or not BUNDLE.exists():
        raise SystemExit("needs Chromium (scripts/browser.sh) and the bundle (make web)")
    small_nodes = max(1, args.nodes // 10)
    clusters = {
        "big": (args.nodes, args.jobs * 10 // 11),
        "small": (small_nodes, args.jobs - args.jobs * 10 // 11),
    }
    database: Callable[[], AbstractContextManager[str]] = (
        _sqlite
        if args.backend == "sqlite"
        else partial(scratch_database, args.dsn, "shaper_bench_dashboard")
    )
    now = datetime.now(UTC)
    with database() as url:
        token = seed(url, clusters, now)
        with served(url, workers=1) as base:
            console.print("reading the API alone …")
            alone = {
                c: api_alone(base, token, f"/api/v1/nodes/map?cluster={c}", args.repeats)
                for c in clusters
            }
            overview_alone, _, _ = api_alone(base, token, "/api/v1/overview", args.repeats)
            views = {v: v for v in args.views.split(",") if v}
            if "job" in views:  # a running job of the big cluster
                with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}) as h:
                    listed = h.get("/api/v1/jobs", params={"state": "running", "limit": 1})
                views["job"] = f"job&id={listed.raise_for_status().json()['items'][0]['id']}"
            console.print(f"loading the dashboard in Chromium ({args.repeats} times) …")
            maps, overview, pages, reads = browser_figures(
                base, token, list(clusters), args.repeats, views
            )
            console.print("reading each view's API calls alone …")
            read_alone = {
                path: api_alone(base, token, f"/api/v1{path}", args.repeats)
                for path in sorted(set().union(*reads.values()))
            }

    table = Table(title=f"Cluster map ({args.backend}, medians of {args.repeats})")
    table.add_column("")
    for c, (n_nodes, _) in clusters.items():
        table.add_column(f"{c}: {n_nodes * GPUS_PER_NODE:,} GPUs", justify="right")
    rows: list[tuple[str, Callable[[str], str]]] = [
        ("GET /nodes/map alone (ms)", lambda c: f"{alone[c][0]:.0f}"),
        ("its payload (KiB)", lambda c: f"{alone[c][1] / 1024:,.0f}"),
        ("GET /nodes/map in the page (ms)", lambda c: f"{maps[c]['read']:.0f}"),
        ("first render of the map (ms)", lambda c: f"{maps[c]['first']:.0f}"),
        ("every row drawn (ms)", lambda c: f"{maps[c]['all']:.0f}"),
    ]
    for label, cell in rows:
        table.add_row(label, *(cell(c) for c in clusters))
    console.print(table)
    gpus = sum(n for n, _ in clusters.values()) * GPUS_PER_NODE
    fleet = Table(title=f"Overview ({gpus:,} GPUs, {args.jobs:,} jobs)")
    fleet.add_column("")
    fleet.add_column("ms", justify="right")
    fleet.add_row("GET /overview alone", f"{overview_alone:.0f}")
    fleet.add_row("fresh load: first contentful paint", f"{overview['first paint']:.0f}")
    fleet.add_row("fresh load: main.js received", f"{overview['main.js in']:.0f}")
    fleet.add_row("fresh load: GET /overview asked", f"{overview['overview asked']:.0f}")
    fleet.add_row("fresh load: its reply received", f"{overview['overview in']:.0f}")
    fleet.add_row("fresh load: cards drawn", f"{overview['cards']:.0f}")
    fleet.add_row("navigated to again: cards drawn", f"{overview['again']:.0f}")
    console.print(fleet)
    if pages:
        for table in views_tables(pages, reads, read_alone, args.repeats):
            console.print(table)
    console.print(
        f"load average (1 min) at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs, "
        "shared by Chromium, the server and this process"
    )


if __name__ == "__main__":
    main()
