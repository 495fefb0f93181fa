"""The CP-SAT placement model, aggregated so that 10,000 GPUs × 10,000 jobs stays small.

Aggregation
-----------
* A **pool** is the free capacity of one node group (cluster, GPU model, labels, taints):
  how many ready nodes have how many free GPUs in the base state. Value depends only on
  the group (the GPU model's speed), so the model counts what goes into a group rather
  than into a node, and checks packing per free-GPU level.
* A **job class** is a set of pending block jobs that are interchangeable for the model:
  same compatible groups, shape (replicas, GPUs/CPU/memory per replica, spread limit,
  whether it runs one replica per node), weight, team (when a team constraint names it),
  overdue flag and look-ahead reserves.
  An elastic service's missing replicas form a class of their own (one replica per item).
  Frozen jobs (``Instance.is_frozen``) are in no class and no evacuation: the model
  cannot start, move or stop them, as if their variables were fixed to what they hold.
* An **option** is (class, pool, nodes per job): ``count`` jobs of the class each placed as
  ``nodes`` equal chunks in that group. Single-node placement is ``nodes = 1``; a gang is
  split over the fewest nodes its chunk fits, and a gang that runs one replica per node
  (``Instance.one_replica_per_node``) over a node per replica, where the group has that
  many nodes with room for a replica (else it gets no option there). The model's integer
  variables are these counts, so its size is classes × pools, not jobs × nodes.

Constraint families (``solver/constraints/``), each ``build()`` returning its objective terms:
``assignment`` (each class placed at most its size; the value of what is placed),
``capacity`` (per pool: a packing condition over its free-GPU levels for the chunk sizes,
tight for power-of-two sizes, plus CPU and memory totals), ``quota`` (team caps, and the
GPUs a team must start so that the greedy's preemptions stay within its guarantee),
``lookahead`` (capacity held for elastic services' coming peaks), ``migration`` (how many
nodes of each evacuable kind to empty by moving their checkpointable residents within the
node group, under the disruption budget, at their migration cost) and ``fragmentation``
(whole free nodes kept). ``overdue`` (as many jobs past their max queue wait placed as any
solution places) is added after ``build()``, by the overdue pass of ``solver.solve``
(``solver.overdue_pass``), since its bound comes from a first solve of the built model.
Where a gang that runs one replica per node has an option, ``build()`` also adds rows that
keep its distinct nodes (``PlacementModel._add_spread_rows``): ``capacity``'s per-level
counts would let its replicas share a node while other classes take the rest, and the
realisation would then drop it. Without such a gang the model has none of them.

The model is a relaxation of node-level packing where sizes are not a divisible chain or
CPU/memory bind, so its solution is *realised* node by node afterwards (first-fit
decreasing within each group, then a greedy fill); the realised plan is legal by
construction and checked by ``solver.validate``.

Objective coefficients are the ``solver.objective`` terms scaled by
``solver.objective.SCALE`` to integers. The model's inputs are gathered from the greedy
engine by ``solver.model_inputs``; a solution becomes a placement in ``solver.extraction``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ortools.sat.python import cp_model

from solver.compat import Compatibility, job_signature
from solver.constraints import (
    assignment,
    capacity,
    fragmentation,
    lookahead,
    migration,
    quota,
)
from solver.instance import Instance, Job
from solver.state import UNLIMITED, ClusterState

# The families ``build()`` adds, in this order (the order fixes the model's proto).
FAMILIES = (assignment, migration, capacity, quota, lookahead, fragmentation)


@dataclass
class Pool:
    """Free capacity of one node group: how many ready nodes have how many free GPUs."""

    index: int
    group: int
    cluster: str
    speed: float
    model: str = ""  # the GPU model's name (a job's own speed there: JobClass.speeds)
    nodes: list[int] = field(default_factory=list)
    levels: dict[int, int] = field(default_factory=dict)  # free GPUs -> nodes
    free_cpu: int | None = None  # total, None when it cannot bind
    free_mem: int | None = None
    whole_nodes: int = 0
    partial_gpus: int = 0  # free GPUs on nodes that are partly used
    max_node_gpus: int = 0
    evacuable_gpus: int = 0  # size of the largest node migration could empty
    evacuable_total: int = 0  # GPUs migration could free in the pool

    @property
    def max_free(self) -> int:
        return max(self.levels, default=0)

    @property
    def free_gpus(self) -> int:
        return sum(free * count for free, count in self.levels.items())


@dataclass
class JobClass:
    index: int
    jobs: list[Job]
    groups: frozenset[int]
    replicas: int
    gpus_per_replica: int
    cpu_per_replica: int
    mem_per_replica: int
    max_nodes: int | None
    weight: float
    boost: float
    team: str
    reserves: tuple[int, ...]  # look-ahead reserves this class must keep off
    elastic: bool = False
    overdue: bool = False  # pending past its SLA's max queue wait
    # Its jobs run at most one replica on a node (``Instance.one_replica_per_node``).
    one_replica_per_node: bool = False
    size: int = 0  # jobs in the class, or missing replicas for an elastic class
    # Where its image is, and what placing one of its jobs in another cluster costs
    # (objective units: ``solver.objective``'s "started away" term).
    home_cluster: str | None = None
    remote_cost: float = 0.0
    # Its jobs' own speeds on GPU models (``Instance.own_speeds``; empty: the models').
    speeds: dict[str, float] = field(default_factory=dict)

    @property
    def total_gpus(self) -> int:
        return self.replicas * self.gpus_per_replica

    def speed_on(self, pool: Pool) -> float:
        return self.speeds.get(pool.model, pool.speed) if self.speeds else pool.speed


@dataclass
class Option:
    job_class: JobClass
    pool: Pool
    nodes: int  # nodes per job
    chunk_replicas: int  # replicas per node
    var: cp_model.IntVar
    upper: int

    @property
    def chunk_gpus(self) -> int:
        return self.chunk_replicas * self.job_class.gpus_per_replica


@dataclass
class Reserve:
    """GPUs of some groups to keep from long immovable jobs (an elastic forecast)."""

    groups: frozenset[int]
    gpus: int


@dataclass
class Evacuation:
    """Identical evacuable nodes of one pool: same size, free GPUs and movable residents.

    Evacuating one moves all its residents (checkpointable, ``migratable`` single-node jobs)
    elsewhere in the same node group, which turns a partly used node into a whole free one.
    """

    index: int
    pool: Pool
    node_gpus: int
    free_gpus: int
    residents: tuple[tuple[int, int, int], ...]  # (GPUs, CPU, memory) per resident job
    nodes: list[int] = field(default_factory=list)  # cheapest to move first
    costs: list[float] = field(default_factory=list)
    var: cp_model.IntVar | None = None

    @property
    def moves(self) -> int:
        return len(self.residents)


def chunk_fit(pool: Pool, job_class: JobClass) -> int:
    """Replicas of the class the emptiest node of the pool holds (GPUs only)."""
    return max(pool.max_free, pool.evacuable_gpus) // job_class.gpus_per_replica


def build_pools(state: ClusterState, jobs: list[Job] | None = None) -> list[Pool]:
    """One pool per node group, with its free nodes counted by free GPUs.

    CPU (memory) gets a pool total only where it can bind: on a node where some job in
    ``jobs`` would run out of CPU before it runs out of free GPUs.
    """
    nodes = state.instance.nodes
    groups = state.compat.groups
    cpu_per_gpu = max((j.cpu_milli_per_replica / j.gpus_per_replica for j in jobs or ()), default=0)
    mem_per_gpu = max(
        (j.memory_mib_per_replica / j.gpus_per_replica for j in jobs or ()), default=0
    )
    by_group: dict[int, Pool] = {}
    cpu_binds: set[int] = set()
    mem_binds: set[int] = set()
    for node_index, node in enumerate(nodes):
        free_gpus = state.free_gpus[node_index]
        if not state.ready[node_index] or free_gpus <= 0:
            continue
        group = state.compat.group_of_node[node_index]
        pool = by_group.get(group)
        if pool is None:
            pool = Pool(
                index=len(by_group),
                group=group,
                cluster=groups[group].cluster,
                speed=groups[group].gpu_model.speed,
                model=groups[group].gpu_model.name,
                free_cpu=0,
                free_mem=0,
            )
            by_group[group] = pool
        pool.nodes.append(node_index)
        pool.levels[free_gpus] = pool.levels.get(free_gpus, 0) + 1
        pool.max_node_gpus = max(pool.max_node_gpus, node.gpus)
        if free_gpus == node.gpus:
            pool.whole_nodes += 1
        else:
            pool.partial_gpus += free_gpus
        free_cpu = state.free_cpu[node_index]
        free_mem = state.free_mem[node_index]
        pool.free_cpu = (pool.free_cpu or 0) + min(free_cpu, UNLIMITED // 4)
        pool.free_mem = (pool.free_mem or 0) + min(free_mem, UNLIMITED // 4)
        if free_cpu < free_gpus * cpu_per_gpu:
            cpu_binds.add(group)
        if free_mem < free_gpus * mem_per_gpu:
            mem_binds.add(group)
    for group, pool in by_group.items():
        if group not in cpu_binds:
            pool.free_cpu = None
        if group not in mem_binds:
            pool.free_mem = None
    return list(by_group.values())


def build_classes(
    instance: Instance,
    compat: Compatibility,
    jobs: list[Job],
    reserves: dict[str, tuple[int, ...]],
    teams: set[str] | None = None,
) -> list[JobClass]:
    """Group interchangeable jobs; ``teams`` are the teams a constraint counts by name."""
    by_key: dict[tuple[object, ...], JobClass] = {}
    for job in jobs:
        weight = instance.weight(job)
        overdue = instance.is_overdue(job)
        boost = instance.boost(job)
        capped = teams is None or job.team in teams
        remote_cost = 0.0
        if job.home_cluster is not None:
            remote_cost = weight * job.total_gpus * instance.transfer_per_gpu(job)
        speeds = instance.own_speeds(job)
        one_per_node = job.replicas > 1 and job.id in instance.one_replica_per_node
        key = (
            job_signature(job),
            tuple(sorted(speeds.items())),
            job.home_cluster,
            remote_cost,
            job.replicas,
            job.gpus_per_replica,
            job.cpu_milli_per_replica,
            job.memory_mib_per_replica,
            job.max_nodes,
            weight,
            overdue,
            boost,
            job.team if capped else None,
            reserves[job.id],
            one_per_node,
        )
        job_class = by_key.get(key)
        if job_class is None:
            job_class = JobClass(
                index=len(by_key),
                jobs=[],
                groups=frozenset(compat.groups_for(job)),
                replicas=job.replicas,
                gpus_per_replica=job.gpus_per_replica,
                cpu_per_replica=job.cpu_milli_per_replica,
                mem_per_replica=job.memory_mib_per_replica,
                max_nodes=job.max_nodes,
                weight=weight,
                boost=boost,
                team=job.team,
                reserves=reserves[job.id],
                overdue=overdue,
                one_replica_per_node=one_per_node,
                home_cluster=job.home_cluster,
                remote_cost=remote_cost,
                speeds=dict(speeds),
            )
            by_key[key] = job_class
        job_class.jobs.append(job)
        job_class.size += 1
    return list(by_key.values())


def elastic_class(
    instance: Instance, compat: Compatibility, job: Job, missing: int, index: int
) -> JobClass:
    return JobClass(
        index=index,
        jobs=[job],
        groups=frozenset(compat.groups_for(job)),
        replicas=1,
        gpus_per_replica=job.gpus_per_replica,
        cpu_per_replica=job.cpu_milli_per_replica,
        mem_per_replica=job.memory_mib_per_replica,
        max_nodes=1,
        weight=instance.weight(job),
        boost=1.0,
        team=job.team,
        reserves=(),
        elastic=True,
        size=missing,
    )


class PlacementModel:
    """Variables and constraints; ``build()`` assembles the objective from the families."""

    def __init__(
        self,
        instance: Instance,
        pools: list[Pool],
        classes: list[JobClass],
        reserves: list[Reserve],
        team_room: dict[str, int],
        team_min_start: dict[str, int] | None = None,
        evacuations: list[Evacuation] | None = None,
        migration_budget: int = 0,
    ) -> None:
        self.instance = instance
        self.config = instance.config
        self.pools = pools
        self.classes = classes
        self.reserves = reserves
        self.team_room = team_room
        self.team_min_start = team_min_start or {}
        self.evacuations = evacuations or []
        self.evacuations_by_pool: dict[int, list[Evacuation]] = {}
        for evacuation in self.evacuations:
            self.evacuations_by_pool.setdefault(evacuation.pool.index, []).append(evacuation)
        self.migration_budget = migration_budget
        self.model = cp_model.CpModel()
        self.options: list[Option] = []
        self.options_by_pool: dict[int, list[Option]] = {}
        self.options_by_class: dict[int, list[Option]] = {}
        self.objective_terms: list[tuple[int, cp_model.IntVar]] = []
        self.whole_nodes_used: dict[int, cp_model.IntVar] = {}  # pool index -> var
        self.overdue_required = 0  # overdue jobs the model must place (overdue pass)
        self.overdue_proven = True  # that count is the most any solution places

    def _make_options(self) -> None:
        pool_by_group = {pool.group: pool for pool in self.pools}
        for job_class in self.classes:
            for group in sorted(job_class.groups):
                pool = pool_by_group.get(group)
                if pool is None:
                    continue
                fit = chunk_fit(pool, job_class)
                if fit <= 0:
                    continue
                if job_class.elastic:
                    nodes, chunk = 1, 1
                    room = pool.free_gpus + pool.evacuable_total
                    upper = min(job_class.size, room // job_class.gpus_per_replica)
                else:
                    split = self._split(job_class, fit, self._nodes_for(job_class, pool))
                    if split is None:
                        continue
                    nodes, chunk = split
                    room = pool.free_gpus + pool.evacuable_total
                    upper = min(job_class.size, room // job_class.total_gpus)
                if upper <= 0:
                    continue
                var = self.model.new_int_var(
                    0, upper, f"place_c{job_class.index}_g{pool.group}_k{nodes}"
                )
                option = Option(job_class, pool, nodes, chunk, var, upper)
                self.options.append(option)
                self.options_by_pool.setdefault(pool.index, []).append(option)
                self.options_by_class.setdefault(job_class.index, []).append(option)

    def _nodes_for(self, job_class: JobClass, pool: Pool) -> int:
        """Nodes of the pool a job of the class may split over: all of them, or for a job
        that runs one replica per node those with room for a replica, now or once emptied
        by migration (each takes a chunk of its own, so a node counts once however much
        room it has)."""
        if not job_class.one_replica_per_node:
            return len(pool.nodes)
        need = job_class.gpus_per_replica
        able = sum(count for free, count in pool.levels.items() if free >= need)
        for evacuation in self.evacuations_by_pool.get(pool.index, []):
            if evacuation.free_gpus < need <= evacuation.node_gpus:
                able += len(evacuation.nodes)
        return able

    @staticmethod
    def _split(job_class: JobClass, fit: int, pool_nodes: int) -> tuple[int, int] | None:
        """Fewest nodes over which the job splits evenly with chunks that fit a node; a
        node per replica for a job that runs one replica per node (None where the pool
        has too few nodes or ``max_nodes`` allows too few: the job waits in this pool)."""
        replicas = job_class.replicas
        limit = job_class.max_nodes if job_class.max_nodes is not None else replicas
        if job_class.one_replica_per_node and replicas > 1:
            return (replicas, 1) if replicas <= min(limit, pool_nodes) else None
        for nodes in range(1, min(limit, replicas, pool_nodes) + 1):
            if replicas % nodes == 0 and replicas // nodes <= fit:
                return nodes, replicas // nodes
        return None

    def build(self) -> None:
        """Options, then every constraint family, then the objective they contribute."""
        self._make_options()
        for family in FAMILIES:
            self.objective_terms.extend(family.build(self))
        self._add_spread_rows()
        self.maximize()

    def _add_spread_rows(self) -> None:
        """``capacity``'s rows again, less what a gang that runs one replica per node
        (``Instance.one_replica_per_node``) takes from its distinct nodes: nothing where no
        such gang has an option, so the model is then the same as without this step.

        ``capacity`` counts free GPUs per level, so it lets two replicas of one such gang
        share a node with room for both while other classes take the other nodes; the
        realisation (``solver.extraction``) then finds too few distinct nodes for the gang
        and the model's count is lost. Placing one gang of r replicas of g GPUs on a set S
        of r distinct nodes leaves, on each node of S, only f - g free for everything
        else, so for every threshold t of ``capacity`` (items of at least t GPUs)::

            everything else ≤ Σ_{v∉S} maxfill(f_v) + Σ_{v∈S} maxfill(f_v - g)
                            = room - Σ_{v∈S} (maxfill(f_v) - maxfill(f_v - g))

        and the same with ⌊f/t⌋ for the count of items. S is unknown, so the rows take the
        r nodes that lose least (the bound stays valid: a necessary condition of any
        node-level placement, and they cut off no plan the realisation could make). Moved
        to the left, the gang's own GPUs included, a row is ``capacity``'s row plus
        ``excess × present``, where ``excess`` is what the gang loses beyond its own GPUs
        (zero where it may pack: no row then) and ``present`` is 1 when a gang of that
        shape is placed in the group. The competition is joint: the row counts every other
        class's items at once, which a per-option bound on nodes with room does not.
        """
        for pool in self.pools:
            options = self.options_by_pool.get(pool.index, [])
            shapes: dict[tuple[int, int], list[Option]] = {}
            for option in options:
                if option.job_class.one_replica_per_node:
                    key = (option.nodes, option.chunk_gpus)
                    shapes.setdefault(key, []).append(option)
            if not shapes:
                continue
            evacuations = [
                (e, e.var)
                for e in self.evacuations_by_pool.get(pool.index, [])
                if e.var is not None
            ]
            # As ``capacity``'s: the chunk sizes placed here and the residents moved here.
            sizes = sorted(
                {o.chunk_gpus for o in options}
                | {r[0] for e, _ in evacuations for r in e.residents},
                reverse=True,
            )
            states = _node_states(pool, [e for e, _ in evacuations])
            for (replicas, gpus), alike in sorted(shapes.items()):
                excesses = {t: _spread_excess(states, sizes, (replicas, gpus, t)) for t in sizes}
                if not any(gpu > 0 or count > 0 for gpu, count in excesses.values()):
                    continue  # the gang loses no more than its own GPUs: ``capacity`` holds
                present = self._present(pool, replicas, gpus, alike)
                for threshold, excess in excesses.items():
                    if excess[0] <= 0 and excess[1] <= 0:
                        continue
                    name = f"g{pool.group}_k{replicas}x{gpus}_s{threshold}"
                    self._add_spread_row(pool, evacuations, sizes, threshold, excess, present, name)
            self._add_gang_slot_rows(pool, [o for alike in shapes.values() for o in alike], states)

    def _add_gang_slot_rows(
        self, pool: Pool, spread: list[Option], states: list[tuple[int, tuple[int, ...]]]
    ) -> None:
        """Such gangs against each other, which ``_add_spread_rows`` (a gang against all
        else) does not see: two gangs of three replicas cannot both use the one node of
        three with room for a single replica. Count a node's slots of g GPUs (⌊f/g⌋, for
        each chunk size g of such gangs). A gang puts at most one replica on a node, so on
        the M nodes with at least t slots at most M of its r replicas, and the rest on
        nodes with fewer, whose slots C number at most: ``Σ max(0, r - M) × count ≤ C``
        over the gangs of chunks of at least g GPUs (each takes a slot at least), for
        every t. Over all t this is the exact condition for gangs of one shape alone
        (r × count ≤ Σ_v min(count, slots_v)); rows that no counts can break are left out.
        """
        for level in sorted({o.chunk_gpus for o in spread}):
            slots = [(n, max(f // level for f in frees)) for n, frees in states]
            for least in sorted({s for _, s in slots if s > 0}):
                many = sum(n for n, s in slots if s >= least)
                few = sum(n * s for n, s in slots if s < least)
                terms = [
                    (o.nodes - many, o) for o in spread if o.chunk_gpus >= level and o.nodes > many
                ]
                if sum(k * o.upper for k, o in terms) <= few:
                    continue
                self.model.add(sum(k * o.var for k, o in terms) <= few).with_name(
                    f"spread_slots_g{pool.group}_s{level}_t{least}"
                )

    def _present(
        self, pool: Pool, replicas: int, gpus: int, alike: list[Option]
    ) -> cp_model.LinearExprT:
        """1 when a gang of this shape is placed in the pool: the count itself where one
        option of at most one job has the shape (no new variable), else 1 - ``absent``, a
        Boolean that any count of the shape forces to 0. Written with ``absent`` so that
        every new coefficient but the excess's is non-negative: rounding an LP solution
        down (``solver.relaxation``) then errs towards "placed", the safe side."""
        if len(alike) == 1 and alike[0].upper == 1:
            return alike[0].var
        absent = self.model.new_bool_var(f"spread_absent_g{pool.group}_k{replicas}x{gpus}")
        for option in alike:
            self.model.add(option.var + option.upper * absent <= option.upper).with_name(
                f"spread_absent_g{pool.group}_c{option.job_class.index}"
            )
        return 1 - absent

    def _add_spread_row(
        self,
        pool: Pool,
        evacuations: list[tuple[Evacuation, cp_model.IntVar]],
        sizes: list[int],
        threshold: int,
        excess: tuple[int, int],
        present: cp_model.LinearExprT,
        name: str,
    ) -> None:
        """``capacity``'s GPU and count rows of one threshold, evacuations included, each
        plus its excess (GPUs, nodes) times ``present``, where the excess is positive."""
        allowed = [s for s in sizes if s >= threshold]
        gpu_excess, count_excess = excess
        placed: list[cp_model.LinearExprT] = [gpu_excess * present]
        count: list[cp_model.LinearExprT] = [count_excess * present]
        for o in self.options_by_pool[pool.index]:
            if o.chunk_gpus >= threshold:
                placed.append(o.nodes * o.chunk_gpus * o.var)
                count.append(o.nodes * o.var)
        for e, var in evacuations:
            moved = sum(r[0] for r in e.residents if r[0] >= threshold)
            moved_count = sum(1 for r in e.residents if r[0] >= threshold)
            gained = capacity.maxfill(e.node_gpus, allowed) - capacity.maxfill(e.free_gpus, allowed)
            gained_nodes = e.node_gpus // threshold - e.free_gpus // threshold
            placed.append((moved - gained) * var)
            count.append((moved_count - gained_nodes) * var)
        room = sum(n * capacity.maxfill(free, allowed) for free, n in pool.levels.items())
        nodes_able = sum(n * (free // threshold) for free, n in pool.levels.items())
        if gpu_excess > 0:
            self.model.add(sum(placed) <= room).with_name(f"spread_capacity_{name}")
        if count_excess > 0:
            self.model.add(sum(count) <= nodes_able).with_name(f"spread_chunks_{name}")

    def maximize(self) -> None:
        """Set (or set back, after the overdue pass's first solve) the model's objective."""
        self.model.maximize(sum(coef * var for coef, var in self.objective_terms))


def _node_states(pool: Pool, evacuations: list[Evacuation]) -> list[tuple[int, tuple[int, ...]]]:
    """The pool's nodes as (how many, the free GPUs each may have): its level, or for a
    node migration may empty (``Evacuation``) also its whole size."""
    counts = dict(pool.levels)
    states: list[tuple[int, tuple[int, ...]]] = []
    for e in evacuations:
        if e.free_gpus in counts:  # counted at its level when it has free GPUs
            counts[e.free_gpus] = max(0, counts[e.free_gpus] - len(e.nodes))
        states.append((len(e.nodes), (e.free_gpus, e.node_gpus)))
    states.extend((n, (free,)) for free, n in counts.items() if n > 0)
    return states


def _spread_excess(
    states: list[tuple[int, tuple[int, ...]]], sizes: list[int], shape: tuple[int, int, int]
) -> tuple[int, int]:
    """What a gang of ``shape`` (replicas, GPUs each, threshold) takes from the items of
    at least the threshold beyond its own, in GPUs and in items, on the distinct nodes
    that lose least (``PlacementModel._add_spread_rows``); (0, 0) if too few nodes."""
    replicas, gpus, threshold = shape
    allowed = [s for s in sizes if s >= threshold]
    own = 1 if gpus >= threshold else 0  # the gang's chunks are items of these rows
    gpu_loss = _least_loss(states, replicas, gpus, lambda f: capacity.maxfill(f, allowed))
    count_loss = _least_loss(states, replicas, gpus, lambda f: f // threshold)
    if gpu_loss is None or count_loss is None:
        return 0, 0  # too few nodes with room: the class has no option here anyway
    return gpu_loss - own * replicas * gpus, count_loss - own * replicas


def _least_loss(
    states: list[tuple[int, tuple[int, ...]]],
    replicas: int,
    gpus: int,
    room: Callable[[int], int],
) -> int | None:
    """Least total of ``room(f) - room(f - gpus)`` over ``replicas`` distinct nodes with
    room for a replica (each node at its free GPUs that lose least); None if too few."""
    losses: list[tuple[int, int]] = []
    for count, frees in states:
        able = [room(f) - room(f - gpus) for f in frees if f >= gpus]
        if able:
            losses.append((min(able), count))
    total, left = 0, replicas
    for loss, count in sorted(losses):
        take = min(count, left)
        total += take * loss
        left -= take
        if left == 0:
            return total
    return None
