"""MIG (Multi-Instance GPU) geometry: the GPU instance profiles a GPU model offers, where
on a GPU each may start, and where a new one should go.

A MIG-capable GPU has 8 memory slices and 7 compute slices. A GPU instance of a profile
takes ``memory_slices`` contiguous memory slices from its *start* and ``compute_slices``
compute slices. NVML creates one only at the starts the profile allows and only where no
instance already holds any of those memory slices (``nvmlGpuInstancePlacement_t``:
``start`` is the first memory slice occupied, ``size`` the number occupied). So a GPU's
free slots, not a count of free slices, decide whether a profile fits: on an empty 80 GB
GPU a 3g.40gb at start 0 leaves no room for a 4g.40gb (which may only start at 0), at
start 4 it leaves it; a 1g.10gb at slices 1 and another at 5 leave 6 free memory slices
and 5 compute slices, yet no 3g.40gb fits.

Source of the tables: NVIDIA's Multi-Instance GPU User Guide, "Supported MIG Profiles"
(https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html: the
profiles of the A100-SXM4-40GB, renamed by memory on the 80 GB A100 and the H100) and its
``nvidia-smi mig -lgipp`` listing of the possible placements, the same on all three, as
``{starts}:memory slices``::

    ID 19  1g (1/8 memory)   {0,1,2,3,4,5,6}:1
    ID 15  1g (2/8 memory)   {0,2,4,6}:2
    ID 14  2g                {0,2,4}:2
    ID  9  3g                {0,4}:4
    ID  5  4g                {0}:4
    ID  0  7g                {0}:8

The media-extension profiles (``+me``: at most one per GPU) are left out.

Where a new instance goes (:func:`best_start`): at the start that leaves the most room,
meaning, for each profile of the GPU's table from the largest to the smallest, the number of
starts where it could still go — the lexicographically largest such vector wins, then the
lowest start. Why: the starts are aligned like a buddy allocator's blocks (a profile of 2^k
memory slices starts at multiples of 2^k), so a small instance put where it breaks the
fewest large aligned blocks keeps the large profiles, which have one or two places to go,
placeable; the small ones fit in the gaps whatever happens. On an empty GPU a 1g goes to
slice 6 (the 4g at 0 and the 2g at 0, 2 and 4 stay possible) and a 3g to slice 4 (the 4g
at 0 stays possible).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field, model_validator

MEMORY_SLICES = 8
COMPUTE_SLICES = 7


class MigProfile(BaseModel):
    """One GPU instance profile of a GPU model (``GpuModel.mig_profiles``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1, max_length=32, description="e.g. '3g.40gb'")
    compute_slices: int = Field(ge=1, le=COMPUTE_SLICES)
    memory_slices: int = Field(ge=1, le=MEMORY_SLICES)
    starts: tuple[int, ...] = Field(
        min_length=1,
        description="the memory slices an instance may start at (NVML's possible placements)",
    )

    @model_validator(mode="after")
    def _check_starts(self) -> MigProfile:
        last = MEMORY_SLICES - self.memory_slices
        bad = [start for start in self.starts if not 0 <= start <= last]
        if bad:
            raise ValueError(
                f"MIG profile {self.name}: starts {bad} out of range: a {self.memory_slices}-slice "
                f"instance starts at memory slice 0 to {last}"
            )
        if list(self.starts) != sorted(set(self.starts)):
            raise ValueError(f"MIG profile {self.name}: starts must be ascending and distinct")
        return self

    def mask(self, start: int) -> int:
        """The memory slices an instance started at ``start`` holds, as a bit mask."""
        return ((1 << self.memory_slices) - 1) << start


def _table(memory_gb: tuple[int, int, int, int, int, int]) -> tuple[MigProfile, ...]:
    """The six profiles of the A100/H100 geometry, named by their memory (GB)."""
    geometry = (  # compute slices, memory slices, starts
        (1, 1, (0, 1, 2, 3, 4, 5, 6)),
        (1, 2, (0, 2, 4, 6)),
        (2, 2, (0, 2, 4)),
        (3, 4, (0, 4)),
        (4, 4, (0,)),
        (7, 8, (0,)),
    )
    return tuple(
        MigProfile(
            name=f"{compute}g.{gb}gb", compute_slices=compute, memory_slices=memory, starts=starts
        )
        for gb, (compute, memory, starts) in zip(memory_gb, geometry, strict=True)
    )


A100_40GB = _table((5, 10, 10, 20, 20, 40))
A100_80GB = _table((10, 20, 20, 40, 40, 80))
H100_80GB = A100_80GB  # the same names and placements (MIG user guide, H100 profiles)


@dataclass(frozen=True)
class MigSlice:
    """One GPU instance on a GPU: whose it is, its profile and its start."""

    owner: str
    profile: MigProfile
    start: int

    @property
    def mask(self) -> int:
        return self.profile.mask(self.start)

    def describe(self) -> str:
        last = self.start + self.profile.memory_slices - 1
        return f"{self.profile.name} at memory slices {self.start}-{last}"


@dataclass
class GpuLayout:
    """The GPU instances on one GPU, and the profiles its model offers. Add instances with
    :meth:`add` (the memory and compute in use are kept up to date)."""

    table: tuple[MigProfile, ...]
    slices: list[MigSlice] = field(default_factory=list)
    used_memory: int = field(init=False, default=0)  # bit mask of memory slices
    used_compute: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        held, self.slices = self.slices, []
        for new in held:
            self.add(new)

    def add(self, new: MigSlice) -> None:
        self.slices.append(new)
        self.used_memory |= new.mask
        self.used_compute += new.profile.compute_slices

    @property
    def free_memory_slices(self) -> int:
        return MEMORY_SLICES - self.used_memory.bit_count()

    @property
    def free_compute_slices(self) -> int:
        return COMPUTE_SLICES - self.used_compute


def open_starts(layout: GpuLayout, profile: MigProfile) -> tuple[int, ...]:
    """The starts where an instance of ``profile`` could be created now."""
    if layout.used_compute + profile.compute_slices > COMPUTE_SLICES:
        return ()
    used = layout.used_memory
    return tuple(start for start in profile.starts if not used & profile.mask(start))


def fits(layout: GpuLayout, profile: MigProfile) -> bool:
    return bool(open_starts(layout, profile))


def room(layout: GpuLayout) -> tuple[int, ...]:
    """Per profile of the table, largest first, how many starts are still open."""
    return tuple(len(open_starts(layout, profile)) for profile in _largest_first(layout.table))


def best_start(layout: GpuLayout, profile: MigProfile) -> int | None:
    """The open start that leaves the most :func:`room` (then the lowest); None if none."""
    best: int | None = None
    best_key: tuple[tuple[int, ...], int] | None = None
    for start in open_starts(layout, profile):
        after = GpuLayout(layout.table, [*layout.slices, MigSlice("", profile, start)])
        key = (room(after), -start)
        if best_key is None or key > best_key:
            best, best_key = start, key
    return best


def place(layout: GpuLayout, profile: MigProfile, owner: str) -> int | None:
    """Create ``owner``'s instance of ``profile`` at :func:`best_start`; its start, or None
    (and ``layout`` unchanged) when the profile fits nowhere."""
    start = best_start(layout, profile)
    if start is not None:
        layout.add(MigSlice(owner, profile, start))
    return start


def clash(slices: Sequence[MigSlice], new: MigSlice) -> str | None:
    """Why ``new`` cannot join ``slices`` on one GPU (a memory slice two hold, or more than
    the GPU's compute slices), or None when it can."""
    for held in slices:
        if held.mask & new.mask:
            return f"overlaps {held.owner}'s {held.describe()}"
    compute = sum(held.profile.compute_slices for held in slices) + new.profile.compute_slices
    if compute > COMPUTE_SLICES:
        return f"takes the GPU to {compute} compute slices, over {COMPUTE_SLICES}"
    return None


def profile_named(table: Iterable[MigProfile], name: str) -> MigProfile | None:
    return next((profile for profile in table if profile.name == name), None)


def _largest_first(table: tuple[MigProfile, ...]) -> list[MigProfile]:
    return sorted(table, key=lambda p: (-p.memory_slices, -p.compute_slices, p.name))
