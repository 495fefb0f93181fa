"""Seeded random solver instances: one builder for the solver benchmark (bench/solver.py)
and the solver's tests, with the distribution drawn from as a parameter.

    random_instance(7, LoadedCluster(gpus=1000, load=2.0), config)   # the benchmark's
    random_instance(seed, EveryRule(nodes=6, pending=12))            # the property tests'

The builder draws an instance in phases, in this order, from one generator seeded by the
distribution: nodes, the running block jobs, the running services, the pending queue, the
SLA policies, and the solver config when none is given. A last pass (the federation's home
clusters, a shaper's recent history) draws from a second generator so that it leaves the
first one's draws as they were: an instance with that pass is the one without it, changed.
The same seed and distribution give the same instance on every run and machine; the order
of the draws is part of that, so reordering them changes every instance (the benchmark's
figures, the property tests' examples).
"""

from __future__ import annotations

import random
from typing import Protocol

from solver.instance import GpuModel, Instance, Job, Node, SlaPolicy, SolverConfig

from .every_rule import EveryRule
from .loaded_cluster import LoadedCluster

__all__ = ["Distribution", "EveryRule", "LoadedCluster", "random_instance"]


class Distribution(Protocol):
    """What :func:`random_instance` draws each phase from. ``free`` maps each node to its
    GPUs not yet held; a phase that places work takes the GPUs it places from it."""

    @property
    def now(self) -> float: ...

    @property
    def gpu_models(self) -> tuple[GpuModel, ...]: ...

    def generator(self, seed: int) -> random.Random: ...

    def draw_nodes(self, rng: random.Random) -> list[Node]: ...

    def draw_running(
        self, rng: random.Random, nodes: list[Node], free: dict[str, int]
    ) -> list[Job]: ...

    def draw_services(
        self, rng: random.Random, nodes: list[Node], free: dict[str, int]
    ) -> list[Job]: ...

    def draw_queue(self, rng: random.Random, nodes: list[Node]) -> list[Job]: ...

    def draw_policies(self, rng: random.Random, nodes: list[Node]) -> tuple[SlaPolicy, ...]: ...

    def draw_config(self, rng: random.Random) -> SolverConfig: ...

    def last_pass(
        self, seed: int, nodes: list[Node], jobs: list[Job], config: SolverConfig
    ) -> tuple[list[Job], SolverConfig]: ...


def random_instance(
    seed: int, distribution: Distribution, config: SolverConfig | None = None
) -> Instance:
    """The instance ``distribution`` draws for ``seed``; ``config`` None: the distribution's
    own (drawn last from the first generator, where it draws one)."""
    rng = distribution.generator(seed)
    nodes = distribution.draw_nodes(rng)
    free = {node.name: node.gpus for node in nodes}
    jobs = distribution.draw_running(rng, nodes, free)
    jobs += distribution.draw_services(rng, nodes, free)
    jobs += distribution.draw_queue(rng, nodes)
    policies = distribution.draw_policies(rng, nodes)
    if config is None:
        config = distribution.draw_config(rng)
    jobs, config = distribution.last_pass(seed, nodes, jobs, config)
    return Instance(
        now=distribution.now,
        gpu_models=distribution.gpu_models,
        nodes=tuple(nodes),
        jobs=tuple(jobs),
        policies=policies,
        config=config,
    )
