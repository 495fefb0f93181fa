"""bench/fleet_load.py (``python -m bench.api --mixed``) at a small size, on PostgreSQL:
connectors push deltas through the real server while dashboard readers read, and every
seq a connector was acknowledged is the one the server stored — and the check would say
so if one were not. Figures are not asserted: speed is the benchmark's to print."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from rich.console import Console

from app.core import migrate
from bench import fleet_load

# A server, two load processes and 3 s of load: about 20-30 s on a loaded 2-core machine.
pytestmark = pytest.mark.slow


def test_mixed_load_accounts_for_every_seq(make_postgres_database: Any) -> None:
    url = make_postgres_database("mixed_load")
    migrate.upgrade(url)

    @contextmanager
    def database() -> Iterator[str]:
        yield url

    load = fleet_load.Load(
        connectors=2,
        push_every_s=1.0,
        delta_nodes=5,
        cluster_nodes=8,
        cluster_jobs=10,
        readers=2,
        seconds=3.0,
    )
    run = fleet_load.run_level("postgres", database, load, 1, Console(quiet=True))

    assert run.accounting.problems == []
    assert run.accounting.accounted == 2
    for connector in run.connectors:
        assert not connector.refused and connector.unacknowledged == 0
        # The seeded snapshot (seq 1), then one delta a push, each seq acknowledged once.
        assert len(connector.acked) >= 2
        assert connector.acked == list(range(1, len(connector.acked) + 1))
        assert connector.samples_acked == 5 * (len(connector.acked) - 1)
    assert set(run.reads.latencies_s) == set(fleet_load.READS)
    assert not run.reads.failed

    # The accounting tells: a seq acknowledged but never stored, samples counted twice.
    first = run.connectors[0]
    unstored = dataclasses.replace(first, acked=[*first.acked, first.acked[-1] + 1])
    doubled = dataclasses.replace(first, samples_acked=2 * first.samples_acked)
    for forged in (unstored, doubled):
        accounting = fleet_load.account(url, [forged], load)
        assert accounting.accounted == 0 and len(accounting.problems) == 1
