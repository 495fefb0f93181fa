"""The solver benchmark's instances (bench/solver.py), seeded: a cluster of ``gpus`` GPUs
over four GPU models, a fragmented running state, elastic services at their daily peak and
a queue worth ``load`` × the capacity. tests/solver/test_exact.py solves the small ones
exactly."""

from __future__ import annotations

import math
import random

from solver.instance import GpuModel, Instance, Job, JobShape, Node, SlaPolicy, SolverConfig

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


def make_instance(
    gpus: int, load: float, seed: int, config: SolverConfig, *, clusters: int | None = None
) -> Instance:
    """``clusters``: how many clusters the nodes are dealt over (default: one per 1,000
    GPUs, at most four)."""
    rng = random.Random(seed * 1_000_003 + gpus)
    count = clusters if clusters is not None else max(1, min(4, gpus // 1000))
    cluster_names = [f"c{i}" for i in range(count)]
    nodes: list[Node] = []
    total = 0
    while total < gpus:
        size = 8 if rng.random() < 0.6 else 4
        size = min(size, gpus - total) if gpus - total < 4 else size
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
    free = {n.name: n.gpus for n in nodes}
    jobs: list[Job] = []

    def job_fields(size: int) -> dict[str, object]:
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

    # Fragmented running state: small jobs scattered over ~70 % of the GPUs.
    node_names = [n.name for n in nodes]
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
        fields = job_fields(size)
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
    # Elastic services, running at their daily peak (as FIFO would keep them).
    services = max(1, total // 100)
    for index in range(services):
        per_replica = rng.choice((1, 1, 2))
        peak = rng.randint(2, 6)
        trough = max(1, peak // 3)
        phase = rng.random() * 24
        forecast = tuple(
            round(trough + (peak - trough) * (0.5 + 0.5 * math.cos((h - phase) / 24 * 2 * math.pi)))
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
    # Pending queue worth ``load`` × the capacity.
    queued = 0
    index = 0
    while queued < load * total:
        roll = rng.random()
        if roll < 0.08 and total >= 32:
            replicas = rng.choice((2, 4))
            per_replica = 8
            max_nodes: int | None = replicas
        else:
            replicas = 1
            per_replica = rng.choice((1, 1, 1, 2, 2, 4, 8))
            max_nodes = 1
        fields = job_fields(per_replica)
        jobs.append(
            Job(
                id=f"q{index:06d}",
                replicas=replicas,
                gpus_per_replica=per_replica,
                max_nodes=max_nodes,
                submit_time=NOW - rng.uniform(0, 6 * 3600),
                **fields,
            )
        )
        queued += replicas * per_replica
        index += 1
    policies = (
        SlaPolicy(team="research", priority_weight=2.0, guaranteed_gpus=total // 5),
        SlaPolicy(team="product", priority_weight=3.0, guaranteed_gpus=total // 5),
        SlaPolicy(team="batch", priority_weight=1.0, borrowing_limit=total // 2),
        SlaPolicy(
            team="infra", priority_weight=4.0, guaranteed_gpus=total // 10, preemptible=False
        ),
    )
    return Instance(
        now=NOW,
        gpu_models=MODELS,
        nodes=tuple(nodes),
        jobs=tuple(jobs),
        policies=policies,
        config=config,
    )


def make_federated_instance(
    clusters: int, gpus_per_cluster: int, load: float, seed: int, config: SolverConfig
) -> Instance:
    """A federation group of ``clusters`` clusters planned as one instance, as the live
    cycle and ``sim.adapter`` build it: each pending job submitted to one cluster
    (``home_cluster``; starting it elsewhere costs the transfer of its image), each running
    job and service held to the cluster it runs in. The nodes, running state and queue are
    :func:`make_instance`'s over ``clusters × gpus_per_cluster`` GPUs; the homes are drawn
    from a second generator so that they leave those draws as they were."""
    instance = make_instance(clusters * gpus_per_cluster, load, seed, config, clusters=clusters)
    rng = random.Random(seed * 7_919 + clusters)
    names = sorted({node.cluster for node in instance.nodes})
    # Unequal load, as in the simulator's federation-unequal: half the clusters get most
    # of the submissions.
    weights = [4.0 if index < len(names) // 2 else 1.0 for index in range(len(names))]
    cluster_of = {node.name: node.cluster for node in instance.nodes}
    jobs = []
    for job in instance.jobs:
        if job.placement:
            here = cluster_of[next(iter(job.placement))]
            update: dict[str, object] = {"clusters": frozenset({here})}
        else:
            update = {"home_cluster": rng.choices(names, weights=weights)[0]}
        jobs.append(job.model_copy(update=update))
    # A new Instance (not model_copy, which would keep the cached look-ups of the old jobs).
    return Instance(
        now=instance.now,
        gpu_models=instance.gpu_models,
        nodes=instance.nodes,
        jobs=tuple(jobs),
        policies=instance.policies,
        config=instance.config,
    )
