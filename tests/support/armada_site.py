"""The Armada site the connector tests share: two executor clusters on the test server
(tests/support/armada_server.py) and a connector configured for them.

* ``exec-a``: nodes ``a1`` and ``a2``, 8 H100 each;
* ``exec-b``: node ``b1``, 4 A100;
* queues ``research`` and ``prod`` (followed: job sets ``train`` and ``sweep`` of
  ``research``, ``serve`` of ``prod``) and the cordoned hold queue ``shaper-held``.

Every node carries the labels the connector pins with (``kubernetes.io/hostname``, the
executor label) and the GPU model label, as an executor's nodes would.
"""

from __future__ import annotations

from typing import Any

from connectors.armada import ArmadaConnector, ArmadaConnectorConfig
from tests.support.armada_server import ArmadaTestServer

CLUSTER = "armada-test"
HOLD_QUEUE = "shaper-held"
EXECUTOR_LABEL = "shaper.io/armada-executor"
GPU_LABEL = "nvidia.com/gpu.product"
NODES = (
    ("exec-a", "a1", 8, "H100"),
    ("exec-a", "a2", 8, "H100"),
    ("exec-b", "b1", 4, "A100"),
)
JOB_SETS = (("research", "train"), ("research", "sweep"), ("prod", "serve"))


def start_server() -> ArmadaTestServer:
    server = ArmadaTestServer()
    server.create_queue("research")
    server.create_queue("prod")
    server.create_queue(HOLD_QUEUE, cordoned=True)
    for executor, name, gpus, model in NODES:
        labels = {"kubernetes.io/hostname": name, EXECUTOR_LABEL: executor, GPU_LABEL: model}
        server.add_node(executor, name, gpus=gpus, **labels)
    server.start()
    return server


def config_for(server: ArmadaTestServer, **overrides: Any) -> ArmadaConnectorConfig:
    fields: dict[str, Any] = {
        "cluster": CLUSTER,
        "url": server.address,
        # The connector's own default. 5 s, as before, passed a first read's GetQueues
        # deadline once in a clean-clone run on two loaded cores (the stream answered by
        # this process's test server; not seen again in 15 runs with six busy loops); the
        # tests of deadlines set their own (1 s).
        "timeout_s": 20.0,
        "job_sets": [{"queue": q, "job_set": s} for q, s in JOB_SETS],
        "hold_queue": HOLD_QUEUE,
        "nodes": [
            {"name": name, "executor": executor, "gpu_model": model, "gpu_count": gpus}
            for executor, name, gpus, model in NODES
        ],
        "mapping": {"queue_priorities": {"prod": 100, "research": 10}},
        **overrides,
    }
    return ArmadaConnectorConfig.model_validate(fields)


def connector_for(server: ArmadaTestServer, **overrides: Any) -> ArmadaConnector:
    return ArmadaConnector(config_for(server, **overrides))
