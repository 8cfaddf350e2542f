"""Sets of mesh axes as bitmasks: the one place that turns mesh axis names into bits and back.

A strategy gives every fine class a set of mesh axes. The search, the legality rules and the cost
model all handle millions of such sets, so they are ints: bit i is mesh axis i of the `MeshSpec`
(`{"data": 2, "model": 4}`: data = 0b01, model = 0b10, both = 0b11). Everything that needs the
shard count of a set, its axis names, or its bits as a 0/1 matrix asks a `MeshAxes` here:

    ax = mesh_axes(MeshSpec({"data": 2, "model": 4}))
    ax.mask(("data", "model")) == 3;  ax.names_of(3) == ("data", "model");  ax.ways[3] == 8

Names come out in mesh order: a named dim's mesh axes are a set, major to minor in mesh order, as
a `PartitionSpec` entry lists them.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from toast_core.errors import StrategyError, bad_value
from toast_core.mesh import MeshSpec


@dataclass(frozen=True, eq=False)
class MeshAxes:
    """Bitmask arithmetic over the axes of one mesh (build it with `mesh_axes`)."""

    mesh: MeshSpec
    names: tuple[str, ...]
    ways: np.ndarray  # [2**n] int64: number of shards of each set of mesh axes
    n_bits: np.ndarray  # [2**n] int64: number of mesh axes in each set
    log2_sizes: np.ndarray  # [n] float64
    real: int  # the mesh axes of size > 1 (a collective over the others is none at all)

    @property
    def n(self) -> int:
        return len(self.names)

    def index(self, name: str) -> int:
        try:
            return self.names.index(name)
        except ValueError:
            raise StrategyError(
                bad_value("mesh axis", name, f"a mesh axis of {self.mesh}")
            ) from None

    def mask(self, names) -> int:
        """The bitmask of mesh axis names (a name or an iterable of names)."""
        if isinstance(names, str):
            names = (names,)
        m = 0
        for a in names:
            m |= 1 << self.index(a)
        return m

    @staticmethod
    def bit(i: int) -> int:
        """The mask of mesh axis i alone."""
        return 1 << i

    def indices(self, mask: int) -> list[int]:
        """Mesh axis indices of a bitmask, in mesh order."""
        mask = int(mask)
        return [i for i in range(len(self.names)) if mask >> i & 1]

    def names_of(self, mask: int) -> tuple[str, ...]:
        """Mesh axis names of a bitmask, in mesh order."""
        mask = int(mask)
        return tuple(a for i, a in enumerate(self.names) if mask >> i & 1)

    def names_of_masks(self, masks) -> tuple[str, ...]:
        """Mesh axis names of several bitmasks in turn (sub-factors of one dim, major first)."""
        out: list[str] = []
        for m in masks:
            out += self.names_of(m)
        return tuple(out)

    def bits(self, masks: np.ndarray) -> np.ndarray:
        """[n axes, len(masks)] float 0/1 matrix: bit a of each mask (for sparse mat-vecs)."""
        return ((masks[None, :] >> np.arange(self.n)[:, None]) & 1).astype(np.float64)


@lru_cache(maxsize=64)
def mesh_axes(mesh: MeshSpec) -> MeshAxes:
    """The `MeshAxes` of a mesh (memoized: a MeshSpec is frozen and hashable)."""
    n = len(mesh.axis_names)
    sizes = np.asarray(mesh.axis_sizes, dtype=np.int64)
    ways = np.ones(1 << n, dtype=np.int64)
    n_bits = np.zeros(1 << n, dtype=np.int64)
    for m in range(1 << n):
        for i in range(n):
            if m >> i & 1:
                ways[m] *= sizes[i]
                n_bits[m] += 1
    ways.setflags(write=False)
    n_bits.setflags(write=False)
    log2 = np.log2(sizes.astype(np.float64))
    log2.setflags(write=False)
    real = sum(1 << i for i, size in enumerate(mesh.axis_sizes) if size > 1)
    return MeshAxes(mesh, tuple(mesh.axis_names), ways, n_bits, log2, real)
