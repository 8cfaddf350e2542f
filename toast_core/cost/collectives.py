"""Alpha-beta cost of collectives on a ring, per mesh axis and composed over several mesh axes.

The model (DESIGN.md §4; the ring algorithms of "How to Scale Your Model", jax-ml scaling book,
and the classic alpha-beta model of Thakur, Rabenseifner & Gropp 2005): a collective over a mesh
axis of size `n` runs `n - 1` ring steps; each step costs a fixed latency alpha plus the bytes it
moves divided by W, the bandwidth of that mesh axis's links. With `V` the bytes of the *full*
array on that mesh axis (the gathered array for an all-gather, the unreduced buffer for an
all-reduce):

    all-gather, reduce-scatter   (n - 1) * alpha + (n - 1) / n   * V / W
    all-reduce                   2 * all-gather              (reduce-scatter, then all-gather)
    all-to-all                   (n - 1) * alpha + (n - 1) / n^2 * V / W
    collective-permute           alpha + V_halo / W

For all-to-all, `V` is likewise the full array on the mesh axis, i.e. `n` times one device's
buffer: every device keeps `1/n` of its buffer and sends the other `(n - 1)/n` of it.

Worked example: all-gather of a 1 MiB array (V = 2**20 bytes) over `model=4` on links of
W = 9e10 B/s with alpha = 5e-6 s costs 3 * 5e-6 + 0.75 * 2**20 / 9e10 = 2.37e-5 s; the
all-reduce of the same buffer costs twice that.

A collective over several mesh axes (a dim sharded on `("data", "model")`) composes per mesh axis,
one stage per axis, each stage priced with its own axis's W and alpha (`collective_time_s`). The
size of the buffer each stage moves depends on the stage order; we use the order a hierarchical
implementation picks, which is the cheapest one under this model: **slow mesh axes move the
smallest buffer**. An all-gather runs the slow axes first (while the buffer is still sharded),
then the fast ones; a reduce-scatter runs the fast axes first and the slow ones last; an
all-reduce is that reduce-scatter followed by that all-gather. Mesh axes of the same link kind
keep the order given, minor (last) axis first for an all-gather; on equal links the order does
not change the bandwidth term at all, e.g. all-gather over `(a, b)` of V costs
`(n_b - 1)/n_b * (V / n_a) / W + (n_a - 1)/n_a * V / W = (n_a n_b - 1)/(n_a n_b) * V / W`,
the cost of one ring over `n_a * n_b` devices, with `(n_a - 1) + (n_b - 1)` latency steps
instead of `n_a n_b - 1`.

This module also says how many bytes per device the optimized HLO reports for each collective
(`hlo_result_bytes`), so predicted and compiled collective bytes can be compared
(`toast_core.apply.hlo.collective_bytes_by_kind`). Note that XLA's CPU pipeline never emits
`reduce-scatter`: it lowers one to an all-reduce of the full buffer followed by a dynamic slice,
so on simulated CPU devices a predicted reduce-scatter shows up as an all-reduce of `V` bytes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from toast_core.errors import ToastError, bad_value
from toast_core.mesh.spec import HardwareSpec, MeshSpec

__all__ = [
    "COLLECTIVE_KINDS",
    "all_gather_s",
    "all_reduce_s",
    "all_to_all_s",
    "collective_permute_s",
    "collective_result_bytes",
    "collective_time_s",
    "hlo_result_bytes",
    "reduce_scatter_s",
    "ring_bytes_sent",
]

COLLECTIVE_KINDS: tuple[str, ...] = (
    "all-gather",
    "all-reduce",
    "all-to-all",
    "collective-permute",
    "reduce-scatter",
)


def _check_args(full_bytes: float, n: int, link_bytes_per_s: float, alpha_s: float) -> None:
    if full_bytes < 0:
        raise ToastError(bad_value("full_bytes", full_bytes, "a non-negative byte count"))
    if n < 1 or int(n) != n:
        raise ToastError(bad_value("n", n, "a positive int mesh axis size"))
    if not link_bytes_per_s > 0:
        raise ToastError(bad_value("link_bytes_per_s", link_bytes_per_s, "a positive bandwidth"))
    if alpha_s < 0:
        raise ToastError(bad_value("alpha_s", alpha_s, "a non-negative latency"))


def all_gather_s(full_bytes: float, n: int, link_bytes_per_s: float, alpha_s: float) -> float:
    """Ring all-gather over a mesh axis of size n: `(n-1)*alpha + (n-1)/n * V/W`.

    `full_bytes` is V, the gathered array (the result on each device). Zero when n == 1 or V == 0.
    Source: DESIGN.md §4; scaling book, "Sharded matrices and how to multiply them".
    """
    _check_args(full_bytes, n, link_bytes_per_s, alpha_s)
    if n == 1 or full_bytes == 0:
        return 0.0
    return (n - 1) * alpha_s + (n - 1) / n * full_bytes / link_bytes_per_s


def reduce_scatter_s(full_bytes: float, n: int, link_bytes_per_s: float, alpha_s: float) -> float:
    """Ring reduce-scatter over a mesh axis of size n: `(n-1)*alpha + (n-1)/n * V/W`.

    `full_bytes` is V, the unreduced buffer on each device (the result is V/n). It mirrors the
    all-gather step for step. Zero when n == 1 or V == 0. Source: DESIGN.md §4.
    """
    return all_gather_s(full_bytes, n, link_bytes_per_s, alpha_s)


def all_reduce_s(full_bytes: float, n: int, link_bytes_per_s: float, alpha_s: float) -> float:
    """Ring all-reduce = reduce-scatter + all-gather: `2 * ((n-1)*alpha + (n-1)/n * V/W)`.

    `full_bytes` is V, the buffer being summed (its size on each device before and after).
    Source: DESIGN.md §4.
    """
    return 2.0 * all_gather_s(full_bytes, n, link_bytes_per_s, alpha_s)


def all_to_all_s(full_bytes: float, n: int, link_bytes_per_s: float, alpha_s: float) -> float:
    """All-to-all over a mesh axis of size n: `(n-1)*alpha + (n-1)/n^2 * V/W`.

    `full_bytes` is V, the full array on the mesh axis: `n` times each device's buffer. Each
    device sends `(n-1)/n` of its `V/n` buffer. Zero when n == 1 or V == 0. Source: DESIGN.md §4.
    """
    _check_args(full_bytes, n, link_bytes_per_s, alpha_s)
    if n == 1 or full_bytes == 0:
        return 0.0
    return (n - 1) * alpha_s + (n - 1) / (n * n) * full_bytes / link_bytes_per_s


def collective_permute_s(halo_bytes: float, link_bytes_per_s: float, alpha_s: float) -> float:
    """Collective-permute (each device sends one halo to a neighbour): `alpha + V_halo/W`.

    Zero when `halo_bytes == 0`. Source: DESIGN.md §4.
    """
    _check_args(halo_bytes, 1, link_bytes_per_s, alpha_s)
    if halo_bytes == 0:
        return 0.0
    return alpha_s + halo_bytes / link_bytes_per_s


def _check_kind(kind: str) -> None:
    if kind not in COLLECTIVE_KINDS:
        raise ToastError(bad_value("kind", kind, f"one of {', '.join(COLLECTIVE_KINDS)}"))


def hlo_result_bytes(kind: str, full_bytes: int, n: int) -> int:
    """Per-device result bytes XLA's optimized HLO shows for one collective of V = `full_bytes`.

    This is the size of the instruction's result shape (summed over tuple elements), the figure
    `toast_core.apply.hlo` parses from `compiled.as_text()`:

    - all-gather: V (the gathered buffer);
    - all-reduce: V (same shape as its operand);
    - reduce-scatter: V / n (the scattered piece);
    - all-to-all: V / n (one device's buffer; same shape as its operand);
    - collective-permute: V (the halo sent and received; `n` is ignored).

    Divisions are floor divisions: divisibility is enforced by the strategy, not here. Zero when
    the collective is a no-op (n == 1, except for collective-permute, or V == 0).
    """
    _check_kind(kind)
    _check_args(full_bytes, n, 1.0, 0.0)
    if full_bytes == 0 or (n == 1 and kind != "collective-permute"):
        return 0
    if kind in ("reduce-scatter", "all-to-all"):
        return int(full_bytes) // n
    return int(full_bytes)


def ring_bytes_sent(kind: str, full_bytes: float, n: int) -> float:
    """Bytes one device sends in the ring model for a collective of V = `full_bytes`.

    all-gather and reduce-scatter `(n-1)/n * V`; all-reduce `2 * (n-1)/n * V`; all-to-all
    `(n-1)/n^2 * V`; collective-permute `V`. It is the beta term of the time functions times W.
    """
    _check_kind(kind)
    _check_args(full_bytes, n, 1.0, 0.0)
    if kind == "collective-permute":
        return float(full_bytes)
    if kind == "all-to-all":
        return (n - 1) / (n * n) * full_bytes
    factor = 2.0 if kind == "all-reduce" else 1.0
    return factor * (n - 1) / n * full_bytes


def _mesh_axes(axes: Sequence[str] | str, mesh: MeshSpec) -> tuple[str, ...]:
    if isinstance(axes, str):
        axes = (axes,)
    axes = tuple(axes)
    for axis in axes:
        if axis not in mesh.axis_names:
            raise ToastError(bad_value("axes", axes, f"mesh axes among {mesh.axis_names}"))
    if len(set(axes)) != len(axes):
        raise ToastError(bad_value("axes", axes, "distinct mesh axes"))
    return axes


def collective_result_bytes(
    kind: str, full_bytes: int, axes: Sequence[str] | str, mesh: MeshSpec
) -> int:
    """`hlo_result_bytes` for a collective over several mesh axes (n = product of their sizes)."""
    axes = _mesh_axes(axes, mesh)
    return hlo_result_bytes(kind, full_bytes, math.prod(mesh.size(axis) for axis in axes))


def _gather_order(axes: tuple[str, ...], mesh: MeshSpec) -> tuple[str, ...]:
    """Stage order of an all-gather: slow mesh axes first, then minor (last) axes first."""
    minor_first = tuple(reversed(axes))
    return tuple(sorted(minor_first, key=lambda axis: not mesh.is_slow(axis)))


def _staged_gather_s(
    full_bytes: float, axes: tuple[str, ...], mesh: MeshSpec, hw: HardwareSpec
) -> float:
    """Sum of one all-gather stage per mesh axis, the buffer growing by each axis's size."""
    stages = _gather_order(axes, mesh)
    buffer_bytes = full_bytes / math.prod(mesh.size(axis) for axis in stages)
    total_s = 0.0
    for axis in stages:
        n = mesh.size(axis)
        slow = mesh.is_slow(axis)
        buffer_bytes *= n
        total_s += all_gather_s(buffer_bytes, n, hw.link_bytes_per_s(slow), hw.alpha_s(slow))
    return total_s


def collective_time_s(
    kind: str,
    full_bytes: float,
    axes: Sequence[str] | str,
    mesh: MeshSpec,
    hw: HardwareSpec,
) -> float:
    """Time of one collective over the mesh axes `axes`, composed per mesh axis (module essay).

    `full_bytes` is V over all of `axes` together (the gathered array; the unreduced buffer; for
    all-to-all `n_total` times each device's buffer; for collective-permute the halo). Stages:

    - all-gather: slow axes first, then the others minor-first; the stage on axis `a` gathers
      the buffer from `B` to `B * n_a` bytes and costs `all_gather_s(B * n_a, n_a, W_a, alpha_a)`;
    - reduce-scatter: the same stages in reverse (a mirror image, so the same total time);
    - all-reduce: reduce-scatter then all-gather, i.e. twice the all-gather time;
    - all-to-all: one stage per axis, each re-distributing the whole per-device buffer
      `b = V / n_total`: `sum_a all_to_all_s(b * n_a, n_a, W_a, alpha_a)` (order-free);
    - collective-permute: one hop on the slowest link among `axes` (`alpha + V/W`).

    An empty `axes` or size-1 axes cost nothing.
    """
    _check_kind(kind)
    axes = _mesh_axes(axes, mesh)
    if full_bytes < 0:
        raise ToastError(bad_value("full_bytes", full_bytes, "a non-negative byte count"))
    axes = tuple(axis for axis in axes if mesh.size(axis) > 1)
    if not axes or full_bytes == 0:
        return 0.0
    if kind == "collective-permute":
        slow = any(mesh.is_slow(axis) for axis in axes)
        return collective_permute_s(full_bytes, hw.link_bytes_per_s(slow), hw.alpha_s(slow))
    if kind == "all-to-all":
        buffer_bytes = full_bytes / math.prod(mesh.size(axis) for axis in axes)
        total_s = 0.0
        for axis in axes:
            n = mesh.size(axis)
            slow = mesh.is_slow(axis)
            total_s += all_to_all_s(
                buffer_bytes * n, n, hw.link_bytes_per_s(slow), hw.alpha_s(slow)
            )
        return total_s
    gather_s = _staged_gather_s(full_bytes, axes, mesh, hw)
    return 2.0 * gather_s if kind == "all-reduce" else gather_s
