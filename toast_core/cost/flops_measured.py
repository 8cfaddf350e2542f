"""Flop rules fitted to XLA's `cost_analysis()`, for primitives XLA expands into many HLO ops.

Every count here was measured on jaxlib 0.10.2 (CPU), compiling the single primitive on f32 (the
commands are in tests/test_flops.py, which checks each rule against XLA). XLA's own
`HloCostAnalysis` counts the expanded HLO, so these are the figures a plan is judged by; they are
per element (or per window, per combine) unless said otherwise.
"""

from __future__ import annotations

from math import ceil, prod

from toast_core.cost.flops import flop_rule
from toast_core.ir import primitives as prim

#: (flops, transcendentals) per result element of the special functions XLA expands into
#: polynomials and iterations (f32 inputs in [0.5, 1.5]; igamma, betainc and the gamma gradients
#: iterate, so their counts are the loops' static bodies as XLA counts them).
EXPANDED = {
    "acos": (3, 2),
    "acosh": (7, 4),
    "asin": (5, 2),
    "asinh": (11, 3),
    "atanh": (7, 2),
    "bessel_i0e": (83, 1),
    "bessel_i1e": (83, 1),
    "cosh": (3, 2),
    "digamma": (73, 3),
    "erf_inv": (37, 2),
    "erfc": (60, 1),
    "exp2": (1, 1),
    "igamma": (265, 6),
    "igamma_grad_a": (536, 11),
    "igammac": (265, 6),
    "lgamma": (52, 4),
    "logistic": (3, 1),
    "nextafter": (24, 0),
    "polygamma": (71, 11),
    "random_gamma_grad": (519, 10),
    "regularized_incomplete_beta": (204, 12),
    "sinh": (10, 3),
    "zeta": (113, 11),
}
if set(EXPANDED) != prim.EXPANDED_TRANSCENDENTAL:
    raise AssertionError(sorted(set(EXPANDED) ^ prim.EXPANDED_TRANSCENDENTAL))

#: Flops per result element that a special function's second reader fusion, and each one after
#: it, computes again (`fusion.fusion_work`): XLA fuses the cheap part of the expansion (the
#: polynomials, selects) into every loop that reads the result, and computes the expensive part
#: (exp, log, divisions) once. Measured as the increase of `cost_analysis()` flops when `f(x)`
#: on f32[64] (and [8, 12]: the same) is read by 1, 2, 3, 4 elementwise loops `f(x) * c + x`.
EXPANDED_DUPLICATED = {
    "acos": (0, 0),
    "acosh": (5, 4),
    "asin": (1, 1),
    "asinh": (8, 6),
    "atanh": (5, 5),
    "bessel_i0e": (84, 82),
    "bessel_i1e": (84, 82),
    "cosh": (1, 1),
    "digamma": (20, 11),
    "erf_inv": (36, 35),
    "erfc": (62, 58),
    "exp2": (0, 0),
    "igamma": (8, 8),
    "igamma_grad_a": (35, 25),
    "igammac": (8, 8),
    "lgamma": (33, 19),
    "logistic": (0, 0),
    "nextafter": (24, 24),
    "polygamma": (62, 59),
    "random_gamma_grad": (29, 24),
    "regularized_incomplete_beta": (108, 35),
    "sinh": (6, 6),
    "zeta": (135, 103),
}
if set(EXPANDED_DUPLICATED) != prim.EXPANDED_TRANSCENDENTAL:
    raise AssertionError(sorted(set(EXPANDED_DUPLICATED) ^ prim.EXPANDED_TRANSCENDENTAL))


#: (Flops, transcendentals) per element of the core and of the whole result of a one-operand
#: special function run on a broadcast (not of a scalar): XLA's simplifier sinks the broadcast past the cheap ops of
#: the expansion, not past its selects, whose predicate has another element type
#: (`simplify._elementwise_uniform`), so the selects and what follows them run on the whole
#: result (which is no broadcast then) and the rest on the core. Measured: `f(broadcast(x))`,
#: x f32[16, 32] in [0.5, 1.5], broadcast 4 and 8 times along a new dim 0 (erfc: 58 x 512 +
#: 6 x 2,048 = 41,984 flops at 4 times, where the model counted 60 x 512; fuzz seed 18 #306,
#: a gelu of a broadcast, 0.78 of XLA's flops). Those that sink whole (acos, asin, cosh,
#: logistic, exp2) and those of several operands are not listed.
EXPANDED_ON_BROADCAST = {
    "acosh": ((6, 1), (4, 0)),
    "asinh": ((12, 2), (3, 0)),
    "atanh": ((5, 1), (2, 0)),
    "bessel_i0e": ((84, 1), (1, 0)),
    "bessel_i1e": ((82, 2), (1, 0)),
    "digamma": ((20, 59), (2, 1)),
    "erf_inv": ((20, 19), (2, 0)),
    "erfc": ((58, 6), (1, 0)),
    "lgamma": ((9, 43), (0, 4)),
    "sinh": ((9, 1), (3, 0)),
}


def expanded_extra_copies(primitive: str, reader_fusions: int) -> float:
    """How many more times than once XLA counts the flops of a special function read by
    `reader_fusions` loop fusions (`EXPANDED_DUPLICATED`, as a fraction of `EXPANDED`'s
    count): erfc read by two loops counts 60 + 62 flops per element, by three 60 + 62 + 58.
    Split for one reader (`fusion._widened_by_its_reader`), it counts one reader's cheap part
    less than for two: 60 + 62 - 58 (measured `f(x)[:, None] * w` on f32[32]: digamma 82 per
    element, erfc 64, lgamma 66, polygamma 74, erf_inv 38, bessel_i0e 85, asinh 13, as the
    table gives)."""
    if reader_fusions < 1 or primitive not in EXPANDED_DUPLICATED:
        return 0.0
    first, further = EXPANDED_DUPLICATED[primitive]
    per_element = EXPANDED[primitive][0]
    return (first + further * (reader_fusions - 2)) / per_element if per_element else 0.0


def _size(program, vid: int) -> int:
    return program.values[vid].size


@flop_rule(*sorted(prim.EXPANDED_TRANSCENDENTAL))
def expanded_flops(op, program):
    per_flops, per_trans = EXPANDED[op.primitive]
    n = sum(_size(program, r) for r in op.results)
    return float(n * per_flops), float(n * per_trans)


# --- bits and randomness --------------------------------------------------------------------------


@flop_rule("bitcast_convert_type")
def bitcast_convert_type_flops(op, program):
    """Same width: 1 per element (f32 -> i32). To a narrower type XLA shifts and masks: 6 per
    narrow result element (f32 -> u8 and f32 -> bf16); to a wider one 5 per narrow operand element
    (u8[..., 4] -> f32)."""
    src, dst = program.values[op.operands[0]], program.values[op.results[0]]
    if len(dst.shape) > len(src.shape):
        return 6.0 * dst.size, 0.0
    if len(dst.shape) < len(src.shape):
        return 5.0 * src.size, 0.0
    return float(dst.size), 0.0


@flop_rule("random_bits")
def random_bits_flops(op, program):
    """Threefry on 32-bit bits: 45 integer ops per element and 13 once, for one dim longer than
    1 (u32[n]: 45 n + 13, n = 2 .. 4,096; a single element 53). Each further such dim adds 2 per
    element and 2 per index of every such dim but the last: the counter is the element's linear
    index, summed from one iota per dim (u32[2, 8]: 769, [8, 2]: 781, [32, 32]: 48,205,
    [2, 3, 4]: 1,199, [8, 8, 8]: 25,133, [2, 2, 2, 2]: 841; fuzz seed 18 #229, the dropout of
    an f32[16], counted 47 per element: 1.06 of XLA's flops). 8- and 16-bit bits add 1 per
    element (narrowed, u8[32, 32]: 49,229), 64-bit bits 3 (a threefry pair joined, u64[64, 64]
    with x64 on: 204,941)."""
    width = op.param("bit_width", 32)
    extra = 1 if width < 32 else 3 if width == 64 else 0
    n = _size(program, op.results[0])
    dims = [d for d in program.values[op.results[0]].shape if d > 1]
    if not dims:
        return float(53 + extra), 0.0
    linear_index = 2 * n * (len(dims) - 1) + 2 * sum(dims[:-1])
    return float((45 + extra) * n + 13 + linear_index), 0.0


def sharded_random_bits_flops(op, program, ways: tuple[int, ...], whole: tuple[bool, ...]) -> float:
    """Per-device flops of `random_bits` with result dim d cut `ways[d]` ways (`whole[d]`: by
    every mesh axis of more than 1 device, in mesh order), as XLA's partitioner runs it: the
    threefry on the local elements (45 n + 13, n of them, however few), and the counter of
    each element, its global linear index, which JAX builds as sum_d iota_d * stride_d over the
    global shape (`prng.iota_2x32_shape`) and which the CPU computes twice, once into the high
    word's fusion and once into the low word's.

    Per fusion: a dim cut to L > 1 local positions adds the device's offset to its 1-D iota
    (L adds), then multiplies by the stride as uncut (L, if a later dim is longer than 1). The
    offset is index * L converted to u64 (2 scalar flops); the index is a constant table read at
    the partition id, or, for a `whole` cut, the partition id itself, converted first (3). A dim
    cut to L = 1 is a broadcast scalar: its index converted (1, or 2 for a `whole` cut) times the
    stride (1). The terms are summed left to right, each add on the n local elements, except
    where the simplifier sinks the add below the broadcasts, as when one operand is a broadcast
    scalar and the other a broadcast scalar (1 add) or a broadcast 1-D term (its L adds).

    Measured, `jax.random.bits(key, shape)` under a sharding constraint, `cost_analysis()` per
    device (unsharded on the local shape in parentheses): u32[32] cut 8 ways, 207 (193); [2, 16]
    cut (a, bc) on 2x2x2, 217 (193; fuzz seed 19 #2512 predicted 0.911 of XLA's flops); [16, 2]
    (bc, a), 223; [16, 8] (a, b) on 2x4, 809 (781); [2, 3, 4] (a, b, -) on 2x3, 211; [8, 4, 4]
    (abc, -, -), 787 (773); [2, 2, 8] (-, b, ac), 221 (205); [4, 8, 2] (a, -, b), 827; [8] on
    8, 62 (53); [16] cut by b on 2x3, 299 (the padded 6 per device)."""
    shape = program.values[op.results[0]].shape
    local = [-(-d // w) for d, w in zip(shape, ways)]
    n = prod(local)
    width = op.param("bit_width", 32)
    counter, acc = 0, None  # the running sum: None, a broadcast "scalar", its dim, or "full"
    for d, (size, cut, length, by_all) in enumerate(zip(shape, ways, local, whole)):
        if size <= 1:
            continue
        later = prod(shape[d + 1 :]) > 1
        offset = (1 + (length > 1) + by_all) if cut > 1 else 0
        if length > 1:  # a broadcast 1-D term along d
            counter += offset + (length if cut > 1 else 0) + (length if later else 0)
            term = d
        else:  # a broadcast scalar
            counter += offset + later
            term = "scalar"
        if acc is None:
            acc = term
        elif acc == term == "scalar":
            counter += 1
        elif "scalar" in (acc, term):
            acc = term if acc == "scalar" else acc
            counter += local[acc] if acc != "full" else n
        else:
            counter, acc = counter + n, "full"
    per_element = 45 + (1 if width < 32 else 3 if width == 64 else 0)
    return float(per_element * n + 13 + 2 * counter)


@flop_rule("random_split")
def random_split_flops(op, program):
    """44 per new key plus 13 (split into 4: 189; into 16: 717)."""
    return float(44 * _size(program, op.results[0]) + 13), 0.0


@flop_rule("random_fold_in")
def random_fold_in_flops(op, program):
    """One threefry hash per key: 53."""
    return float(53 * _size(program, op.results[0])), 0.0


@flop_rule("random_seed")
def random_seed_flops(op, program):
    """Splitting a seed into the key's two words: 3 per key."""
    return float(3 * _size(program, op.results[0])), 0.0


@flop_rule("threefry2x32")
def threefry2x32_flops(op, program):
    """39 per pair of counts (1,024 pairs: 39,947)."""
    return float(39 * _size(program, op.results[0])), 0.0


# --- windows ---------------------------------------------------------------------------------------


def _window_elements(op) -> int:
    return prod(op.param("window_dimensions", ()) or (1,))


@flop_rule(*sorted(prim.REDUCE_WINDOWS))
def reduce_window_flops(op, program):
    """window - 1 combines per result element, padding taps included (max pool 2x2/2 on
    [2, 8, 8, 4]: 384; 3x3/1 SAME: 4,096)."""
    combines = _window_elements(op) - 1
    return float(sum(_size(program, r) for r in op.results) * combines), 0.0


@flop_rule("select_and_scatter_add")
def select_and_scatter_add_flops(op, program):
    """Per dy element: 11 per window comparison (the select, with its NaN handling) and 1 add
    (2x2/2 on [2, 8, 8, 4]: 4,352; 3x3/1 SAME: 45,568)."""
    per_source = 11 * (_window_elements(op) - 1) + 1
    return float(_size(program, op.operands[0]) * per_source), 0.0


# --- scans and sort ---------------------------------------------------------------------------------

_SCAN_BASE = 16


def scan_combines(n: int) -> int:
    """Combines XLA's CPU backend spends on a prefix scan of length n: a scan of up to 16 elements
    is one reduce-window (n * (n - 1)); a longer one is padded to a multiple of 16, scanned in
    blocks of 16, the block totals scanned recursively and added back (measured exactly for n in
    2, 16, 17, 20, 33, 40, 100, 256, 300, 1000, 4096)."""
    if n <= _SCAN_BASE:
        return n * (n - 1)
    blocks = ceil(n / _SCAN_BASE)
    padded = blocks * _SCAN_BASE
    carry = blocks - 1 if blocks <= _SCAN_BASE else 0
    return padded * (_SCAN_BASE - 1) + scan_combines(blocks) + padded + carry


@flop_rule(*sorted(prim.CUMULATIVE))
def cumulative_flops(op, program):
    """`scan_combines` per scanned row; cumlogsumexp's combine is 8 flops and 2 transcendentals
    (a log-add-exp), the others 1 flop."""
    shape = program.values[op.operands[0]].shape
    axis = op.param("axis", 0)
    combines = prod(shape) // max(shape[axis], 1) * scan_combines(shape[axis]) if shape else 0
    if op.primitive == "cumlogsumexp":
        return 8.0 * combines, 2.0 * combines
    return float(combines), 0.0


def window_scan_factor(op, program) -> float:
    """A prefix scan's combines when each output folds its whole window (n - 1 per output, the
    reduce-window XLA's partitioner leaves) over `scan_combines`' blocked count: 1.0 for a row
    of up to 16 elements."""
    shape = program.values[op.operands[0]].shape
    n = shape[op.param("axis", 0)] if shape else 1
    blocked = scan_combines(n)
    return n * (n - 1) / blocked if blocked else 1.0


#: Primitives counted as a sort of their first operand's elements (`sort_flops_of`).
SORTS = frozenset({"sort", "top_k"})


def sort_flops_of(n: int) -> int:
    """XLA's count for sorting n elements: N * ceil(log2 N)."""
    return n * max(n - 1, 0).bit_length()


@flop_rule("sort")
def sort_flops(op, program):
    """N * ceil(log2 N) over all N elements of the first operand, rows or not, as XLA counts it
    ([4, 8]: 160; [4, 100]: 3,600; [32, 32]: 10,240)."""
    n = _size(program, op.operands[0])
    if program.values[op.operands[0]].shape[op.param("dimension", 0)] == 1:
        return 0.0, 0.0  # sorting rows of one element: XLA removes the sort
    return float(sort_flops_of(n)), 0.0


@flop_rule("top_k")
def top_k_flops(op, program):
    """A sort of all N elements, N * ceil(log2 N), unless XLA:CPU calls its TopK library routine
    (a custom call `cost_analysis()` does not count: zero here). XLA expands `top_k` into a sort
    and slices of its first k, then matches that pattern back into the call; the simplifier runs
    in between and merges a slice of the result into the expansion's, so a result read by a
    unit-stride slice that cuts another dim or starts past 0 in the top-k dim no longer matches
    and the whole sort stays (`top_k_stays_a_sort`). The call is for f32 only; a top_k that keeps
    the whole dim is a sort of (values, iota). Measured: `lax.top_k(x, 2)[0]` of x[3, 3, 8, 8]
    calls TopK, `...[:, :, :-1]` or `[..., 1]` sorts 5,760 flops, `[..., :1]` or `[..., ::2]` (not
    merged) still calls; of x[12, 16, 6, 2] (whole dim) sorts 27,648; fuzz seed 18 #256, a
    batchnorm of `top_k(x, 2)[0][:, :, :-1]`, predicted 1,132 of 6,892; seed 14 #696, a `top_k`
    of the whole last dim, 1,728 of 29,376."""
    shape = program.values[op.operands[0]].shape
    axis = op.param("axis", len(shape) - 1)
    if not shape or shape[axis] == 1 or not top_k_stays_a_sort(op, program):
        return 0.0, 0.0
    return float(sort_flops_of(_size(program, op.operands[0]))), 0.0


def top_k_stays_a_sort(op, program) -> bool:
    """Whether XLA:CPU leaves `top_k` op a sort rather than its TopK call (`top_k_flops`): it keeps
    its whole dim, sorts a non-f32 operand, or a result is read by a unit-stride slice XLA merges
    into the expansion's (cutting a dim other than the top-k one, or starting past 0 in it)."""
    operand = program.values[op.operands[0]]
    shape = operand.shape
    axis = op.param("axis", len(shape) - 1) % len(shape)
    if op.param("k", 0) >= shape[axis] or str(operand.dtype) != "float32":
        return True
    uses = program.uses()
    for r in op.results:
        for user, _ in uses[r]:
            reader = program.ops[user]
            if reader.primitive != "slice" or any(
                s not in (None, 1) for s in reader.param("strides") or ()
            ):
                continue
            starts, limits = reader.param("start_indices"), reader.param("limit_indices")
            out = program.values[r].shape
            if starts[axis] != 0 or any(
                d != axis and (starts[d] != 0 or limits[d] != out[d]) for d in range(len(out))
            ):
                return True
    return False
