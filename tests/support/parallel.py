"""Which tests may run side by side when the suite runs on several pytest-xdist workers.

``make test`` runs ``pytest -n 2 --dist loadgroup``: each worker is its own pytest session,
so a session fixture runs once per worker that needs it. That is fine for what every fixture
makes private (a PostgreSQL database named after the worker's PID, a redis-server on a free
port, a temporary directory), but not for the real services that listen on fixed ports or
own machine-wide state: the three-node Slurm (slurmctld on 6817, slurmrestd on 6820), the
Kubernetes control plane (``SHAPER_K8S_PORT_BASE``), the real kubelet node (that base + 100)
and the Ray cluster (28265...). Every module that uses one of them joins that service's
group (an ``xdist_group`` mark), so that one worker runs them all, one after another; a
module that uses two joins both groups into one. The control pipeline (Celery workers, node
agents, a private broker) could run twice, but its modules share one to start it once.

Every other module is a work unit of its own (:class:`ModuleOrServiceScheduling`): its
tests stay together on one worker, as module-scoped fixtures and tests that share a
module's state (a Redis DB number, a scratch file) expect. Units go to whichever worker is
free, the service groups first: they are the longest, and one started last would be the
run's tail.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping

import pytest
from xdist.scheduler import LoadScopeScheduling
from xdist.workermanage import WorkerController

# Fixture → the shared service it starts (or, for the pipeline, the one worth starting once).
SHARED_SERVICES: Mapping[str, str] = {
    "slurm_cluster": "slurm",
    "slurm_b_cluster": "slurm",
    "slurm_24_cluster": "slurm-24",
    "k8s_cluster": "kubernetes",
    "real_node_started": "kubernetes-real-node",
    "ray_cluster": "ray",
    "pipeline": "actions-pipeline",
}


def service_groups(uses: Iterable[tuple[str, Iterable[str]]]) -> dict[str, str]:
    """The group of each module that uses a shared service, from (module, fixtures of one
    of its tests) pairs; modules that use none are left out.

    Services used by one module are merged (union-find), so that no service is started by
    two workers.
    """
    parent: dict[str, str] = {}

    def root(service: str) -> str:
        while parent.setdefault(service, service) != service:
            service = parent[service]
        return service

    services_of: dict[str, set[str]] = {}
    for module, fixtures in uses:
        found = services_of.setdefault(module, set())
        found.update(SHARED_SERVICES[name] for name in fixtures if name in SHARED_SERVICES)
    for found in services_of.values():
        for service in found:
            parent[root(service)] = root(min(found))
    return {
        module: "+".join(sorted(other for other in parent if root(other) == root(min(found))))
        for module, found in services_of.items()
        if found
    }


def refuse_unsafe_runs(config: pytest.Config) -> None:
    """Refuse a run on several workers whose groups would not reach the scheduler: two
    workers would each start the same real service."""
    dist = config.getvalue("dist")
    if dist not in ("no", "loadgroup"):  # "no": one process, no xdist
        raise pytest.UsageError(f"on several workers the tests need `--dist loadgroup`, not {dist}")
    if dist == "loadgroup" and pytest.version_tuple[:2] >= (9, 2):
        raise pytest.UsageError(
            "pytest 9.2 loses pytest-xdist's test groups (pytest-dev/pytest-xdist#1386): "
            "run the tests on one worker, or with pytest<9.2 as pyproject.toml pins"
        )


class ModuleOrServiceScheduling(LoadScopeScheduling):
    """xdist's scope scheduling with a module as the scope, or the service group a test's
    node id carries (pytest-xdist appends ``@<group>`` to the id of a test with an
    ``xdist_group`` mark); the service groups are handed out first."""

    def _split_scope(self, nodeid: str) -> str:
        if nodeid.rfind("@") > nodeid.rfind("]"):  # not an '@' inside a parameter's id
            return nodeid.rsplit("@", 1)[1]
        return nodeid.split("::", 1)[0]

    def _assign_work_unit(self, node: WorkerController) -> None:
        # The first call comes once the queue is built, before any unit has gone out.
        if not getattr(self, "_ordered", False):
            self._ordered = True
            self.workqueue = OrderedDict(
                sorted(self.workqueue.items(), key=lambda unit: unit[0].endswith(".py"))
            )
        super()._assign_work_unit(node)
