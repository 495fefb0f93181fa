"""Forecasts the shaping cycle and the simulator share: service demand (``demand``) and
block-job durations (``duration``), with the error of each tracked.

A top-level package, not part of ``solver``: the solver imports only ortools and pydantic
(DESIGN.md), and these estimators need statsmodels. ``app`` and ``sim`` both import it, so
the control plane and a replay forecast the same way; it imports neither of them (nor
``solver``): plain numbers in, plain numbers out.
"""
