"""The CRIU save-migrate-resume of running Slurm jobs through the whole control plane (API,
control worker, three node agents, the connector process) against Slurm 24.11: the tests
of test_slurm_migration.py, imported, with ``migration_cluster`` (what their deployment is
built around) the 24.11 cluster and ``slurm`` too.

A module of their own: the deployment lives as long as its module, and its connector
process reads the cluster and lifts the pins of requeued jobs all along, which the pin
tests of test_slurm_current.py must not have beside them (one lifted a pin in the second
between a requeue and the operator's edit that test makes).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.connectors.conftest import SlurmCluster

# Imported for collection: each runs again here against Slurm 24.11.
from tests.connectors.test_slurm_migration import (  # noqa: F401
    deployment,
    test_a_migration_whose_target_never_runs_the_job_sends_it_home_to_resume,
    test_a_move_that_loses_both_target_and_source_leaves_the_job_queued_with_its_checkpoint,
    test_a_planned_move_that_loses_its_target_comes_back_to_its_held_source,
    test_a_preempted_slurm_job_is_checkpointed_first_and_resumes_from_its_checkpoint,
    test_a_running_slurm_job_is_checkpointed_requeued_to_another_node_and_resumes,
    test_an_approved_plan_moves_a_job_and_the_freed_node_waits_for_the_planned_start,
)

pytestmark = pytest.mark.slow


@pytest.fixture
def slurm(slurm_24: SlurmCluster) -> Iterator[SlurmCluster]:
    yield slurm_24


@pytest.fixture(scope="module")
def migration_cluster(slurm_24_cluster: SlurmCluster) -> SlurmCluster:
    return slurm_24_cluster
