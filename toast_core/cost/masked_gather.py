"""Flops XLA's SPMD partitioner adds to a gather whose indexed operand dim is sharded (the masked
rule of `rules_indexing.gather_rule`): each device clamps every index, tests whether it falls in
its own rows, looks the row up at the index minus its offset, zeros the rows it does not own (a
select per result element), and the all-reduce adds the partial results. None of that is in the
unsharded gather, which XLA counts as zero flops (clamped modes) or as its fill mask.

Measured on jaxlib 0.10.2 (CPU), `x[i]` of x[R * n, D] with i[k] replicated and dim 0 on n
devices, besides the index normalization (3 per index) and the all-reduce (1 per result element):

* per index vector: a clamp, two compares, an or, and the subtract of the device's offset: 5;
  with one local row (R = 1) the subtract goes: 4;
* once: the device's offset from its partition id. On a dim cut over every device of the mesh,
  a convert, a multiply by R and an add of R - 1 (3; 1 with R = 1: the convert); on a dim cut over
  some mesh axes the offset is a table lookup (no flops) times R plus R - 1 (1; 0 with R = 1).
  (x[8, 16], k = 3, over 4 of 4 devices: 123 flops; over 2 of 8: 121; x[4, 16] over 4 of 8: 117);
* a select per local result element.

`jnp.take`'s fill mode (`mode=FILL_OR_DROP`) applies its mask (`flops.gather_flops`: a select per
result element, 3 per index vector) after the all-reduce, on the result's own shard, and every
device tests the bounds of each index it holds: the op's share of its iteration space is wrong
there, masked dims cut or not (fuzz seed 16 #1410, `x[64, 32]` with dim 0 on 8 devices,
`jnp.take(x, i[1], axis=1)`: 8 selects and 3 per index, 11 flops per device, not 67 / 8).
With a masked dim cut, that fill mask is a fusion apart from the gather's (the all-reduce
between them), so it normalizes each index again (`where(i < 0, i + n, i)`, 3 flops) besides
the gather's own normalization (fuzz seed 17 #979: `take_along_axis(x[4, 16], i[2, 16],
axis=0)` with dim 0 on 2 devices, 545 flops; 449 counting it once).
"""

from __future__ import annotations

from math import prod

from toast_core.ir.program import Op, Program


def masked_gather_flops(
    op: Op,
    program: Program,
    masked_ways: float,
    result_ways: float,
    index_ways: float,
    whole_mesh: bool,
    mask_fusions: float = 1.0,
) -> float:
    """Flops of one execution of a gather on one device when its masked (indexed, slice size 1)
    operand dims are cut `masked_ways` ways, its result `result_ways` ways and its indices
    `index_ways` ways; `whole_mesh` when the masked cut spans every device (module essay).

    `mask_fusions`: the loop fusions computing the fill mask (`gather_fusion.gather_copies`),
    each with it; the partitioned lookup is one fusion, computed once. With the mask in
    several fusions, the index normalization is counted on the ops making the index, once per
    fusion, as the model counts it for any gather (fuzz seed 19 #1149, `take_along_axis(x[8,
    64, 2], i)` with dim 0 on 2 devices, read by four loops: 17,799 flops)."""
    dn = dict(op.param("dimension_numbers"))
    slice_sizes = op.param("slice_sizes", ())
    operand = program.values[op.operands[0]].shape
    indices = program.values[op.operands[1]].shape
    vectors = prod(indices[:-1]) / index_ways if indices else 1.0
    result = program.values[op.results[0]].size / result_ways
    out = result + 3 * vectors if "FILL" in str(op.param("mode", "")) else 0.0
    if masked_ways <= 1 + 1e-9:
        return out * mask_fusions
    masked = [
        d for d in dn.get("start_index_map", ()) if slice_sizes[d] == 1 and operand[d] > 1
    ]  # fmt: skip
    one_row = prod(operand[d] for d in masked) / masked_ways <= 1 + 1e-9
    offset = (1 if one_row else 3) if whole_mesh else (0 if one_row else 1)
    if out and mask_fusions <= 1:  # the fill mask's fusion, after the all-reduce, normalizes
        out += 3 * vectors  # the indices again (in several: counted on the index's ops)
    lookup = result + (4 if one_row else 5) * vectors + offset
    return out * mask_fusions + lookup * min(mask_fusions, 1.0)  # none when it is dead


def masked_gathers(program: Program) -> list[int]:
    """Indices of the gathers `masked_gather_flops` may apply to: those with a masked operand dim
    (indexed, slice size 1, size > 1) and those in fill mode."""
    out = []
    for i, op in enumerate(program.ops):
        if op.primitive != "gather" or not op.results:
            continue
        dn = dict(op.param("dimension_numbers"))
        slice_sizes = op.param("slice_sizes", ())
        operand = program.values[op.operands[0]].shape
        fill = "FILL" in str(op.param("mode", ""))
        if fill or any(
            slice_sizes[d] == 1 and operand[d] > 1 for d in dn.get("start_index_map", ())
        ):
            out.append(i)
    return out
