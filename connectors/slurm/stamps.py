"""What the connector writes in a Slurm job's AdminComment: Slurm's field for the tools that
administer jobs, which users cannot set. It holds ``;``-separated stamps; words of others
are kept as they are.

* ``shaper-step:<key>[:<restarts>]`` — a step that acted on the job (a requeue, with the
  job's restart count then; a moved job's cancel), so that a resend finds its own work
  (connectors.base.SupportsStepKey).
* ``shaper-pin:<restarts>:<nodes before>:<nodes pinned>`` — Shaper pinned the job
  (``ReqNodeList``) to ``<nodes pinned>`` for the run that starts at restart count
  ``<restarts>``; ``<nodes before>`` is the node list the job asked for before Shaper's
  first pin (hostlist expressions; empty: none).

Why the pin is stamped: Slurm keeps a job's ``ReqNodeList`` for good — it refuses to change
it while the job runs ("Invalid node name specified") and keeps it when the job is requeued
— so a pin Shaper set to start a job on the nodes a plan chose would bind every later run
too. A job Slurm requeues after its node failed, or that a higher partition preempts, would
then wait for those nodes only, and Shaper's own snapshot would plan it nowhere else
(app.shaping.snapshot pins a pending job to its ``required_nodes``). The restart count
tells the run a pin was for from the later ones: a pending job whose count has passed its
pin's, and whose node list is still the one Shaper pinned (an operator's own edit since is
left alone), is reported with its nodes before, and the connector gives them back to Slurm
(``SlurmConnector.read_state``). A pin is lifted even when the run it was for never
started (Slurm requeued the job at launch): a job pinned to the node that holds its
checkpoint image may then start elsewhere, which the move's confirm finds and undoes.

A job Shaper submitted for a move between clusters (``shaper-move:`` in its comment) was
pinned by sbatch's ``--nodelist`` for its first run, with no node list of its own (the
source's are switched off: connectors.slurm.submission): its pin counts as
``shaper-pin:0::`` (pinned to whatever it asks).

Pins set before these stamps existed carry none and are never lifted.
"""

from __future__ import annotations

from dataclasses import dataclass

from connectors.slurm.hostlist import expand_hostlist

STEP = "shaper-step:"
PIN = "shaper-pin:"
SEPARATOR = ";"


def stamps(comment: str) -> list[str]:
    return [word for word in comment.split(SEPARATOR) if word]


def stamp(comment: str, prefix: str) -> str | None:
    """The comment's stamp of this kind (``STEP``, ``PIN``), None when it has none."""
    return next((word for word in stamps(comment) if word.startswith(prefix)), None)


def step_restarts(comment: str, key: str) -> int | None:
    """The restart count the step ``key`` stamped (``shaper-step:<key>:<restarts>``); None
    when the comment has no such stamp."""
    word, prefix = stamp(comment, STEP), f"{STEP}{key}:"
    if word is None or not word.startswith(prefix):
        return None
    count = word[len(prefix) :]
    return int(count) if count.isdigit() else None


def with_stamp(comment: str, prefix: str, new: str | None) -> str:
    """The comment with its stamp of this kind replaced by ``new`` (dropped when None),
    the other words kept in their order."""
    words = stamps(comment)
    at = next((i for i, word in enumerate(words) if word.startswith(prefix)), len(words))
    kept = [word for word in words if not word.startswith(prefix)]
    if new is not None:
        kept.insert(at, new)  # where the old one was: every word before it is kept
    return SEPARATOR.join(kept)


@dataclass(frozen=True)
class Pin:
    restarts: int  # the restart count of the run the pin is for
    before: str  # the job's own ReqNodeList before Shaper's first pin; "" for none
    pinned: str = ""  # the nodes pinned; "" when not recorded (a moved job's submission)

    @property
    def word(self) -> str:
        return f"{PIN}{self.restarts}:{self.before}:{self.pinned}"

    def stale(self, *, restarts: int, required_nodes: str) -> bool:
        """Whether the job has been requeued since the run the pin was for, its node list
        still the one pinned."""
        if restarts <= self.restarts or not required_nodes:
            return False
        return not self.pinned or _same_nodes(self.pinned, required_nodes)


def _same_nodes(one: str, other: str) -> bool:
    try:
        return set(expand_hostlist(one)) == set(expand_hostlist(other))
    except ValueError:
        return one == other


def read_pin(comment: str, *, moved: bool = False, required_nodes: str = "") -> Pin | None:
    """The pin the comment records; for a job submitted for a move (``moved``) with a node
    list and no stamp, the submission's (``shaper-pin:0::``)."""
    word = stamp(comment, PIN)
    if word is None:
        return Pin(restarts=0, before="") if moved and required_nodes else None
    parts = word[len(PIN) :].split(":")
    if len(parts) != 3 or not parts[0].isdigit():
        return None  # not ours to read: left alone
    return Pin(restarts=int(parts[0]), before=parts[1], pinned=parts[2])
