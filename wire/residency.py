"""Cluster labels and a job's residency: which clusters of its federation group it may run in.

A cluster has labels (``{"region": "eu-west", "site": "ams1"}``) in Kubernetes' syntax, so
that they can be copied from its nodes' or a federation tool's and read the same way: a
key is ``[prefix/]name``, the prefix a DNS subdomain, name and value at most 63
characters (a value may be empty). A job's :class:`Residency` names the clusters it may
run in by those labels (``cluster_selector``: every key=value must match) and by name
(``allowed_clusters``); both rules must let it go, and the cluster it was submitted to
always may keep it. A team's SLA policy has the same two rules; a job must satisfy its
own and its team's.

Connectors read a job's residency from the same two keys wherever their scheduler keeps
a job's own words (:data:`SELECTOR_KEY`, :data:`CLUSTERS_KEY`): Kubernetes and Kueue from
the annotations of the Job, its pod template or its pods; Armada from the job's
annotations; Ray from the submission's metadata; Slurm from words of the job's
``--comment`` (``shaper.io/cluster-selector=region=eu``), since a comment is what any
user can set at ``sbatch`` time and every Slurm version reports. The values are text:
``region=eu,site=ams1`` (Kubernetes' equality label selector) and ``alpha,beta``.

A value a connector cannot read keeps the job where it was submitted
(:func:`read_residency`): a job that asked to keep its data somewhere must not move
because its request had a typo.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints

logger = logging.getLogger(__name__)

CLUSTER_NAME_PATTERN = r"^[a-z0-9][a-z0-9-]{0,62}$"
MAX_LABELS = 32
MAX_LABEL_PREFIX = 253
MAX_ALLOWED_CLUSTERS = 1_000
SELECTOR_KEY = "shaper.io/cluster-selector"
CLUSTERS_KEY = "shaper.io/allowed-clusters"

_LABEL_NAME = re.compile(r"[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_LABEL_PREFIX = re.compile(r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*")
_LABEL_VALUE = re.compile(r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")


def _label_key_error(key: str) -> str | None:
    prefix, slash, name = key.rpartition("/")
    if slash and not (len(prefix) <= MAX_LABEL_PREFIX and _LABEL_PREFIX.fullmatch(prefix)):
        return f"key {key!r}: its prefix must be a DNS subdomain of at most 253 characters"
    if not _LABEL_NAME.fullmatch(name):
        return (
            f"key {key!r}: its name must be 1-63 characters of a-z, 0-9, '-', '_', '.', "
            "beginning and ending with a-z or 0-9"
        )
    return None


def check_labels(labels: dict[str, str]) -> dict[str, str]:
    """Refuses the whole map at its first bad entry, naming it (pydantic reports the field:
    ``labels``, ``spec.teams[0].cluster_selector``, ``jobs[0].residency.cluster_selector``)."""
    if len(labels) > MAX_LABELS:
        raise ValueError(f"at most {MAX_LABELS} labels, not {len(labels)}")
    for key, value in labels.items():
        error = _label_key_error(key)
        if error is not None:
            raise ValueError(error)
        if not _LABEL_VALUE.fullmatch(value):
            raise ValueError(
                f"value {value!r} of {key!r}: must be empty or 1-63 characters of A-Z, a-z, "
                "0-9, '-', '_', '.', beginning and ending with a letter or digit"
            )
    return labels


Labels = Annotated[dict[str, str], AfterValidator(check_labels)]
ClusterName = Annotated[str, StringConstraints(pattern=CLUSTER_NAME_PATTERN, max_length=63)]


class Residency(BaseModel):
    """The clusters of its federation group a job may run in (see the module docstring);
    an empty selector and no names: any."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cluster_selector: Labels = Field(
        default_factory=dict,
        description="only clusters whose labels include every key=value here",
    )
    allowed_clusters: list[ClusterName] | None = Field(
        default=None,
        max_length=MAX_ALLOWED_CLUSTERS,
        description="only these clusters (None: any; []: none but the one it is in)",
    )


def parse_residency(selector: str | None, clusters: str | None) -> Residency | None:
    """The residency two text values state (``"region=eu,site=ams1"``, ``"alpha,beta"``);
    None when both are absent or blank. A malformed value is a ``ValueError`` saying what."""
    selector, clusters = (selector or "").strip(), (clusters or "").strip()
    if not selector and not clusters:
        return None
    labels: dict[str, str] = {}
    for pair in filter(None, (p.strip() for p in selector.split(","))):
        key, equals, value = pair.partition("=")
        if not equals or key.strip() in labels:
            raise ValueError(f"{SELECTOR_KEY}: {pair!r} is not a new key=value")
        labels[key.strip()] = value.strip()
    names = [n.strip() for n in clusters.split(",") if n.strip()] if clusters else None
    return Residency(cluster_selector=labels, allowed_clusters=names)


def read_residency(values: Mapping[str, object], *, job: str) -> Residency | None:
    """A connector's reading of a job's residency from its annotations or metadata
    (``values``: :data:`SELECTOR_KEY`, :data:`CLUSTERS_KEY`). One it cannot read keeps the
    job in its own cluster (``allowed_clusters=[]``), logged, rather than let it go
    anywhere."""
    selector, clusters = values.get(SELECTOR_KEY), values.get(CLUSTERS_KEY)
    try:
        return parse_residency(
            None if selector is None else str(selector), None if clusters is None else str(clusters)
        )
    except ValueError as error:
        logger.warning("job %s: keeping it in its cluster, unreadable residency: %s", job, error)
        return Residency(allowed_clusters=[])
