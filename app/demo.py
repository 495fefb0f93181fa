"""``shaper demo``: a multi-cluster site with 24 hours of history, on the embedded default.

The history is produced by pushing telemetry snapshots through the same ingest path that
connectors use, one every 15 simulated minutes, from a small first-fit placement of a
seeded workload. It is illustrative data (the simulator in ``sim/`` is the tool for
measured comparisons); the dashboard and API show it exactly as they would a real site.
"""

from __future__ import annotations

import math
import random
import shutil
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from sqlmodel import Session, select

from app.clusters import service as cluster_service
from app.clusters.models import Cluster, ClusterCreate, ShapingMode
from app.core.config import get_settings
from app.core.db import get_engine
from app.shaping.cycle import run_cycle
from app.telemetry import service as telemetry_service
from app.tokens import service as token_service
from app.tokens.models import ApiTokenCreate
from connectors.base import (
    AllocationReport,
    JobKind,
    JobReport,
    JobShape,
    JobState,
    Metric,
    NodeReport,
    SampleReport,
    SchedulerKind,
    TelemetrySnapshot,
)

STEP = timedelta(minutes=15)
HISTORY = timedelta(hours=24)


@dataclass
class _Site:
    name: str
    scheduler: SchedulerKind
    description: str
    nodes: list[tuple[str, str, int]]  # (name, gpu model, gpus)
    teams: list[str]
    kinds: list[JobKind]
    services: list[tuple[str, int, int]] = field(default_factory=list)  # name, peak, gpus/replica


SITES = (
    _Site("hpc-a", SchedulerKind.slurm, "Slurm training cluster (H100)",
          [(f"hgx{i:02d}", "H100", 8) for i in range(1, 17)],
          ["llm-pretrain", "vision", "research"],
          [JobKind.training, JobKind.training, JobKind.hpc, JobKind.quantization]),
    _Site("k8s-inference", SchedulerKind.kueue, "Kubernetes + Kueue inference cluster",
          [(f"l40s-{i}", "L40S", 4) for i in range(1, 9)]
          + [(f"a100-{i}", "A100-80G", 8) for i in range(1, 5)],
          ["serving", "batch"], [JobKind.batch_inference, JobKind.quantization],
          services=[("chat-api", 12, 2), ("embed-api", 8, 1), ("rerank-api", 4, 1)]),
    _Site("ray-lab", SchedulerKind.ray, "Ray cluster for research (A10)",
          [(f"ray-{i}", "A10", 4) for i in range(1, 7)],
          ["research", "rl"], [JobKind.training, JobKind.batch_inference]),
)  # fmt: skip


@dataclass
class _Job:
    report: JobReport
    ends: datetime | None
    placement: dict[str, list[int]] = field(default_factory=dict)


def _diurnal(peak: int, at: datetime) -> int:
    """Demand peaking at 14:00 UTC, about a third of the peak at night."""
    phase = math.cos((at.hour + at.minute / 60 - 14) / 24 * 2 * math.pi)
    return max(1, round(peak * (0.65 + 0.35 * phase)))


def _place(gpus: int, free: dict[str, list[int]], size: dict[str, int]) -> dict[str, list[int]]:
    """First fit on one node, else whole nodes for a gang; {} when it does not fit."""
    for node, indices in free.items():
        if len(indices) >= gpus:
            return {node: indices[:gpus]}
    whole = [n for n, indices in free.items() if len(indices) == size[n]]
    placement: dict[str, list[int]] = {}
    for node in whole:
        if gpus <= 0:
            break
        take = min(gpus, size[node])
        placement[node] = free[node][:take]
        gpus -= take
    return placement if gpus <= 0 else {}


def _history(site: _Site, start: datetime, rng: random.Random) -> list[TelemetrySnapshot]:
    size = {name: gpus for name, _, gpus in site.nodes}
    jobs: list[_Job] = []
    snapshots = []
    counter = 0
    at = start
    while at <= start + HISTORY:
        for job in jobs:  # completions
            if job.ends and job.ends <= at and job.report.state is JobState.running:
                job.report = job.report.model_copy(
                    update={"state": JobState.finished, "end_time": job.ends}
                )
                job.placement = {}
        for _ in range(rng.choice([0, 0, 1, 1, 2])):  # arrivals
            counter += 1
            gpus = rng.choice([1, 1, 2, 4, 8, 8, 16])
            team = rng.choice(site.teams)
            report = JobReport(
                external_id=f"{site.name}-{counter}",
                name=f"{team}-{counter}",
                team=team,
                queue=team,
                kind=rng.choice(site.kinds),
                priority=rng.choice([10, 50, 100]),
                gpus_requested=gpus,
                gang_size=max(1, gpus // 8),
                checkpointable=rng.random() < 0.6,
                submit_time=at,
                state=JobState.pending,
            )
            jobs.append(_Job(report, None))
        free = {name: list(range(gpus)) for name, gpus in size.items()}
        for job in jobs:
            for node, indices in job.placement.items():
                free[node] = [i for i in free[node] if i not in indices]
        for service, peak, per_replica in site.services:  # elastic services follow demand
            replicas = _diurnal(peak, at)
            placement: dict[str, list[int]] = {}
            for _ in range(replicas):
                got = _place(per_replica, free, size)
                for node, indices in got.items():
                    placement.setdefault(node, []).extend(indices)
                    free[node] = [i for i in free[node] if i not in indices]
            job = next((j for j in jobs if j.report.external_id == service), None)
            report = JobReport(
                external_id=service,
                name=service,
                team="serving",
                queue="serving",
                kind=JobKind.realtime_inference,
                shape=JobShape.elastic,
                priority=200,
                sla_class="realtime",
                gpus_requested=per_replica,
                min_replicas=1,
                max_replicas=peak,
                replicas=replicas,
                submit_time=start,
                start_time=start,
                state=JobState.running,
            )
            if job is None:
                jobs.append(_Job(report, None, placement))
            else:
                job.report, job.placement = report, placement
        for job in jobs:  # FIFO starts
            if job.report.state is JobState.pending:
                placement = _place(job.report.gpus_requested, free, size)
                if placement:
                    for node, indices in placement.items():
                        free[node] = [i for i in free[node] if i not in indices]
                    job.placement = placement
                    job.ends = at + timedelta(minutes=rng.randint(30, 360))
                    job.report = job.report.model_copy(
                        update={"state": JobState.running, "start_time": at}
                    )
        visible = [
            j
            for j in jobs
            if j.report.state is not JobState.finished
            or (j.ends and at - j.ends < timedelta(hours=2))
        ]
        reports = [
            j.report.model_copy(
                update={
                    "allocations": [
                        AllocationReport(node=n, gpu_indices=sorted(i))
                        for n, i in j.placement.items()
                    ]
                }
            )
            for j in visible
        ]
        samples = [
            SampleReport(
                at=at,
                metric=Metric.gpu_util,
                node=name,
                value=round((1 - len(free[name]) / gpus) * rng.uniform(0.55, 0.95), 3),
            )
            for name, _, gpus in site.nodes
        ] + [
            SampleReport(
                at=at, metric=Metric.demand_replicas, job=service, value=_diurnal(peak, at)
            )
            for service, peak, _ in site.services
        ]
        nodes = [
            NodeReport(
                name=n,
                gpu_model=m,
                gpu_count=g,
                cpu_cores=g * 16,
                memory_mib=g * 128 * 1024,
                labels={"rack": f"r{i // 4}"},
            )
            for i, (n, m, g) in enumerate(site.nodes)
        ]
        snapshots.append(
            TelemetrySnapshot(
                connector_session=f"demo-{site.name}",
                seq=len(snapshots),
                sent_at=at,
                nodes=nodes,
                jobs=reports,
                samples=samples,
            )
        )
        at += STEP
    return snapshots


def seed_demo_site(*, session: Session, now: datetime, seed: int = 7) -> int:
    """Register the demo clusters and push their 24 h history; returns snapshots pushed."""
    rng = random.Random(seed)
    start = (now - HISTORY).replace(second=0, microsecond=0)
    pushed = 0
    for site in SITES:
        if session.exec(select(Cluster).where(Cluster.name == site.name)).first():
            continue
        cluster_service.register_cluster(
            session=session,
            now=start,
            cluster_in=ClusterCreate(
                name=site.name,
                scheduler=site.scheduler,
                description=site.description,
                mode=ShapingMode.advise,
            ),
        )
        for snapshot in _history(site, start, rng):
            telemetry_service.ingest(
                session=session, cluster_name=site.name, push=snapshot, now=snapshot.sent_at or now
            )
            pushed += 1
    return pushed


def run_demo(*, port: int, reset: bool) -> None:
    import uvicorn
    from rich.console import Console

    from app.bootstrap import prepare_database
    from app.main import create_app

    console = Console(stderr=True)
    settings = get_settings()
    if reset and settings.database_url is None and settings.data_dir.exists():
        shutil.rmtree(settings.data_dir)
    prepare_database(settings)
    now = datetime.now(UTC)
    with Session(get_engine()) as session:
        with console.status("seeding the demo site (24 h of telemetry)…"):
            pushed = seed_demo_site(session=session, now=now)
        with console.status("planning each cluster once (advise mode: proposals only)…"):
            for site in SITES:
                run_cycle(session=session, cluster_name=site.name, now=now)
        token = token_service.create_token(
            session=session,
            now=now,
            token_in=ApiTokenCreate(
                name="demo", scopes=["operator"], expires_at=now + timedelta(days=1)
            ),
        )
    if pushed:
        console.print(f"seeded {pushed} telemetry snapshots across {len(SITES)} clusters")
    url = f"http://{settings.host}:{port}/#token={token.token}"
    console.print(f"[bold]Dashboard:[/bold] {url}", soft_wrap=True)
    console.print(
        f"API: curl -H 'Authorization: Bearer {token.token}' "
        f"http://{settings.host}:{port}/api/v1/clusters",
        soft_wrap=True,
    )
    uvicorn.run(create_app(settings), host=settings.host, port=port, log_level="warning")
