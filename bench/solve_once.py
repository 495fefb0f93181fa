"""A federation group planned by one solve per period against its members' own solves and
a second solve for the group's moves (``SHAPER_FEDERATION_SOLVE_ONCE``), on the demo's
clusters (issue 16).

    python -m bench.solve_once [--members hpc-a k8s-inference] [--periods 2]

Each setting runs in a process of its own (settings are read once per process) on a fresh
SQLite database: ``shaper demo``'s clusters seeded with their 24 h of telemetry (seed 7, at
2026-12-05 06:00 UTC), the members named put in one group, then ``--periods`` shaping
periods through ``app.shaping.tasks.run_shaping_cycles`` 60 s apart, no saga run in
between. Printed side by side per period: the solves made (calls of a policy's ``plan``),
each member's decisions by kind, the moves proposed, the moves whose target node a member's
own proposed or approved start also goes to (``onto_a_start``: the same node, not
necessarily too few GPUs for both), and the period's wall time. ``solves`` counts every
plan made in the period, the clusters outside the group (planned alone) included.
Figures, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

SEEDED_AT = datetime(2026, 12, 5, 6, 0, tzinfo=UTC)
GROUP = "site"


def _one(members: Sequence[str], periods: int) -> dict[str, Any]:
    """One setting, in this process (its data dir and setting come from the environment)."""
    from sqlmodel import Session, select

    from app.actions.models import Action
    from app.bootstrap import prepare_database
    from app.clusters.models import Cluster
    from app.core.config import get_settings
    from app.core.db import get_engine
    from app.demo import seed_demo_site
    from app.federation import planning
    from app.federation import service as federation_service
    from app.federation.models import FederationGroupCreate
    from app.plans.models import Plan
    from app.shaping import cycle, tasks

    settings = get_settings()
    prepare_database(settings)
    with Session(get_engine()) as session:
        seed_demo_site(session=session, now=SEEDED_AT)
        federation_service.create_group(
            session=session, group_in=FederationGroupCreate(name=GROUP), now=SEEDED_AT, actor=None
        )
        for name in members:
            federation_service.add_cluster(
                session=session, name=GROUP, cluster=name, now=SEEDED_AT, actor=None
            )

    solves = 0

    def counted(get_policy: Any) -> Any:
        def get(name: str) -> Any:
            policy = get_policy(name)
            plan = policy.plan

            class Counted:
                def __getattr__(self, attr: str) -> Any:
                    return getattr(policy, attr)

                def plan(self, instance: Any) -> Any:
                    nonlocal solves
                    solves += 1
                    return plan(instance)

            return Counted()

        return get

    for module in (cycle, planning):
        setattr(module, "get_policy", counted(module.get_policy))  # noqa: B010

    class Clock:  # the plans made at the seeded "now", both settings alike
        at = SEEDED_AT + timedelta(seconds=5)

        def now(self) -> datetime:
            return Clock.at

    setattr(tasks, "SystemClock", Clock)  # noqa: B010
    found: dict[str, Any] = {"solve_once": settings.federation_solve_once, "periods": []}
    for _ in range(periods):
        solves = 0
        started = time.perf_counter()
        planned = tasks.run_shaping_cycles()
        wall = time.perf_counter() - started
        with Session(get_engine()) as session:
            names = {c.id: c.name for c in session.exec(select(Cluster))}
            decisions: dict[str, dict[str, int]] = {}
            for name, plan_id in sorted(planned.items()):
                plan = session.get(Plan, plan_id)
                if name in members and plan is not None:
                    kinds = Counter(d["action"] for d in plan.decisions)
                    decisions[name] = dict(sorted(kinds.items()))
            actions = list(session.exec(select(Action)))
            live = [a for a in actions if a.state in ("proposed", "approved")]
            moves = [a for a in live if a.kind == "move"]
            starts = {
                (names[a.cluster_id], node)
                for a in live
                if a.kind == "start"
                for node in (a.target_node or "").split(",")
                if node
            }
            onto = [
                m
                for m in moves
                if any(
                    (names.get(m.target_cluster_id or -1), node) in starts
                    for node in (m.target_node or "").split(",")
                )
            ]
        found["periods"].append(
            {
                "solves": solves,
                "wall_s": round(wall, 2),
                "decisions": decisions,
                "moves": len(moves),
                "onto_a_start": len(onto),
            }
        )
        Clock.at += timedelta(seconds=60)
    return found


def _run(setting: bool, members: Sequence[str], periods: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="shaper-solve-once-") as data:
        env = {
            **os.environ,
            "SHAPER_DATA_DIR": data,
            "SHAPER_DATABASE_URL": f"sqlite:///{data}/shaper.db",
            "SHAPER_FEDERATION_SOLVE_ONCE": "true" if setting else "false",
            "SHAPER_LOG_LEVEL": "WARNING",
        }
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "bench.solve_once",
                "--one",
                "--periods",
                str(periods),
                "--members",
                *members,
            ],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise SystemExit(f"the run with solve-once {setting} failed:\n{done.stderr}")
        return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", nargs="+", default=["hpc-a", "k8s-inference"])
    parser.add_argument("--periods", type=int, default=2)
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(_one(args.members, args.periods)))
        return 0
    off, on = (_run(setting, args.members, args.periods) for setting in (False, True))
    print(f"group {GROUP}: {', '.join(args.members)}")
    print("off: each member's own solve, then the group's moves; on: one solve for the group")
    for period, (a, b) in enumerate(zip(off["periods"], on["periods"], strict=True), start=1):
        print(f"-- period {period}")
        print(f"{'':24} {'off':>40} | {'on':>40}")
        for key in ("solves", "moves", "onto_a_start", "wall_s"):
            print(f"{key:24} {a[key]!s:>40} | {b[key]!s:>40}")
        for name in args.members:
            left = ", ".join(f"{k} {v}" for k, v in a["decisions"].get(name, {}).items())
            right = ", ".join(f"{k} {v}" for k, v in b["decisions"].get(name, {}).items())
            print(f"{name + ' decisions':24} {left:>40} | {right:>40}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
