"""Mixed fleet load (issue 13): connectors pushing node deltas on a cadence while dashboard
clients read, with every sequence number accounted for. Run as ``python -m bench.api
--mixed``; this module holds the mode.

Per level of ``--connectors`` (``10 25 50 100`` runs each in turn, a fresh database each):
``C`` clusters of ``--cluster-nodes`` (default ``--delta-nodes``) × 8 GPUs and
``--cluster-jobs`` jobs, each seeded with its connector session's snapshot (seq 1, written
in-process before the server starts: seeding is not the measured load). The application
runs under uvicorn (``--workers``, default 2) in a process of its own; the load comes from
two more processes:

* **connectors** (one asyncio process, a task and a keep-alive connection a connector, its
  own ``connector:<cluster>`` token): connector ``i`` is due every ``--push-every`` s from
  ``i × push-every / C`` (spread over the period, as independent sites would be) and
  pushes a delta of ``--delta-nodes`` node reports (2 % draining, the rest up, rotating
  through the cluster's nodes), one ``gpu_util`` sample per node reported, ``K / 50``
  jobs with a new priority, one running job completed and one new pending job, with
  seq = the last acknowledged + 1. A push that cannot land is retried as it was (same
  bytes, so a push written but whose answer was lost comes back ``duplicate: true`` and is
  counted once); one refused or given up is followed by a snapshot with the next seq, as
  the contract says. A push due while the one before is still in flight waits for it:
  its delay past the due time is its lag.
* **readers** (one asyncio process, ``--readers`` tasks, each with its own keep-alive
  connection and a viewer token): the dashboard's reads in turn, each task starting at
  another one: ``GET /overview``, ``/clusters``, ``/jobs?limit=100``, ``/nodes/map`` of a
  random cluster, ``/utilization``.

asyncio rather than threads: 200 readers as threads would spend the two shared cores on
the GIL and thread switches, beside the server they measure; one event loop a role costs
one core at most and leaves the rest to the server.

After the run (server stopped, nothing in flight) every cluster is checked in the
database against what its connector was acknowledged: the live session is its own; the
stored ``last_seq`` is the highest seq acknowledged; ``seq_gaps`` is the number of seqs
below it never acknowledged (refused or given up: the connector skipped them with a
snapshot); ``recent_pushes`` (the server's window of its last 64 accepted pushes) is the
last acknowledged seqs, in order, each once; the ``gpu_util`` samples stored are those of
the acknowledged pushes, each once; the jobs stored are the seeded ones plus one a
acknowledged push. A push written twice, or lost, or acknowledged and not written, shows
as a difference here.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import queue
import random
import time
from collections import Counter
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from multiprocessing.queues import Queue
from typing import Any

import httpx
import sqlalchemy as sa
from rich.console import Console
from rich.table import Table
from sqlmodel import Session, col, func, select

from app.clusters.models import Cluster
from app.core.db import make_engine
from app.gpu_models import service as gpu_model_service
from app.jobs.models import Job
from app.telemetry.models import TelemetrySample
from app.tokens import service as token_service
from app.tokens.models import ApiTokenCreate
from bench.api import seed_cluster, serving, sqlite_database
from bench.ingest import make_snapshot
from bench.scratch_db import DEFAULT_DSN, scratch_database
from wire.telemetry import REPLAY_WINDOW

READS: dict[str, Callable[[str], str]] = {
    "GET /overview": lambda _: "/api/v1/overview",
    "GET /clusters": lambda _: "/api/v1/clusters",
    "GET /jobs?limit=100": lambda _: "/api/v1/jobs?limit=100",
    "GET /nodes/map (one cluster)": lambda cluster: f"/api/v1/nodes/map?cluster={cluster}",
    "GET /utilization (24 h)": lambda _: "/api/v1/utilization",
}
ISSUE = {"connectors": 100, "push_every_s": 5.0, "delta_nodes": 1000, "readers": 200}
TIMEOUT_S = 60.0
ATTEMPTS = 3  # a push whose answer never came is sent again, as it was, this many times


@dataclass(frozen=True)
class Load:
    connectors: int
    push_every_s: float
    delta_nodes: int
    cluster_nodes: int
    cluster_jobs: int
    readers: int
    seconds: float
    read_every_s: float = 0.0  # each reader's period; 0: the next read once answered

    @property
    def slots(self) -> list[list[float]]:
        """Each connector's due times, seconds from the start, within the run."""
        step = self.push_every_s / self.connectors
        periods = range(int(self.seconds / self.push_every_s) + 1)
        return [
            [due for p in periods if (due := i * step + p * self.push_every_s) < self.seconds]
            for i in range(self.connectors)
        ]


def cluster_name(index: int) -> str:
    return f"load-{index:03d}"


def session_name(index: int) -> str:
    return f"load-connector-{index:03d}"


def _at(when: datetime) -> str:
    return when.isoformat().replace("+00:00", "Z")


# ---------------------------------------------------------------------------- seeding


def seed_fleet(url: str, load: Load) -> tuple[str, list[str]]:
    """The clusters, each with its connector's snapshot (seq 1); returns the viewer token
    and each cluster's connector token."""
    engine = make_engine(url)
    now = datetime.now(UTC)
    try:
        with Session(engine, expire_on_commit=False) as session:
            gpu_model_service.ensure_default_catalogue(session=session)
            for index in range(load.connectors):
                snapshot = make_snapshot(load.cluster_nodes, load.cluster_jobs, seed=1 + index)
                snapshot["connector_session"] = session_name(index)
                seed_cluster(session, cluster_name(index), snapshot, now)
            viewer = token_service.create_token(
                session=session, token_in=ApiTokenCreate(name="viewer", scopes=["viewer"]), now=now
            ).token
            connectors = [
                token_service.create_token(
                    session=session,
                    token_in=ApiTokenCreate(
                        name=f"connector-{i}", scopes=[f"connector:{cluster_name(i)}"]
                    ),
                    now=now,
                ).token
                for i in range(load.connectors)
            ]
    finally:
        engine.dispose()
    return viewer, connectors


# ------------------------------------------------------------------------- connectors


@dataclass
class ConnectorResult:
    cluster: str
    session: str
    acked: list[int] = field(default_factory=lambda: [1])  # seq 1: the seeded snapshot
    duplicates: int = 0  # acknowledged as already written (a retry whose answer was lost)
    refused: Counter[str] = field(default_factory=Counter)  # "409 snapshot_required" …
    retries: int = 0  # attempts sent again after no answer or a retryable refusal
    lost: int = 0  # pushes given up after ATTEMPTS without an answer
    resyncs: int = 0  # snapshots sent after a refused or lost push
    unacknowledged: int = 0  # pushes refused or lost
    latencies_s: list[float] = field(default_factory=list)  # every acknowledged attempt
    # Each push's start past its due time; one never sent: the run's end past it.
    lags_s: list[float] = field(default_factory=list)
    due: int = 0  # pushes due within the run
    sent: int = 0  # pushes started within the run
    samples_acked: int = 0  # samples in acknowledged pushes, each push counted once
    jobs_added: int = 0  # new jobs in acknowledged pushes
    period_s: float = 0.0

    @property
    def kept_cadence(self) -> bool:
        """Every push due was sent and acknowledged, none sent later than one period past
        its due time."""
        return (
            self.sent == self.due
            and not self.unacknowledged
            and max(self.lags_s, default=0) <= self.period_s
        )


class Connector:
    """One cluster's connector: its state as it last reported it, and its push loop."""

    def __init__(self, index: int, load: Load, rng: random.Random) -> None:
        snapshot = make_snapshot(load.cluster_nodes, load.cluster_jobs, seed=1 + index)
        self.index = index
        self.load = load
        self.rng = rng
        self.nodes: list[dict[str, Any]] = snapshot["nodes"]
        self.jobs: dict[str, dict[str, Any]] = {j["external_id"]: j for j in snapshot["jobs"]}
        self.running = [j for j, job in self.jobs.items() if job["state"] == "running"]
        self.cursor = 0
        self.seq = 1
        self.resync = False
        self.result = ConnectorResult(
            cluster_name(index), session_name(index), period_s=load.push_every_s
        )

    def delta(self, seq: int) -> tuple[dict[str, Any], int, int]:
        """The next delta (its body, samples and new jobs in it)."""
        now = _at(datetime.now(UTC))
        rng, k = self.rng, self.load.delta_nodes
        nodes, samples = [], []
        for offset in range(k):
            node = self.nodes[(self.cursor + offset) % len(self.nodes)]
            nodes.append({**node, "state": "draining" if rng.random() < 0.02 else "up"})
            samples.append(
                {"at": now, "metric": "gpu_util", "value": round(rng.random(), 3),
                 "node": node["name"], "gpu_index": rng.randrange(8)}
            )  # fmt: skip
        self.cursor = (self.cursor + k) % len(self.nodes)
        ids = list(self.jobs)
        changed = {}
        for _ in range(max(1, k // 50)):
            job = self.jobs[ids[rng.randrange(len(ids))]]
            changed[job["external_id"]] = {**job, "priority": rng.randint(0, 100)}
        if self.running:
            done = self.running.pop(rng.randrange(len(self.running)))
            changed[done] = {
                **self.jobs[done], "state": "finished", "end_time": now, "allocations": []
            }  # fmt: skip
        new = f"new-{self.index}-{seq}"
        changed[new] = {
            "external_id": new, "name": new, "team": f"team-{seq % 17}", "kind": "training",
            "priority": 50, "gpus_requested": 1, "submit_time": now, "state": "pending",
        }  # fmt: skip
        self.jobs.update(changed)
        body = {
            "kind": "delta", "connector_session": self.result.session, "seq": seq,
            "nodes": nodes, "jobs": list(changed.values()), "samples": samples,
        }  # fmt: skip
        return body, len(samples), 1

    def snapshot(self, seq: int) -> dict[str, Any]:
        return {
            "kind": "snapshot", "connector_session": self.result.session, "seq": seq,
            "nodes": self.nodes, "jobs": list(self.jobs.values()),
        }  # fmt: skip

    async def push(self, http: httpx.AsyncClient) -> None:
        """The next push (a delta, or a snapshot after a push that did not land) until it
        is acknowledged, refused, or given up."""
        seq = self.seq + 1
        self.seq = seq  # a seq is never reused, acknowledged or not
        if self.resync:
            body, samples, jobs = self.snapshot(seq), 0, 0
            self.result.resyncs += 1
        else:
            body, samples, jobs = self.delta(seq)
        content = json.dumps(body).encode()
        path = f"/api/v1/clusters/{self.result.cluster}/telemetry"
        headers = {"Content-Type": "application/json"}
        for attempt in range(ATTEMPTS):
            if attempt:
                self.result.retries += 1
            started = time.perf_counter()
            try:
                response = await http.post(path, content=content, headers=headers)
            except httpx.TransportError:  # no answer: it may or may not have been written
                continue
            if response.status_code == 200:
                self.result.latencies_s.append(time.perf_counter() - started)
                ack = response.json()
                if ack["seq"] != seq:
                    self.result.refused[f"200 acknowledged seq {ack['seq']}"] += 1
                    break
                self.result.acked.append(seq)
                self.result.duplicates += bool(ack["duplicate"])
                self.result.samples_acked += samples
                self.result.jobs_added += jobs
                self.resync = False
                return
            if response.status_code in (429, 503):  # retryable: the same bytes again
                self.result.refused[f"{response.status_code} (retried)"] += 1
                await asyncio.sleep(float(response.headers.get("Retry-After", "1")))
                continue
            try:
                code = response.json()["error"]["code"]
            except (ValueError, KeyError, TypeError):
                code = response.text[:40]
            self.result.refused[f"{response.status_code} {code}"] += 1
            break
        else:
            self.result.lost += 1
        self.result.unacknowledged += 1
        self.resync = True  # the next push is a snapshot with the next seq

    async def run(self, http: httpx.AsyncClient, start: float, due: list[float]) -> None:
        self.result.due = len(due)
        end = start + self.load.seconds
        for offset in due:
            wait = start + offset - time.time()
            if wait > 0:
                await asyncio.sleep(wait)
            if time.time() >= end:  # behind so far that the run ended first: never sent,
                # late by at least the rest of the run, each of those still due
                self.result.lags_s += [end - start - later for later in due[self.result.sent :]]
                break
            self.result.lags_s.append(max(0.0, time.time() - start - offset))
            self.result.sent += 1
            await self.push(http)


def _client(base: str, token: str) -> httpx.AsyncClient:
    """A client of its own: one keep-alive connection, as a separate program would hold."""
    return httpx.AsyncClient(
        base_url=base,
        headers={"Authorization": f"Bearer {token}"},
        timeout=TIMEOUT_S,
        limits=httpx.Limits(max_connections=1),
    )


async def _connectors(
    base: str, tokens: list[str], load: Load, start_queue: Queue[float], ready: Any
) -> list[ConnectorResult]:
    rng = random.Random(11)
    connectors = [Connector(i, load, random.Random(rng.random())) for i in range(load.connectors)]
    clients = [_client(base, token) for token in tokens]
    ready.set()
    start = await asyncio.get_running_loop().run_in_executor(None, start_queue.get)
    slots = load.slots
    try:
        await asyncio.gather(
            *(
                c.run(http, start, slots[c.index])
                for c, http in zip(connectors, clients, strict=True)
            )
        )
    finally:
        await asyncio.gather(*(http.aclose() for http in clients))
    return [c.result for c in connectors]


def connectors_process(
    base: str, tokens: list[str], load: Load, start: Queue[float], ready: Any, out: Queue[Any]
) -> None:
    out.put(asyncio.run(_connectors(base, tokens, load, start, ready)))


# ---------------------------------------------------------------------------- readers


@dataclass
class ReadFigures:
    latencies_s: dict[str, list[float]] = field(default_factory=dict)
    failed: Counter[str] = field(default_factory=Counter)  # "GET /overview 503" …


async def _reader(
    index: int, http: httpx.AsyncClient, load: Load, start: float, figures: ReadFigures
) -> None:
    rng = random.Random(index)
    labels = list(READS)
    turn = index % len(labels)
    end = start + load.seconds
    await asyncio.sleep(max(0.0, start - time.time()))
    while time.time() < end:
        label = labels[turn % len(labels)]
        turn += 1
        path = READS[label](cluster_name(rng.randrange(load.connectors)))
        started = time.perf_counter()
        try:
            status = (await http.get(path)).status_code
        except httpx.TransportError:
            status = 0
        elapsed = time.perf_counter() - started
        figures.latencies_s.setdefault(label, []).append(elapsed)
        if status != 200:
            figures.failed[f"{label} {status}"] += 1
        if load.read_every_s > elapsed:  # a dashboard polling; 0: as fast as answered
            await asyncio.sleep(load.read_every_s - elapsed)


async def _readers(
    base: str, token: str, load: Load, start_queue: Queue[float], ready: Any
) -> ReadFigures:
    figures = ReadFigures()
    clients = [_client(base, token) for _ in range(load.readers)]
    ready.set()
    start = await asyncio.get_running_loop().run_in_executor(None, start_queue.get)
    try:
        await asyncio.gather(
            *(_reader(i, http, load, start, figures) for i, http in enumerate(clients))
        )
    finally:
        await asyncio.gather(*(http.aclose() for http in clients))
    return figures


def readers_process(
    base: str, token: str, load: Load, start: Queue[float], ready: Any, out: Queue[Any]
) -> None:
    out.put(asyncio.run(_readers(base, token, load, start, ready)))


# --------------------------------------------------------------------------- the run


@dataclass
class Accounting:
    clusters: int = 0
    accounted: int = 0  # clusters whose stored seqs, samples and jobs match the acks
    problems: list[str] = field(default_factory=list)


@dataclass
class RunFigures:
    backend: str
    load: Load
    connectors: list[ConnectorResult]
    reads: ReadFigures
    wall_s: float
    load_average: float  # mean of the 1-minute load average sampled each second
    load_average_end: float
    accounting: Accounting


def _per_cluster(session: Session, cluster_id: Any) -> dict[int, int]:
    """Rows per cluster of the table ``cluster_id`` is a column of."""
    counts = session.execute(sa.select(cluster_id, func.count()).group_by(cluster_id))
    return {int(cluster): int(n) for cluster, n in counts}


def account(url: str, results: list[ConnectorResult], load: Load) -> Accounting:
    """Every cluster's stored session, seqs, samples and jobs against its connector's acks."""
    engine = make_engine(url)
    accounting = Accounting(clusters=len(results))
    try:
        with Session(engine) as session:
            clusters = {c.name: c for c in session.exec(select(Cluster))}
            samples = _per_cluster(session, col(TelemetrySample.cluster_id))
            jobs = _per_cluster(session, col(Job.cluster_id))
    finally:
        engine.dispose()
    for result in results:
        cluster = clusters[result.cluster]
        acked = result.acked
        last = acked[-1]
        window = [int(seq) for seq, _ in cluster.recent_pushes]
        expected_window = acked[-REPLAY_WINDOW:]
        checks = {
            "session": (cluster.connector_session, result.session),
            "last_seq": (cluster.last_seq, last),
            "seq_gaps": (cluster.seq_gaps, last - len(set(acked))),
            "acknowledged seqs increasing, each once": (
                acked == sorted(set(acked)),
                True,
            ),
            "recent_pushes": (window, expected_window),
            "gpu_util samples": (samples.get(cluster.id or 0, 0), result.samples_acked),
            "jobs": (jobs.get(cluster.id or 0, 0), load.cluster_jobs + result.jobs_added),
        }
        wrong = [f"{k}: stored {s!r}, acknowledged {a!r}" for k, (s, a) in checks.items() if s != a]
        if wrong:
            accounting.problems.append(f"{result.cluster}: " + "; ".join(wrong)[:400])
        else:
            accounting.accounted += 1
    return accounting


def run_level(
    backend: str,
    database: Callable[[], AbstractContextManager[str]],
    load: Load,
    workers: int,
    console: Console,
) -> RunFigures:
    with database() as url:
        console.log(
            f"{backend}: seeding {load.connectors} cluster(s) × {load.cluster_nodes} nodes, "
            f"{load.cluster_jobs} jobs each"
        )
        viewer, tokens = seed_fleet(url, load)
        with serving(url, workers) as server:
            with httpx.Client(base_url=server.base, timeout=TIMEOUT_S) as warm:
                for label, path in READS.items():  # imports and caches, each worker
                    for _ in range(2 * workers):
                        response = warm.get(
                            path(cluster_name(0)), headers={"Authorization": f"Bearer {viewer}"}
                        )
                        assert response.status_code == 200, (label, response.text[:200])
            context = multiprocessing.get_context("spawn")
            out: Queue[Any] = context.Queue()
            starts: list[Queue[float]] = [context.Queue(), context.Queue()]
            ready = [context.Event(), context.Event()]
            processes = [
                context.Process(
                    target=connectors_process,
                    args=(server.base, tokens, load, starts[0], ready[0], out),
                    daemon=True,
                ),
                context.Process(
                    target=readers_process,
                    args=(server.base, viewer, load, starts[1], ready[1], out),
                    daemon=True,
                ),
            ]
            for process in processes:
                process.start()
            for event in ready:
                if not event.wait(120):
                    raise RuntimeError("a load process did not start")
            console.log(
                f"{backend}: {load.connectors} connectors, {load.readers} readers, "
                f"{load.seconds:g} s"
            )
            start = time.time() + 1.0
            for start_queue in starts:
                start_queue.put(start)
            averages: list[float] = []
            results: list[Any] = []
            while len(results) < 2:
                try:
                    results.append(out.get(timeout=1.0))
                except queue.Empty:  # sample the load average meanwhile
                    if any(p.exitcode not in (None, 0) for p in processes):
                        raise RuntimeError("a load process failed") from None
                if time.time() < start + load.seconds:
                    averages.append(os.getloadavg()[0])
            wall_s = time.time() - start
            load_end = os.getloadavg()[0]
            for process in processes:
                process.join()
        connectors = next(r for r in results if isinstance(r, list))
        reads = next(r for r in results if isinstance(r, ReadFigures))
        accounting = account(url, connectors, load)
    return RunFigures(
        backend,
        load,
        connectors,
        reads,
        wall_s,
        sum(averages) / len(averages) if averages else load_end,
        load_end,
        accounting,
    )


# ------------------------------------------------------------------------- reporting


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))] * 1000 if ordered else 0.0


def report(runs: list[RunFigures], console: Console, *, issue: bool) -> None:
    first = runs[0].load
    pace = f"a read every {first.read_every_s:g} s each" if first.read_every_s else "back to back"
    pushes = Table(
        title=f"Connectors: a delta of {first.delta_nodes:,} nodes (+ {first.delta_nodes:,} "
        f"gpu_util samples, {max(1, first.delta_nodes // 50) + 2} job changes) every "
        f"{first.push_every_s:g} s per connector, {first.readers} dashboard readers ({pace}), "
        f"{first.seconds:g} s; clusters of {first.cluster_nodes:,} nodes × 8 GPUs, "
        f"{first.cluster_jobs:,} jobs; issue 13's target: 100 connectors × 1,000 nodes every 5 s "
        "while 200 clients read, every seq accounted for"
    )
    for column in (
        "backend", "connectors", "intended push/s", "achieved push/s", "due / sent / acked",
        "refused", "lost", "dup", "push p50/p95/p99 ms", "kept cadence", "lag p95 / max s",
        "seqs accounted", "load avg (mean / end)",
    ):  # fmt: skip
        pushes.add_column(column, justify="left" if column == "backend" else "right")
    for run in runs:
        cs = run.connectors
        latencies = [x for c in cs for x in c.latencies_s]
        lags = [x for c in cs for x in c.lags_s]
        refused: Counter[str] = Counter()
        for c in cs:
            refused.update(c.refused)
        acked = sum(len(c.acked) - 1 for c in cs)  # the seeded snapshot was not a push here
        intended = run.load.connectors / run.load.push_every_s
        pushes.add_row(
            run.backend,
            str(run.load.connectors),
            f"{intended:.1f}",
            f"{acked / run.load.seconds:.1f}",
            f"{sum(c.due for c in cs)} / {sum(c.sent for c in cs)} / {acked}",
            ", ".join(f"{n} × {k}" for k, n in sorted(refused.items())) or "0",
            str(sum(c.lost for c in cs)),
            str(sum(c.duplicates for c in cs)),
            f"{_pct(latencies, 50):.0f} / {_pct(latencies, 95):.0f} / {_pct(latencies, 99):.0f}",
            f"{sum(c.kept_cadence for c in cs)} of {len(cs)}",
            f"{_pct(lags, 95) / 1000:.1f} / {max(lags, default=0):.1f}",
            f"{run.accounting.accounted} of {run.accounting.clusters}",
            f"{run.load_average:.1f} / {run.load_average_end:.1f}",
        )
    console.print(pushes)
    reads = Table(title="Dashboard readers during the pushes (each row: one level above)")
    for column in ("backend", "connectors", "endpoint", "p50 / p99 ms", "req/s", "failed"):
        reads.add_column(column, justify="left" if column in ("backend", "endpoint") else "right")
    for run in runs:
        for label in READS:
            values = run.reads.latencies_s.get(label, [])
            failed = sum(n for k, n in run.reads.failed.items() if k.startswith(label + " "))
            reads.add_row(
                run.backend,
                str(run.load.connectors),
                label,
                f"{_pct(values, 50):.0f} / {_pct(values, 99):.0f}",
                f"{len(values) / run.load.seconds:,.1f}",
                str(failed),
            )
    console.print(reads)
    for run in runs:
        for problem in run.accounting.problems[:10]:
            console.print(f"[red]{run.backend} {run.load.connectors}: {problem}[/red]")
    full = [r for r in runs if r.load.connectors >= ISSUE["connectors"]]
    kept = [r.load.connectors for r in runs if all(c.kept_cadence for c in r.connectors)]
    console.print(
        f"largest level that kept every connector's cadence: {max(kept) if kept else 'none'}"
        f" connectors; target (issue 13): {ISSUE['connectors']} connectors × "
        f"{ISSUE['delta_nodes']:,} nodes every {ISSUE['push_every_s']:g} s with "
        f"{ISSUE['readers']} readers"
        + (
            ": " + ("met" if full and all(r.load.connectors in kept for r in full) else "not met")
            if issue
            else ""
        )
        + f"; every seq accounted for: "
        f"{'yes' if all(not r.accounting.problems for r in runs) else 'NO'}; CPUs: {os.cpu_count()}"
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("--mixed (connectors pushing while the dashboard reads)")
    group.add_argument(
        "--mixed", action="store_true", help="connectors push deltas while dashboard clients read"
    )
    group.add_argument(
        "--connectors",
        type=int,
        nargs="+",
        default=[ISSUE["connectors"]],
        help="one run per level (e.g. 10 25 50 100), a fresh database each; default 100",
    )
    group.add_argument("--push-every", type=float, default=ISSUE["push_every_s"], help="s")
    group.add_argument("--delta-nodes", type=int, default=ISSUE["delta_nodes"])
    group.add_argument("--cluster-nodes", type=int, help="default: --delta-nodes")
    group.add_argument("--cluster-jobs", type=int, default=1000)
    group.add_argument("--readers", type=int, default=ISSUE["readers"])
    group.add_argument(
        "--read-every",
        type=float,
        default=0.0,
        help="s between a reader's reads (a polling dashboard); default 0: back to back",
    )


def main_mixed(args: argparse.Namespace, console: Console) -> list[RunFigures]:
    """``--seconds`` is the length of each level's run (default here: 60 s)."""
    dsn = args.dsn or DEFAULT_DSN
    databases: dict[str, Callable[[], AbstractContextManager[str]]] = {
        "sqlite": sqlite_database,
        "postgres": partial(scratch_database, dsn, "shaper_bench_mixed"),
    }
    runs = []
    for backend in args.backends or ["postgres"]:
        for connectors in args.connectors:
            load = Load(
                connectors=connectors,
                push_every_s=args.push_every,
                delta_nodes=args.delta_nodes,
                cluster_nodes=max(args.cluster_nodes or args.delta_nodes, args.delta_nodes),
                cluster_jobs=args.cluster_jobs,
                readers=args.readers,
                seconds=args.seconds,
                read_every_s=args.read_every,
            )
            runs.append(run_level(backend, databases[backend], load, args.workers, console))
    issue = (
        args.push_every == ISSUE["push_every_s"]
        and args.delta_nodes == ISSUE["delta_nodes"]
        and args.readers == ISSUE["readers"]
    )
    report(runs, console, issue=issue)
    return runs
