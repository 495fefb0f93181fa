"""Connectors: one per scheduler kind. They speak `connectors.base`, never `app`."""
