"""``shaper demo``: live simulated clusters with 24 hours of history, on the embedded default.

Three simulated clusters (connectors.sim) stand in for a multi-cluster site: a Slurm-like
training cluster, a Kubernetes/Kueue-like inference cluster with elastic services and a
Ray-like research cluster. Their first 24 hours run in simulated time before the server
starts, one snapshot every 15 minutes through the same ingest path connectors use. Then
they follow the wall clock: each pushes telemetry to the server as a deployed connector
does (TelemetryRunner, with its own ``connector:<cluster>`` token), the in-process beat
plans them every cycle, and their saga steps are answered in this process by their
simulated node agents and connector (app.actions.local). ``hpc-a`` runs in enforce mode
(actions go at once), ``k8s-inference`` in advise mode (approve them on the dashboard),
``ray-lab`` in observe mode (plans only). Everything shown is simulated, and says so.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from sqlmodel import Session, select

from app.clusters import service as cluster_service
from app.clusters.models import Cluster, ClusterCreate, ShapingMode
from app.core.config import get_settings
from app.core.db import get_engine
from app.core.logging import configure_logging
from app.shaping.cycle import run_cycle
from app.telemetry import service as telemetry_service
from app.tokens import service as token_service
from app.tokens.models import ApiTokenCreate
from connectors.sim import ServiceSpec, SimCluster, SimExecutors, SiteSpec
from wire.telemetry import JobKind, SchedulerKind, TelemetrySnapshot

STEP = timedelta(minutes=15)
HISTORY = timedelta(hours=24)


@dataclass(frozen=True)
class DemoSite:
    spec: SiteSpec
    description: str
    mode: ShapingMode

    @property
    def name(self) -> str:
        return self.spec.name


SITES = (
    DemoSite(
        SiteSpec("hpc-a", tuple((f"hgx{i:02d}", "H100", 8) for i in range(1, 17)),
                 ("llm-pretrain", "vision", "research"),
                 (JobKind.training, JobKind.training, JobKind.hpc, JobKind.quantization),
                 arrivals_per_hour=8.0, elastic_share=0.5),
        "Simulated Slurm-like training cluster (H100)", ShapingMode.enforce),
    DemoSite(
        SiteSpec("k8s-inference",
                 tuple((f"l40s-{i}", "L40S", 4) for i in range(1, 9))
                 + tuple((f"a100-{i}", "A100-80G", 8) for i in range(1, 5)),
                 ("serving", "batch"), (JobKind.batch_inference, JobKind.quantization),
                 services=(ServiceSpec("chat-api", 12, 2), ServiceSpec("embed-api", 8, 1),
                           ServiceSpec("rerank-api", 4, 1)),
                 arrivals_per_hour=3.0, job_gpus=(1, 1, 2, 4, 8)),
        "Simulated Kubernetes + Kueue-like inference cluster", ShapingMode.advise),
    DemoSite(
        SiteSpec("ray-lab", tuple((f"ray-{i}", "A10", 4) for i in range(1, 7)),
                 ("research", "rl"), (JobKind.training, JobKind.batch_inference),
                 arrivals_per_hour=2.0, job_gpus=(1, 1, 2, 4, 8)),
        "Simulated Ray-like research cluster (A10)", ShapingMode.observe),
)  # fmt: skip


class _DemoClock:
    """Simulated time while the history runs, then the wall clock."""

    def __init__(self) -> None:
        self.at: datetime | None = None

    def __call__(self) -> datetime:
        return self.at or datetime.now(UTC)


@dataclass
class SeededDemo:
    clusters: dict[str, SimCluster]
    pushed: int


def seed_demo_site(*, session: Session, now: datetime, seed: int = 7) -> SeededDemo:
    """Register the demo clusters, run their first 24 h and push it; the clusters then
    follow the wall clock."""
    start = (now - HISTORY).replace(second=0, microsecond=0)
    clusters: dict[str, SimCluster] = {}
    pushed = 0
    for index, site in enumerate(SITES):
        clock = _DemoClock()
        clock.at = start
        cluster = SimCluster(site.spec, start=start, seed=seed + index, clock=clock)
        clusters[site.name] = cluster
        # Seeded by an earlier run: its history is stored; run it again without pushing,
        # so the live cluster starts from a day's worth of state.
        push = session.exec(select(Cluster).where(Cluster.name == site.name)).first() is None
        if push:
            cluster_service.register_cluster(
                session=session,
                now=start,
                cluster_in=ClusterCreate(
                    name=site.name,
                    scheduler=SchedulerKind.sim,
                    description=site.description,
                    mode=site.mode,
                ),
            )
        seq = 0
        # Every STEP through the day, and a last snapshot at ``now`` itself: the first plans
        # are made on it, and a plan made on a stale view is refused when it is carried out.
        times = [start + STEP * k for k in range(int((now - start) / STEP) + 1)]
        if times[-1] < now:
            times.append(now)
        for at in times:
            clock.at = at
            state = cluster.read_state()
            if push:
                snapshot = TelemetrySnapshot.of(
                    state, connector_session=f"demo-history-{site.name}", seq=seq
                )
                telemetry_service.ingest(
                    session=session, cluster_name=site.name, push=snapshot, now=at
                )
                pushed += 1
            seq += 1
        clock.at = None
    return SeededDemo(clusters=clusters, pushed=pushed)


def _go_live(clusters: dict[str, SimCluster], *, base_url: str, tokens: dict[str, str]) -> None:
    """Connectors and agents for the simulated clusters, in this process."""
    from app.actions import local
    from connectors.runner import RunnerConfig, TelemetryRunner

    settings = get_settings()
    for name, cluster in clusters.items():
        executors = SimExecutors(cluster, state_dir=settings.data_dir / "sim-connectors" / name)
        for prefix in executors.queues():
            local.register(prefix, executors.handle)
        runner = TelemetryRunner(
            cluster,
            RunnerConfig(
                control_plane=base_url,
                cluster=name,
                token=tokens[name],
                interval_s=15.0,
                backoff_initial_s=0.5,
                backoff_max_s=5.0,
            ),
        )
        threading.Thread(
            target=_when_up, args=(base_url, runner.run), name=f"sim-{name}", daemon=True
        ).start()


def _when_up(base_url: str, run: Callable[[], None], *, timeout_s: float = 60.0) -> None:
    """Start pushing once the server (started after this thread) answers its health check."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base_url}/healthz", timeout=1.0).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    run()


DEMO_SCENARIO = "training-heavy"


def _seed_simulation(directory: Path, console: Any) -> None:
    """One `shaper sim compare` result for the dashboard's Simulations page, once."""
    # The demo is an entry point like the CLI, which mounts `shaper sim`: the service
    # itself only reads result files and never imports the simulator.
    from sim.run import compare, write_results
    from sim.scenario import load_scenario

    path = directory / f"{DEMO_SCENARIO}.json"
    if path.exists():
        return
    with console.status(f"simulating the {DEMO_SCENARIO} scenario under four policies…"):
        write_results(compare(load_scenario(DEMO_SCENARIO)), path)
    console.print(f"simulation result for the dashboard: {path}")


def run_demo(*, port: int, reset: bool) -> None:
    import uvicorn
    from rich.console import Console

    from app.bootstrap import prepare_database
    from app.main import create_app
    from app.worker import start_in_process_beat

    console = Console(stderr=True)
    settings = get_settings()
    if reset and settings.database_url is None and settings.data_dir.exists():
        shutil.rmtree(settings.data_dir)
    prepare_database(settings)
    now = datetime.now(UTC)
    with Session(get_engine()) as session:
        with console.status("running 24 h of the simulated clusters…"):
            seeded = seed_demo_site(session=session, now=now)
        with console.status("planning each cluster once…"):
            for site in SITES:
                run_cycle(session=session, cluster_name=site.name, now=now)
        expires = now + timedelta(days=1)
        token = token_service.create_token(
            session=session,
            now=now,
            token_in=ApiTokenCreate(name="demo", scopes=["operator"], expires_at=expires),
        )
        connector_tokens = {
            site.name: token_service.create_token(
                session=session,
                now=now,
                token_in=ApiTokenCreate(
                    name=f"demo-connector-{site.name}",
                    scopes=[f"connector:{site.name}"],
                    expires_at=expires,
                ),
            ).token
            for site in SITES
        }
    if seeded.pushed:
        console.print(f"seeded {seeded.pushed} telemetry snapshots across {len(SITES)} clusters")
    _seed_simulation(settings.resolved_sim_results_dir, console)
    base = f"http://{settings.host}:{port}"
    # From here the log says what each cycle decided and how each action ended.
    configure_logging(settings.log_level, settings.log_format)
    _go_live(seeded.clusters, base_url=base, tokens=connector_tokens)
    start_in_process_beat(settings)
    modes = ", ".join(f"{site.name} {site.mode.value}" for site in SITES)
    console.print(f"live simulated clusters ({modes}); shaping cycle every "
                  f"{settings.cycle_period_s:.0f} s")  # fmt: skip
    console.print(f"[bold]Dashboard:[/bold] {base}/#token={token.token}", soft_wrap=True)
    console.print(
        f"API: curl -H 'Authorization: Bearer {token.token}' {base}/api/v1/clusters",
        soft_wrap=True,
    )
    uvicorn.run(create_app(settings), host=settings.host, port=port, log_level="warning")
