"""Op factors in Shardy's model: what one primitive says about how its dims relate.

A rule maps every operand dim and result dim of an op to an ordered list of *factors* (major to
minor) whose sizes multiply to the dim size. Operands and results that carry the same factor must be
sharded alike for the op to run locally. Each factor has a kind:

* ``pass``      - consistent sharding needs no communication (the default);
* ``reduction`` - in operands, absent from results (dot_general contracting dims, reduced dims):
                  sharding it leaves a partial result that needs an all-reduce or reduce-scatter;
* ``replicate`` - must be unsharded at this op (sort dim, concatenated dim, size-changing slices):
                  sharding it forces an all-gather of the operand before the op;
* ``permute``   - shardable with a halo exchange (collective-permute): padded dims, conv spatial dims.

Size-1 dims get no factor at all: they can never be sharded, so they never link anything. A rule
may also leave a larger dim without factors (`FactorBuilder.unshardable`) when XLA cannot
partition it correctly (`xla_limits.py`): that dim of the value is then always replicated, and its
uses read it as a local slice.

Example: ``dot_general [b,m,k] x [b,k,n] -> [b,m,n]`` has factors b, m, k (reduction), n;
``reshape [8, 32] -> [8, 4, 8]`` has factors i, j, k with the operand's dim 1 = (j, k).
"""

from __future__ import annotations

from dataclasses import dataclass

KINDS = ("pass", "reduction", "replicate", "permute")


@dataclass(frozen=True, slots=True)
class OpFactors:
    """The factor rule of one op: factor sizes and kinds, and each dim's factors (major to minor)."""

    sizes: tuple[int, ...]
    kinds: tuple[str, ...]
    operands: tuple[tuple[tuple[int, ...], ...], ...]
    results: tuple[tuple[tuple[int, ...], ...], ...]
    is_fallback: bool = False


class FactorBuilder:
    """Small helper the rules use to allocate factors and lay out dims."""

    def __init__(self, operand_shapes, result_shapes) -> None:
        self.operand_shapes = [tuple(s) for s in operand_shapes]
        self.result_shapes = [tuple(s) for s in result_shapes]
        self.sizes: list[int] = []
        self.kinds: list[str] = []
        self.operands = [[() for _ in s] for s in self.operand_shapes]
        self.results = [[() for _ in s] for s in self.result_shapes]
        self._unshardable: set[tuple[str, int, int]] = set()

    def factor(self, size: int, kind: str = "pass") -> int | None:
        """A new factor, or None for size 1 (never shardable, so never linked)."""
        if size == 1:
            return None
        self.sizes.append(int(size))
        self.kinds.append(kind)
        return len(self.sizes) - 1

    def unshardable(self, side: str, i: int, d: int) -> None:
        """Leaves dim d of operand (`side="o"`) or result (`"r"`) i without factors: never
        sharded, linked to nothing (for dims XLA's partitioner gets wrong, see `xla_limits.py`)."""
        self._unshardable.add((side, i, d))

    def set_operand(self, i: int, d: int, *factors: int | None) -> None:
        self.operands[i][d] = tuple(f for f in factors if f is not None)

    def set_result(self, i: int, d: int, *factors: int | None) -> None:
        self.results[i][d] = tuple(f for f in factors if f is not None)

    def fresh_operand_dims(self, i: int, kind: str = "pass") -> None:
        """Operand dims not set by the rule get their own (unlinked) factors."""
        for d, size in enumerate(self.operand_shapes[i]):
            if not self.operands[i][d] and ("o", i, d) not in self._unshardable:
                self.set_operand(i, d, self.factor(size, kind))

    def fresh_result_dims(self, i: int, kind: str = "pass") -> None:
        for d, size in enumerate(self.result_shapes[i]):
            if not self.results[i][d] and ("r", i, d) not in self._unshardable:
                self.set_result(i, d, self.factor(size, kind))

    def shared(self, size: int, kind: str = "pass", *, operands=(), results=()) -> int | None:
        """One factor of `size` on the listed (operand, dim) and (result, dim) slots."""
        f = self.factor(size, kind)
        for i, d in operands:
            self.set_operand(i, d, f)
        for i, d in results:
            self.set_result(i, d, f)
        return f

    def build(self, fallback: bool = False) -> OpFactors:
        """The rule's factors; dims the rule left unset get fresh factors of their own, `pass`,
        or `replicate` for the `fallback` of a primitive without a rule."""
        kind = "replicate" if fallback else "pass"
        for i in range(len(self.operand_shapes)):
            self.fresh_operand_dims(i, kind)
        for i in range(len(self.result_shapes)):
            self.fresh_result_dims(i, kind)
        return OpFactors(
            tuple(self.sizes),
            tuple(self.kinds),
            tuple(tuple(dims) for dims in self.operands),
            tuple(tuple(dims) for dims in self.results),
            fallback,
        )


def mixed_radix_groups(a: tuple[int, ...], b: tuple[int, ...]):
    """Aligns two shapes of equal element count into groups of dims with equal products.

    Yields (dims of a, dims of b, refined factor sizes or None). The refinement is the common
    ordered factorization: it exists when the prefix products of both sides nest (each divides the
    next once merged and sorted). Size-1 dims are skipped.
    """
    ia = [i for i, s in enumerate(a) if s != 1]
    ib = [i for i, s in enumerate(b) if s != 1]
    i = j = 0
    while i < len(ia) and j < len(ib):
        ga, gb = [ia[i]], [ib[j]]
        pa, pb = a[ia[i]], b[ib[j]]
        i += 1
        j += 1
        while pa != pb:
            if pa < pb and i < len(ia):
                ga.append(ia[i])
                pa *= a[ia[i]]
                i += 1
            elif pb < pa and j < len(ib):
                gb.append(ib[j])
                pb *= b[ib[j]]
                j += 1
            else:
                return
        yield ga, gb, refine([a[d] for d in ga], [b[d] for d in gb])


def refine(xs: list[int], ys: list[int]) -> list[int] | None:
    """Common ordered refinement of two factorizations of one number, or None if none exists."""
    cuts = set()
    for seq in (xs, ys):
        p = 1
        for s in seq:
            p *= s
            cuts.add(p)
    chain = sorted(cuts)
    out, prev = [], 1
    for c in chain:
        if c % prev:
            return None
        if c // prev != 1:
            out.append(c // prev)
        prev = c
    return out


def split_dim(sizes: list[int], refined: list[int]) -> list[list[int]]:
    """Distributes refined factor sizes (major to minor) over dims of the given sizes."""
    out, k = [], 0
    for s in sizes:
        part, p = [], 1
        while p < s:
            part.append(refined[k])
            p *= refined[k]
            k += 1
        out.append(part)
    return out
