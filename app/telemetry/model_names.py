"""GPU model names in a push, spelt as the catalogue spells them.

Schedulers name GPU models their own way: Slurm sites type GRES in lower case
(``gpu:h100:2``), Ray's ``accelerator_type`` resources and Armada's node labels in
whatever case their admins chose. The catalogue has ``H100``. A push naming ``h100`` was
refused whole (422, unknown GPU model) until the connector was given an alias for every
model. A name that differs from exactly one catalogue name only in case is that model: it
is rewritten to the catalogue's spelling in the nodes' models, the jobs' allowed models
and the jobs' speeds before the push is checked and stored, so the stored rows compare
equal to the next push's (which is rewritten the same way) and the snapshot matches them
against the nodes' models by name. A name matching no catalogue name, or several that
differ only in case, is left as it is: the check refuses it, naming the field.
"""

from __future__ import annotations

from collections.abc import Collection

from app.gpu_models.service import by_case
from wire.telemetry import JobReport, NodeReport, TelemetryDelta, TelemetrySnapshot

Push = TelemetrySnapshot | TelemetryDelta


def spelt_as_catalogue(push: Push, catalogue: Collection[str]) -> Push:
    """``push`` with every GPU model name the catalogue spells otherwise rewritten (see
    the module docstring); ``push`` itself when there is none, which is the common case
    and costs one set lookup per name."""
    known = set(catalogue)
    lowered = by_case(catalogue)

    def spelt(name: str) -> str:
        return name if name in known else lowered.get(name.lower(), name)

    nodes: list[NodeReport] | None = None
    for i, node in enumerate(push.nodes):
        if node.gpu_model is not None and spelt(node.gpu_model) != node.gpu_model:
            nodes = nodes if nodes is not None else list(push.nodes)
            nodes[i] = node.model_copy(update={"gpu_model": spelt(node.gpu_model)})
    jobs: list[JobReport] | None = None
    for i, job in enumerate(push.jobs):
        # Most jobs name no model, or the catalogue's: no list is built for them (this
        # pass is on every push's path: bench.ingest times it).
        allowed, speeds = job.allowed_gpu_models, job.speeds
        if (not allowed or known.issuperset(allowed)) and (not speeds or known.issuperset(speeds)):
            continue
        allowed = [spelt(name) for name in job.allowed_gpu_models]
        speeds = {spelt(name): speed for name, speed in job.speeds.items()}
        if allowed != job.allowed_gpu_models or list(speeds) != list(job.speeds):
            jobs = jobs if jobs is not None else list(push.jobs)
            jobs[i] = job.model_copy(update={"allowed_gpu_models": allowed, "speeds": speeds})
    update = {
        **({"nodes": nodes} if nodes is not None else {}),
        **({"jobs": jobs} if jobs is not None else {}),
    }
    return push.model_copy(update=update) if update else push
