"""The solver benchmark's distribution (bench/solver.py): a cluster of ``gpus`` GPUs over
four GPU models, a fragmented running state, elastic services at their daily peak and a
queue worth ``load`` × the capacity; optionally dealt over several clusters planned as one
federation group. tests/solver/test_exact.py solves the small ones exactly."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import ClassVar

from solver.instance import GpuModel, Job, JobShape, Node, SlaPolicy, SolverConfig

GIB = 1024
MODELS = (
    GpuModel(
        name="h100", memory_mib=80 * GIB, precisions=frozenset({"fp8", "bf16", "fp16"}), speed=2.0
    ),
    GpuModel(name="a100", memory_mib=80 * GIB, precisions=frozenset({"bf16", "fp16"}), speed=1.3),
    GpuModel(
        name="l40s", memory_mib=48 * GIB, precisions=frozenset({"fp8", "bf16", "fp16"}), speed=0.9
    ),
    GpuModel(name="v100", memory_mib=32 * GIB, precisions=frozenset({"fp16"}), speed=0.5),
)
TEAMS = ("research", "product", "batch", "infra")
NOW = 1_000_000.0


@dataclass(frozen=True)
class LoadedCluster:
    """``clusters``: how many clusters the nodes are dealt over (default: one per 1,000
    GPUs, at most four). ``federated``: the clusters are one federation group, as the live
    cycle and ``sim.adapter`` build it: each pending job submitted to one cluster
    (``home_cluster``; starting it elsewhere costs the transfer of its image), each running
    job and service held to the cluster it runs in."""

    gpus: int
    load: float
    clusters: int | None = None
    federated: bool = False

    now: ClassVar[float] = NOW
    gpu_models: ClassVar[tuple[GpuModel, ...]] = MODELS

    @property
    def cluster_count(self) -> int:
        return self.clusters if self.clusters is not None else max(1, min(4, self.gpus // 1000))

    def generator(self, seed: int) -> random.Random:
        return random.Random(seed * 1_000_003 + self.gpus)

    def draw_nodes(self, rng: random.Random) -> list[Node]:
        cluster_names = [f"c{i}" for i in range(self.cluster_count)]
        nodes: list[Node] = []
        total = 0
        while total < self.gpus:
            size = 8 if rng.random() < 0.6 else 4
            size = min(size, self.gpus - total) if self.gpus - total < 4 else size
            model = rng.choices(MODELS, weights=(3, 3, 2, 2))[0]
            nodes.append(
                Node(
                    name=f"n{len(nodes):05d}",
                    cluster=cluster_names[len(nodes) % len(cluster_names)],
                    gpu_model=model.name,
                    gpus=size,
                    cpu_milli=size * 12_000,
                    memory_mib=size * 128 * GIB,
                )
            )
            total += size
        return nodes

    def draw_running(
        self, rng: random.Random, nodes: list[Node], free: dict[str, int]
    ) -> list[Job]:
        """Fragmented running state: small jobs scattered over ~70 % of the GPUs."""
        total = sum(node.gpus for node in nodes)
        node_names = [node.name for node in nodes]
        jobs: list[Job] = []
        target_running = int(0.7 * total)
        running = 0
        attempts = 0
        while running < target_running and attempts < 20 * total:
            attempts += 1
            size = rng.choice((1, 1, 1, 2))
            name = rng.choice(node_names)
            if free[name] < size:
                continue
            free[name] -= size
            running += size
            fields = _job_fields(rng)
            fields.pop("precision", None)
            fields.pop("gpu_memory_mib", None)
            jobs.append(
                Job(
                    id=f"run{len(jobs):06d}",
                    gpus_per_replica=size,
                    placement={name: size},
                    start_time=NOW - rng.uniform(600, 20 * 3600),
                    submit_time=NOW - 30 * 3600,
                    **fields,
                )
            )
        return jobs

    def draw_services(
        self, rng: random.Random, nodes: list[Node], free: dict[str, int]
    ) -> list[Job]:
        """Elastic services, running at their daily peak (as FIFO would keep them)."""
        node_names = [node.name for node in nodes]
        jobs: list[Job] = []
        for index in range(max(1, sum(node.gpus for node in nodes) // 100)):
            per_replica = rng.choice((1, 1, 2))
            peak = rng.randint(2, 6)
            trough = max(1, peak // 3)
            phase = rng.random() * 24
            forecast = tuple(
                round(
                    trough
                    + (peak - trough) * (0.5 + 0.5 * math.cos((h - phase) / 24 * 2 * math.pi))
                )
                for h in range(24)
            )
            placement: dict[str, int] = {}
            placed = 0
            for name in rng.sample(node_names, len(node_names)):
                while placed < peak and free[name] >= per_replica:
                    free[name] -= per_replica
                    placement[name] = placement.get(name, 0) + per_replica
                    placed += 1
                if placed == peak:
                    break
            jobs.append(
                Job(
                    id=f"svc{index:04d}",
                    shape=JobShape.elastic,
                    team="infra",
                    priority=4.0,
                    gpus_per_replica=per_replica,
                    replicas=placed,
                    min_replicas=1,
                    max_replicas=peak + 2,
                    forecast=forecast,
                    forecast_step_s=3600,
                    placement=placement,
                    cpu_milli_per_replica=2_000,
                    memory_mib_per_replica=16 * GIB,
                    start_time=NOW - 86_400,
                )
            )
        return jobs

    def draw_queue(self, rng: random.Random, nodes: list[Node]) -> list[Job]:
        """Pending queue worth ``load`` × the capacity: single-node jobs and gangs."""
        total = sum(node.gpus for node in nodes)
        jobs: list[Job] = []
        queued = 0
        while queued < self.load * total:
            roll = rng.random()
            if roll < 0.08 and total >= 32:
                replicas = rng.choice((2, 4))
                per_replica = 8
                max_nodes: int | None = replicas
            else:
                replicas = 1
                per_replica = rng.choice((1, 1, 1, 2, 2, 4, 8))
                max_nodes = 1
            # Drawn before the submit time: the order of draws is what a seed stands for.
            fields = _job_fields(rng)
            jobs.append(
                Job(
                    id=f"q{len(jobs):06d}",
                    replicas=replicas,
                    gpus_per_replica=per_replica,
                    max_nodes=max_nodes,
                    submit_time=NOW - rng.uniform(0, 6 * 3600),
                    **fields,
                )
            )
            queued += replicas * per_replica
        return jobs

    def draw_policies(self, rng: random.Random, nodes: list[Node]) -> tuple[SlaPolicy, ...]:
        """Fixed per team, sized to the capacity (no draws)."""
        total = sum(node.gpus for node in nodes)
        return (
            SlaPolicy(team="research", priority_weight=2.0, guaranteed_gpus=total // 5),
            SlaPolicy(team="product", priority_weight=3.0, guaranteed_gpus=total // 5),
            SlaPolicy(team="batch", priority_weight=1.0, borrowing_limit=total // 2),
            SlaPolicy(
                team="infra", priority_weight=4.0, guaranteed_gpus=total // 10, preemptible=False
            ),
        )

    def draw_config(self, rng: random.Random) -> SolverConfig:
        """The defaults (bench/solver.py passes its own)."""
        return SolverConfig()

    def last_pass(
        self, seed: int, nodes: list[Node], jobs: list[Job], config: SolverConfig
    ) -> tuple[list[Job], SolverConfig]:
        """Federated: the pending jobs' home clusters, the running ones' own clusters."""
        if not self.federated:
            return jobs, config
        rng = random.Random(seed * 7_919 + self.cluster_count)
        names = sorted({node.cluster for node in nodes})
        # Unequal load, as in the simulator's federation-unequal: half the clusters get most
        # of the submissions.
        weights = [4.0 if index < len(names) // 2 else 1.0 for index in range(len(names))]
        cluster_of = {node.name: node.cluster for node in nodes}
        homed = []
        for job in jobs:
            if job.placement:
                here = cluster_of[next(iter(job.placement))]
                update: dict[str, object] = {"clusters": frozenset({here})}
            else:
                update = {"home_cluster": rng.choices(names, weights=weights)[0]}
            homed.append(job.model_copy(update=update))
        return homed, config


def _job_fields(rng: random.Random) -> dict[str, object]:
    """A block job's team, priority, size per replica, runtime and GPU requirements."""
    fields: dict[str, object] = {
        "team": rng.choice(TEAMS),
        "priority": rng.choice((1.0, 1.0, 2.0, 4.0, 8.0)),
        "cpu_milli_per_replica": 4_000,
        "memory_mib_per_replica": 32 * GIB,
        "expected_runtime_s": rng.choice((1800.0, 3600.0, 4 * 3600.0, 24 * 3600.0)),
        "checkpointable": rng.random() < 0.5,
    }
    roll = rng.random()
    if roll < 0.1:
        fields["precision"] = "fp8"
    elif roll < 0.2:
        fields["gpu_memory_mib"] = 64 * GIB
    return fields
