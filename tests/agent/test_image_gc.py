"""The rule of the checkpoint images' garbage collection (agent.image_gc), without a node;
and the command that runs it, where the node cannot answer.

On a real kubelet and containerd: tests/k8s/test_real_node_checkpoint_gc.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from agent.image_gc import EXPIRED, decide, imported_at
from agent.kubelet import checkpoint_tag, tagged_at
from agent.settings import AgentSettings

REPO = Path(__file__).resolve().parents[2]
REPOSITORY = "localhost/shaper/checkpoint"
NOW = 1_800_000_000.0
DAY = 86_400.0


def image(pod: str, taken: float, repository: str = REPOSITORY) -> str:
    return f"{repository}/default/{pod}/counter:{checkpoint_tag(taken)}"


def test_the_tag_says_when_the_checkpoint_was_taken() -> None:
    tag = checkpoint_tag(NOW + 0.25)
    assert tag == "ckpt-20270115T080000250Z"
    assert tagged_at(tag) == NOW + 0.25
    for other in ("latest", "ckpt-20270115T080000Z", "ckpt-20271345T080000250Z", "v1"):
        assert tagged_at(other) is None, other


def test_only_images_under_the_repository_with_the_agents_tag_are_its_own() -> None:
    assert imported_at(image("a", NOW), REPOSITORY) == NOW
    assert imported_at(image("a", NOW), REPOSITORY + "/") == NOW
    assert imported_at(image("a", NOW, "localhost/other"), REPOSITORY) is None
    # a repository whose name only begins like the agent's
    assert imported_at(image("a", NOW, REPOSITORY + "-2"), REPOSITORY) is None
    assert imported_at(f"{REPOSITORY}/default/a/counter:latest", REPOSITORY) is None
    assert imported_at("docker.io/library/busybox:1.36", REPOSITORY) is None


def test_the_rule() -> None:
    waiting = image("waiting", NOW - 60)
    expired = image("expired", NOW - DAY - 1)
    running_old = image("running-old", NOW - 10 * DAY)
    foreign_old = image("foreign", NOW - 10 * DAY, "localhost/other")
    untagged = f"{REPOSITORY}/default/x/counter:latest"
    images = [waiting, expired, running_old, foreign_old, untagged]
    remove, keep = decide(
        images,
        repository=REPOSITORY,
        in_use={running_old, foreign_old},
        now=NOW,
        ttl_s=DAY,
    )
    assert remove == {expired: EXPIRED}
    assert keep.keys() == {waiting, running_old}
    assert keep[running_old] == "in use"  # in use past its TTL
    # Unused and within its TTL: kept, even if a restored pod ran from it and is gone (the
    # Job still names it; Kueue may evict and re-admit the Workload on its own).
    assert keep[waiting].startswith("unused, kept for a restore (60 s of 86400 s)")
    # TTL 0: nothing removed
    remove, keep = decide(images, repository=REPOSITORY, in_use=set(), now=NOW, ttl_s=0)
    assert remove == {} and set(keep) == {waiting, expired, running_old}


def test_settings_of_the_collection_and_of_the_kubelet_token(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    settings = AgentSettings()
    assert settings.checkpoint_image_ttl_s == DAY
    assert settings.checkpoint_image_gc_interval_s == 600
    monkeypatch.setenv("SHAPER_CHECKPOINT_IMAGE_TTL_S", "-1")
    with pytest.raises(ValidationError, match="SHAPER_CHECKPOINT_IMAGE_TTL_S"):
        AgentSettings()
    monkeypatch.delenv("SHAPER_CHECKPOINT_IMAGE_TTL_S")
    monkeypatch.setenv("SHAPER_KUBELET_TOKEN_FILE", str(tmp_path / "token"))
    monkeypatch.setenv("SHAPER_KUBELET_CLIENT_CERT", str(tmp_path / "c.crt"))
    monkeypatch.setenv("SHAPER_KUBELET_CLIENT_KEY", str(tmp_path / "c.key"))
    with pytest.raises(ValidationError, match="set one, not both"):
        AgentSettings()


def test_the_command_removes_nothing_when_the_node_cannot_say_what_is_in_use(
    tmp_path: Path,
) -> None:
    """No containerd client: the sweep stops before anything, exit 1 naming the cause."""
    env = {
        "PATH": "/usr/bin:/bin",
        "SHAPER_AGENT_STATE_DIR": str(tmp_path / "state"),
        "SHAPER_CTR": str(tmp_path / "no-ctr"),
        "SHAPER_KUBELET_URL": "https://127.0.0.1:9",
    }
    done = subprocess.run(
        [sys.executable, "-m", "agent", "gc-checkpoints", "--node", "n1"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "is not installed (SHAPER_CTR)" in done.stderr
    assert done.stdout == ""
