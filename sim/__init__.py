"""Trace-driven simulation of the shaping policies (``shaper sim``).

``sim.engine`` runs the discrete-event loop; ``sim.adapter`` turns its state into a
``solver.Instance`` each cycle and the solver's ``Plan`` back into actions; ``sim.workload``
and ``sim.scenario`` describe the work; ``sim.traces`` loads real traces; ``sim.metrics`` and
``sim.report`` turn a run into figures; ``sim.fgd`` is the FGD placement experiment on
the Alibaba 2023 trace; ``sim.cli`` is the ``shaper sim`` command group.
"""
