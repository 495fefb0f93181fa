"""Connectors: one per scheduler kind. They speak `wire` and implement `connectors.base`;
they never import `app`, nor `agent` (a peer)."""
