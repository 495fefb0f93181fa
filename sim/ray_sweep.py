"""``shaper sim sweep --ray ADDRESS``: the seeds of a sweep as tasks on an existing Ray
cluster, with the same rows as a local sweep (sim.sweep).

Each seed's workload is built here, on the machine that runs the command, and travels
with its task: a scenario given as a YAML path needs no copy on the cluster, and every
seed runs the very jobs a local sweep would. A task runs every policy on its seed
(:func:`sim.sweep.seed_metrics`) and returns only their metrics; the rows are made here,
seed by seed in the order asked, by the same code as a local sweep's. Runs are
reproducible whatever the load (sim.adapter: one CP-SAT worker, deterministic time), so
a seed gives the same figures on any node.

This machine's ``sim``, ``solver`` and ``forecast`` packages go with the tasks (Ray's
``py_modules``), so the cluster runs this version of the simulator; their third-party
dependencies (numpy, ortools, pydantic, statsmodels …) must be installed on the nodes.
``ADDRESS`` is what ``ray.init`` accepts: ``host:port`` of the GCS when this machine is
a node of the cluster, ``ray://host:10001`` (Ray Client) from elsewhere.
"""

from __future__ import annotations

import importlib
import logging
import socket
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any

from sim.sweep import Metrics, SeedRow, policy_names, seed_metrics, seed_rows, seed_workload
from sim.workload import Workload

# Shipped to the workers with every task (small: well under 1 MB together).
SHIPPED_PACKAGES = ("sim", "solver", "forecast")


class RayUnavailable(Exception):
    """The Ray cluster cannot be reached, or Ray is not installed here."""


def _ray() -> Any:
    try:
        return importlib.import_module("ray")
    except ImportError as error:
        raise RayUnavailable(
            f"--ray needs the ray package here (pip install 'ray[default]'): {error}"
        ) from error


def _check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail fast when nothing listens at the address: ``ray.init`` retries an unreachable
    GCS for minutes before it gives up."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise RayUnavailable(f"--ray wants host:port or ray://host:port, got {address!r}")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as error:
        raise RayUnavailable(f"nothing answers at {address} ({error})") from error


def _run_seed(workload: Workload, names: list[str], drain: bool) -> Metrics:
    return seed_metrics(workload, names, drain=drain)


def sweep_on_ray(
    address: str,
    scenario: str,
    seeds: Sequence[int],
    policies: Sequence[str],
    *,
    baseline: str = "fifo",
    on_seed: Callable[[int], None] | None = None,
    solver_config: Mapping[str, object] | None = None,
    drain: bool = False,
    cpus_per_seed: float = 1.0,
) -> list[SeedRow]:
    """The rows of ``sim.sweep.sweep`` with the same arguments; ``on_seed`` is called as
    each seed's task ends (in the order they end)."""
    ray = _ray()
    _check_reachable(address)
    names = policy_names(baseline, policies)
    workloads = {seed: seed_workload(scenario, seed, solver_config) for seed in seeds}
    shipped: list[ModuleType] = [importlib.import_module(name) for name in SHIPPED_PACKAGES]
    try:
        ray.init(
            address=address,
            runtime_env={"py_modules": shipped},
            logging_level=logging.WARNING,
            log_to_driver=False,
        )
    except (ConnectionError, RuntimeError, ValueError) as error:
        raise RayUnavailable(f"cannot reach the Ray cluster at {address}: {error}") from error
    try:
        run_seed = ray.remote(num_cpus=cpus_per_seed)(_run_seed)
        pending = {run_seed.remote(workloads[seed], names, drain): seed for seed in seeds}
        metrics: dict[int, Metrics] = {}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                seed = pending.pop(ref)
                metrics[seed] = ray.get(ref)
                if on_seed is not None:
                    on_seed(seed)
    finally:
        ray.shutdown()
    rows: list[SeedRow] = []
    for seed in seeds:
        rows.extend(seed_rows(seed, metrics[seed], baseline=baseline, drain=drain))
    return rows
