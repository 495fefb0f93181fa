"""The node agent's fenced steps, called directly: two nodes' executors on a real counter."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agent.fencing import FenceStore
from agent.steps import StepExecutor
from agent.workload import WorkloadStore
from tests.support.counter import count_of, next_count, start_counter
from tests.support.processes import Reaper
from wire.steps import AgentStepRequest, Outcome


def request(step: str, generation: int, key: str, **args: Any) -> AgentStepRequest:
    return AgentStepRequest.model_validate(
        {
            "action_id": 1,
            "key": key,
            "step": step,
            "workload_id": "counter",
            "generation": generation,
            "args": args,
        }
    )


def test_fencing_refuses_stale_steps_and_answers_duplicates_from_the_journal(
    tmp_path: Path,
) -> None:
    reaper = Reaper(tmp_path)
    try:
        node_a, node_b = WorkloadStore(tmp_path / "a"), WorkloadStore(tmp_path / "b")
        agent_a = StepExecutor(store=node_a, cluster="lab", node="a", confirm_grace_s=0.2)
        agent_b = StepExecutor(store=node_b, cluster="lab", node="b", confirm_grace_s=0.2)
        counts = tmp_path / "count.json"
        start_counter(store=node_a, reaper=reaper, count_file=counts, backend="signal", state_mb=1)

        checkpoint = agent_a.run(request("checkpoint", 1, "m:checkpoint"))
        assert checkpoint.ok and checkpoint.outcome is Outcome.executed
        image = checkpoint.result["image"]
        at_checkpoint = count_of(counts)
        # The fence moved before the step ran, and stays: generation 1, left at 1.
        fence = FenceStore(node_a.state_dir).load("counter")
        assert (fence.generation, fence.left_at) == (1, 1)

        again = agent_a.run(request("checkpoint", 1, "m:checkpoint"))
        assert again.outcome is Outcome.duplicate and again.result == checkpoint.result

        copied = agent_b.run(request("transfer", 1, "m:transfer", image=image))
        assert copied.ok and Path(copied.result["image_dir"]).is_relative_to(tmp_path / "b")
        restored = agent_b.run(
            request("restore", 1, "m:restore", image=image, image_dir=copied.result["image_dir"])
        )
        assert restored.ok
        reaper.track(node_b.load("counter"))
        assert next_count(counts, at_checkpoint) > at_checkpoint
        assert agent_b.run(request("confirm", 1, "m:confirm")).ok

        # The same saga cannot bring the workload back to a; an older one cannot either.
        for generation, key in ((1, "late:1"), (0, "late:0")):
            refused = agent_a.run(request("restore", generation, key, image=image))
            assert refused.outcome is Outcome.refused and not refused.ok
            assert "stale fencing token" in (refused.error or "")
        # An old release cannot kill it on b.
        assert agent_b.run(request("release", 0, "old:release")).outcome is Outcome.refused
        pid = node_b.load("counter").pid
        assert node_b.load("counter").is_running()

        # A restore delivered twice on b: answered, not run again.
        twice = agent_b.run(
            request("restore", 1, "m:restore", image=image, image_dir=copied.result["image_dir"])
        )
        assert twice.outcome is Outcome.duplicate and node_b.load("counter").pid == pid
        # A new generation (the next saga) may bring it home.
        assert agent_a.run(request("release", 1, "m:release", delete_image=True)).ok
        assert not (tmp_path / "a" / "images" / "counter").exists()
        outcomes = [e["outcome"] for e in FenceStore(node_a.state_dir).read_journal()]
        assert outcomes == ["executed", "duplicate", "refused", "refused", "executed"]
    finally:
        reaper.cleanup()
