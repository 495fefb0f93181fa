"""The node agent: runs workloads under management and checkpoints/restores them.

Imports only the standard library, pydantic and connectors.base (never `app`).
"""
