"""A digest of every policy's plan on the solver benchmark's instances, to show that a
change meant only to make planning faster leaves every plan the same to the byte.

    .venv/bin/python -m bench.plan_digests --out /tmp/before.txt     # on the code before
    .venv/bin/python -m bench.plan_digests --compare /tmp/before.txt # after: exit 1 on a change
    .venv/bin/python -m bench.plan_digests --large --out /tmp/before-large.txt

Instances (``bench.instances.random_instance``, as ``bench/solver.py`` builds them): 100,
500 and 1,000 GPUs at loads 1 and 2 with seeds 1–5, 2,000 GPUs at loads 1 and 2 with seeds
1–2, and a federation group of four clusters (1,000 GPUs, seed 7, loads 1 and 2), each
planned by every policy: 36 instances, 144 plans, a few minutes on two cores. ``--large``
plans the 10,000- and 100,000-GPU instances of load 1 (seed 7) with ``priority`` and
``shaper`` instead (the second takes about a minute).

Plans are computed in the deterministic mode (``SolverConfig.deterministic``: CP-SAT limited
by deterministic time), so the same code gives the same plan whatever the load. The digest
is SHA-256 of the plan's JSON (``model_dump``, in its own key order, so the order of every
mapping counts) without ``stats.wall_time_s``. Not a test: the digests change whenever a
change of the solver is meant to change plans.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.instances import LoadedCluster, random_instance  # noqa: E402
from solver.instance import SolverConfig  # noqa: E402
from solver.plan import Plan  # noqa: E402
from solver.policies import POLICY_NAMES, get_policy  # noqa: E402

Case = tuple[int, LoadedCluster, list[str]]  # seed, instance shape, policies


def digest(plan: Plan) -> str:
    data = plan.model_dump(mode="json")
    data["stats"].pop("wall_time_s", None)
    return hashlib.sha256(json.dumps(data).encode()).hexdigest()[:16]


def cases(large: bool) -> list[Case]:
    if large:
        both = ["priority", "shaper"]
        return [(7, LoadedCluster(gpus=gpus, load=1.0), both) for gpus in (10_000, 100_000)]
    every = list(POLICY_NAMES)
    result: list[Case] = []
    for gpus, seeds in ((100, 5), (500, 5), (1000, 5), (2000, 2)):
        for load in (1.0, 2.0):
            for seed in range(1, seeds + 1):
                result.append((seed, LoadedCluster(gpus=gpus, load=load), every))
    for load in (1.0, 2.0):
        group = LoadedCluster(gpus=1000, load=load, clusters=4, federated=True)
        result.append((7, group, every))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--large", action="store_true", help="10,000 and 100,000 GPUs instead")
    parser.add_argument("--out", type=Path, help="write the digests here too")
    parser.add_argument(
        "--compare", type=Path, help="digests to compare with (exit 1 if any differ)"
    )
    args = parser.parse_args()
    config = SolverConfig(time_limit_s=2.0, num_workers=2, seed=7, deterministic=True)
    lines: list[str] = []
    for seed, shape, policies in cases(args.large):
        instance = random_instance(seed, shape, config)
        for name in policies:
            started = time.process_time()
            plan = get_policy(name).plan(instance)
            cpu = time.process_time() - started
            line = (
                f"{shape.gpus} load={shape.load:g} seed={seed} federated={shape.federated} "
                f"{name} {digest(plan)} objective={plan.stats.objective:.3f}"
            )
            lines.append(line)
            print(f"{line}  cpu {cpu:.2f} s", flush=True)
    if args.out is not None:
        args.out.write_text("".join(f"{line}\n" for line in lines))
    if args.compare is not None:
        before = args.compare.read_text().splitlines()
        changed = [(old, new) for old, new in zip(before, lines, strict=False) if old != new]
        if len(before) != len(lines) or changed:
            for old, new in changed:
                print(f"changed: {old}\n     now: {new}")
            print(f"{len(changed)} of {len(lines)} plans changed ({len(before)} before)")
            sys.exit(1)
        print(f"all {len(lines)} plans the same")


if __name__ == "__main__":
    main()
