"""Constraint families of :class:`solver.model.PlacementModel`.

Each module has ``build(model) -> list[(coefficient, variable)]``: it adds its constraints
to ``model.model`` and returns its contribution to the (maximised) objective.
"""
