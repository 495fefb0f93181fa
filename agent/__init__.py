"""The node agent: runs workloads under management and checkpoints/restores them.

Speaks `wire` (step protocol, queue names, executor runtime, node samples) and never
imports `app` or `connectors`, its peers.
"""
