"""The node agent: runs workloads under management and checkpoints/restores them; on a
Kubernetes node, takes kubelet checkpoints of pods as images (agent.kubelet, agent.api).

Speaks `wire` (step protocol, queue names, executor runtime, node samples) and never
imports `app` or `connectors`, its peers.
"""
