"""The roll-up's fold keeps a group whose counts cancel and whose busy sum does not
(app/utilization/fold.py), on PostgreSQL, the one backend that folds deltas.

A node that changes GPU model moves its folded samples off the old model (a delta of -n
samples and -their sum); another node's new sample of the old model in the same period
adds +1 and its value. Folded in one batch, the old model's group sums to 0 samples and
0 GPUs but not to 0 busy: dropping it would leave the moved node's busy sum on the old
model for good.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import Engine
from sqlmodel import Session, col, select

from app.clusters import service as cluster_service
from app.clusters.models import ClusterCreate
from app.core import migrate
from app.core.db import make_engine
from app.core.lookup import row_id
from app.utilization import fold
from app.utilization.models import UtilizationRollup, UtilizationRollupDelta
from app.utilization.rollup import EXACT_US
from tests.support.clock import T0
from wire.telemetry import SchedulerKind

AT_US = 1_800_000_000_000_000  # an instant, µs since the epoch


@pytest.fixture
def engine(make_postgres_database: Any) -> Iterator[Engine]:
    url = make_postgres_database("rollup_fold")
    migrate.upgrade(url)
    engine = make_engine(url)
    yield engine
    engine.dispose()


def _delta(cluster_id: int, samples: int, sample_sum: float) -> UtilizationRollupDelta:
    return UtilizationRollupDelta(
        dimension="gpu_model",
        cluster_id=cluster_id,
        node_id=None,  # the group is gpu_model_id as written
        gpu_model_id=0,
        team="",
        at_us=AT_US,
        gpus=0,
        opened=0,
        closed=0,
        samples=samples,
        sample_sum=sample_sum,
    )


def test_a_group_whose_counts_cancel_keeps_its_busy_sum(engine: Engine) -> None:
    with Session(engine) as session:
        cluster = cluster_service.register_cluster(
            session=session,
            cluster_in=ClusterCreate(name="alpha", scheduler=SchedulerKind.sim),
            now=T0,
        )
        cluster_id = row_id(cluster)
        # One sample of 0.8 already folded into the exact-instant period.
        session.add(_delta(cluster_id, 1, 0.8))
        session.commit()
        assert fold.fold_deltas(session=session) == 1
        # The node leaves that model (-1, -0.8); another node's sample there (+1, 0.3).
        session.add(_delta(cluster_id, -1, -0.8))
        session.add(_delta(cluster_id, 1, 0.3))
        session.commit()
        assert fold.fold_deltas(session=session) == 2
        row = session.exec(
            select(UtilizationRollup).where(
                col(UtilizationRollup.cluster_id) == cluster_id,
                col(UtilizationRollup.dimension) == "gpu_model",
                col(UtilizationRollup.period_us) == EXACT_US,
            )
        ).one()
        assert row.samples == 1
        assert row.sample_sum == pytest.approx(0.3)
        left = session.execute(sa.select(sa.func.count()).select_from(UtilizationRollupDelta))
        assert left.scalar_one() == 0
