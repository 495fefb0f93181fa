"""Simulated clusters (the ``sim`` kind): a live cluster model, its connector and agents.

Importing it registers the kind, so ``shaper connector run --kind sim --cluster lab
--set nodes=8 --set gpus_per_node=8 --set gpu_model=H100`` runs a simulated cluster that
follows the wall clock and pushes telemetry like a real one (with ``--broker``, it also
answers scheduler-level steps). ``shaper demo`` hosts several in its own process.
"""

from __future__ import annotations

from connectors.registry import register
from connectors.sim.agents import SimExecutors
from connectors.sim.cluster import ServiceSpec, SimCluster, SiteSpec, diurnal, utc_now
from wire.telemetry import JobKind, SchedulerKind


def create_sim_connector(
    *,
    cluster: str,
    nodes: int = 4,
    gpus_per_node: int = 8,
    gpu_model: str = "H100",
    arrivals_per_hour: float = 6.0,
    seed: int = 7,
) -> SimCluster:
    """Registry factory: a homogeneous simulated cluster that follows the wall clock."""
    if nodes < 1 or gpus_per_node < 1:
        raise ValueError("nodes and gpus_per_node must be at least 1")
    spec = SiteSpec(
        name=cluster,
        nodes=tuple((f"{cluster}-n{i:02d}", gpu_model, gpus_per_node) for i in range(1, nodes + 1)),
        teams=("research", "prod"),
        kinds=(JobKind.training, JobKind.batch_inference, JobKind.hpc),
        arrivals_per_hour=arrivals_per_hour,
    )
    return SimCluster(spec, start=utc_now(), seed=seed, clock=utc_now)


register(SchedulerKind.sim, create_sim_connector)

__all__ = [
    "ServiceSpec",
    "SimCluster",
    "SimExecutors",
    "SiteSpec",
    "create_sim_connector",
    "diurnal",
]
