"""An example workload: counts in a loop while holding a block of state in memory.

    python agent/examples/counter.py --count-file /tmp/count.json --state-mb 100

Every --interval seconds it bumps its count, changes one byte of its state and writes
{"count", "pid", "started_at", "resumed_from", "state_bytes"} to the count file (atomically).
Standard library only, so any Python 3.11 runs it, inside or outside the project.

- Transparent checkpoint (CRIU): nothing to do; a restored counter simply goes on
  counting, with the same started_at.
- Cooperative checkpoint: on SIGUSR1 it writes its count and state to
  $SHAPER_CHECKPOINT_PATH (atomically) and exits with 0. Started with
  $SHAPER_RESUME_FROM=<that file>, it checks the state's SHA-256 and goes on from the
  saved count; a damaged checkpoint makes it exit with 3.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import BinaryIO

EXIT_BAD_CHECKPOINT = 3
_PATTERN = bytes(range(256))


def _write_atomically(path: Path, write: Callable[[BinaryIO], object]) -> None:
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(temporary, "wb") as stream:
        write(stream)
    os.replace(temporary, path)


def _initial_state(size: int) -> bytearray:
    # Repeating a non-zero pattern touches every page, so the state really is resident
    # (a zeroed bytearray would stay unmapped and make checkpoints look cheap).
    repeats, rest = divmod(size, len(_PATTERN))
    return bytearray(_PATTERN * repeats + _PATTERN[:rest])


def _load(path: Path) -> tuple[int, bytearray]:
    with open(path, "rb") as stream:
        header = json.loads(stream.readline())
        state = bytearray(header["state_bytes"])
        if stream.readinto(state) != len(state) or stream.read(1):
            raise ValueError(f"{path}: state has the wrong length")
    if hashlib.sha256(state).hexdigest() != header["state_sha256"]:
        raise ValueError(f"{path}: state fails its SHA-256 check")
    return int(header["count"]), state


def _save(path: Path, count: int, state: bytearray) -> None:
    header = {
        "count": count,
        "state_bytes": len(state),
        "state_sha256": hashlib.sha256(state).hexdigest(),
    }

    def write(stream: BinaryIO) -> None:
        stream.write(json.dumps(header).encode() + b"\n")
        stream.write(state)

    _write_atomically(path, write)


def _writer(data: bytes) -> Callable[[BinaryIO], object]:
    return lambda stream: stream.write(data)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count-file", type=Path, required=True)
    parser.add_argument("--state-mb", type=float, default=100.0, help="state held in memory")
    parser.add_argument("--interval", type=float, default=0.02, help="seconds per count")
    args = parser.parse_args(argv)

    started_at = time.time()
    resume_from = os.environ.get("SHAPER_RESUME_FROM")
    if resume_from:
        try:
            count, state = _load(Path(resume_from))
        except (OSError, ValueError, KeyError) as error:
            print(f"counter: cannot resume from {resume_from}: {error}", flush=True)
            return EXIT_BAD_CHECKPOINT
        print(f"counter: resumed from {resume_from} at count {count}", flush=True)
    else:
        count, state = 0, _initial_state(int(args.state_mb * (1 << 20)))
        print(f"counter: started with {len(state)} bytes of state", flush=True)

    checkpoint_requested = False

    def request_checkpoint(signum: int, frame: FrameType | None) -> None:
        nonlocal checkpoint_requested
        checkpoint_requested = True

    signal.signal(signal.SIGUSR1, request_checkpoint)

    while True:
        if checkpoint_requested:
            target = os.environ.get("SHAPER_CHECKPOINT_PATH")
            if target:
                _save(Path(target), count, state)
                print(f"counter: checkpointed at count {count} to {target}", flush=True)
                return 0
            print("counter: SIGUSR1 without $SHAPER_CHECKPOINT_PATH; ignored", flush=True)
            checkpoint_requested = False
        count += 1
        if state:
            state[count % len(state)] = count & 0xFF
        progress = {
            "count": count,
            "pid": os.getpid(),
            "started_at": started_at,
            "resumed_from": resume_from,
            "state_bytes": len(state),
        }
        _write_atomically(args.count_file, _writer(json.dumps(progress).encode()))
        time.sleep(args.interval)


if __name__ == "__main__":
    sys.exit(main())
