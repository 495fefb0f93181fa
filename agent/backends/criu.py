"""Transparent checkpoint/restore of a process tree with the `criu` command line.

Dump: `criu dump -t PID` freezes the tree, writes its image and kills it; we then wait
until the source PID is really gone and checksum the image.

Restore: by default into a new PID namespace, `unshare -p -f --mount-proc criu restore`,
so the PIDs recorded in the image never clash with processes on the target node. CRIU
stays in the foreground as the namespace's init and parent of the restored tree; it is the
workload's holder, and killing its process group ends the whole namespace. The workload's
host PID is found through /proc (its NSpid ends with the PID in the image).

A workload restored into a namespace is dumped again from inside it (`nsenter -p -m`), so
it can move any number of times.

Needs CRIU >= 4.1 on kernels >= 6.13 (scripts/install-criu.sh builds one), root, and
workloads started with setsid and stdin from /dev/null (see agent.workload).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from agent import procs
from agent.backends.base import (
    BackendUnavailable,
    CheckpointFailed,
    CheckpointImage,
    RestoreFailed,
    checkpoint_lost,
    fresh_image_dir,
    release_process,
    require_gone,
    require_running,
    seal_image,
    verify_image,
)
from agent.workload import (
    RunningWorkload,
    WorkloadState,
    WorkloadStore,
    kill_workload,
    utc_now,
)

MIN_VERSION = (4, 1)
INSTALL_HINT = "run scripts/install-criu.sh as root to build and install a working CRIU"
_RESTORE_DONE = "Restore finished successfully"
# CRIU's last line of a good dump, written once the image is complete and the tree killed
# (or left stopped); a failed dump ends with "Dumping FAILED." instead.
_DUMP_DONE = "Dumping finished successfully"
_DUMP_LOG = "dump.log"
_VERSION = re.compile(r"^Version:\s*(\d+)\.(\d+)", re.MULTILINE)


def find_criu(explicit: str | None = None) -> tuple[str, tuple[int, int]]:
    """Path and version of a usable criu binary, or BackendUnavailable saying how to get one.

    Uses `explicit` (``--criu`` or $SHAPER_CRIU, agent.settings), else the first of PATH's
    criu and /usr/local/sbin/criu (where the install script puts it; not on every PATH)
    that works.
    """
    candidates = [explicit] if explicit else [shutil.which("criu"), "/usr/local/sbin/criu"]
    tried = []
    for candidate in filter(None, candidates):
        try:
            result = subprocess.run(
                [candidate, "--version"], capture_output=True, text=True, timeout=30
            )
        except OSError as error:
            tried.append(f"{candidate}: {error.strerror}")
            continue
        match = _VERSION.search(result.stdout)
        if result.returncode != 0 or match is None:
            tried.append(f"{candidate}: `--version` failed")
            continue
        version = (int(match[1]), int(match[2]))
        if version < MIN_VERSION:
            tried.append(f"{candidate}: version {version[0]}.{version[1]} is too old")
            continue
        return candidate, version
    found = "; ".join(tried) or "no criu binary found"
    raise BackendUnavailable(
        f"CRIU >= {MIN_VERSION[0]}.{MIN_VERSION[1]} is needed on this kernel ({found}): "
        f"{INSTALL_HINT}"
    )


class CriuBackend:
    name = "criu"

    def __init__(
        self,
        *,
        store: WorkloadStore,
        criu: str | None = None,
        new_pid_namespace: bool = True,
        dump_args: Sequence[str] = (),
        restore_args: Sequence[str] = (),
        dump_timeout: float = 600.0,
        restore_timeout: float = 120.0,
        gone_timeout: float = 10.0,
        now: Callable[[], datetime] = utc_now,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """dump_args/restore_args: extra CRIU options (--file-locks, --tcp-established)."""
        self.store = store
        self._explicit_criu = criu
        self._criu: tuple[str, tuple[int, int]] | None = None
        self.new_pid_namespace = new_pid_namespace
        self.dump_args = list(dump_args)
        self.restore_args = list(restore_args)
        self.dump_timeout = dump_timeout
        self.restore_timeout = restore_timeout
        self.gone_timeout = gone_timeout
        self._now = now
        self._clock = clock

    @property
    def criu(self) -> str:
        if self._criu is None:
            self._criu = find_criu(self._explicit_criu)
        return self._criu[0]

    def check(self) -> None:
        """Raise BackendUnavailable unless `criu check` passes on this node."""
        result = subprocess.run([self.criu, "check"], capture_output=True, text=True, timeout=60)
        if result.returncode != 0:
            raise BackendUnavailable(
                f"`{self.criu} check` failed: {(result.stdout + result.stderr).strip()}; "
                f"{INSTALL_HINT}"
            )

    # -- checkpoint ---------------------------------------------------------------------

    def checkpoint(self, workload: RunningWorkload, image_dir: Path) -> CheckpointImage:
        pid = require_running(workload)
        image_dir = fresh_image_dir(workload, image_dir)
        root_pid = workload.namespace_pid or pid
        dump = [
            self.criu,
            "dump",
            "-t",
            str(root_pid),
            "-D",
            str(image_dir),
            "-o",
            _DUMP_LOG,
            "-v3",
            *self.dump_args,
        ]
        if workload.namespace_pid is not None:
            # CRIU must see the tree in its own PID namespace: dump from inside it. Leave
            # the tree stopped and kill it ourselves afterwards: when CRIU kills it, the
            # namespace's init exits and the kernel kills the still-running dump with it.
            dump = ["nsenter", "-t", str(workload.pid), "-p", "-m", *dump, "--leave-stopped"]

        started = self._clock()
        try:
            result = subprocess.run(dump, capture_output=True, text=True, timeout=self.dump_timeout)
        except subprocess.TimeoutExpired:
            raise CheckpointFailed(
                f"workload {workload.id}: criu dump took more than {self.dump_timeout} s; "
                f"{self._still_running(workload)}"
            ) from None
        if result.returncode != 0:
            raise CheckpointFailed(
                f"workload {workload.id}: criu dump of PID {root_pid} failed "
                f"(exit {result.returncode}); {self._still_running(workload)}. "
                f"Log {image_dir / _DUMP_LOG}:\n"
                f"{procs.read_tail(image_dir / _DUMP_LOG) or result.stderr.strip()}"
            )
        dumped = self._clock()

        # CRIU has killed the tree (or left it stopped, see above); make sure the PID is
        # gone before anyone restores the image.
        if workload.namespace_pid is not None:
            kill_workload(workload, timeout=self.gone_timeout)
        gone = [pid, *([workload.holder_pid] if workload.holder_pid else [])]
        if not all(procs.wait_gone(p, timeout=self.gone_timeout) for p in gone):
            kill_workload(workload, timeout=self.gone_timeout)
            if workload.is_running():
                raise CheckpointFailed(
                    f"workload {workload.id}: PID {workload.pid} is still running after "
                    "a successful dump and SIGKILL; not releasing the image for restore"
                )
        source_gone = self._clock()
        return self._seal(
            workload,
            image_dir,
            started=started,
            phases={"dump": dumped - started, "wait_source_gone": source_gone - dumped},
        )

    def recover_checkpoint(self, workload: RunningWorkload, image_dir: Path) -> CheckpointImage:
        """Seal a dump whose agent died before recording it, if CRIU's log says it finished.

        A `criu dump` outlives the agent that started it: wait for one still writing here
        before reading its log. The dump's own duration is not known any more.
        """
        require_gone(workload)
        image_dir = Path(image_dir).resolve()
        started = self._clock()
        if not procs.wait_until(
            lambda: not _dumps_into(image_dir),
            timeout=self.dump_timeout,
            interval=0.5,
            clock=self._clock,
        ):
            raise CheckpointFailed(
                f"workload {workload.id}: a criu dump into {image_dir} is still running after "
                f"{self.dump_timeout} s"
            )
        dump_log = image_dir / _DUMP_LOG
        if _DUMP_DONE not in _read(dump_log):
            tail = procs.read_tail(dump_log, lines=3) or "no dump.log"
            raise checkpoint_lost(
                workload, image_dir, f"CRIU's log does not say {_DUMP_DONE!r}; it ends:\n{tail}"
            )
        # A namespaced tree is killed by us after its dump, with its holder: finish that.
        if not kill_workload(workload, timeout=self.gone_timeout):
            raise CheckpointFailed(
                f"workload {workload.id}: its holder PID {workload.holder_pid} survived SIGKILL; "
                "not releasing the image for restore"
            )
        waited = self._clock()
        return self._seal(
            workload,
            image_dir,
            started=started,
            phases={"wait_dump_gone": waited - started},
            recovered=True,
        )

    def _seal(
        self,
        workload: RunningWorkload,
        image_dir: Path,
        *,
        started: float,
        phases: dict[str, float],
        recovered: bool = False,
    ) -> CheckpointImage:
        """Checksum a finished dump of a gone workload and record the workload CHECKPOINTED."""
        # Measured now that nothing writes to it: CRIU checks this size on restore.
        log_path = Path(workload.spec.log_path)
        log_size = log_path.stat().st_size if log_path.exists() else None
        details: dict[str, Any] = {
            "root_pid": workload.namespace_pid or workload.pid,
            "log_size": log_size,
        }
        if recovered:
            details["recovered"] = True
        image = seal_image(
            backend=self.name,
            workload=workload,
            image_dir=image_dir,
            started=started,
            phases=phases,
            clock=self._clock,
            created_at=self._now(),
            details=details,
        )
        workload.state = WorkloadState.checkpointed
        self.store.save(workload)
        return image

    @staticmethod
    def _still_running(workload: RunningWorkload) -> str:
        if workload.is_running():
            return "the workload keeps running"
        return "the workload is no longer running"

    # -- restore ------------------------------------------------------------------------

    def restore(
        self, image: CheckpointImage, *, image_dir: str | Path | None = None
    ) -> RunningWorkload:
        if image.backend != self.name:
            raise RestoreFailed(
                f"workload {image.workload.id}: a {image.backend!r} image cannot be restored "
                "by the criu backend"
            )
        image_dir = Path(image_dir or image.image_dir).resolve()
        verify_image(image, image_dir)
        criu = self.criu
        root_pid = int(image.details["root_pid"])
        if not self.new_pid_namespace and procs.is_running(root_pid):
            raise RestoreFailed(
                f"workload {image.workload.id}: PID {root_pid} from the image is taken on "
                "this node; restore into a new PID namespace instead"
            )
        self._prepare_log(image)

        workdir = self.store.workload_dir(image.workload.id)
        restore_log = workdir / f"restore-{time.time_ns()}.log"
        restore = [
            criu,
            "restore",
            "-D",
            str(image_dir),
            # Logs and stats go to the work directory, so the image stays unchanged.
            "-W",
            str(workdir),
            "-o",
            str(restore_log),
            "-v3",
            *self.restore_args,
        ]
        if self.new_pid_namespace:
            restore = ["unshare", "-p", "-f", "--mount-proc", *restore]
        try:
            holder = procs.spawn_detached(
                restore, env=os.environ, cwd="/", log_path=workdir / "criu-restore.out"
            )
        except OSError as error:
            raise RestoreFailed(
                f"workload {image.workload.id}: cannot start {restore[0]!r}: {error}"
            ) from error
        holder_started = procs.start_ticks(holder.pid)

        def finished() -> bool:
            return holder.poll() is not None or _RESTORE_DONE in _read(restore_log)

        procs.wait_until(finished, timeout=self.restore_timeout, clock=self._clock)
        host_pid = None
        if holder.poll() is None and _RESTORE_DONE in _read(restore_log):
            host_pid = self._find_restored(holder.pid, root_pid)
        if host_pid is None:
            self._abort(holder.pid)
            why = (
                f"criu restore exited with status {holder.returncode}"
                if holder.returncode is not None
                else f"criu restore did not finish within {self.restore_timeout} s"
            )
            raise RestoreFailed(
                f"workload {image.workload.id}: {why}; nothing was left running. "
                f"Log {restore_log}:\n{procs.read_tail(restore_log)}"
            )

        workload = RunningWorkload(
            spec=image.workload,
            backend=self.name,
            pid=host_pid,
            pid_started=procs.start_ticks(host_pid),
            namespace_pid=root_pid if self.new_pid_namespace else None,
            holder_pid=holder.pid,
            holder_started=holder_started,
            started_at=self._now(),
            resumed_from=str(image_dir),
        )
        self.store.save(workload)
        return workload

    @staticmethod
    def _prepare_log(image: CheckpointImage) -> None:
        """Recreate the workload's log file where a new node lacks it.

        CRIU reopens open files by path and refuses a file whose size changed, so the log
        must exist with the size it had at dump time; its contents stay on the source.
        """
        log_size = image.details.get("log_size")
        log_path = Path(image.workload.log_path)
        if log_size is None or log_path.exists():
            return
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "wb") as log:
            log.truncate(int(log_size))

    def _find_restored(self, holder_pid: int, root_pid: int) -> int | None:
        """Host PID of the restored root: a child or grandchild of the holder."""

        def search() -> int | None:
            level = [holder_pid]
            for _depth in range(2):
                level = [child for parent in level for child in procs.children_of(parent)]
                for pid in level:
                    if procs.namespace_pids(pid)[-1:] == [root_pid]:
                        return pid
            return None

        found: list[int] = []

        def located() -> bool:
            pid = search()
            if pid is not None:
                found.append(pid)
            return pid is not None

        procs.wait_until(located, timeout=5.0, clock=self._clock)
        return found[0] if found else None

    def _abort(self, holder_pid: int) -> None:
        procs.kill_group(holder_pid)
        procs.wait_gone(holder_pid, timeout=self.gone_timeout)

    # -- release ------------------------------------------------------------------------

    def release(self, workload: RunningWorkload, *, timeout: float = 10.0) -> None:
        release_process(self.store, workload, timeout=timeout)


def _dumps_into(image_dir: Path) -> list[int]:
    """PIDs of `criu dump` processes that write into image_dir."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            arguments = Path(entry.path, "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"dump" in arguments and os.fsencode(image_dir) in arguments:
            if procs.is_running(int(entry.name)):
                found.append(int(entry.name))
    return found


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""
