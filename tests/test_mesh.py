"""MeshSpec and HardwareSpec: construction, parsing, presets, and errors that show the bad value."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from toast_core.errors import ToastError
from toast_core.mesh import HARDWARE_PRESETS, HardwareSpec, MeshSpec, hardware

GIB = 2**30
GB = 10**9


def test_mesh_properties():
    mesh = MeshSpec({"data": 2, "model": 4})
    assert mesh.axis_names == ("data", "model")
    assert mesh.axis_sizes == (2, 4)
    assert mesh.size("model") == 4
    assert mesh.n_devices == 8
    assert not mesh.is_slow("data")
    assert mesh.link_kind("model") == "fast"
    assert mesh.as_dict() == {"data": 2, "model": 4}
    assert str(mesh) == "data=2,model=4"


def test_mesh_slow_axes_normalized_to_mesh_order():
    mesh = MeshSpec({"dcn": 2, "data": 2, "model": 4}, slow_axes=("model", "dcn"))
    assert mesh.slow_axes == ("dcn", "model")
    assert mesh.is_slow("dcn") and mesh.is_slow("model") and not mesh.is_slow("data")
    assert mesh == MeshSpec({"dcn": 2, "data": 2, "model": 4}, slow_axes=["dcn", "model"])
    assert str(mesh) == "dcn=2:slow,data=2,model=4:slow"


def test_mesh_is_hashable_and_frozen():
    first = MeshSpec({"data": 2, "model": 4})
    second = MeshSpec([("data", 2), ("model", 4)])
    assert first == second and hash(first) == hash(second)
    assert len({first, second, MeshSpec({"model": 4, "data": 2})}) == 2  # order matters
    with pytest.raises(AttributeError):
        first.axes = ()  # type: ignore[misc]


def test_mesh_as_dict_is_a_copy():
    mesh = MeshSpec({"data": 2})
    mesh.as_dict()["data"] = 99
    assert mesh.size("data") == 2


def test_mesh_parse():
    assert MeshSpec.parse("data=2,model=4") == MeshSpec({"data": 2, "model": 4})
    parsed = MeshSpec.parse(" dcn = 2 : slow , model=4:fast ")
    assert parsed == MeshSpec({"dcn": 2, "model": 4}, slow_axes=("dcn",))
    assert repr(parsed) == "MeshSpec({'dcn': 2, 'model': 4}, slow_axes=('dcn',))"


@given(
    st.dictionaries(
        st.from_regex(r"[a-z_][a-z0-9_]{0,6}", fullmatch=True),
        st.integers(min_value=1, max_value=4096),
        min_size=1,
        max_size=4,
    ),
    st.data(),
)
def test_mesh_str_parse_round_trip(axes, data):
    slow = data.draw(st.lists(st.sampled_from(sorted(axes)), unique=True))
    mesh = MeshSpec(axes, slow_axes=slow)
    assert MeshSpec.parse(str(mesh)) == mesh
    assert mesh.n_devices == math.prod(axes.values())


@pytest.mark.parametrize(
    ("axes", "shown"),
    [
        ({}, "axes={}"),
        ({"data": 0}, "axes['data']=0"),
        ({"data": -2}, "axes['data']=-2"),
        ({"data": 2.0}, "axes['data']=2.0"),
        ({"data": True}, "axes['data']=True"),
        ({"data": "2"}, "axes['data']='2'"),
        ({"2data": 2}, "axes='2data'"),
        ({"da ta": 2}, "axes='da ta'"),
        ([("data", 2), ("data", 4)], "('data', 4)"),
        ("data=2", "axes='data=2'"),
    ],
)
def test_bad_mesh_raises_with_value(axes, shown):
    with pytest.raises(ToastError) as error:
        MeshSpec(axes)
    assert shown in str(error.value)


def test_unknown_slow_axis_raises():
    with pytest.raises(ToastError, match="slow_axes=.*'dcn'"):
        MeshSpec({"data": 2}, slow_axes=("dcn",))


@pytest.mark.parametrize(
    "text", ["", "data", "data=", "data=two", "data=2,", "data=2:medium", "=2"]
)
def test_bad_mesh_text_raises_with_value(text):
    with pytest.raises(ToastError) as error:
        MeshSpec.parse(text)
    assert f"mesh={text!r}" in str(error.value)


def test_unknown_mesh_axis_lookups_raise():
    mesh = MeshSpec({"data": 2})
    with pytest.raises(ToastError, match="axis='model'"):
        mesh.size("model")
    with pytest.raises(ToastError, match="axis='model'"):
        mesh.is_slow("model")


PRESET_TABLE = [
    ("tpu-v4", 2.75e14, 1.2e12, 32 * GIB, 9e10, 2.5e10),
    ("tpu-v5e", 1.97e14, 8.1e11, 16 * GIB, 9e10, 2.5e10),
    ("tpu-v5p", 4.59e14, 2.8e12, 95 * GIB, 1.8e11, 2.5e10),
    ("tpu-v6e", 9.2e14, 1.6e12, 32 * GIB, 1.8e11, 2.5e10),
    ("a100-80gb", 3.12e14, 2.0e12, 80 * GB, 3.0e11, 2.5e10),
    ("h100-80gb", 9.9e14, 3.35e12, 80 * GB, 4.5e11, 5.0e10),
    ("h200", 9.9e14, 4.8e12, 141 * GB, 4.5e11, 5.0e10),
    ("b200", 2.25e15, 8.0e12, 180 * GB, 9.0e11, 5.0e10),
]


def test_presets_are_exactly_the_design_table():
    assert list(HARDWARE_PRESETS) == [row[0] for row in PRESET_TABLE]


@pytest.mark.parametrize("row", PRESET_TABLE, ids=[row[0] for row in PRESET_TABLE])
def test_preset_values(row):
    name, flops, hbm_bw, hbm_bytes, fast, slow = row
    spec = hardware(name)
    assert spec.name == name
    assert spec.peak_flops_per_s == flops
    assert spec.hbm_bytes_per_s == hbm_bw
    assert spec.hbm_capacity_bytes == hbm_bytes and isinstance(spec.hbm_capacity_bytes, int)
    assert spec.link_bytes_per_s(is_slow=False) == fast
    assert spec.link_bytes_per_s(is_slow=True) == slow
    assert spec.alpha_s(is_slow=False) == 5e-6 and spec.alpha_s(is_slow=True) == 2e-5
    assert spec.flops_efficiency == 1.0
    assert HardwareSpec.from_dict(spec.to_dict()) == spec


def test_hardware_resolution():
    spec = hardware("TPU-v5e")
    assert spec is HARDWARE_PRESETS["tpu-v5e"]
    assert hardware(spec) is spec
    custom = {**spec.to_dict(), "name": "my-chip", "flops_efficiency": 0.6}
    built = hardware(custom)
    assert built.name == "my-chip"
    assert built.effective_flops_per_s == pytest.approx(0.6 * 1.97e14)
    assert hash(built) == hash(HardwareSpec.from_dict(custom))


def test_unknown_preset_lists_valid_names():
    with pytest.raises(ToastError) as error:
        hardware("tpu-v9")
    message = str(error.value)
    assert "hardware='tpu-v9'" in message
    assert all(name in message for name in HARDWARE_PRESETS)


def test_hardware_rejects_other_types():
    with pytest.raises(ToastError, match="hardware=42"):
        hardware(42)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("peak_flops_per_s", 0),
        ("hbm_bytes_per_s", -1.0),
        ("hbm_capacity_bytes", float("inf")),
        ("fast_link_bytes_per_s", "fast"),
        ("slow_link_bytes_per_s", None),
        ("fast_alpha_s", -5e-6),
        ("slow_alpha_s", float("nan")),
        ("flops_efficiency", 1.5),
        ("flops_efficiency", True),
        ("name", ""),
    ],
)
def test_bad_hardware_field_raises_naming_it(field, value):
    data = {**HARDWARE_PRESETS["h100-80gb"].to_dict(), field: value}
    with pytest.raises(ToastError) as error:
        HardwareSpec.from_dict(data)
    assert f"`{field}={value!r}`" in str(error.value)


def test_from_dict_unknown_and_missing_fields():
    data = HARDWARE_PRESETS["h200"].to_dict()
    with pytest.raises(ToastError, match="unknown: peak_tflops"):
        HardwareSpec.from_dict({**data, "peak_tflops": 1.0})
    del data["hbm_bytes_per_s"]
    with pytest.raises(ToastError, match="missing: hbm_bytes_per_s"):
        HardwareSpec.from_dict(data)
    with pytest.raises(ToastError, match="hardware=\\['h200'\\]"):
        HardwareSpec.from_dict(["h200"])  # type: ignore[arg-type]
