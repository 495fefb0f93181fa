"""The FGD workload-inflation experiment on the Alibaba 2023 trace (ATC'23, Weng et al.).

A re-implementation, in numpy, of the experiment of the FGD paper's simulator
(``hkust-adsl/kubernetes-scheduler-simulator``: ``experiments/run_scripts/
generate_run_scripts.py``, ``scripts/generate_config_and_run.py``,
``pkg/simulator/core.go``, ``pkg/utils/frag.go``, ``pkg/simulator/plugin/*_score.go``).
Pods ask for CPU, memory and whole GPUs or a fraction of one; they arrive until their GPU
requests reach 130 % of the cluster's GPU capacity, never leave, and a pod that fits
nowhere stays unallocated. The figure is the GPU capacity left unallocated, per placement
policy. It is a simulator of its own, beside :mod:`sim.engine`: its policies are the
reference's and Shaper's stand-ins for them; ``shaper-solver`` (accepted, not run by
default) places the GPU pods with the solver itself (:mod:`sim.fgd.through_solver`),
through ``solver.Instance``'s fractional GPUs (``Job.gpu_milli``).

One module per part, in the order a run uses them:

* :mod:`sim.fgd.pod`: a pod's request, and the units (milli-GPUs);
* :mod:`sim.fgd.cluster`: the node list and every node's free capacity; feasibility;
* :mod:`sim.fgd.workload`: the pod list, shuffled and inflated to the target;
* :mod:`sim.fgd.fragmentation`: the typical pods and a node's GPU fragmentation for them;
* :mod:`sim.fgd.scores`: one node-scoring function per policy;
* :mod:`sim.fgd.placement`: the policies by name (:data:`PLACEMENTS`) and the tie-break;
* :mod:`sim.fgd.migration`, :mod:`sim.fgd.preemption`, :mod:`sim.fgd.shaper`: what
  Shaper's policies do when a pod fits nowhere;
* :mod:`sim.fgd.through_solver`: ``shaper-solver``, a batch of pods per ``solve()``;
* :mod:`sim.fgd.experiment`: one run; :mod:`sim.fgd.results`: its figures and the
  comparison with the baselines; :mod:`sim.fgd.report`: the CLI's tables.

Where this differs from the reference: the reference's pod shuffle is seeded from the clock
(its seed drives the appended pods and the node order), ours is seeded; its random numbers
differ from numpy's; the reference reports the median of ten seeds (42-51), the CLI runs one
seed unless given ``--seeds``. Published reference results for the default trace at 130 %:
dot-product leaves about 8.7-9.5 % of the GPUs unallocated (540-590), FGD about 4.6 %
(≈ 285).
"""

from sim.fgd.cluster import Cluster
from sim.fgd.experiment import ALL_POLICIES, KNOWN_POLICIES, TIE_BREAKS, run_inflation
from sim.fgd.fragmentation import TaskMix
from sim.fgd.placement import BASELINES, PLACEMENTS, POLICIES, select_node
from sim.fgd.pod import FULL, MAX_GPUS, Pod
from sim.fgd.results import InflationResult, SeedSpread, compare_to_baselines, spread_over_seeds
from sim.fgd.shaper import MAKE_ROOM, SHAPER_POLICIES
from sim.fgd.workload import MOVABLE, read_pods

__all__ = [
    "ALL_POLICIES",
    "BASELINES",
    "FULL",
    "KNOWN_POLICIES",
    "MAKE_ROOM",
    "MAX_GPUS",
    "MOVABLE",
    "PLACEMENTS",
    "POLICIES",
    "SHAPER_POLICIES",
    "TIE_BREAKS",
    "Cluster",
    "InflationResult",
    "Pod",
    "SeedSpread",
    "TaskMix",
    "compare_to_baselines",
    "read_pods",
    "run_inflation",
    "select_node",
    "spread_over_seeds",
]
