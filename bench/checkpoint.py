"""CRIU dump and restore time against image size, next to the disk's own write speed.

    python -m bench.checkpoint [--sizes 50,200,1024] [--dir /var/tmp] [--json out.json]

For each size (MiB of workload state) it starts agent/examples/counter.py holding that
much memory, checkpoints it with the CRIU backend, restores it into a new PID namespace,
checks that the count went on, and kills it. In the same run and directory it writes a
file of the same size the plain way, once left in the page cache and once with fsync, so
the CRIU figures can be read against what the disk itself does. CRIU does not fsync its
images: compare its dump with the page-cache write, and add the fsync cost for a durable
image. Needs root and CRIU >= 4.1 (scripts/install-criu.sh).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from agent import procs
from agent.backends.base import verify_image
from agent.backends.criu import CriuBackend
from agent.settings import AgentSettings
from agent.workload import WorkloadStore, kill_workload, start_workload

MiB = 1 << 20
COUNTER = Path(__file__).resolve().parents[1] / "agent" / "examples" / "counter.py"


@dataclass
class Row:
    state_mib: int
    image_mib: float
    dump_s: float
    checksum_s: float
    verify_s: float
    restore_s: float
    write_cache_s: float
    write_fsync_s: float

    @property
    def dump_mb_s(self) -> float:
        return self.image_mib / self.dump_s

    @property
    def disk_mb_s(self) -> float:
        return self.state_mib / self.write_fsync_s


def disk_write(path: Path, size: int, *, fsync: bool) -> float:
    """Seconds to write size bytes to path (non-zero data, 4 MiB blocks), optionally fsynced."""
    block = (bytes(range(256)) * (4 * MiB // 256))[: 4 * MiB]
    started = time.monotonic()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        written = 0
        while written < size:
            written += os.write(fd, block[: min(len(block), size - written)])
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
    elapsed = time.monotonic() - started
    path.unlink()
    return elapsed


def count_of(count_file: Path) -> int:
    try:
        return int(json.loads(count_file.read_text())["count"])
    except (FileNotFoundError, ValueError, KeyError):
        return -1


def measure(size_mib: int, work: Path, criu: CriuBackend, store: WorkloadStore) -> Row:
    count_file = work / f"count-{size_mib}.json"
    workload = start_workload(
        store=store,
        command=[
            sys.executable,
            str(COUNTER),
            "--count-file",
            str(count_file),
            "--state-mb",
            str(size_mib),
            "--interval",
            "0.05",
        ],
        workload_id=f"bench-{size_mib}",
    )
    restored = None
    try:
        if not procs.wait_until(lambda: count_of(count_file) >= 3, timeout=120):
            raise RuntimeError(f"the {size_mib} MiB counter did not start")
        image_dir = work / f"image-{size_mib}"
        image = criu.checkpoint(workload, image_dir)
        at_dump = count_of(count_file)

        started = time.monotonic()
        verify_image(image, image_dir)
        verify_s = time.monotonic() - started

        started = time.monotonic()
        restored = criu.restore(image)
        restore_s = time.monotonic() - started
        if not procs.wait_until(lambda: count_of(count_file) > at_dump, timeout=60):
            raise RuntimeError(f"the {size_mib} MiB counter did not go on after restore")
        shutil.rmtree(image_dir)
    finally:
        kill_workload(restored or workload, timeout=30)

    scratch = work / f"disk-{size_mib}.bin"
    return Row(
        state_mib=size_mib,
        image_mib=image.size_bytes / MiB,
        dump_s=image.phases["dump"],
        checksum_s=image.phases["checksum"],
        verify_s=verify_s,
        restore_s=restore_s,
        write_cache_s=disk_write(scratch, size_mib * MiB, fsync=False),
        write_fsync_s=disk_write(scratch, size_mib * MiB, fsync=True),
    )


def print_table(rows: list[Row], directory: Path) -> None:
    header = (
        f"{'state MiB':>9} {'image MiB':>9} {'dump s':>7} {'dump MiB/s':>10} {'sha256 s':>8} "
        f"{'verify s':>8} {'restore s':>9} {'write s':>7} {'write+fsync s':>13} "
        f"{'disk MiB/s':>10}"
    )
    print(f"CRIU checkpoint/restore vs disk write, images in {directory}")
    print("restore s includes verify s (the restore checks every image file's SHA-256)")
    print(header)
    print("-" * len(header))
    for row in rows:
        print(
            f"{row.state_mib:>9} {row.image_mib:>9.1f} {row.dump_s:>7.2f} "
            f"{row.dump_mb_s:>10.0f} {row.checksum_s:>8.2f} {row.verify_s:>8.2f} "
            f"{row.restore_s:>9.2f} {row.write_cache_s:>7.2f} {row.write_fsync_s:>13.2f} "
            f"{row.disk_mb_s:>10.0f}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="50,200,1024", help="state sizes in MiB")
    parser.add_argument("--dir", type=Path, default=Path("/var/tmp"), help="where images go")
    parser.add_argument("--json", type=Path, help="also write the rows as JSON here")
    args = parser.parse_args(argv)
    sizes = [int(size) for size in args.sizes.split(",")]

    args.dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="shaper-bench-checkpoint-", dir=args.dir))
    try:
        store = WorkloadStore(work / "state")
        criu = CriuBackend(store=store, criu=AgentSettings().criu)  # $SHAPER_CRIU, as the agent
        criu.check()
        rows = [measure(size, work, criu, store) for size in sizes]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print_table(rows, args.dir)
    if args.json:
        args.json.write_text(json.dumps([asdict(row) for row in rows], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
