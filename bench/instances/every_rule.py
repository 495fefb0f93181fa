"""The solver's property tests' distribution (tests/solver/test_properties.py, test_exact.py):
small, legal snapshots that exercise every rule ``validate`` checks (node states, taints,
selectors, gangs, services, budgets, a shaper's recent history)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import ClassVar

from solver.instance import GpuModel, Job, JobShape, Node, NodeState, SlaPolicy, SolverConfig

# The GPU models and the clock; tests/solver/builders.py's hand-made instances use them too.
NOW = 100_000.0
H100 = GpuModel(
    name="h100", memory_mib=81_920, precisions=frozenset({"fp8", "bf16", "fp16"}), speed=2.0
)
A100 = GpuModel(name="a100", memory_mib=40_960, precisions=frozenset({"bf16", "fp16"}), speed=1.0)
MODELS = (H100, A100)
TEAMS = ("a", "b", "c")


@dataclass(frozen=True)
class EveryRule:
    """``nodes`` nodes over two clusters and ``pending`` pending jobs, besides the running
    work and services drawn. ``shaper_history``: some jobs acted on lately, over their move
    budget, locked or stranded, with a dwell time and a move budget in the config."""

    nodes: int = 6
    pending: int = 12
    shaper_history: bool = False

    now: ClassVar[float] = NOW
    gpu_models: ClassVar[tuple[GpuModel, ...]] = MODELS

    def generator(self, seed: int) -> random.Random:
        return random.Random(seed)

    def draw_nodes(self, rng: random.Random) -> list[Node]:
        nodes: list[Node] = []
        for index in range(self.nodes):
            gpus = rng.choice((2, 4, 8, 8))
            nodes.append(
                Node(
                    name=f"n{index}",
                    cluster=rng.choice(("c1", "c1", "c2")),
                    gpu_model=rng.choice(MODELS).name,
                    gpus=gpus,
                    cpu_milli=gpus * 4000,
                    memory_mib=gpus * 64_000,
                    labels={"zone": rng.choice(("a", "b"))},
                    taints=frozenset({"spot"}) if rng.random() < 0.15 else frozenset(),
                    state=rng.choices(list(NodeState), weights=(85, 10, 5))[0],
                )
            )
        return nodes

    def draw_running(
        self, rng: random.Random, nodes: list[Node], free: dict[str, int]
    ) -> list[Job]:
        """Fragmented running work on every node, and a gang over two nodes of a cluster."""
        jobs: list[Job] = []
        for node in nodes:
            while free[node.name] > 0 and rng.random() < 0.6:
                size = rng.choice([s for s in (1, 2, 4) if s <= free[node.name]])
                free[node.name] -= size
                jobs.append(
                    Job(
                        id=f"r{len(jobs)}",
                        gpus_per_replica=size,
                        placement={node.name: size},
                        cpu_milli_per_replica=1000,
                        start_time=NOW - rng.uniform(0, 7200),
                        submit_time=NOW - 8000,
                        last_moved_at=rng.choice((None, NOW - 100, NOW - 10_000)),
                        migrations_today=rng.randint(0, 2),
                        preemptions_today=rng.randint(0, 2),
                        **_lifecycle(rng),
                    )
                )
        # A running gang over two nodes of one cluster, when there is room.
        by_cluster: dict[str, list[str]] = {}
        for node in nodes:
            if free[node.name] >= 2:
                by_cluster.setdefault(node.cluster, []).append(node.name)
        for names in by_cluster.values():
            if len(names) >= 2 and rng.random() < 0.7:
                a, b = names[:2]
                free[a] -= 2
                free[b] -= 2
                jobs.append(
                    Job(
                        id=f"r{len(jobs)}",
                        gpus_per_replica=2,
                        replicas=2,
                        max_nodes=2,
                        placement={a: 2, b: 2},
                        start_time=NOW - 3000,
                        **_lifecycle(rng),
                    )
                )
        return jobs

    def draw_services(
        self, rng: random.Random, nodes: list[Node], free: dict[str, int]
    ) -> list[Job]:
        """Up to two services on what the block jobs left, each with its own limits."""
        jobs: list[Job] = []
        for index in range(rng.randint(0, 2)):
            placement: dict[str, int] = {}
            for node in rng.sample(nodes, len(nodes)):
                if free[node.name] and rng.random() < 0.5:
                    count = rng.randint(1, free[node.name])
                    free[node.name] -= count
                    placement[node.name] = count
            replicas = sum(placement.values())
            jobs.append(
                Job(
                    id=f"s{index}",
                    shape=JobShape.elastic,
                    team=rng.choice(TEAMS),
                    replicas=replicas,
                    placement=placement,
                    min_replicas=rng.randint(0, max(0, replicas)),
                    max_replicas=replicas + rng.randint(0, 6),
                    forecast=tuple(rng.randint(0, 10) for _ in range(6)),
                    forecast_step_s=3600,
                    max_replica_change=rng.choice((None, None, 1, 3)),
                )
            )
        return jobs

    def draw_queue(self, rng: random.Random, nodes: list[Node]) -> list[Job]:
        """``pending`` block jobs with mixed requirements, and sometimes a pending service."""
        jobs: list[Job] = []
        for index in range(self.pending):
            replicas = rng.choice((1, 1, 1, 2, 3))
            per_replica = rng.choice((1, 1, 2, 4, 8))
            requirements: dict[str, object] = {}
            roll = rng.random()
            if roll < 0.1:
                requirements["precision"] = "fp8"
            elif roll < 0.2:
                requirements["allowed_gpu_models"] = frozenset({rng.choice(MODELS).name})
            elif roll < 0.3:
                requirements["node_selector"] = {"zone": "a"}
            elif roll < 0.35:
                requirements["gpu_memory_mib"] = 60_000
            if rng.random() < 0.2:
                requirements["tolerations"] = frozenset({"spot"})
            jobs.append(
                Job(
                    id=f"p{index}",
                    gpus_per_replica=per_replica,
                    replicas=replicas,
                    max_nodes=rng.choice((None, 1, 2)) if replicas > 1 else None,
                    cpu_milli_per_replica=rng.choice((0, 2000, 6000, 20_000)),
                    memory_mib_per_replica=rng.choice((0, 100_000)),
                    submit_time=NOW - rng.uniform(0, 20_000),
                    **requirements,
                    **_lifecycle(rng),
                )
            )
        if rng.random() < 0.3:
            jobs.append(
                Job(
                    id="s-pending",
                    shape=JobShape.elastic,
                    gpus_per_replica=2,
                    replicas=0,
                    min_replicas=1,
                    max_replicas=4,
                    forecast=(2, 4),
                )
            )
        return jobs

    def draw_policies(self, rng: random.Random, nodes: list[Node]) -> tuple[SlaPolicy, ...]:
        """A policy for most teams (a team without one gets the defaults)."""
        return tuple(
            SlaPolicy(
                team=team,
                priority_weight=rng.choice((1.0, 2.0, 3.0)),
                guaranteed_gpus=rng.choice((0, 4, 8)),
                borrowing_limit=rng.choice((None, None, 0, 4, 16)),
                max_queue_wait_s=rng.choice((None, 5000.0)),
                preemptible=rng.random() < 0.8,
                max_migrations_per_day=rng.choice((None, 1, 2)),
                max_preemptions_per_day=rng.choice((None, 1, 2)),
            )
            for team in TEAMS
            if rng.random() < 0.8
        )

    def draw_config(self, rng: random.Random) -> SolverConfig:
        """Fast and deterministic, with the per-cycle budgets and cooldown drawn."""
        return SolverConfig(
            time_limit_s=1.0,
            num_workers=1,
            deterministic=True,
            max_migrations_per_cycle=rng.choice((0, 1, 3, 16)),
            max_preemptions_per_cycle=rng.choice((None, 0, 1, 3)),
            migration_cooldown_s=rng.choice((0.0, 1800.0)),
        )

    def last_pass(
        self, seed: int, nodes: list[Node], jobs: list[Job], config: SolverConfig
    ) -> tuple[list[Job], SolverConfig]:
        """With ``shaper_history``: jobs acted on lately, over their move budget, locked or
        stranded, and the dwell time and move budget that make some of them frozen."""
        if not self.shaper_history:
            return jobs, config
        rng = random.Random(seed ^ 0x5EED)
        acted_on = []
        for job in jobs:
            update: dict[str, object] = {}
            if rng.random() < 0.3:
                update["last_acted_at"] = NOW - rng.uniform(0, 1200)
            if rng.random() < 0.15:
                update["actions_last_hour"] = rng.randint(1, 4)
            if rng.random() < 0.05:
                update["locked"] = True
            if not job.is_running and rng.random() < 0.1:
                update["overdue"] = True
            acted_on.append(job.model_copy(update=update))
        config = config.model_copy(
            update={
                "dwell_s": rng.choice((0.0, 600.0)),
                "max_actions_per_job_hour": rng.choice((1, 3)),
            }
        )
        return acted_on, config


def _lifecycle(rng: random.Random) -> dict[str, object]:
    """A job's team, priority and what its policy may override."""
    return {
        "team": rng.choice(TEAMS),
        "priority": rng.choice((1.0, 2.0, 4.0)),
        "checkpointable": rng.random() < 0.5,
        "expected_runtime_s": rng.choice((None, 600.0, 7200.0, 86_400.0)),
        "preemptible": rng.choice((None, None, False)),
    }
