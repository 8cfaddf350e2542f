"""Alpha-beta ring costs of collectives: hand values, properties, multi-axis composition."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from toast_core.cost.collectives import (
    COLLECTIVE_KINDS,
    all_gather_s,
    all_reduce_s,
    all_to_all_s,
    collective_permute_s,
    collective_result_bytes,
    collective_time_s,
    hlo_result_bytes,
    reduce_scatter_s,
    ring_bytes_sent,
)
from toast_core.errors import ToastError
from toast_core.mesh import HardwareSpec, MeshSpec, hardware

W = 9e10
ALPHA = 5e-6
RING_FUNCTIONS = (all_gather_s, reduce_scatter_s, all_reduce_s, all_to_all_s)

byte_counts = st.integers(min_value=0, max_value=2**40)
axis_sizes = st.integers(min_value=1, max_value=512)
bandwidths = st.floats(min_value=1e6, max_value=1e13)
alphas = st.floats(min_value=0.0, max_value=1e-3)


def test_hand_values():
    mib = 2**20
    assert all_gather_s(mib, 4, W, ALPHA) == pytest.approx(3 * ALPHA + 0.75 * mib / W)
    assert all_gather_s(mib, 4, W, ALPHA) == pytest.approx(2.3738e-5, rel=1e-4)
    assert reduce_scatter_s(mib, 4, W, ALPHA) == pytest.approx(3 * ALPHA + 0.75 * mib / W)
    assert all_reduce_s(mib, 4, W, ALPHA) == pytest.approx(2 * (3 * ALPHA + 0.75 * mib / W))
    assert all_to_all_s(mib, 4, W, ALPHA) == pytest.approx(3 * ALPHA + 3 / 16 * mib / W)
    assert collective_permute_s(mib, W, ALPHA) == pytest.approx(ALPHA + mib / W)


def test_zero_bytes_and_size_one_cost_nothing():
    for function in RING_FUNCTIONS:
        assert function(0, 8, W, ALPHA) == 0.0
        assert function(10**9, 1, W, ALPHA) == 0.0
    assert collective_permute_s(0, W, ALPHA) == 0.0


@pytest.mark.parametrize("function", RING_FUNCTIONS)
@given(a=byte_counts, b=byte_counts, n=axis_sizes, w=bandwidths, alpha=alphas)
def test_monotone_in_bytes(function, a, b, n, w, alpha):
    small, large = sorted((a, b))
    assert function(small, n, w, alpha) <= function(large, n, w, alpha)


@given(a=byte_counts, b=byte_counts, w=bandwidths, alpha=alphas)
def test_permute_monotone_in_bytes(a, b, w, alpha):
    small, large = sorted((a, b))
    assert collective_permute_s(small, w, alpha) <= collective_permute_s(large, w, alpha)


@pytest.mark.parametrize("function", RING_FUNCTIONS)
@given(v=byte_counts, w=bandwidths, alpha=alphas)
def test_zero_on_size_one_axis(function, v, w, alpha):
    assert function(v, 1, w, alpha) == 0.0


@given(v=byte_counts, n=axis_sizes, w=bandwidths, alpha=alphas)
def test_all_reduce_is_twice_all_gather(v, n, w, alpha):
    assert all_reduce_s(v, n, w, alpha) == pytest.approx(2 * all_gather_s(v, n, w, alpha))
    assert reduce_scatter_s(v, n, w, alpha) == all_gather_s(v, n, w, alpha)


@given(v=byte_counts, n=axis_sizes)
def test_time_is_alpha_steps_plus_bytes_sent_over_w(v, n):
    for kind, function in (
        ("all-gather", all_gather_s),
        ("reduce-scatter", reduce_scatter_s),
        ("all-to-all", all_to_all_s),
    ):
        expected = (n - 1) * ALPHA + ring_bytes_sent(kind, v, n) / W if v and n > 1 else 0.0
        assert function(v, n, W, ALPHA) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("call", "shown"),
    [
        (lambda: all_gather_s(-1, 4, W, ALPHA), "full_bytes=-1"),
        (lambda: all_gather_s(8, 0, W, ALPHA), "n=0"),
        (lambda: all_to_all_s(8, 2.5, W, ALPHA), "n=2.5"),
        (lambda: all_reduce_s(8, 4, 0.0, ALPHA), "link_bytes_per_s=0.0"),
        (lambda: reduce_scatter_s(8, 4, W, -1.0), "alpha_s=-1.0"),
        (lambda: collective_permute_s(-8, W, ALPHA), "full_bytes=-8"),
        (lambda: hlo_result_bytes("all-gatherr", 8, 2), "kind='all-gatherr'"),
    ],
)
def test_bad_arguments_raise_with_value(call, shown):
    with pytest.raises(ToastError) as error:
        call()
    assert shown in str(error.value)


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("all-gather", 4096),
        ("all-reduce", 4096),
        ("reduce-scatter", 1024),
        ("all-to-all", 1024),
        ("collective-permute", 4096),
    ],
)
def test_hlo_result_bytes(kind, expected):
    assert hlo_result_bytes(kind, 4096, 4) == expected


def test_hlo_result_bytes_of_no_ops():
    assert hlo_result_bytes("all-gather", 4096, 1) == 0
    assert hlo_result_bytes("all-reduce", 0, 4) == 0
    assert hlo_result_bytes("collective-permute", 256, 1) == 256


MESH = MeshSpec({"dcn": 2, "data": 4, "model": 8, "one": 1}, slow_axes=("dcn",))
HW = hardware("tpu-v5p")


@pytest.mark.parametrize("kind", COLLECTIVE_KINDS)
def test_single_axis_matches_per_axis_function(kind):
    v = 3 * 2**24
    w, alpha = HW.fast_link_bytes_per_s, HW.fast_alpha_s
    expected = {
        "all-gather": all_gather_s(v, 8, w, alpha),
        "reduce-scatter": reduce_scatter_s(v, 8, w, alpha),
        "all-reduce": all_reduce_s(v, 8, w, alpha),
        "all-to-all": all_to_all_s(v, 8, w, alpha),
        "collective-permute": collective_permute_s(v, w, alpha),
    }[kind]
    assert collective_time_s(kind, v, ("model",), MESH, HW) == pytest.approx(expected)
    assert collective_time_s(kind, v, "model", MESH, HW) == pytest.approx(expected)


def test_slow_axis_uses_slow_link():
    v = 2**24
    got = collective_time_s("all-gather", v, ("dcn",), MESH, HW)
    assert got == pytest.approx(all_gather_s(v, 2, HW.slow_link_bytes_per_s, HW.slow_alpha_s))
    fast_mesh = MeshSpec({"dcn": 2})
    assert got > collective_time_s("all-gather", v, ("dcn",), fast_mesh, HW)


def test_multi_axis_all_gather_stages_slow_axis_first():
    v = 2**26
    fast_w, slow_w = HW.fast_link_bytes_per_s, HW.slow_link_bytes_per_s
    # Slow dcn gathers the 1/16 shard up to V/8, then model (fast) gathers V/8 up to V.
    expected = all_gather_s(v / 8, 2, slow_w, HW.slow_alpha_s) + all_gather_s(
        v, 8, fast_w, HW.fast_alpha_s
    )
    for axes in (("dcn", "model"), ("model", "dcn")):
        assert collective_time_s("all-gather", v, axes, MESH, HW) == pytest.approx(expected)
        assert collective_time_s("reduce-scatter", v, axes, MESH, HW) == pytest.approx(expected)
        assert collective_time_s("all-reduce", v, axes, MESH, HW) == pytest.approx(2 * expected)


def test_multi_axis_on_equal_links_has_single_ring_bandwidth_term():
    v = 2**26
    no_latency = HardwareSpec("bw-only", 1e15, 1e12, 2**35, W, W / 4, 1e-30, 1e-30)
    composed = collective_time_s("all-gather", v, ("data", "model"), MESH, no_latency)
    assert composed == pytest.approx(all_gather_s(v, 32, W, 0.0))
    composed = collective_time_s("all-to-all", v, ("data", "model"), MESH, no_latency)
    # Each stage re-distributes the per-device buffer v/32 over its own axis.
    assert composed == pytest.approx((3 / 4 + 7 / 8) * v / 32 / W)


def test_multi_axis_latency_is_sum_of_per_axis_steps():
    tiny = 1  # one byte: the time is almost all latency
    got = collective_time_s("all-gather", tiny, ("data", "model"), MESH, HW)
    assert got == pytest.approx((3 + 7) * HW.fast_alpha_s, rel=1e-3)


def test_size_one_and_empty_axes_cost_nothing():
    for kind in COLLECTIVE_KINDS:
        assert collective_time_s(kind, 2**20, ("one",), MESH, HW) == 0.0
        assert collective_time_s(kind, 2**20, (), MESH, HW) == 0.0
        assert collective_time_s(kind, 2**20, ("model", "one"), MESH, HW) == pytest.approx(
            collective_time_s(kind, 2**20, ("model",), MESH, HW)
        )


@pytest.mark.parametrize("kind", COLLECTIVE_KINDS)
@given(
    a=byte_counts,
    b=byte_counts,
    axes=st.lists(st.sampled_from(MESH.axis_names), unique=True, max_size=4),
)
def test_multi_axis_monotone_in_bytes(kind, a, b, axes):
    small, large = sorted((a, b))
    assert collective_time_s(kind, small, axes, MESH, HW) <= collective_time_s(
        kind, large, axes, MESH, HW
    )


@given(v=byte_counts, axes=st.lists(st.sampled_from(MESH.axis_names), unique=True, max_size=4))
def test_multi_axis_all_reduce_is_twice_all_gather(v, axes):
    gather = collective_time_s("all-gather", v, axes, MESH, HW)
    assert collective_time_s("all-reduce", v, axes, MESH, HW) == pytest.approx(2 * gather)


def test_collective_result_bytes_over_axes():
    assert collective_result_bytes("reduce-scatter", 2**20, ("data", "model"), MESH) == 2**15
    assert collective_result_bytes("all-gather", 2**20, ("data", "model"), MESH) == 2**20


def test_bad_axes_raise_with_value():
    with pytest.raises(ToastError, match="axes=\\('data', 'pipe'\\)"):
        collective_time_s("all-gather", 8, ("data", "pipe"), MESH, HW)
    with pytest.raises(ToastError, match="axes=\\('data', 'data'\\)"):
        collective_time_s("all-gather", 8, ("data", "data"), MESH, HW)
    with pytest.raises(ToastError, match="full_bytes=-8"):
        collective_time_s("all-gather", -8, ("data",), MESH, HW)
