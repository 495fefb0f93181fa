"""FGD's fragmentation with memory counted (``TypicalShape.memory_mib``): a node whose free
memory is below what every job of a shape asks has its free GPUs fragmented for that shape,
as a node without the CPU does; shapes without memory give FGD's own measure."""

from __future__ import annotations

from solver.fragmentation import Fragmentation, least_memory, node_fragmentation, typical_shapes
from solver.greedy.sharing import shapes_of
from solver.instance import GpuModel, Instance, Job, Node, SolverConfig, TypicalShape
from solver.solve import solve
from solver.validate import validate
from tests.solver.test_fractional import _share as running  # a share on its node and GPU

A100 = GpuModel(name="a100", memory_mib=80_000)
CONFIG = SolverConfig(use_cp_sat=False)
HALF = TypicalShape(cpu_milli=1_000, gpu_milli=500, share=1.0, memory_mib=1_000)


def _node(name: str, memory_mib: int, gpus: int = 1) -> Node:
    return Node(
        name=name,
        cluster="c",
        gpu_model="a100",
        gpus=gpus,
        cpu_milli=64_000,
        memory_mib=memory_mib,
    )


def test_a_node_without_the_shapes_memory_has_its_free_gpus_fragmented() -> None:
    # 500 milli free fits the half-GPU shape by GPU and CPU; by memory only with 1,000 MiB.
    assert node_fragmentation([500], 8_000, "a100", (HALF,), free_mem=1_000) == 0
    assert node_fragmentation([500], 8_000, "a100", (HALF,), free_mem=999) == 500
    # Memory not given (None) or a shape without memory (0): FGD's own measure.
    assert node_fragmentation([500], 8_000, "a100", (HALF,)) == 0
    blind = HALF.model_copy(update={"memory_mib": 0})
    assert node_fragmentation([500], 8_000, "a100", (blind,), free_mem=0) == 0


def test_the_cached_measure_keys_memory_only_when_a_shape_carries_it() -> None:
    aware = Fragmentation((HALF,))
    assert aware(free_milli=[500], free_cpu=8_000, model="a100", free_mem=999) == 500
    assert aware(free_milli=[500], free_cpu=8_000, model="a100", free_mem=5_000) == 0
    assert len(aware._cache) == 2  # one entry per memory
    blind = Fragmentation((HALF.model_copy(update={"memory_mib": 0}),))
    assert blind(free_milli=[500], free_cpu=8_000, model="a100", free_mem=999) == 0
    assert blind(free_milli=[500], free_cpu=8_000, model="a100", free_mem=5_000) == 0
    assert len(blind._cache) == 1  # memory left out of the key: one entry for both


def test_least_memory_per_shape() -> None:
    shape = (1_000, 500, 1, ())
    other = (2_000, 1_000, 1, ())
    least = least_memory([(shape, 3_000), (shape, 1_000), (other, 7_000), (shape, 2_000)])
    assert least == {shape: 1_000, other: 7_000}
    (half, whole) = sorted(
        typical_shapes({shape: 3, other: 1}, popularity=1.0, memory=least),
        key=lambda s: s.gpu_milli,
    )
    assert (half.memory_mib, whole.memory_mib) == (1_000, 7_000)
    assert all(s.memory_mib == 0 for s in typical_shapes({shape: 3}, popularity=1.0))


def _share(job_id: str, memory_mib: int) -> Job:
    return Job(
        id=job_id, gpu_milli=500, cpu_milli_per_replica=1_000, memory_mib_per_replica=memory_mib
    )


def test_a_share_goes_where_the_expected_work_keeps_its_memory() -> None:
    # Both nodes leave 500 milli after the share. On n0 its 1,000 MiB leave 500, too little
    # for any half-GPU job of the expected work; n1 keeps 3,000. FGD's own measure ties the
    # two and takes the first node; counting memory takes n1.
    nodes = (_node("n0", 1_500), _node("n1", 4_000))
    job = _share("s", 1_000)
    for shape, expected in ((HALF.model_copy(update={"memory_mib": 0}), "n0"), (HALF, "n1")):
        instance = Instance(
            gpu_models=(A100,), nodes=nodes, jobs=(job,), config=CONFIG, typical_shapes=(shape,)
        )
        plan = solve(instance)
        assert plan.placement["s"] == {expected: 1}
        assert validate(instance, plan) == []


def test_a_whole_gpu_job_goes_where_the_expected_work_keeps_its_memory() -> None:
    # Two 2-GPU nodes; a 1-GPU job of 6,000 MiB. On n0 (8,000 MiB) it would leave 2,000,
    # below the expected 1-GPU work's 4,000, stranding the other GPU; n1 keeps enough.
    whole = TypicalShape(cpu_milli=1_000, share=1.0, memory_mib=4_000)
    nodes = (_node("n0", 8_000, gpus=2), _node("n1", 16_000, gpus=2))
    job = Job(id="w", cpu_milli_per_replica=1_000, memory_mib_per_replica=6_000)
    for shape, expected in ((whole.model_copy(update={"memory_mib": 0}), "n0"), (whole, "n1")):
        instance = Instance(
            gpu_models=(A100,), nodes=nodes, jobs=(job,), config=CONFIG, typical_shapes=(shape,)
        )
        assert solve(instance).placement["w"] == {expected: 1}


def test_shapes_taken_from_the_jobs_carry_memory_with_the_switch() -> None:
    nodes = (_node("n0", 1_500), _node("n1", 4_000))
    jobs = (_share("a", 1_000), _share("b", 2_000))
    blind = Instance(gpu_models=(A100,), nodes=nodes, jobs=jobs, config=CONFIG)
    assert [s.memory_mib for s in shapes_of(blind)] == [0]
    aware = blind.model_copy(
        update={"config": CONFIG.model_copy(update={"fragmentation_memory": True})}
    )
    assert [s.memory_mib for s in shapes_of(aware)] == [1_000]
    # Given shapes win over the jobs' own, switch or not.
    given = aware.model_copy(
        update={"typical_shapes": (HALF.model_copy(update={"memory_mib": 7}),)}
    )
    assert [s.memory_mib for s in shapes_of(given)] == [7]


def test_a_share_moved_across_nodes_goes_where_the_expected_work_keeps_its_memory() -> None:
    # c (600 milli, 5,000 MiB) fits only n0, whose GPU b (500, movable) holds; b may move to
    # n1 or n2 (300 held there by fixed shares), each left with 200 milli free after it. The
    # expected work is 200-milli shares of at least 2,000 MiB: n1 (2,500 MiB) would keep
    # 1,500 and n2 (4,000) 3,000. Blind to memory the two tie and b goes to n1; counting it,
    # n1's last 200 milli would strand, so b goes to n2.
    nodes = (_node("n0", 16_000), _node("n1", 2_500), _node("n2", 4_000))

    jobs = (
        running("b", 500, ("n0", 0), memory_mib_per_replica=1_000, checkpointable=True),
        running("a1", 300, ("n1", 0)),
        running("a2", 300, ("n2", 0)),
        Job(id="c", gpu_milli=600, memory_mib_per_replica=5_000),
    )
    config = CONFIG.model_copy(update={"share_moves_across_nodes": True})
    small = TypicalShape(gpu_milli=200, share=1.0, memory_mib=2_000)
    for shape, expected in ((small.model_copy(update={"memory_mib": 0}), "n1"), (small, "n2")):
        instance = Instance(
            gpu_models=(A100,), nodes=nodes, jobs=jobs, config=config, typical_shapes=(shape,)
        )
        plan = solve(instance)
        assert validate(instance, plan) == []
        assert plan.placement["c"] == {"n0": 1}
        assert plan.placement["b"] == {expected: 1}


def test_of_two_nodes_to_make_room_on_the_one_that_keeps_memory_is_chosen() -> None:
    # c (600 milli, 5,000 MiB) fits nowhere: n0 and n1 each hold a movable 600 share on
    # GPU 0 (b, d) and a fixed 500 on GPU 1; n2 has an idle GPU but 3,000 MiB. Either b
    # moves to n2 and c lands on n0, or d moves and c lands on n1; each leaves 900 milli
    # free on its node. n0 (6,500 MiB) would keep 1,500, below the expected work's 2,000,
    # n1 (8,000) 3,000. Blind to memory the options tie and the first (n0) wins; counting
    # memory, n1.
    nodes = (_node("n0", 6_500, gpus=2), _node("n1", 8_000, gpus=2), _node("n2", 3_000))

    jobs = (
        running("b", 600, ("n0", 0), memory_mib_per_replica=1_000, checkpointable=True),
        running("f0", 500, ("n0", 1)),
        running("d", 600, ("n1", 0), memory_mib_per_replica=1_000, checkpointable=True),
        running("f1", 500, ("n1", 1)),
        Job(id="c", gpu_milli=600, memory_mib_per_replica=5_000),
    )
    config = CONFIG.model_copy(update={"share_moves_across_nodes": True})
    small = TypicalShape(gpu_milli=200, share=1.0, memory_mib=2_000)
    for shape, expected, moved in (
        (small.model_copy(update={"memory_mib": 0}), "n0", "b"),
        (small, "n1", "d"),
    ):
        instance = Instance(
            gpu_models=(A100,), nodes=nodes, jobs=jobs, config=config, typical_shapes=(shape,)
        )
        plan = solve(instance)
        assert validate(instance, plan) == []
        assert plan.placement["c"] == {expected: 1}
        assert plan.placement[moved] == {"n2": 1}
