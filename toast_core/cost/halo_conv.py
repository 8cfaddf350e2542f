"""Flops of a convolution on one device when its result is cut along a spatial dim, as XLA's SPMD
partitioner runs it (`PartitionConvolutionTiledOutput`, xla/service/spmd/convolution_handler.cc).

The partitioner reshards the input as a *windowed input* (`ReshardAsWindowedInput`): each device
extends its input shard with the halos its windows reach into (collective-permutes from its
neighbours) to `stride * (out - 1) + (window - 1) * dilation + 1` elements along that dim, where
`out` is its result shard (`ceil(n / k)` of the `n` outputs on `k` devices), and convolves that
with no padding. So two things differ from the global count's share:

* the convolution: the padding is now data (zeros), so every tap of every local output counts:
  `out * window` taps along a cut dim, where the global count skips the taps on padding
  (`flops.valid_taps`);
* the mask: where a window reaches past the input (padding: low on the first device, high on the
  last), the extended shard is masked to zero by a select on each element's position
  (`ExchangeHaloAndGetValidData`): an add (iota + the device's offset), a compare per side that
  can fall outside (low when the padding is, high when the last device's window ends past the
  input), an `and` of two compares, and the select: 3 or 5 flops per element of the extended
  input, and 2 scalars for the offset (partition id converted and scaled). A second cut spatial
  dim extends and masks the already extended shard.

Measured (f32, XLA:CPU): `conv(x[2, 4, 12], w[5, 4, 3], SAME)` with W cut 3 ways: 1,202 flops per
device (960 for the convolution on [2, 4, 6], 240 for the mask, 2), where the share of the global
2,720 is 907; with padding (2, 0) one compare: 1,106; VALID on [2, 4, 16] 2 ways, no mask: 1,683;
a 3x3 SAME conv of [2, 4, 12, 8] with H cut 3 and W 2 ways: 13,922 (11,520 + 960 + 1,440 + 2);
fuzz seed 19 #188, a 3x2 conv with H cut 3 ways: 34,818, the share 21,845.
"""

from __future__ import annotations

from toast_core.cost.flops import conv_window, convolution_flops, valid_taps
from toast_core.ir.program import Op, Program

__all__ = ["halo_conv_flops", "spatial_dims"]


def spatial_dims(op: Op) -> tuple[tuple[int, int, int], ...]:
    """(input dim, kernel dim, result dim) of each spatial dim of a convolution."""
    dn = dict(op.param("dimension_numbers"))
    lhs, rhs, out = dn["lhs_spec"], dn["rhs_spec"], dn["out_spec"]
    return tuple((lhs[i], rhs[i], out[i]) for i in range(2, len(lhs)))


def halo_conv_flops(
    op: Op,
    program: Program,
    share: float,
    out_ways: tuple[float, ...],
    lhs_ways: tuple[float, ...],
) -> float | None:
    """Flops of one execution of convolution `op` on one device, given `share`, the global
    count's share the device computes (its work's cut), `out_ways` the shard count of each
    spatial dim of the result and `lhs_ways` of each dim of the input (module essay). None when
    no spatial dim is cut or a cut one is not the windowed input the essay describes (dilated
    input, the input cut otherwise than the result): the share stands."""
    lhs = program.values[op.operands[0]].shape
    rhs = program.values[op.operands[1]].shape
    out = program.values[op.results[0]].shape
    strides, padding, lhs_dil, rhs_dil = conv_window(op, len(lhs) - 2)
    ratio, cut = 1.0, False
    # the input shard, dim by dim; each cut spatial dim replaces its size by the extended one
    extended = [n / max(w, 1.0) for n, w in zip(lhs, lhs_ways)]
    mask = 0.0
    for i, (ld, kd, od) in enumerate(spatial_dims(op)):
        k = out_ways[i]
        if k <= 1 + 1e-9:
            continue
        if lhs_dil[i] != 1 or abs(lhs_ways[ld] - k) > 1e-9:
            return None
        cut = True
        n, window, stride, dil = lhs[ld], rhs[kd], strides[i], rhs_dil[i]
        lo = padding[i][0]
        local_out = -(-out[od] // round(k))
        full = valid_taps(n, out[od], window, stride, lo, 1, dil)
        if full == 0:
            return None
        ratio *= k * local_out * window / full
        ext = stride * (local_out - 1) + (window - 1) * dil + 1
        extended[ld] = ext
        last_end = (round(k) - 1) * local_out * stride - lo + ext
        compares = (lo > 0) + (last_end > n)
        if compares:
            elements = 1.0
            for e in extended:
                elements *= e
            mask += elements * (2 * compares + 1)
    if not cut:
        return None
    return convolution_flops(op, program) * share * ratio + mask + (2 if mask else 0)
