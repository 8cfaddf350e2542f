"""Factor rules for randomness and bit reinterpretation: `jax.random`'s key plumbing, `random_bits`,
`threefry2x32`, and `bitcast_convert_type` (which turns random bits into floats).

Key arrays `key<fry>[K...]` carry one key per element of K; every rule links those K dims through,
so a batch of per-example keys shards like the batch. What XLA does with the bits was measured on 8
simulated CPU devices (jax 0.10.2, `jax_threefry_partitionable` on, its default): a dropout
`where(bernoulli(key, 0.9, x.shape), x / 0.9, 0)` compiled with x[B_data, S, F] generates its bits
at the shard's size (threefry ops on u32[B/8, S, F], no collective, flops 1/8 of the replicated
program), and so it does for bits made at [B*S, F] and reshaped, bits broadcast over S, bits of
`fold_in`-derived keys, per-example `vmap`ed keys, and F sharded instead of B. So the bits' dims are
ordinary factors; only with `jax_threefry_partitionable` off (recorded at trace time) does every
device generate the whole array, and the new dims are then `replicate` (work undivided).
"""

from __future__ import annotations

from toast_core.analysis.factors import FactorBuilder, OpFactors
from toast_core.analysis.rules import elementwise_rule, rule


def _key_dims(fb: FactorBuilder, n: int, operands=(0,)) -> list:
    """Links the first n dims (the key-array dims K) of the given operands and of result 0."""
    return [
        fb.shared(fb.result_shapes[0][d], operands=[(i, d) for i in operands], results=[(0, d)])
        for d in range(n)
    ]


@rule("bitcast_convert_type")
def bitcast_convert_type_rule(op, operand_shapes, result_shapes) -> OpFactors:
    """Same bit width: elementwise. To a narrower type `f32[A, B] -> u8[A, B, 4]` or a wider one
    `u8[A, B, 4] -> f32[A, B]`, the bytes of one element must be on one device: the extra minor
    dim is `replicate` (Shardy's rule, checked in tests/test_shardy_oracle.py)."""
    src, dst = operand_shapes[0], result_shapes[0]
    fb = FactorBuilder(operand_shapes, result_shapes)
    common = min(len(src), len(dst))
    for d in range(common):
        fb.shared(src[d], operands=[(0, d)], results=[(0, d)])
    if len(src) > len(dst):
        fb.set_operand(0, common, fb.factor(src[common], "replicate"))
    elif len(dst) > len(src):
        fb.set_result(0, common, fb.factor(dst[common], "replicate"))
    return fb.build()


@rule("random_bits")
def random_bits_rule(op, operand_shapes, result_shapes) -> OpFactors:
    """`random_bits(keys[K], shape=S) -> bits[K, S]`: K links to the keys; the S dims are new
    factors, shardable when XLA partitions threefry, `replicate` (each device computes the whole
    array) when `jax_threefry_partitionable` was off.

    Measured: the gradient of `mean(dropout(x @ w) ** 2)` with x[64_data, 32], w[32, 128] on 8
    devices compiles its threefry rounds on u32[8, 128] (u32[64, 128] with x replicated), and
    `cost_analysis()` gives 194,611 flops per device against 1,523,853 replicated (7.8x), with no
    collective. tests/test_flops.py keeps checking it."""
    fb = FactorBuilder(operand_shapes, result_shapes)
    n_keys = len(operand_shapes[0])
    _key_dims(fb, n_keys)
    kind = "pass" if op.param("threefry_partitionable", True) else "replicate"
    for d in range(n_keys, len(result_shapes[0])):
        fb.set_result(0, d, fb.factor(result_shapes[0][d], kind))
    return fb.build()


@rule("random_clone", "random_fold_in", "random_seed")
def random_key_map_rule(op, operand_shapes, result_shapes) -> OpFactors:
    """One key out per key (or seed) in: elementwise over the key-array dims K."""
    return elementwise_rule(op, operand_shapes, result_shapes)


@rule("random_split")
def random_split_rule(op, operand_shapes, result_shapes) -> OpFactors:
    """`random_split(keys[K], shape=S) -> keys[K, S]`: K links through; S is new."""
    fb = FactorBuilder(operand_shapes, result_shapes)
    _key_dims(fb, len(operand_shapes[0]))
    return fb.build()


@rule("random_unwrap")
def random_unwrap_rule(op, operand_shapes, result_shapes) -> OpFactors:
    """`keys[K] -> u32[K, 2]`: K links through; the key-data dim is new."""
    fb = FactorBuilder(operand_shapes, result_shapes)
    _key_dims(fb, len(operand_shapes[0]))
    return fb.build()


@rule("random_wrap")
def random_wrap_rule(op, operand_shapes, result_shapes) -> OpFactors:
    """`u32[K, 2] -> keys[K]`: K links through; the words of one key must be on one device."""
    fb = FactorBuilder(operand_shapes, result_shapes)
    n_keys = len(result_shapes[0])
    _key_dims(fb, n_keys)
    for d in range(n_keys, len(operand_shapes[0])):
        fb.set_operand(0, d, fb.factor(operand_shapes[0][d], "replicate"))
    return fb.build()


@rule("threefry2x32")
def threefry2x32_rule(op, operand_shapes, result_shapes) -> OpFactors:
    """`threefry2x32(k1, k2, x1[A], x2[A]) -> (y1[A], y2[A])`: elementwise over the counts; the
    key words (scalars, or broadcast to A) link where their shape matches."""
    fb = FactorBuilder(operand_shapes, result_shapes)
    out = result_shapes[0]
    for d, size in enumerate(out):
        operands = [
            (i, d) for i, s in enumerate(operand_shapes) if len(s) == len(out) and s[d] == size
        ]
        fb.shared(size, operands=operands, results=[(i, d) for i in range(len(result_shapes))])
    return fb.build()
