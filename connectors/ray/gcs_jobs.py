"""What a submission's entrypoint asked for, read from the GCS: the Jobs API's REST
listing leaves it out.

Ray keeps each submission's full record (``JobInfo``) in the GCS's key-value store, namespace
``job``, key ``_ray_internal_job_info_<submission id>``; its REST answers build their
entries from it but drop ``entrypoint_num_cpus``, ``entrypoint_num_gpus``,
``entrypoint_memory`` and ``entrypoint_resources``. A job submitted again (a requeue here,
a move to another cluster) without them would start its driver without the CPUs, GPUs or
memory it reserved, so they are read here, through the same GCS client the node drain uses
(connectors.ray.drain). The key's layout is Ray's internal one, as of Ray 2.60.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from connectors.base import ConnectorError
from connectors.ray.drain import gcs_client

ENTRYPOINT_FIELDS = (
    "entrypoint_num_cpus",
    "entrypoint_num_gpus",
    "entrypoint_memory",
    "entrypoint_resources",
)
_NAMESPACE = b"job"
_KEY = "_ray_internal_job_info_{}"


def entrypoint_requests(address: str, submission_ids: Iterable[str]) -> dict[str, dict[str, Any]]:
    """By submission id: the entrypoint fields its submission set, none of them 0 (none
    set: ``{}``). A submission the GCS has no record of is left out."""
    wanted = sorted(set(submission_ids))
    if not wanted:
        return {}
    keys = [_KEY.format(submission_id).encode() for submission_id in wanted]
    try:
        records = gcs_client(address).internal_kv_multi_get(keys, _NAMESPACE)
    except ConnectorError:
        raise
    except Exception as error:  # Ray raises its own errors for an unreachable GCS
        raise ConnectorError(
            f"read Ray's job records from the GCS at {address}: {error}", retryable=True
        ) from error
    found: dict[str, dict[str, Any]] = {}
    for submission_id, key in zip(wanted, keys, strict=True):
        raw = records.get(key)
        if raw is None:
            continue
        try:
            record = json.loads(raw)
        except ValueError as error:
            raise ConnectorError(
                f"Ray's job record of {submission_id} in the GCS is not JSON ({error})",
                retryable=False,
            ) from error
        # Ray writes 0 for what a submission did not ask for: the same as leaving it out.
        found[submission_id] = {
            field: record[field] for field in ENTRYPOINT_FIELDS if record.get(field)
        }
    return found
