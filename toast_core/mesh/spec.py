"""Device meshes and hardware: the two frozen specs every cost function takes.

A `MeshSpec` is the logical device mesh a strategy is written against: an ordered list of named
mesh axes with sizes, e.g. `data=2,model=4` (8 devices). Each mesh axis also has a link kind:
*fast* (ICI on TPU, NVLink on GPU; the default) or *slow* (DCN between TPU slices, InfiniBand or
Ethernet between GPU hosts). The cost model prices a collective over a mesh axis with that axis's
link bandwidth and latency, so marking the cross-host axis slow is what makes the search keep
heavy collectives off it.

A `HardwareSpec` holds the per-chip figures of DESIGN.md §4: peak bf16 FLOP/s, HBM bandwidth and
capacity, the bandwidth of one mesh axis's links of each kind, the per-hop latency (alpha) of
each link kind, and the byte thresholds up to which the target's XLA compiler combines
independent collectives of one kind into one op (`toast_core.cost.combine`). `HARDWARE_PRESETS` carries the public figures for common accelerators, and
`hardware()` resolves a preset name, a spec, or a dict describing a user's own chip.

Neither spec needs devices: a 2048-device mesh is just numbers.

    >>> mesh = MeshSpec.parse("dcn=2:slow,model=4")
    >>> mesh.n_devices, mesh.is_slow("dcn"), str(mesh)
    (8, True, 'dcn=2:slow,model=4')
    >>> hardware("tpu-v5e").link_bytes_per_s(is_slow=True)
    25000000000.0
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Iterable, Mapping
from dataclasses import MISSING, dataclass, fields
from typing import Any

from toast_core.errors import ToastError, bad_value

__all__ = [
    "COMBINABLE_KINDS",
    "HARDWARE_PRESETS",
    "XLA_CPU_COMBINE",
    "XLA_DEFAULT_COMBINE_BYTES",
    "HardwareSpec",
    "MeshSpec",
    "hardware",
]

_AXIS_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_LINK_KINDS = ("fast", "slow")


def _check_axis_name(name: object, argument: str) -> str:
    if not isinstance(name, str) or not _AXIS_NAME.match(name):
        raise ToastError(
            bad_value(
                argument, name, "a mesh axis name (letters, digits, '_', not starting with a digit)"
            )
        )
    return name


def _check_axis_size(name: str, size: object) -> int:
    if isinstance(size, bool) or not isinstance(size, numbers.Integral) or int(size) < 1:
        raise ToastError(bad_value(f"axes[{name!r}]", size, "a positive int mesh axis size"))
    return int(size)


def _normalize_axes(axes: object) -> tuple[tuple[str, int], ...]:
    if isinstance(axes, Mapping):
        items = list(axes.items())
    elif isinstance(axes, Iterable) and not isinstance(axes, str | bytes):
        items = list(axes)
        if not all(isinstance(item, tuple | list) and len(item) == 2 for item in items):
            raise ToastError(bad_value("axes", axes, "a mapping or (name, size) pairs"))
    else:
        raise ToastError(bad_value("axes", axes, "a mapping of mesh axis name to size"))
    if not items:
        raise ToastError(bad_value("axes", axes, "at least one mesh axis"))
    normalized: list[tuple[str, int]] = []
    seen: set[str] = set()
    for name, size in items:
        _check_axis_name(name, "axes")
        if name in seen:
            raise ToastError(
                bad_value("axes", axes, f"distinct mesh axis names ({name!r} repeats)")
            )
        seen.add(name)
        normalized.append((name, _check_axis_size(name, size)))
    return tuple(normalized)


@dataclass(frozen=True, slots=True, init=False)
class MeshSpec:
    """A named device mesh: ordered mesh axes with sizes and a link kind per mesh axis.

    Construct with a mapping in mesh order, `MeshSpec({"data": 2, "model": 4})`, optionally naming
    the mesh axes whose links are slow: `MeshSpec({"dcn": 2, "model": 4}, slow_axes=("dcn",))`.
    Mesh order matters: it is the order of `jax.sharding.Mesh` axis names, major to minor, and of
    the device ids laid out as `np.arange(n_devices).reshape(axis_sizes)`.

    Fields are tuples so the spec is hashable: `axes` holds `(name, size)` pairs in mesh order and
    `slow_axes` the slow mesh axis names, also in mesh order (so equality ignores the order in which
    they were given).
    """

    axes: tuple[tuple[str, int], ...]
    slow_axes: tuple[str, ...]

    def __init__(
        self,
        axes: Mapping[str, int] | Iterable[tuple[str, int]],
        slow_axes: Iterable[str] | str = (),
    ) -> None:
        normalized = _normalize_axes(axes)
        names = tuple(name for name, _ in normalized)
        if isinstance(slow_axes, str):
            slow_axes = (slow_axes,)
        try:
            slow = set(slow_axes)
        except TypeError:
            raise ToastError(
                bad_value("slow_axes", slow_axes, "a tuple of mesh axis names")
            ) from None
        unknown = sorted(str(name) for name in slow if name not in names)
        if unknown:
            raise ToastError(
                bad_value("slow_axes", tuple(slow_axes), f"mesh axis names among {names}")
                + f" (unknown: {', '.join(unknown)})"
            )
        object.__setattr__(self, "axes", normalized)
        object.__setattr__(self, "slow_axes", tuple(name for name in names if name in slow))

    @classmethod
    def parse(cls, text: str) -> MeshSpec:
        """Parses the CLI form `data=2,model=4`; a `:slow` (or `:fast`) suffix sets the link kind.

        Example: `MeshSpec.parse("dcn=2:slow, model=4")`. Whitespace around items is ignored.
        """
        if not isinstance(text, str) or not text.strip():
            raise ToastError(bad_value("mesh", text, "text like 'data=2,model=4'"))
        axes: list[tuple[str, int]] = []
        slow: list[str] = []
        for item in text.split(","):
            match = re.fullmatch(r"\s*([^=\s]+)\s*=\s*(\d+)\s*(?::\s*(\w+)\s*)?", item)
            if match is None:
                raise ToastError(
                    bad_value("mesh", text, "items like 'name=size' or 'name=size:slow'")
                    + f" (cannot parse {item.strip()!r})"
                )
            name, size_text, kind = match.groups()
            if kind is not None and kind not in _LINK_KINDS:
                raise ToastError(
                    bad_value("mesh", text, "link kind 'fast' or 'slow' after ':'")
                    + f" (got {kind!r})"
                )
            axes.append((name, int(size_text)))
            if kind == "slow":
                slow.append(name)
        return cls(axes, slow_axes=tuple(slow))

    @property
    def axis_names(self) -> tuple[str, ...]:
        """Mesh axis names in mesh order."""
        return tuple(name for name, _ in self.axes)

    @property
    def axis_sizes(self) -> tuple[int, ...]:
        """Mesh axis sizes in mesh order."""
        return tuple(size for _, size in self.axes)

    @property
    def n_devices(self) -> int:
        """Number of devices: the product of the mesh axis sizes."""
        return math.prod(self.axis_sizes)

    def _check_axis(self, axis: str) -> None:
        if axis not in self.axis_names:
            raise ToastError(bad_value("axis", axis, f"a mesh axis among {self.axis_names}"))

    def size(self, axis: str) -> int:
        """Size of one mesh axis."""
        self._check_axis(axis)
        return dict(self.axes)[axis]

    def is_slow(self, axis: str) -> bool:
        """Whether the mesh axis runs over slow links (DCN / InfiniBand)."""
        self._check_axis(axis)
        return axis in self.slow_axes

    def link_kind(self, axis: str) -> str:
        """`"slow"` or `"fast"`: the link kind of one mesh axis."""
        return "slow" if self.is_slow(axis) else "fast"

    def as_dict(self) -> dict[str, int]:
        """`{name: size}` in mesh order (a fresh dict; the spec itself stays frozen)."""
        return dict(self.axes)

    def __str__(self) -> str:
        return ",".join(
            f"{name}={size}" + (":slow" if name in self.slow_axes else "")
            for name, size in self.axes
        )

    def __repr__(self) -> str:
        slow = f", slow_axes={self.slow_axes!r}" if self.slow_axes else ""
        return f"MeshSpec({self.as_dict()!r}{slow})"


#: Collective kinds XLA has a combiner pass for (all-reduce, all-gather, reduce-scatter combiners).
COMBINABLE_KINDS = ("all-gather", "all-reduce", "reduce-scatter")

#: XLA's shared default combine threshold, `kDefault{AllReduce,AllGather,ReduceScatter}
#: CombineThreshold = 30 * 1024 * 1024 + 7` bytes (openxla/xla xla/service/collective_utils.h),
#: the default of the GPU flags `--xla_gpu_{all_reduce,all_gather,reduce_scatter}_combine_threshold_bytes`
#: (xla/debug_options_flags.cc), which xla/service/gpu/gpu_compiler.cc passes to the three combiner
#: passes with `combine_threshold_count=256`.
XLA_DEFAULT_COMBINE_BYTES = 30 * 1024 * 1024 + 7
_XLA_DEFAULT_COMBINE = tuple((kind, float(XLA_DEFAULT_COMBINE_BYTES)) for kind in COMBINABLE_KINDS)

#: XLA's CPU compiler (xla/service/cpu/cpu_compiler.cc, after layout assignment) runs only an
#: all-reduce combiner, with `kCombineBytes = std::numeric_limits<int64_t>::max()` and
#: `kCombineCount = 256`: every independent all-reduce of one key merges. It is not a preset (no
#: one trains on simulated CPU devices); `validate` uses it to predict the op counts it compiles.
XLA_CPU_COMBINE = (("all-reduce", float(2**63 - 1)),)


def _normalize_combine(value: object) -> tuple[tuple[str, float], ...]:
    """A mapping (or pairs) of collective kind -> combine threshold bytes, as sorted pairs."""
    items = value.items() if isinstance(value, Mapping) else value
    try:
        pairs = [(kind, threshold) for kind, threshold in items]  # type: ignore[union-attr]
    except (TypeError, ValueError):
        raise ToastError(
            bad_value("combine_threshold_bytes", value, "a mapping of collective kind to bytes")
        ) from None
    out: dict[str, float] = {}
    for kind, threshold in pairs:
        if kind not in COMBINABLE_KINDS:
            raise ToastError(
                bad_value("combine_threshold_bytes", value, f"kinds among {COMBINABLE_KINDS}")
                + f" (got {kind!r})"
            )
        if (
            isinstance(threshold, bool)
            or not isinstance(threshold, numbers.Real)
            or not 0 <= float(threshold) < math.inf
        ):
            raise ToastError(
                bad_value("combine_threshold_bytes", value, "finite non-negative byte thresholds")
                + f" (got {kind!r}: {threshold!r})"
            )
        out[kind] = float(threshold)
    return tuple(sorted(out.items()))


def _check_positive(field_name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ToastError(bad_value(field_name, value, "a positive number"))
    number = float(value)
    if not math.isfinite(number) or number <= 0:
        raise ToastError(bad_value(field_name, value, "a positive finite number"))
    return number


@dataclass(frozen=True, slots=True)
class HardwareSpec:
    """Per-chip performance figures used by the cost model (DESIGN.md §4).

    - `peak_flops_per_s`: dense bf16 peak of one chip.
    - `hbm_bytes_per_s`, `hbm_capacity_bytes`: HBM bandwidth and capacity of one chip.
    - `fast_link_bytes_per_s`, `slow_link_bytes_per_s`: W, the bandwidth available to a collective
      along one mesh axis whose links are fast (ICI / NVLink) or slow (DCN / InfiniBand).
    - `fast_alpha_s`, `slow_alpha_s`: alpha, the fixed latency of one ring step on a fast or slow
      link. Defaults 5e-6 s and 2e-5 s are this project's assumptions (order-of-magnitude figures
      for one collective hop on ICI/NVLink and on a datacenter network), not vendor data.
    - `flops_efficiency`: fraction of peak reachable by compute; the roofline divides by
      `peak_flops_per_s * flops_efficiency`. The default 1.0 is the pure roofline; set e.g. 0.6
      for a typical achievable model-FLOPs utilisation.
    - `combine_threshold_bytes`: per collective kind, the byte size up to which the target's XLA
      merges independent collectives of that kind and replica groups into one op (latency paid
      once); a kind absent or at 0 is never combined. Given as a mapping, kept as sorted
      `(kind, bytes)` pairs so the spec stays hashable. Default: XLA's shared default (30 MiB + 7)
      for all-reduce, all-gather and reduce-scatter (see `XLA_DEFAULT_COMBINE_BYTES`).
    """

    name: str
    peak_flops_per_s: float
    hbm_bytes_per_s: float
    hbm_capacity_bytes: int
    fast_link_bytes_per_s: float
    slow_link_bytes_per_s: float
    fast_alpha_s: float = 5e-6
    slow_alpha_s: float = 2e-5
    flops_efficiency: float = 1.0
    combine_threshold_bytes: tuple[tuple[str, float], ...] = _XLA_DEFAULT_COMBINE

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ToastError(bad_value("name", self.name, "a non-empty hardware name"))
        object.__setattr__(
            self, "combine_threshold_bytes", _normalize_combine(self.combine_threshold_bytes)
        )
        for spec_field in fields(self):
            if spec_field.name in ("name", "combine_threshold_bytes"):
                continue
            value = _check_positive(spec_field.name, getattr(self, spec_field.name))
            if spec_field.name == "hbm_capacity_bytes":
                value = int(value)
            object.__setattr__(self, spec_field.name, value)
        if self.flops_efficiency > 1.0:
            raise ToastError(
                bad_value("flops_efficiency", self.flops_efficiency, "a number in (0, 1]")
            )

    def link_bytes_per_s(self, is_slow: bool) -> float:
        """W of a mesh axis: `slow_link_bytes_per_s` if its links are slow, else the fast figure."""
        return self.slow_link_bytes_per_s if is_slow else self.fast_link_bytes_per_s

    def alpha_s(self, is_slow: bool) -> float:
        """Alpha (latency of one ring step) of a mesh axis with slow or fast links."""
        return self.slow_alpha_s if is_slow else self.fast_alpha_s

    def combine_threshold(self, kind: str) -> float:
        """Bytes up to which XLA combines collectives of `kind` on this hardware (0: never)."""
        return dict(self.combine_threshold_bytes).get(kind, 0.0)

    @property
    def effective_flops_per_s(self) -> float:
        """`peak_flops_per_s * flops_efficiency`, the compute rate of the roofline."""
        return self.peak_flops_per_s * self.flops_efficiency

    def to_dict(self) -> dict[str, Any]:
        """All fields as a plain dict (JSON-ready); `from_dict` reads it back."""
        out = {spec_field.name: getattr(self, spec_field.name) for spec_field in fields(self)}
        out["combine_threshold_bytes"] = dict(self.combine_threshold_bytes)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> HardwareSpec:
        """Builds a user-defined spec; unknown or missing fields are errors that name the field."""
        if not isinstance(data, Mapping):
            raise ToastError(bad_value("hardware", data, "a mapping of HardwareSpec fields"))
        known = {spec_field.name for spec_field in fields(cls)}
        unknown = sorted(str(key) for key in data if key not in known)
        if unknown:
            raise ToastError(
                bad_value("hardware", dict(data), f"only the fields {sorted(known)}")
                + f" (unknown: {', '.join(unknown)})"
            )
        required = [spec_field.name for spec_field in fields(cls) if spec_field.default is MISSING]
        missing = [name for name in required if name not in data]
        if missing:
            raise ToastError(
                bad_value("hardware", dict(data), f"the required fields {required}")
                + f" (missing: {', '.join(missing)})"
            )
        return cls(**dict(data))


_GIB = 2**30
_GB = 10**9

HARDWARE_PRESETS: dict[str, HardwareSpec] = {
    spec.name: spec
    for spec in (
        # Google TPUs: per chip; capacities in GiB. Source: "How to Scale Your Model"
        # (jax-ml scaling book) and Cloud TPU documentation. Combine thresholds: XLA:TPU is closed
        # source (libtpu; its all-reduce combiner threshold is the flag
        # `xla_jf_crs_combiner_threshold_in_bytes`, default unpublished), so the presets keep
        # XLA's shared default of 30 MiB + 7 (xla/service/collective_utils.h).
        HardwareSpec("tpu-v4", 2.75e14, 1.2e12, 32 * _GIB, 9e10, 2.5e10),
        HardwareSpec("tpu-v5e", 1.97e14, 8.1e11, 16 * _GIB, 9e10, 2.5e10),
        HardwareSpec("tpu-v5p", 4.59e14, 2.8e12, 95 * _GIB, 1.8e11, 2.5e10),
        HardwareSpec("tpu-v6e", 9.2e14, 1.6e12, 32 * _GIB, 1.8e11, 2.5e10),
        # NVIDIA GPUs: per GPU; capacities in GB (1e9); fast = NVLink, slow = InfiniBand.
        # Source: vendor data sheets (dense bf16). Combine thresholds: the defaults of
        # --xla_gpu_{all_reduce,all_gather,reduce_scatter}_combine_threshold_bytes, 30 MiB + 7
        # each (xla/service/collective_utils.h, xla/service/gpu/gpu_compiler.cc).
        HardwareSpec("a100-80gb", 3.12e14, 2.0e12, 80 * _GB, 3.0e11, 2.5e10),
        HardwareSpec("h100-80gb", 9.9e14, 3.35e12, 80 * _GB, 4.5e11, 5.0e10),
        HardwareSpec("h200", 9.9e14, 4.8e12, 141 * _GB, 4.5e11, 5.0e10),
        HardwareSpec("b200", 2.25e15, 8.0e12, 180 * _GB, 9.0e11, 5.0e10),
    )
}


def hardware(name_or_spec: str | HardwareSpec | Mapping[str, Any]) -> HardwareSpec:
    """Resolves a preset name (`"tpu-v5e"`), passes a `HardwareSpec` through, or builds one from a
    dict of its fields (a user-defined preset)."""
    if isinstance(name_or_spec, HardwareSpec):
        return name_or_spec
    if isinstance(name_or_spec, str):
        spec = HARDWARE_PRESETS.get(name_or_spec.strip().lower())
        if spec is None:
            raise ToastError(
                bad_value("hardware", name_or_spec, f"one of {', '.join(HARDWARE_PRESETS)}")
            )
        return spec
    if isinstance(name_or_spec, Mapping):
        return HardwareSpec.from_dict(name_or_spec)
    raise ToastError(
        bad_value("hardware", name_or_spec, "a preset name, a HardwareSpec or a dict of its fields")
    )
