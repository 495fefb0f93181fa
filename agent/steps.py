"""The node agent's saga steps: checkpoint, transfer, restore, confirm, release — fenced.

StepExecutor.run() takes an AgentStepRequest (wire.steps), checks it against the workload's
fence (see agent.fencing), runs it with the workload's checkpoint backend and returns the
StepReport to send back; StepExecutor.handle() does the same for a message as it comes off
the agent's queue, which `shaper agent worker` serves with wire.executor. Each step is also
idempotent on its own, so a step that ran but whose answer was lost (the agent died before
it journalled it) gives the same answer when it runs again: a checkpoint already taken is
returned, one whose agent died after the process stopped is recovered from the dump it
left (the backend's recover_checkpoint), an image already copied is verified and kept, a
workload that already runs here is not restored a second time.

Images live in ``<state>/images/<workload>/g<generation>/image`` with the image record
(CheckpointImage JSON) next to it in ``image.json``.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

from agent import procs, resume
from agent.backends import create_backend
from agent.backends.base import (
    BackendError,
    CheckpointImage,
    ImageCorrupt,
    WorkloadNotRunning,
    verify_image,
)
from agent.fencing import FenceStore
from agent.workload import CHECKPOINT_PATH_ENV, RunningWorkload, WorkloadState, WorkloadStore
from wire.queues import agent_queue
from wire.steps import AgentStep, AgentStepRequest, Outcome, StepReport

log = logging.getLogger(__name__)
# How long a restored workload must stay up for `confirm` to call it running.
CONFIRM_GRACE_S = 1.0
MiB = 1 << 20


class StepExecutor:
    def __init__(
        self,
        *,
        store: WorkloadStore,
        cluster: str,
        node: str,
        backend_options: dict[str, dict[str, Any]] | None = None,
        confirm_grace_s: float = CONFIRM_GRACE_S,
    ) -> None:
        """backend_options: constructor options by backend name ({"criu": {"criu": path}})."""
        self.store = store
        self.fences = FenceStore(store.state_dir)
        self.name = agent_queue(cluster, node)
        self.images_dir = store.images_dir
        self.backend_options = backend_options or {}
        self.confirm_grace_s = confirm_grace_s

    # -- fencing ---------------------------------------------------------------------------

    def handle(self, message: dict[str, Any]) -> StepReport:
        """Run a step as it came off the wire (an unknown step name does not validate)."""
        return self.run(AgentStepRequest.model_validate(message))

    def run(self, request: AgentStepRequest) -> StepReport:
        if (
            request.step is AgentStep.confirm
            and request.key not in self.fences.load(request.workload_id).steps
        ):
            # Outside the fence lock: the `agent exec` that restores the workload takes it.
            # A confirm answered before is not made to wait again: the journal replays it.
            self._wait_for_start(request)
        with self.fences.hold(request.workload_id) as fence:
            remembered = fence.steps.get(request.key)
            if remembered is not None:
                report = StepReport.replayed(remembered)
                self._journal(request, report)
                return report
            stale = None
            if request.generation < fence.generation:
                stale = f"this node has seen generation {fence.generation}"
            elif (
                request.step is AgentStep.restore
                and fence.left_at is not None
                and request.generation <= fence.left_at
            ):
                stale = f"the workload left this node at generation {fence.left_at}"
            if stale is not None:
                report = self._report(
                    request,
                    ok=False,
                    outcome=Outcome.refused,
                    error=(
                        f"stale fencing token: {request.step.value} of workload "
                        f"{request.workload_id} carries generation {request.generation}; {stale}"
                    ),
                )
                self._journal(request, report)
                return report
            if request.generation > fence.generation:
                fence.generation = request.generation
                self.fences.save(fence)  # fenced before anything runs

            try:
                result = self._handlers[request.step](self, request)
            except BackendError as error:
                report = self._report(
                    request, ok=False, error=str(error), retryable=error.retryable
                )
            except (KeyError, ValueError, OSError) as error:
                # A checkpoint's OSError (a full disk after the dump) is worth a retry, not
                # journalled: the next delivery finds the dump and seals it (_recover), or
                # the process running again (recorded so) and starts afresh.
                report = self._report(
                    request,
                    ok=False,
                    error=f"{type(error).__name__}: {error}",
                    retryable=isinstance(error, OSError) and request.step is AgentStep.checkpoint,
                )
            else:
                report = self._report(request, ok=True, result=result)
                if request.step in (AgentStep.checkpoint, AgentStep.release):
                    fence.left_at = max(fence.left_at or 0, request.generation)
            if report.ok or not report.retryable:
                fence.remember(request.key, report.model_dump(mode="json"))
            self.fences.save(fence)
            self._journal(request, report)
            return report

    def _report(self, request: AgentStepRequest, *, ok: bool, **fields: Any) -> StepReport:
        return request.answer(executor=self.name, ok=ok, **fields)

    def _journal(self, request: AgentStepRequest, report: StepReport) -> None:
        self.fences.journal(
            {
                "key": request.key,
                "step": request.step.value,
                "workload": request.workload_id,
                "generation": request.generation,
                "outcome": report.outcome.value,
                "ok": report.ok,
                "error": report.error,
            }
        )
        log.info(
            "%s %s of %s (generation %s): %s%s",
            self.name,
            request.step.value,
            request.workload_id,
            request.generation,
            report.outcome.value,
            "" if report.ok else f", failed: {report.error}",
        )

    # -- steps -----------------------------------------------------------------------------

    def _image_root(self, workload_id: str, generation: int) -> Path:
        return self.images_dir / workload_id / f"g{generation}"

    def _backend(self, name: str) -> Any:
        return create_backend(name, store=self.store, **self.backend_options.get(name, {}))

    def checkpoint(self, request: AgentStepRequest) -> dict[str, Any]:
        try:
            workload = self.store.load(request.workload_id)
        except KeyError:
            raise WorkloadNotRunning(
                f"workload {request.workload_id} is not managed on {self.name}"
            ) from None
        root = self._image_root(request.workload_id, request.generation)
        record = root / "image.json"
        if workload.state is WorkloadState.checkpointed and record.exists():
            image = CheckpointImage.model_validate_json(record.read_text())
            return _checkpoint_result(image, note="taken earlier")
        image_dir = root / "image"
        if image_dir.exists():  # left by a checkpoint that died half way
            if _interrupted(workload):
                return self._recover(workload, image_dir, record)
            # The process runs (or was never stopped for this checkpoint): start afresh.
            shutil.rmtree(image_dir)
        if not workload.is_running():
            raise WorkloadNotRunning(
                f"workload {request.workload_id} does not run on {self.name} "
                f"(state {workload.state.value}): there is nothing to checkpoint"
            )
        # Said before the process stops, so whoever waits on it (`agent exec --wait` in a
        # batch job) knows that it stopped on purpose and does not end the job.
        workload.state = WorkloadState.checkpointing
        self.store.save(workload)
        try:
            image = self._backend(workload.backend).checkpoint(workload, image_dir)
        except BaseException:
            # Whatever failed (the backend, a full disk, the agent stopping), a process
            # that still runs was not stopped by this checkpoint: recorded running again,
            # or a restore would take it for a stopped one (and the batch job's `agent
            # exec --wait` for one stopped on purpose).
            if workload.is_running():
                workload.state = WorkloadState.running
                self.store.save(workload)
            raise
        _write_atomically(record, image.model_dump_json())
        return _checkpoint_result(image)

    def _recover(self, workload: RunningWorkload, image_dir: Path, record: Path) -> dict[str, Any]:
        """Finish a checkpoint whose agent died after the process stopped and before the
        image was recorded: the dump left in image_dir is all that is left of the workload.

        The backend seals it if its dump finished, or raises CheckpointLost (not retryable)
        and leaves the directory for inspection.
        """
        image = self._backend(workload.backend).recover_checkpoint(workload, image_dir)
        _write_atomically(record, image.model_dump_json())
        log.warning(
            "%s: recovered the interrupted checkpoint of %s from %s",
            self.name,
            workload.id,
            image_dir,
        )
        return _checkpoint_result(image, note="recovered after the agent died mid-checkpoint")

    def transfer(self, request: AgentStepRequest) -> dict[str, Any]:
        image = CheckpointImage.model_validate(request.args["image"])
        source = Path(image.image_dir).resolve()
        root = self._image_root(request.workload_id, request.generation)
        target = (root / "image").resolve()
        started = time.monotonic()
        if source == target:
            verify_image(image, target)
        elif target.exists() and _verifies(image, target):
            pass  # copied by an earlier delivery of this step
        else:
            if not source.is_dir():
                raise ImageCorrupt(f"the image to transfer, {source}, does not exist")
            incoming = root / ".incoming"
            shutil.rmtree(incoming, ignore_errors=True)
            shutil.rmtree(target, ignore_errors=True)
            root.mkdir(parents=True, exist_ok=True)
            shutil.copytree(source, incoming)
            verify_image(image, incoming)  # every byte, against the manifest
            os.replace(incoming, target)
        seconds = time.monotonic() - started
        return {
            "image_dir": str(target),
            "bytes": image.size_bytes,
            "seconds": round(seconds, 3),
            "summary": f"{image.size_bytes / MiB:.0f} MiB copied and verified in {seconds:.2f} s",
        }

    def restore(self, request: AgentStepRequest) -> dict[str, Any]:
        try:
            current = self.store.load(request.workload_id)
        except KeyError:
            current = None
        if current is not None and current.is_running():
            # Whatever its record says (a checkpoint that failed before it stopped the
            # process, or an agent that died there): it runs, so nothing is restored, and
            # it is recorded running.
            if current.state is not WorkloadState.running:
                current.state = WorkloadState.running
                self.store.save(current)
            return {"pid": current.pid, "summary": f"already running here as PID {current.pid}"}
        # An agent that died mid-restore may have left a restored copy nobody recorded.
        reaped = self._reap_unrecorded(request.workload_id)
        if "image" in request.args:
            image = CheckpointImage.model_validate(request.args["image"])
            image_dir = Path(request.args.get("image_dir") or image.image_dir)
        else:
            # A compensation that never heard of a checkpoint (unanswered, given up) when
            # the checkpoint ran here after all (the agent came back with its queue): the
            # image it left, the last one taken here.
            taken = self._taken_here(current)
            if taken is None:
                raise WorkloadNotRunning(
                    f"workload {request.workload_id} does not run on {self.name} and there "
                    "is no checkpoint to restore it from"
                )
            image, image_dir = taken
        started = time.monotonic()
        restored = self._backend(image.backend).restore(image, image_dir=image_dir)
        seconds = time.monotonic() - started
        return {
            "pid": restored.pid,
            "seconds": round(seconds, 3),
            "reaped": reaped,
            "summary": f"restored from {image_dir} as PID {restored.pid} in {seconds:.2f} s"
            + (f" (stopped unrecorded copies {reaped} first)" if reaped else ""),
        }

    def _taken_here(self, workload: RunningWorkload | None) -> tuple[CheckpointImage, Path] | None:
        """The image of the checkpoint that stopped the workload here, when that is the
        last thing that happened to it here (recorded checkpointed): the newest generation
        with a sealed image. None otherwise (an older image would roll the job back)."""
        if workload is None or workload.state is not WorkloadState.checkpointed:
            return None
        roots = [
            (int(root.name[1:]), root)
            for root in (self.images_dir / workload.id).glob("g*")
            if root.name[1:].isdigit() and (root / "image.json").is_file()
        ]
        if not roots:
            return None
        _, root = max(roots)
        image = CheckpointImage.model_validate_json((root / "image.json").read_text())
        return image, root / "image"

    def stage(self, request: AgentStepRequest) -> dict[str, Any]:
        """Leave a resume pointer: the scheduler will start the workload here (agent.resume).

        The image must be here and intact. The workload is welcome back on this node at this
        generation even if an earlier step of the same saga took it away (a preempted job
        resumes where it was checkpointed).
        """
        image = CheckpointImage.model_validate(request.args["image"])
        image_dir = Path(request.args.get("image_dir") or image.image_dir).resolve()
        verify_image(image, image_dir)
        path = resume.stage(
            self.images_dir,
            resume.ResumePointer(
                workload_id=request.workload_id,
                generation=request.generation,
                image=image,
                image_dir=str(image_dir),
            ),
        )
        return {
            "image_dir": str(image_dir),
            "pointer": str(path),
            "summary": f"staged {image_dir} to resume when the scheduler starts the job here",
        }

    def _wait_for_start(self, request: AgentStepRequest) -> None:
        """Wait up to args.wait_s for the scheduler to start the workload here (restored
        by `agent exec` from the staged image when args.resumed_from names one); confirm
        then says whether it did."""
        wait_s = float(request.args.get("wait_s") or 0)
        expected = request.args.get("resumed_from")

        def started() -> bool:
            try:
                workload = self.store.load(request.workload_id)
            except KeyError:
                return False
            fresh = expected is None or workload.resumed_from == expected
            return fresh and workload.state is WorkloadState.running and workload.is_running()

        if wait_s > 0:
            procs.wait_until(started, timeout=wait_s, interval=0.5)

    def confirm(self, request: AgentStepRequest) -> dict[str, Any]:
        try:
            workload = self.store.load(request.workload_id)
        except KeyError:
            raise WorkloadNotRunning(
                f"workload {request.workload_id} was never started on {self.name}"
            ) from None
        expected = request.args.get("resumed_from")
        if expected is not None and workload.resumed_from != expected:
            raise WorkloadNotRunning(
                f"workload {request.workload_id} runs on {self.name} but was not restored from "
                f"{expected} (it started from {workload.resumed_from or 'scratch'})"
            )
        died = procs.wait_until(lambda: not workload.is_running(), timeout=self.confirm_grace_s)
        if workload.state is not WorkloadState.running or died:
            raise WorkloadNotRunning(
                f"workload {request.workload_id} does not run on {self.name} "
                f"(state {workload.state.value}, PID {workload.pid}); log:\n"
                f"{procs.read_tail(Path(workload.spec.log_path), lines=5)}"
            )
        return {"pid": workload.pid, "summary": f"running as PID {workload.pid}"}

    def release(self, request: AgentStepRequest) -> dict[str, Any]:
        try:
            workload = self.store.load(request.workload_id)
        except KeyError:
            workload = None
        stopped = False
        if workload is not None and workload.is_running():
            self._backend(workload.backend).release(workload)
            stopped = True
        elif workload is not None and workload.state is not WorkloadState.released:
            workload.state = WorkloadState.released
            self.store.save(workload)
        reaped = self._reap_unrecorded(request.workload_id)
        if request.args.get("delete_image", False):
            shutil.rmtree(self.images_dir / request.workload_id, ignore_errors=True)
        return {
            "stopped": stopped,
            "reaped": reaped,
            "summary": ("stopped and released" if stopped else "nothing ran here; released")
            + (f"; stopped unrecorded copies {reaped}" if reaped else ""),
        }

    def _reap_unrecorded(self, workload_id: str) -> list[int]:
        """Kill processes of the workload that this node started but never recorded.

        They are found by what only this node's starts carry: a CRIU restore names this
        node's image directory on its command line, a cooperative restart has this node's
        checkpoint path in its environment. Killing a CRIU holder ends its PID namespace.
        Callers deal with the recorded process first; this finds only what no record has.
        """
        image_mark = f"{self.images_dir / workload_id}/".encode()
        env_mark = (
            f"{CHECKPOINT_PATH_ENV}={self.store.workloads_dir / workload_id}/checkpoint".encode()
        )
        found = []
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                cmdline = Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ")
                environ = Path(entry.path, "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            pid = int(entry.name)
            # A CRIU-restored process keeps the environment of its first start (on another
            # node, maybe); only cooperative restarts, in this PID namespace, carry ours.
            ours = image_mark in cmdline or (
                env_mark in environ and len(procs.namespace_pids(pid)) == 1
            )
            if ours and procs.is_running(pid):
                found.append(pid)
        for pid in found:
            procs.kill_group(pid)
        for pid in found:
            procs.wait_gone(pid, timeout=10)
        if found:
            log.warning("%s: stopped unrecorded copies of %s: %s", self.name, workload_id, found)
        return found

    _handlers = {
        AgentStep.checkpoint: checkpoint,
        AgentStep.transfer: transfer,
        AgentStep.restore: restore,
        AgentStep.stage: stage,
        AgentStep.confirm: confirm,
        AgentStep.release: release,
    }


def _checkpoint_result(image: CheckpointImage, *, note: str | None = None) -> dict[str, Any]:
    return {
        "image": image.model_dump(mode="json"),
        "summary": (
            f"{image.backend} image of {image.size_bytes / MiB:.0f} MiB in "
            f"{image.duration_s:.2f} s" + (f" ({note})" if note else "")
        ),
    }


def _interrupted(workload: RunningWorkload) -> bool:
    """Whether a checkpoint of the workload stopped its process and then lost its agent:
    recorded as being (or having been) checkpointed, and its process gone."""
    checkpointing = workload.state in (WorkloadState.checkpointing, WorkloadState.checkpointed)
    return checkpointing and not workload.is_running()


def _verifies(image: CheckpointImage, image_dir: Path) -> bool:
    try:
        verify_image(image, image_dir)
    except ImageCorrupt:
        return False
    return True


def _write_atomically(path: Path, text: str) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text)
    os.replace(temporary, path)
