"""The wire contract between the control plane, connectors and node agents.

One definition of everything that crosses a process boundary, imported by every side:

* ``wire.telemetry`` — the telemetry schemas connectors and agents push, and the enums
  they use;
* ``wire.steps`` — the saga step protocol: requests, reports, outcomes, step names;
* ``wire.queues`` — queue and task names, and which token scope answers for a queue;
* ``wire.executor`` — the Celery runtime that agents and connectors serve their steps with.
* ``wire.checkpoint_image`` — the kubelet checkpoint images' resume pointer and the node
  agent's HTTP call that takes them (issue 15).

Imports point down only: ``wire`` needs pydantic (and Celery, when an executor is built),
never ``app``, ``agent`` or ``connectors``, which sit above it as peers.
"""
