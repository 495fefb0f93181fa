"""Connector benchmark, Slurm: the figures ``bench/connectors.py`` gives for Kubernetes, on
the largest Slurm cluster the tests run (``scripts/slurm-cluster.sh``: a real slurmctld,
three slurmd nodes × 2 GPUs, slurmrestd with JWT auth).

It submits ``--jobs`` jobs (one GPU each, so 6 run and the rest wait), then measures, for
the connector reading the CLI (``squeue --json`` …) and reading slurmrestd:

1. **In process**: time from construction to the first ``read_state``, and a warm one.
2. **The real connector process** (``python -m connectors.runner --kind slurm``) pushing
   to the real API on a scratch PostgreSQL database (bench.connector_push): start → first
   snapshot stored, a job submitted (``sbatch --hold``) → the control plane has it, p50 /
   p99, and the process's memory. Slurm tells of no change, so the connector polls, and
   each job is submitted as soon as the control plane has the one before, just after a
   push: every figure is then near the worst case, the whole ``--interval`` plus a read
   and a push (a change at a random moment waits half the interval less on average).

    python -m bench.slurm_connector [--jobs 500] [--changes 20] [--interval 1] [--mode both]

Needs root (Slurm's daemons) and no other Slurm test cluster running: its ports are fixed.
Environment: SHAPER_TEST_POSTGRES_DSN (the PostgreSQL server for the scratch database).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from bench.connector_push import (
    CHANGE_P99_TARGET_S,
    FIRST_SNAPSHOT_TARGET_S,
    MEMORY_TARGET_MIB,
    measure_pushed,
    p99,
    verdict,
)
from bench.scratch_db import DEFAULT_DSN
from connectors.slurm import SlurmConnector, SlurmConnectorConfig
from wire.telemetry import SchedulerKind

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "slurm-cluster.sh"
CLUSTER = "bench-slurm"
REST_URL = "http://127.0.0.1:6820"
MAPPING = '{"gpu_model_aliases": {"h100": "H100"}}'
console = Console()


@contextmanager
def slurm_cluster(keep: bool) -> Iterator[Path]:
    """``scripts/slurm-cluster.sh start`` in a temporary folder; stopped at the end unless
    ``keep``. Yields the cluster's slurm.conf."""
    directory = Path(tempfile.mkdtemp(prefix="shaper-bench-slurm-", dir="/tmp"))
    directory.chmod(0o755)
    started = time.monotonic()
    done = subprocess.run(
        [str(SCRIPT), "start", "--dir", str(directory)], capture_output=True, text=True
    )
    if done.returncode != 0:
        shutil.rmtree(directory, ignore_errors=True)
        raise SystemExit(f"the Slurm cluster did not start:\n{done.stderr}{done.stdout}")
    console.print(f"Slurm up in {time.monotonic() - started:.0f} s ({directory})")
    (directory / "jobs").mkdir()
    try:
        yield directory / "etc" / "slurm.conf"
    finally:
        if keep:
            console.print(f"kept: {SCRIPT} stop --dir {directory}")
        else:
            subprocess.run([str(SCRIPT), "stop", "--dir", str(directory)], check=False)
            shutil.rmtree(directory, ignore_errors=True)


def sbatch(conf: Path, *options: str) -> str:
    jobs = conf.parent.parent / "jobs"
    done = subprocess.run(
        [
            "sbatch",
            "--parsable",
            f"--chdir={jobs}",
            f"--output={jobs}/%j.out",
            "--gres=gpu:h100:1",
            *options,
            "--wrap=sleep 3600",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "SLURM_CONF": str(conf)},
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"sbatch failed: {done.stderr}")
    return done.stdout.strip().split(";")[0]


def populate(conf: Path, jobs: int) -> None:
    started = time.monotonic()
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task(f"submitting {jobs} jobs", total=jobs)
        for i in range(jobs):
            sbatch(conf, f"--job-name=bench-{i}")
            progress.advance(task)
    took = time.monotonic() - started
    console.print(f"{jobs} jobs submitted in {took:.1f} s ({jobs / took:.0f}/s)")


def connector_config(conf: Path, mode: str) -> dict[str, Any]:
    fields: dict[str, Any] = {"slurm_conf": conf}
    if mode == "rest":
        fields["rest_url"] = REST_URL
    return fields


def measure_in_process(conf: Path, mode: str) -> dict[str, Any]:
    started = time.monotonic()
    connector = SlurmConnector(
        SlurmConnectorConfig(
            cluster=CLUSTER,
            mapping={"gpu_model_aliases": {"h100": "H100"}},
            **connector_config(conf, mode),
        )
    )
    try:
        state = connector.read_state()
        first_s = time.monotonic() - started
        warm: list[float] = []
        for _ in range(5):
            again = time.monotonic()
            connector.read_state()
            warm.append(time.monotonic() - again)
    finally:
        connector.close()
    return {
        "first_s": first_s,
        "warm_s": statistics.median(warm),
        "nodes": len(state.nodes),
        "jobs": len(state.jobs),
    }


def measure(conf: Path, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    inproc = measure_in_process(conf, mode)
    options = [f"--set={key}={value}" for key, value in connector_config(conf, mode).items()]

    def change(i: int) -> str:
        return sbatch(conf, "--hold", f"--job-name=change-{mode}-{i}")

    pushed = measure_pushed(
        kind="slurm",
        cluster=CLUSTER,
        scheduler=SchedulerKind.slurm,
        connector_args=[
            f"--interval={args.interval}",
            *options,
            f"--set=mapping={MAPPING}",
        ],
        changes=args.changes,
        change=change,
        dsn=args.dsn,
    )
    return {"inproc": inproc, "pushed": pushed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=500, help="jobs submitted before measuring")
    parser.add_argument("--changes", type=int, default=20, help="jobs submitted and timed")
    parser.add_argument("--interval", type=float, default=1.0, help="the connector's interval")
    parser.add_argument("--mode", choices=("cli", "rest", "both"), default="both")
    parser.add_argument("--dsn", default=DEFAULT_DSN, help="PostgreSQL server (admin DSN)")
    parser.add_argument("--keep", action="store_true", help="leave the cluster running")
    args = parser.parse_args()
    modes = ("cli", "rest") if args.mode == "both" else (args.mode,)

    results: dict[str, dict[str, Any]] = {}
    with slurm_cluster(args.keep) as conf:
        populate(conf, args.jobs)
        for mode in modes:
            console.print(f"measuring the connector reading Slurm's {mode} …")
            results[mode] = measure(conf, mode, args)

    table = Table(
        title=f"Slurm connector, 3 nodes × 2 GPUs, {args.jobs} jobs "
        f"(+{args.changes} per mode), interval {args.interval:g} s"
    )
    for column in ("figure", *modes, "target"):
        table.add_column(column, justify="left" if column == "figure" else "right")

    def row(figure: str, cells: list[str], target: str) -> None:
        table.add_row(figure, *cells, target)

    row(
        "in process: first read_state / a warm one",
        [f"{r['inproc']['first_s']:.2f} / {r['inproc']['warm_s']:.2f} s" for r in results.values()],
        "—",
    )
    row(
        "process: start → first snapshot stored (jobs)",
        [
            f"{r['pushed']['first_s']:.2f} s ({r['pushed']['jobs']}) "
            + verdict(r["pushed"]["first_s"], FIRST_SNAPSHOT_TARGET_S)
            for r in results.values()
        ],
        f"≤ {FIRST_SNAPSHOT_TARGET_S:.0f} s",
    )
    row(
        "process: job submitted → control plane, p50 / p99",
        [
            f"{statistics.median(r['pushed']['latencies']):.2f} / "
            f"{p99(r['pushed']['latencies']):.2f} s "
            + verdict(p99(r["pushed"]["latencies"]), CHANGE_P99_TARGET_S)
            for r in results.values()
        ],
        f"p99 ≤ {CHANGE_P99_TARGET_S:.0f} s",
    )
    row(
        "process: memory, RSS at the end / peak (VmHWM)",
        [
            f"{r['pushed']['rss']:.0f} / {r['pushed']['hwm']:.0f} MiB "
            + verdict(r["pushed"]["hwm"], MEMORY_TARGET_MIB)
            for r in results.values()
        ],
        f"≤ {MEMORY_TARGET_MIB:.0f} MiB",
    )
    console.print(table)
    for mode, result in results.items():
        values = " ".join(f"{v:.2f}" for v in result["pushed"]["latencies"])
        console.print(f"{mode}, latencies in order (s): {values}")


if __name__ == "__main__":
    main()
