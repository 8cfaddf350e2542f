"""Global FLOP and transcendental counts per op (before sharding), as XLA's `cost_analysis()`
counts them (measured on this jaxlib, one compiled primitive at a time):

* dot_general: `2 * batch * M * N * K` = 2 x result elements x contracted elements (an outer
  product, with nothing of size > 1 contracted, 1 per result element; a dot of vectors 2 K - 1);
* conv_general_dilated: 2 x output elements x input features per group x kernel window, counting
  only the taps that fall on the input (not on padding), as XLA does;
* elementwise arithmetic, comparisons, selects and conversions: one flop per result element (a
  division by a spread divisor adds the divisor's reciprocal, one per element it is spread from);
  `integer_pow` one per multiply of its square-and-multiply chain (plus a divide when negative);
* transcendental functions (exp, log, tanh, sqrt, rsqrt, pow, ...): one *transcendental* per
  element, not a flop; a few expand into both (`logistic`: 3 flops and 1 transcendental);
* reductions: one flop per element folded in (operand elements - result elements); argmax and
  argmin compare and select index and value (9 per element); combining scatters (add, mul, min,
  max) one per update element;
* layout ops (reshape, transpose, broadcast, slicing, copies...): zero (they move bytes); a gather
  that fills out-of-bounds rows (`jnp.take`) a select per element and a bounds test per index;

Ops whose counts were fitted to XLA's (special functions, random bits, pooling, scans, sort) are in
`flops_measured.py`, with each measurement in the rule's docstring. A primitive with no rule counts
zero.

Counts are global; the evaluator divides them by each op's cut, except where the local count is
not that share: a reduction or dot whose folded dims are cut folds its operand shard into whole
partial sums (`local_fold_flops`), and a prefix scan cut along its scanned dim computes only its
result shard (`Evaluator._windowed_scans`).

Ops inside a `scan` body are multiplied by the trip count by the caller; so is the duplication of
fused producers (`fusion.py`) and the work XLA's simplifier removes (dead code, constants, work on
broadcasts, repeated expressions, identities such as `x + 0`, clamps; a `cond` counts its
costliest branch: `simplify.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from math import prod

from toast_core.ir import primitives as prim
from toast_core.ir.program import Op, Program

#: (flops, transcendentals) of one execution of an op on whole (unsharded) arrays.
FlopRule = Callable[[Op, Program], tuple[float, float]]
FLOP_RULES: dict[str, FlopRule] = {}
#: `@flop_rule("name", ...)` registers a flop rule; a name registered twice raises.
flop_rule = prim.registrar(FLOP_RULES, "flop rules")


def op_flops(op: Op, program: Program) -> float:
    """Flops of one execution of `op` on whole (unsharded) arrays, transcendentals excluded."""
    fn = FLOP_RULES.get(op.primitive)
    return float(fn(op, program)[0]) if fn is not None else 0.0


def op_transcendentals(op: Op, program: Program) -> float:
    """Transcendental evaluations of one execution of `op` on whole arrays."""
    fn = FLOP_RULES.get(op.primitive)
    return float(fn(op, program)[1]) if fn is not None else 0.0


def op_counts(program: Program) -> tuple[list[float], list[float]]:
    """(`op_flops`, `op_transcendentals`) of every op of `program`, each op's rule run once (the
    two apart ran every rule twice: 0.08 s of the evaluator's set-up at GPT-3 175B)."""
    flops, trans = [], []
    rules = FLOP_RULES.get
    for op in program.ops:
        fn = rules(op.primitive)
        if fn is None:
            flops.append(0.0)
            trans.append(0.0)
            continue
        f, t = fn(op, program)
        flops.append(float(f))
        trans.append(float(t))
    return flops, trans


def _result_size(op: Op, program: Program) -> int:
    return sum(program.values[r].size for r in op.results)


def _integer_pow_flops(y: int) -> int:
    """Multiplies of x**|y| by repeated squaring, plus the reciprocal when y < 0."""
    n = abs(int(y))
    if n == 0:
        return 0
    return (n.bit_length() - 1) + (bin(n).count("1") - 1) + (1 if y < 0 else 0)


def valid_taps(
    n_in: int, n_out: int, window: int, stride: int, pad_lo: int, lhs_dil: int, rhs_dil: int
) -> int:
    """Kernel taps, summed over output positions, that land on a real input element (not on
    padding or on the holes of a dilated input): XLA counts only those."""
    extent = (n_in - 1) * lhs_dil + 1
    taps = 0
    for o in range(n_out):
        for k in range(window):
            pos = o * stride + k * rhs_dil - pad_lo
            taps += 0 <= pos < extent and pos % lhs_dil == 0
    return taps


def conv_window(op: Op, n_spatial: int) -> tuple[tuple, tuple, tuple, tuple]:
    """(strides, padding, lhs dilation, rhs dilation) of convolution `op`, one entry per
    spatial dim, with lax's defaults (1, (0, 0), 1, 1) for the params it leaves out."""
    return (
        op.param("window_strides", (1,) * n_spatial),
        op.param("padding", ((0, 0),) * n_spatial),
        op.param("lhs_dilation", None) or (1,) * n_spatial,
        op.param("rhs_dilation", None) or (1,) * n_spatial,
    )


def convolution_flops(op: Op, program: Program) -> float:
    """2 x batch x output features x input features per group x valid taps per spatial dim."""
    dn = dict(op.param("dimension_numbers"))
    lhs_spec, rhs_spec, out_spec = dn["lhs_spec"], dn["rhs_spec"], dn["out_spec"]
    lhs = program.values[op.operands[0]].shape
    rhs = program.values[op.operands[1]].shape
    out = program.values[op.results[0]].shape
    n_spatial = len(lhs_spec) - 2
    strides, padding, lhs_dil, rhs_dil = conv_window(op, n_spatial)
    taps = 1
    for i in range(n_spatial):
        taps *= valid_taps(
            lhs[lhs_spec[2 + i]],
            out[out_spec[2 + i]],
            rhs[rhs_spec[2 + i]],
            strides[i],
            padding[i][0],
            lhs_dil[i],
            rhs_dil[i],
        )
    return 2.0 * out[out_spec[0]] * out[out_spec[1]] * rhs[rhs_spec[1]] * taps


# --- rules, by family ------------------------------------------------------------------------------


@flop_rule("dot_general")
def dot_general_flops(op, program):
    """2 x result elements x contracted elements (a multiply and an add per term). XLA's
    algebraic simplifier rewrites two degenerate dots (measured):

    * nothing contracted, or only dims of size 1 (an outer product, `[12, 1] @ [1, 8]`): one
      multiply per result element (96, not 192);
    * no free dims of size > 1 on either side (a dot of vectors, batched or not: `[16] @ [16]`,
      `[1, 16] @ [16]`): a multiply and a sum, 2 K - 1 per result element (31, not 32).
    """
    (lc, rc), (lb, rb) = op.param("dimension_numbers")
    lhs = program.values[op.operands[0]].shape
    rhs = program.values[op.operands[1]].shape
    out = program.values[op.results[0]].size
    k = prod(lhs[d] for d in lc)
    if k == 1:
        return float(out), 0.0
    lhs_free = prod(n for d, n in enumerate(lhs) if d not in lc and d not in lb)
    rhs_free = prod(n for d, n in enumerate(rhs) if d not in rc and d not in rb)
    if lhs_free == 1 and rhs_free == 1:
        return float(out * (2 * k - 1)), 0.0
    return 2.0 * out * k, 0.0


@flop_rule("conv_general_dilated")
def conv_flops(op, program):
    return convolution_flops(op, program), 0.0


@flop_rule("integer_pow")
def integer_pow_flops(op, program):
    return float(_result_size(op, program) * _integer_pow_flops(op.param("y", 2))), 0.0


@flop_rule(*sorted(prim.TRANSCENDENTAL))
def transcendental_flops(op, program):
    return 0.0, float(_result_size(op, program))


@flop_rule(
    *sorted(
        prim.ELEMENTWISE
        - prim.NO_OP_ELEMENTWISE
        - prim.TRANSCENDENTAL
        - prim.EXPANDED_TRANSCENDENTAL
        - {"integer_pow", "div", "convert_element_type"}
    )
)
def elementwise_flops(op, program):
    """One flop per result element."""
    return float(_result_size(op, program)), 0.0


@flop_rule("convert_element_type")
def convert_flops(op, program):
    """One flop per result element; none when the dtype stays (JAX's convert that only drops a
    weak type, as `x[i]` does to a loop index: XLA removes it; measured in a `fori_loop` body,
    fuzz seed 16 accum_fori)."""
    if program.values[op.operands[0]].dtype == program.values[op.results[0]].dtype:
        return 0.0, 0.0
    return float(_result_size(op, program)), 0.0


@flop_rule("div")
def div_flops(op, program):
    """One flop per result element, plus the reciprocal of a divisor that is spread: XLA's
    simplifier rewrites `x / broadcast(b)` as `x * broadcast(1 / b)` and `x / s` (a scalar) as
    `x * (1 / s)`, computing the reciprocal on the small operand (measured: `x[8, 16] /
    s[8][:, None]` counts 136, `x[8, 16] / s[]` 129: softmax's normalization is one of these).
    A constant divisor's reciprocal is folded: nothing added."""
    n = float(_result_size(op, program))
    return n + spread_divisor_elements(op, program), 0.0


def spread_divisor_elements(op: Op, program: Program) -> int:
    """Elements of what a divisor is spread from: the divisor itself when it is smaller than
    the result (a scalar, or size-1 dims the op broadcasts), or the operand of the broadcasts
    that made it; 0 when nothing is spread or it is spread from a literal."""
    v = spread_divisor_source(op, program)
    return 0 if v is None else program.values[v].size


def spread_divisor_source(op: Op, program: Program) -> int | None:
    """The value a division's divisor is spread from (`spread_divisor_elements`), or None. Its
    reciprocal is computed on that value's shard: a softmax over a cut dim computes `1 / sum`
    on the all-reduced sums, whole on every device (`Evaluator._reciprocals`)."""
    producers = program.producers()
    v = program.values[op.operands[1]]
    while v.role != "literal":
        p = producers[v.id]
        if p is None or program.ops[p].primitive != "broadcast_in_dim":
            break
        v = program.values[program.ops[p].operands[0]]
    if v.role == "literal" or v.size >= _result_size(op, program):
        return None
    return v.id


@flop_rule(*sorted(prim.REDUCTIONS))
def reduce_flops(op, program):
    """One flop per element folded in."""
    return float(_folded(op, program)), 0.0


@flop_rule(*sorted(prim.ARG_REDUCTIONS))
def arg_reduce_flops(op, program):
    """Compare, and select both index and value: 9 flops per element folded in (measured)."""
    return float(_folded(op, program) * 9), 0.0


@flop_rule(*sorted(prim.SCATTERS))
def scatter_flops(op, program):
    """One combine (add, multiply, min, max) per update element; none for an overwriting
    `scatter`. Plus, for a scatter of a single update window (one index vector), what XLA
    makes of it: a dynamic-update-slice that drops an out-of-bounds window by testing it (two
    compares per operand dim, an and of the pairs, reduced: 4 x rank - 1) and selecting the old
    elements (one per update element), in every mode (measured: `x[8, 16].at[i[1]].add(u)`
    45 flops, `.set` 29, `x[4, 32, 2, 2].at[i[1]].add` 277; each also recomputes the index
    normalization, 3, in the test's fusion: fuzz seed 16 #1347, 0.80 of XLA before)."""
    updates = program.values[op.operands[2]].size
    combines = float(updates) if op.primitive in prim.COMBINING_SCATTERS else 0.0
    test = one_window_test_flops(op, program)
    kept = 1 if _uniform(program, op.operands[0]) and _uniform(program, op.operands[2]) else updates
    return (combines + kept + test if test else combines), 0.0


_UNIFORM_LAYOUT = frozenset({"broadcast_in_dim", "reshape", "transpose", "expand_dims", "squeeze"})


def _uniform(program: Program, vid: int, depth: int = 8) -> bool:
    """Whether every element of `vid` is one scalar's: a scalar, a broadcast or reshape of one,
    or elementwise arithmetic of such values. XLA's simplifier makes a dynamic-slice of a
    broadcast the broadcast, and a select of broadcasts under a broadcast predicate the
    broadcast of one scalar select: a masked window of a splat costs one select, not one per
    element (measured, jaxlib 0.10.2 CPU: the gradient of `mean(v.at[:, i].set(tanh(v[:,
    i])))`, v[4, 2, 8]: the cotangent's `1 / n` splat gathered at `i` and the scatter of the
    scattered ids' splat are `select` of f32[1] and u32[] in XLA's HLO; counted per window
    element, 540 of XLA's 473 flops; fuzz seed 19 #274)."""
    while depth > 0:
        depth -= 1
        if program.values[vid].size == 1:
            return True
        p = program.producers()[vid]
        if p is None:
            return False
        op = program.ops[p]
        if op.primitive in _UNIFORM_LAYOUT and op.operands:
            vid = op.operands[0]
            continue
        return op.primitive in prim.ELEMENTWISE and all(
            _uniform(program, v, depth) for v in op.operands
        )
    return False


def one_window_test_flops(op: Op, program: Program) -> int:
    """The bounds test of a one-window scatter (`scatter_flops`): 4 x rank - 1; 0 for a scatter
    of several windows. XLA computes it once however many loops the scatter is fused into."""
    indices = program.values[op.operands[1]].shape
    if indices and prod(indices[:-1]) != 1:
        return 0
    return 4 * len(program.values[op.operands[0]].shape) - 1


@flop_rule("gather")
def gather_flops(op, program):
    """Zero for in-bounds modes; `mode=FILL_OR_DROP` (`jnp.take`, `take_along_axis`) masks each
    row that falls out of bounds: 3 flops per index vector (two compares and an and) and a select
    per result element (measured: `jnp.take(x[16, 8], i[k], axis=0)` 11 per index, axis=1 19).

    Global counts: the evaluator counts a gather on its shards (`masked_gather.py`: the fill
    mask on the result's shard, and the bookkeeping XLA's partitioner adds when the indexed dim
    is sharded)."""
    if "FILL" not in str(op.param("mode", "")):
        return 0.0, 0.0
    indices = program.values[op.operands[1]].shape
    vectors = prod(indices[:-1]) if indices else 1
    masked = 1 if _uniform(program, op.operands[0]) else program.values[op.results[0]].size
    return float(masked + 3 * vectors), 0.0


def _folded(op: Op, program: Program) -> int:
    """Elements folded in: none for a reduction of an empty array, which XLA's simplifier
    rewrites as a broadcast of its init value (it counted minus the result's size: jnp.pad's
    edge mode on [4, 6, 5] reduces an empty [8, 1, 0, 5] slice to [8, 5], -40 flops each)."""
    return max(program.values[op.operands[0]].size - program.values[op.results[0]].size, 0)


@flop_rule(
    *sorted(
        prim.NO_OP_ELEMENTWISE
        | prim.FUSIBLE_LAYOUT
        | prim.REGION_BOUNDARIES
        | prim.CREATION
        | {"dynamic_update_slice", "split", "stack", "tile", "unstack"}
        | {"random_clone", "random_unwrap", "random_wrap"}
    )
)
def no_flops(op, program):
    """Moves or creates bytes without arithmetic (measured zero: tile, stack, unstack, key
    wrapping; an overwriting scatter of several windows: `scatter_flops`)."""
    return 0.0, 0.0


#: Ops whose count is not linear in their iteration space: what they fold in is (operand -
#: result) elements, so when the folded dims are sharded each device folds its operand shard into
#: a whole partial result (`local_fold_flops`).
FOLDING = frozenset(prim.REDUCTIONS | {"dot_general"})


def local_fold_flops(op: Op, program: Program, ways: float, result_ways: float) -> float:
    """Flops of one execution of a folding op (`FOLDING`) on one device whose shard of the op's
    iteration space is 1/`ways` of it, and of the result 1/`result_ways` (the folded dims are cut
    `ways / result_ways` ways). Dividing the global count by `ways` is wrong there: each device
    folds N / ways operand elements into M / result_ways partial sums, so it saves M / result_ways
    per fold, not M / ways (`jnp.sum(x[2, 16, 8], axis=0)` on 2 devices along dim 0: a reduce of a
    size-1 dim, 0 flops, then the all-reduce's 128 adds; the global count / 2 says 64). A dot's
    contraction of local size 1 is an outer product (one multiply per result element), and a dot
    of vectors 2 K - 1 per result element with the local K (`dot_general_flops`)."""
    folded_ways = max(ways / result_ways, 1.0)
    m = program.values[op.results[0]].size / result_ways
    if op.primitive != "dot_general":
        folded = program.values[op.operands[0]].size / ways - m
        return folded if folded > 1e-9 * m else 0.0  # 3-way cuts: log2/exp2 round-off
    (lc, rc), (lb, rb) = op.param("dimension_numbers")
    lhs = program.values[op.operands[0]].shape
    rhs = program.values[op.operands[1]].shape
    k = prod(lhs[d] for d in lc) / folded_ways
    if k <= 1 + 1e-9:  # `ways` comes through log2 / exp2: 3 ways may be 2.9999999999999996
        return m
    lhs_free = prod(n for d, n in enumerate(lhs) if d not in lc and d not in lb)
    rhs_free = prod(n for d, n in enumerate(rhs) if d not in rc and d not in rb)
    if lhs_free == 1 and rhs_free == 1:
        return m * (2 * k - 1)
    return 2.0 * m * k


# Rules fitted to XLA's counts live in their own module and register on import.
from toast_core.cost import flops_measured  # noqa: E402, F401
