"""Per-job speeds through the simulator: the adapter gives the solver each job's own speeds
(``BlockJob.speeds`` → ``Instance.speeds``), and a job that could only start on GPUs slow for
it moves onto faster ones as they free up (``SolverConfig.upgrades``, on by default),
where a scheduler that decides once leaves it crawling."""

from __future__ import annotations

from dataclasses import replace

from sim.adapter import SolverPlanner
from sim.run import simulate
from sim.workload import GpuModel, Workload

from .builders import HOUR, job, workload

# The K80 runs this job type at a tenth of its V100 speed (ResNet-18 with batch size 256
# runs at 0.08 on Gavel's measurements); the model's own speed says 0.22.
SLOW_FOR_IT = (("K80", 0.1),)


def _two_models(horizon_h: float = 48.0) -> Workload:
    first = job("first", gpus=1, hours=1.0)
    long = replace(
        job("long", gpus=1, hours=20.0, at_h=0.01, checkpointable=True), speeds=SLOW_FOR_IT
    )
    return workload(
        [first, long],
        nodes=(("v100", 1), ("k80", 1)),
        model="V100",
        extra_models=(GpuModel(name="K80", speed=0.22),),
        node_models={"k80": "K80"},
        horizon_h=horizon_h,
    )


def test_the_solver_gets_each_jobs_own_speeds() -> None:
    planner = SolverPlanner("shaper")
    sim = simulate(_two_models(horizon_h=0.5), planner, drain=False)  # both still run
    assert planner.instance(sim).speeds == {"long": {"K80": 0.1}}


def test_a_job_started_on_slow_gpus_moves_up_when_faster_ones_free() -> None:
    wl = _two_models()
    ends = {}
    for policy in ("priority", "shaper"):
        sim = simulate(wl, policy)
        state = sim.jobs["long"]
        ends[policy] = (state.end_time or 0.0) / HOUR, state.migrations
    # priority: on the K80 for good, 20 h of V100 work at 0.1.
    assert ends["priority"][0] > 150 and ends["priority"][1] == 0
    # shaper: on the V100 once "first" is done (about 1 h, then the next plan).
    assert ends["shaper"][0] < 25 and ends["shaper"][1] == 1
    off = replace(wl, solver_config={"upgrades": False})
    assert (simulate(off, "shaper").jobs["long"].end_time or 0.0) / HOUR > 150
