"""The Slurm connector against Slurm 24.11 (JSON API v0.0.40-v0.0.42), built from source by
scripts/slurm-build.sh: the same tests as against Debian 12's Slurm 22.05, run again here.

Each test below is the function of its own module, imported; pytest resolves a test's
fixtures from the module that collects it, so ``slurm`` here is the 24.11 cluster
(``slurm_24`` in conftest.py) and every read, action, pin, elastic resize and reservation
those tests check runs against it: through the CLI (``squeue --json``, ``scontrol show
nodes --json``, ``scontrol show job ID --json``) and through slurmrestd at each version it
serves (test_slurm_current_migration.py does the same for the CRIU migrations).
Tests that concern one Slurm only stay in their module: the 22.05 recording, the
controller's restart (`test_runner_backs_off_while_slurmctld_is_down_then_resyncs` waits
on 22.05's timing) and the moves between two clusters (the second cluster is a 22.05 one
sharing the first's munged).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.connectors.conftest import SlurmCluster

# Imported for collection: each runs again here against Slurm 24.11.
from tests.connectors.test_slurm_cluster import (  # noqa: F401
    known_jobs,
    test_a_missing_cli_is_not_retryable,
    test_an_action_on_an_unknown_job_is_not_retryable,
    test_an_api_version_slurmrestd_does_not_serve_is_a_clear_error,
    test_cancel,
    test_drained_node_is_reported_draining,
    test_hold_and_release,
    test_nodes_match_the_cluster,
    test_reason_and_requeue_count_are_read,
    test_requeue_pinned_to_another_node_runs_the_job_there,
    test_slurmrestd_and_cli_give_the_same_snapshot,
    test_suspend_and_resume,
    test_telemetry_of_known_jobs_matches_slurm,
    test_the_connector_is_registered_and_has_every_capability,
    test_through_slurmrestd_a_step_reads_its_job_alone,
    test_through_the_cli_a_step_reads_its_job_alone_where_slurm_can,
    test_token_problems_are_clear_errors,
    test_update_node_count_of_a_pending_job,
)
from tests.connectors.test_slurm_elastic import (  # noqa: F401
    test_a_jobs_node_range_is_reported_while_it_waits_and_by_its_tag_while_it_runs,
    test_a_pending_elastic_job_starts_at_the_size_it_was_planned_at,
    test_a_plan_slurm_cannot_carry_out_is_refused_and_changes_nothing,
    test_a_running_job_grows_by_a_restart_on_the_nodes_planned_and_a_resend_does_not_restart_it,
    test_a_running_job_shrinks_where_it_runs_without_a_restart,
    test_two_replicas_planned_on_one_node_run_on_as_many_nodes,
)
from tests.connectors.test_slurm_pins import (  # noqa: F401
    node2_back,
    test_a_job_requeued_after_shapers_start_is_no_longer_held_to_its_nodes,
    test_a_pin_for_the_run_to_come_stays_and_a_steps_stamp_is_kept_beside_it,
    test_an_operators_edit_since_stays_and_a_list_slurm_refuses_is_cleared,
    test_the_job_gets_back_the_nodes_it_asked_for_itself,
)
from tests.connectors.test_slurm_reservations import (  # noqa: F401
    test_a_give_back_slurm_will_neither_take_nor_end_is_not_now_and_answered_when_resent,
    test_a_plan_made_on_a_stale_view_is_refused_before_anything_is_reserved,
    test_a_reservation_kept_in_use_is_ended_even_in_the_second_it_was_made,
    test_jobs_outlive_a_reservation_the_plan_never_gave_back,
    test_reserved_nodes_go_to_the_planned_job_and_come_back_once_it_runs,
    test_unreserve_gives_the_nodes_back_and_upkeep_tidies_after_a_job_that_went,
    test_without_a_reservation_slurm_gives_the_freed_node_to_a_higher_priority_rival,
)
from tests.connectors.test_slurm_submit import (  # noqa: F401
    test_a_moves_home_cancel_tells_its_own_cancel_from_a_users,
)

# Imported tests keep only their own marks; every test here runs on a real cluster.
pytestmark = pytest.mark.slow


@pytest.fixture
def slurm(slurm_24: SlurmCluster) -> Iterator[SlurmCluster]:
    yield slurm_24
