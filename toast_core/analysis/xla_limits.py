"""Known XLA limitations: shardings XLA's SPMD partitioner gets wrong, which we must never propose.

A plan that is correct in our model can still compile to wrong numbers, fail XLA's HLO verifier, or
crash the process, when it asks the partitioner for a sharding it does not handle. Each entry here
names one such case, says how the analysis keeps plans away from it, and points at the test that
shows XLA still fails on it (compiling a tiny program with that sharding in a subprocess, since
some of them segfault). When a JAX upgrade fixes one, its test fails: then relax the rule and drop
the entry.
"""

from __future__ import annotations

from dataclasses import dataclass

CONV_SPATIAL_MULTI_AXIS = "conv-spatial-multi-axis-mesh"
SCATTER_ONE_WINDOW_INDEXED_SHARDED = "scatter-one-window-indexed-sharded"
SLICE_PREFIX_SAME_SHARD_SIZE = "slice-prefix-same-shard-size"


@dataclass(frozen=True, slots=True)
class XlaLimitation:
    name: str
    description: str  # what fails, where it appears, and how the analysis avoids it
    test: str  # the pytest id that reproduces it with plain `jax.jit`


KNOWN_XLA_LIMITATIONS: dict[str, XlaLimitation] = {
    limit.name: limit
    for limit in (
        XlaLimitation(
            "pad-interior-sharded-result",
            "`lax.pad` with interior padding whose result dim is sharded: wrong values (f32[4, 2]"
            " padded (0, 1, 1) to [8, 2] on 8 devices differs by 8.0) or an HLO-verifier error"
            " (f32[6, 2] padded (0, 0, 2) to [16, 2]: 'Slice dim size 2 greater than dynamic"
            " slice dimension'), sometimes a segfault, with jax 0.10.2. It appears in the"
            " gradients of strided slices `x[::2]`, `cummax`, `cumlogsumexp` and"
            " `associative_scan`. The pad rule leaves that result dim without factors (never"
            " sharded) and gathers the operand, which XLA partitions correctly.",
            "tests/test_xla_limits.py::test_xla_still_fails_on[pad-interior-sharded-result]",
        ),
        XlaLimitation(
            CONV_SPATIAL_MULTI_AXIS,
            "A convolution whose spatial dim is sharded on a mesh with two or more mesh axes of"
            " size > 1: wrong values with jax 0.10.2 on {data: 2, model: 4} (NWC input f32[4,"
            " 16, 6], WIO kernel [3, 6, 8], SAME: W on data with the output features on model"
            " differs by 44.7; the kernel gradient with the input's W on data alone by 27.1, on"
            " model alone by 9.0), from plain `jax.jit` as from our plans. On a one-axis mesh"
            " the same shardings are right. The fuzzer also found a VALID conv on {data: 2, model:"
            " 3} wrong by 0.005 with the input's and the kernel's spatial dims sharded (gathered"
            " at the conv). The legality rules (`toast_core/strategy/legality.py`) keep every"
            " named dim that is a spatial dim of a convolution's input, kernel or output"
            " replicated on such meshes, for the search, the baselines and pins alike.",
            f"tests/test_xla_limits.py::test_xla_still_fails_on[{CONV_SPATIAL_MULTI_AXIS}]",
        ),
        XlaLimitation(
            SCATTER_ONE_WINDOW_INDEXED_SHARDED,
            "A scatter (add, set, mul, min, max) with one update window, `x.at[i].add(u)` with a"
            " single index, whose operand's indexed dim is sharded at the scatter while the"
            " operand comes whole from elsewhere (a replicated parameter or a replicated"
            " intermediate resharded at that use): wrong values with jax 0.10.2 (f32[48] on 8"
            " devices, from plain `jax.jit`, differs by 2.7). XLA turns the one-window scatter"
            " into a dynamic-update-slice of the local shard at a clamped local index, but reads"
            " the element it writes back on the devices that do not own the index from the whole"
            " operand at the global index (a dynamic-slice of a dynamic-slice folded without the"
            " inner clamp), so every other shard gets a foreign element written into its first"
            " or last row. The fuzzer found it (seed 11, program 475: concatenate, scatter-add,"
            " where, bias, error 0.0497). With the operand gathered at the scatter and only the"
            " result sharded, XLA is right, so the scatter rule leaves the indexed operand dims of"
            " one-window scatters without factors (that use is resharded to replicated, with an"
            " explicit constraint) and gives the result dim its own factor.",
            "tests/test_xla_limits.py::test_xla_still_fails_on"
            f"[{SCATTER_ONE_WINDOW_INDEXED_SHARDED}]",
        ),
        XlaLimitation(
            SLICE_PREFIX_SAME_SHARD_SIZE,
            "A unit-stride prefix slice `x[0:b]` of a dim of n elements sharded k ways with"
            " ceil(b / k) == n / k (b < n: `x[:-1]` on any sharding, `x[0:1]` with one element"
            " per shard), whose result is replicated, while another reader gathers x on that dim"
            " (a concatenate, cumsum, sort, reverse, pad or a replicated constraint): XLA's HLO"
            " verifier fails with jax 0.10.2 ('Expected instruction to have shape equal to"
            " f32[1], actual shape is f32[8]' for x f32[8] on 8 devices). The partitioner keeps"
            " such a slice local (its shards have the operand's padded shard size), and the"
            " gathered slice, f32[b], is then reused as the gathered operand, f32[n]. Exactly"
            " that condition fails (every (n, b) checked for n up to 3k on meshes of 2, 4 and 8"
            " shards); a slice not starting at 0, a strided or dynamic slice, or a reader that"
            " does not gather (reduce_sum) is fine. The fuzzer found it (seed 13, program 1041:"
            " `jnp.pad(x, (1, 2), mode='edge')`, which slices `x[0:1]` and concatenates it with"
            " x, on f32[2] sharded over data=2). Such a slice's result cannot be sharded k ways"
            " on that dim (b is not a multiple of k), so the plan already prices a gather of the"
            " operand there; `shard` makes it explicit (a replicated constraint at that use,"
            " `apply/shard.py:_gathered_prefix_slice`), and XLA then partitions it correctly."
            " No plan is excluded.",
            f"tests/test_xla_limits.py::test_xla_still_fails_on[{SLICE_PREFIX_SAME_SHARD_SIZE}]",
        ),
    )
}
