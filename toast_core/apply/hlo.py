"""Reading collectives out of XLA's optimized, SPMD-partitioned HLO text.

`compiled.as_text()` is the per-device program XLA will run: every communication the partitioner
inserted is an instruction such as

    %all-reduce.5 = (f32[24,32]{1,0}, f32[32,16]{1,0}) all-reduce(%a, %b), channel_id=21,
        replica_groups={{0,4},{1,5},{2,6},{3,7}}, use_global_device_ids=true, to_apply=%add,
        metadata={op_name="jit(step)/transpose(jvp())/dot_general" stack_frame_id=3}

(one line in the real text). This module finds each such instruction and records its kind, the
bytes of its result on one device, the device groups it runs over and the jaxpr op that caused it.
It is the "compiled" side of the predicted-vs-compiled comparison of DESIGN.md §4 and §6.

Result bytes. The result shape is a single array `f32[4,64]{1,0}` (the `{...}` is the layout) or a
tuple `(f32[...], bf16[...])` when XLA combined several collectives into one; bytes are the sum of
`dtype_bytes * prod(dims)` over the tuple. For the async forms (`all-gather-start`,
`collective-permute-start`, `all-reduce-start`, seen on GPU/TPU, never on CPU) only the result
buffer counts: `all-gather-start` and `collective-permute-start` return `(operands, results, ...)`
and we count element 1; `all-reduce-start` returns the result itself. `-done` instructions are
skipped, so an async collective is counted once. Collectives inside a `while` body are listed once
(their `computation` field names the body), not once per iteration.

Replica groups. XLA prints the device groups of a collective in four forms, all expanded here to
explicit tuples of device ids (`expand_replica_groups`):

1. explicit lists: `{{0,1,2,3},{4,5,6,7}}` (`{}` means one group of every device);
2. iota: `[2,4]<=[8]`, or `[4,2]<=[2,4]T(1,0)`: `arange(8).reshape(2, 4).transpose(1, 0)`
   reshaped to 4 groups of 2;
3. mesh axes: `mesh['axis_0'=2,'axis_1'=4] {'axis_1'}`: lay the devices out as
   `arange(8).reshape(2, 4)`; a group is the devices that differ only along the braced mesh
   axes (in the braced order). The names are XLA-internal and the mesh can differ per op;
   a sub-axis `'axis_0':(2)4` is the size-4 factor of `axis_0` after a major factor of 2;
4. mesh axes with a device order: `mesh['axis_0'=4,'axis_1'=2], device_ids=([2,4]T(1,0))
   {'axis_0'}`: as 3, but mesh position k holds device `device_ids[k]` (an iota as in form 2
   without the `<=` part, or an explicit id list).

`collective-permute` has `source_target_pairs={{0,1},{1,2},...}` instead; its `groups` are the
connected components of those pairs (for a ring shift along a mesh axis, that axis's groups).

`mesh_axes_of_group` then names the mesh axes of a `jax.sharding.Mesh` (devices laid out as
`arange(n).reshape(mesh_shape)`) that a partition of the devices varies over, so a compiled
collective can be matched to the mesh axes the cost model predicted.

Observed in XLA CPU HLO (jax 0.10.2): no `reduce-scatter` (an all-reduce plus a dynamic slice
instead), no async forms, bf16 collectives promoted to f32, all four group forms.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass

import numpy as np

from toast_core.cost.collectives import COLLECTIVE_KINDS
from toast_core.errors import ToastError, bad_value

__all__ = [
    "COLLECTIVE_KINDS",
    "DTYPE_BYTES",
    "HloCollective",
    "collective_bytes_by_kind",
    "collective_ops_by_kind",
    "expand_replica_groups",
    "mesh_axes_of_group",
    "parse_collectives",
    "shape_bytes",
]

DTYPE_BYTES: dict[str, int] = {
    "pred": 1,
    "s8": 1,
    "u8": 1,
    "s16": 2,
    "u16": 2,
    "f16": 2,
    "bf16": 2,
    "s32": 4,
    "u32": 4,
    "f32": 4,
    "s64": 8,
    "u64": 8,
    "f64": 8,
    "c64": 8,
    "c128": 16,
    "token": 0,
}
"""Bytes per element of HLO element types. Other types fall back to the bit width in the name
(`f8e4m3fn` -> 1 byte, `s4` -> 1 byte: XLA keeps sub-byte types one element per byte unless
packing is enabled)."""

# Async forms whose result tuple is (operands, results, ...): the results are element 1.
_ASYNC_RESULT_INDEX: dict[str, int] = {"all-gather": 1, "collective-permute": 1}

_INSTRUCTION = re.compile(r"\s*(?:ROOT\s+)?%?(?P<name>[\w.\-]+)\s*=\s*")
_OPCODE = re.compile(r"\s*(?P<opcode>[\w\-]+)\(")
_KIND = re.compile(r"(?P<kind>" + "|".join(COLLECTIVE_KINDS) + r")(?P<start>-start)?")
_COMPUTATION = re.compile(r"(?:ENTRY\s+)?%?(?P<name>[\w.\-]+)\s*\(.*\{\s*$")
_ARRAY = re.compile(r"(?P<dtype>[a-z][a-z0-9]*)\[(?P<dims>[^\]]*)\]")
_OP_NAME = re.compile(r'op_name="(?P<op_name>(?:[^"\\]|\\.)*)"')
_DIMENSIONS = re.compile(r"\bdimensions=\{(?P<dims>[\d,\s]*)\}")
_MODULE_DEVICES = re.compile(r"\b(?P<key>num_partitions|replica_count)=(?P<value>\d+)")
_IOTA = re.compile(
    r"\[(?P<groups>[\d,\s]+)\]<=\[(?P<reshape>[\d,\s]+)\](?:T\((?P<perm>[\d,\s]+)\))?"
)
_DEVICE_IOTA = re.compile(r"\[(?P<reshape>[\d,\s]+)\](?:T\((?P<perm>[\d,\s]+)\))?")
_MESH_AXIS = re.compile(r"'?(?P<name>[\w.\-]+)'?\s*=\s*(?P<size>\d+)")
_AXIS_REF = re.compile(r"'?(?P<name>[\w.\-]+)'?(?::\((?P<pre>\d+)\)(?P<size>\d+))?")


@dataclass(frozen=True, slots=True)
class _ArrayShape:
    dtype: str
    dims: tuple[int, ...]

    @property
    def n_bytes(self) -> int:
        return math.prod(self.dims) * dtype_bytes(self.dtype)


_Shape = _ArrayShape | tuple  # a tuple shape holds _Shapes


@dataclass(frozen=True, slots=True)
class HloCollective:
    """One collective instruction of optimized HLO.

    - `kind`: `all-gather`, `all-reduce`, `all-to-all`, `collective-permute` or `reduce-scatter`
      (an async `-start` form is normalized to its kind; `is_async` says it was one).
    - `result_bytes`: bytes of the result on one device (module essay).
    - `groups`: device-id groups, expanded from any of the four replica-group forms, or the
      connected components of `source_target_pairs` for a collective-permute; `()` when they
      could not be parsed (the text is then in `raw_groups`).
    - `group_size`: devices per group (the largest group if sizes differ), 0 if `groups == ()`.
    - `op_name`: the `metadata={op_name="..."}` jaxpr op path, or None (combined collectives join
      several with `:`).
    - `line`: the instruction's text, stripped.
    """

    kind: str
    result_bytes: int
    groups: tuple[tuple[int, ...], ...]
    group_size: int
    op_name: str | None
    line: str
    name: str = ""
    is_async: bool = False
    raw_groups: str | None = None
    source_target_pairs: tuple[tuple[int, int], ...] = ()
    result_shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()
    dimensions: tuple[int, ...] = ()
    computation: str | None = None


def dtype_bytes(dtype: str) -> int:
    if dtype in DTYPE_BYTES:
        return DTYPE_BYTES[dtype]
    bits = re.match(r"[a-z]+(\d+)", dtype)
    return max(1, math.ceil(int(bits.group(1)) / 8)) if bits else 0


def _skip_balanced(text: str, pos: int, open_char: str, close_char: str) -> int:
    """Index just past the bracket that closes the one at `text[pos]` (len(text) if none)."""
    depth = 0
    for index in range(pos, len(text)):
        char = text[index]
        if char == open_char:
            depth += 1
        elif char == close_char:
            depth -= 1
            if depth == 0:
                return index + 1
    return len(text)


def _parse_shape(text: str, pos: int) -> tuple[_Shape, int]:
    """Parses an HLO shape at `text[pos]`: `f32[4,64]{1,0}` or a (nested) tuple of shapes."""
    while pos < len(text) and text[pos] == " ":
        pos += 1
    if pos < len(text) and text[pos] == "(":
        elements: list[_Shape] = []
        pos += 1
        while pos < len(text):
            while pos < len(text) and text[pos] in " ,":
                pos += 1
            if pos < len(text) and text[pos] == ")":
                return tuple(elements), pos + 1
            element, pos = _parse_shape(text, pos)
            elements.append(element)
        raise ValueError("unterminated tuple shape")
    match = _ARRAY.match(text, pos)
    if match is None:
        raise ValueError(f"no shape at {text[pos : pos + 40]!r}")
    dims = tuple(int(dim) for dim in re.findall(r"\d+", match.group("dims")))
    pos = match.end()
    if pos < len(text) and text[pos] == "{":
        pos = _skip_balanced(text, pos, "{", "}")
    return _ArrayShape(match.group("dtype"), dims), pos


def _leaves(shape: _Shape) -> tuple[_ArrayShape, ...]:
    if isinstance(shape, _ArrayShape):
        return (shape,)
    return tuple(leaf for element in shape for leaf in _leaves(element))


def shape_bytes(shape_text: str) -> int:
    """Bytes of an HLO shape text such as `(f32[4,64]{1,0}, bf16[8])`: the sum over its arrays of
    `dtype_bytes * prod(dims)`."""
    try:
        shape, _ = _parse_shape(shape_text, 0)
    except ValueError:
        raise ToastError(bad_value("shape_text", shape_text, "an HLO shape")) from None
    return sum(leaf.n_bytes for leaf in _leaves(shape))


def _ints(text: str) -> list[int]:
    return [int(value) for value in re.findall(r"\d+", text)]


def _iota_ids(reshape: list[int], perm: list[int] | None) -> np.ndarray:
    ids = np.arange(math.prod(reshape)).reshape(reshape)
    if perm:
        ids = ids.transpose(perm)
    return ids.reshape(-1)


def _expand_explicit(text: str, n_devices: int | None) -> tuple[tuple[int, ...], ...]:
    inner = text.strip()[1:-1].strip()
    if not inner:
        if n_devices is None:
            raise ValueError("'{}' (all devices) needs n_devices")
        return (tuple(range(n_devices)),)
    groups = re.findall(r"\{([\d,\s]*)\}", inner)
    if not groups or re.sub(r"\{[\d,\s]*\}|[\s,]", "", inner):
        raise ValueError("malformed explicit groups")
    return tuple(tuple(_ints(group)) for group in groups)


def _expand_iota(match: re.Match[str]) -> tuple[tuple[int, ...], ...]:
    group_shape = _ints(match.group("groups"))
    perm = _ints(match.group("perm")) if match.group("perm") else None
    ids = _iota_ids(_ints(match.group("reshape")), perm)
    return tuple(tuple(int(i) for i in row) for row in ids.reshape(group_shape[0], -1))


def _split_mesh_form(text: str) -> tuple[str, str | None, str]:
    """Splits `mesh[...]`, the optional `device_ids=(...)` and the braced mesh axes."""
    mesh_end = _skip_balanced(text, text.index("["), "[", "]")
    axes_text = text[text.index("[") + 1 : mesh_end - 1]
    rest = text[mesh_end:]
    device_ids = None
    ids_at = rest.find("device_ids=(")
    if ids_at >= 0:
        open_at = ids_at + len("device_ids=")
        close_at = _skip_balanced(rest, open_at, "(", ")")
        device_ids = rest[open_at + 1 : close_at - 1]
        rest = rest[close_at:]
    brace_at = rest.index("{")
    grouped = rest[brace_at + 1 : _skip_balanced(rest, brace_at, "{", "}") - 1]
    return axes_text, device_ids, grouped


def _expand_mesh_form(text: str) -> tuple[tuple[int, ...], ...]:
    axes_text, device_ids_text, grouped_text = _split_mesh_form(text)
    axes = [(m.group("name"), int(m.group("size"))) for m in _MESH_AXIS.finditer(axes_text)]
    if not axes:
        raise ValueError("mesh without axes")
    n_devices = math.prod(size for _, size in axes)
    if device_ids_text is None:
        ids = np.arange(n_devices)
    else:
        iota = _DEVICE_IOTA.fullmatch(device_ids_text.strip())
        if iota is not None:
            perm = _ints(iota.group("perm")) if iota.group("perm") else None
            ids = _iota_ids(_ints(iota.group("reshape")), perm)
        else:
            ids = np.array(_ints(device_ids_text))
    if ids.size != n_devices:
        raise ValueError("device_ids do not fill the mesh")
    refs = [
        (
            m.group("name"),
            int(m.group("pre")) if m.group("pre") else None,
            int(m.group("size") or 0),
        )
        for m in _AXIS_REF.finditer(grouped_text)
    ]
    # Split every mesh axis into factors (major to minor) at the boundaries of its sub-axes, so
    # each grouped axis or sub-axis is a run of whole factors.
    boundaries: dict[str, set[int]] = {name: {1, size} for name, size in axes}
    for name, pre, size in refs:
        if name not in boundaries:
            raise ValueError(f"unknown mesh axis {name!r}")
        if pre is not None:
            boundaries[name] |= {pre, pre * size}
    factor_sizes: list[int] = []
    factor_index: dict[tuple[str, int], int] = {}
    for name, size in axes:
        cuts = sorted(boundaries[name])
        if cuts[-1] != size or any(b % a for a, b in itertools.pairwise(cuts)):
            raise ValueError(f"sub-axes of {name!r} do not nest")
        for low, high in itertools.pairwise(cuts):
            factor_index[(name, low)] = len(factor_sizes)
            factor_sizes.append(high // low)
        if size == 1:
            factor_index[(name, 1)] = len(factor_sizes)
            factor_sizes.append(1)
    grouped: list[int] = []
    for name, pre, size in refs:
        low, high = (1, dict(axes)[name]) if pre is None else (pre, pre * size)
        for (factor_name, factor_low), index in factor_index.items():
            if factor_name == name and low <= factor_low < high:
                grouped.append(index)
        if high == low == 1:
            grouped.append(factor_index[(name, 1)])
    if len(set(grouped)) != len(grouped):
        raise ValueError("grouped mesh axes overlap")
    kept = [index for index in range(len(factor_sizes)) if index not in grouped]
    laid_out = ids.reshape(factor_sizes).transpose(kept + grouped)
    group_size = math.prod(factor_sizes[index] for index in grouped)
    return tuple(tuple(int(i) for i in row) for row in laid_out.reshape(-1, group_size))


def expand_replica_groups(text: str, n_devices: int | None = None) -> tuple[tuple[int, ...], ...]:
    """Expands replica-group text in any of XLA's four forms to explicit device-id groups.

    `text` is what follows `replica_groups=`: `{{0,1},{2,3}}`, `[2,4]<=[8]T(1,0)`,
    `mesh['axis_0'=2,'axis_1'=4] {'axis_1'}`, or that with `, device_ids=(...)` (module essay).
    `n_devices` is needed only for `{}` (one group of every device). Raises `ToastError` on text
    it cannot read.
    """
    stripped = text.strip() if isinstance(text, str) else ""
    try:
        if stripped.startswith("{"):
            return _expand_explicit(stripped, n_devices)
        if stripped.startswith("mesh"):
            return _expand_mesh_form(stripped)
        iota = _IOTA.fullmatch(stripped)
        if iota is not None:
            return _expand_iota(iota)
    except (ValueError, IndexError) as error:
        raise ToastError(
            bad_value("replica_groups", text, "replica groups in one of XLA's four forms")
            + f" ({error})"
        ) from None
    raise ToastError(bad_value("replica_groups", text, "replica groups in one of XLA's four forms"))


def _extract_attribute(line: str, key: str) -> str | None:
    """The text of `key=...` in an instruction line, delimited by bracket balance."""
    at = line.find(key + "=")
    if at < 0:
        return None
    start = at + len(key) + 1
    if line.startswith("mesh[", start):
        end = _skip_balanced(line, start + len("mesh"), "[", "]")
        device_ids = re.match(r",\s*device_ids=\(", line[end:])
        if device_ids is not None:
            end = _skip_balanced(line, end + device_ids.end() - 1, "(", ")")
        brace = re.match(r"\s*\{", line[end:])
        if brace is not None:
            end = _skip_balanced(line, end + brace.end() - 1, "{", "}")
        return line[start:end]
    if line.startswith("{", start):
        return line[start : _skip_balanced(line, start, "{", "}")]
    iota = _IOTA.match(line, start)
    if iota is not None:
        return iota.group(0)
    end = line.find(", ", start)
    return line[start : end if end >= 0 else len(line)]


def _components(pairs: tuple[tuple[int, int], ...]) -> tuple[tuple[int, ...], ...]:
    """Connected components of the device graph given by (source, target) pairs, sorted."""
    parent: dict[int, int] = {}

    def find(device: int) -> int:
        parent.setdefault(device, device)
        while parent[device] != device:
            parent[device] = parent[parent[device]]
            device = parent[device]
        return device

    for source, target in pairs:
        parent[find(source)] = find(target)
    members: dict[int, list[int]] = {}
    for device in parent:
        members.setdefault(find(device), []).append(device)
    return tuple(sorted(tuple(sorted(group)) for group in members.values()))


def _module_n_devices(hlo_text: str) -> int | None:
    header = next((line for line in hlo_text.splitlines() if line.startswith("HloModule")), "")
    counts = {m.group("key"): int(m.group("value")) for m in _MODULE_DEVICES.finditer(header)}
    if not counts:
        return None
    return counts.get("num_partitions", 1) * counts.get("replica_count", 1)


_COMMENT = re.compile(r"/\*.*?\*/")


def _parse_line(line: str, n_devices: int | None, computation: str | None) -> HloCollective | None:
    # Long tuple shapes carry `/*index=5*/` comments between their elements.
    line = _COMMENT.sub("", line)
    instruction = _INSTRUCTION.match(line)
    if instruction is None:
        return None
    try:
        shape, pos = _parse_shape(line, instruction.end())
    except ValueError:
        return None
    opcode = _OPCODE.match(line, pos)
    if opcode is None:
        return None
    kind_match = _KIND.fullmatch(opcode.group("opcode"))
    if kind_match is None:
        return None
    kind = kind_match.group("kind")
    is_async = kind_match.group("start") is not None
    result = shape
    if is_async and kind in _ASYNC_RESULT_INDEX and isinstance(shape, tuple) and len(shape) > 1:
        result = shape[_ASYNC_RESULT_INDEX[kind]]
    leaves = _leaves(result)
    attributes = line[opcode.end() :]

    pairs: tuple[tuple[int, int], ...] = ()
    raw_groups = _extract_attribute(attributes, "replica_groups")
    groups: tuple[tuple[int, ...], ...] = ()
    if raw_groups is not None:
        try:
            groups = expand_replica_groups(raw_groups, n_devices)
        except ToastError:
            groups = ()
    raw_pairs = _extract_attribute(attributes, "source_target_pairs")
    if raw_pairs is not None:
        found = re.findall(r"\{\s*(\d+)\s*,\s*(\d+)\s*\}", raw_pairs)
        pairs = tuple((int(source), int(target)) for source, target in found)
        groups = _components(pairs)
        if raw_groups is None and not pairs:
            raw_groups = raw_pairs
    op_name = _OP_NAME.search(attributes)
    dimensions = _DIMENSIONS.search(attributes)
    return HloCollective(
        kind=kind,
        result_bytes=sum(leaf.n_bytes for leaf in leaves),
        groups=groups,
        group_size=max((len(group) for group in groups), default=0),
        op_name=op_name.group("op_name") if op_name else None,
        line=line.strip(),
        name=instruction.group("name"),
        is_async=is_async,
        raw_groups=raw_groups,
        source_target_pairs=pairs,
        result_shapes=tuple((leaf.dtype, leaf.dims) for leaf in leaves),
        dimensions=tuple(_ints(dimensions.group("dims"))) if dimensions else (),
        computation=computation,
    )


def parse_collectives(hlo_text: str) -> tuple[HloCollective, ...]:
    """Every collective instruction of an HLO module text, in text order.

    Recognizes all-reduce, all-gather, reduce-scatter, all-to-all, collective-permute and their
    async `-start` forms (`-done` is skipped). The device count used for `replica_groups={}` comes
    from the module header (`num_partitions * replica_count`). Never raises on odd replica groups:
    they are recorded with `groups=()` and the text in `raw_groups`.
    """
    if not isinstance(hlo_text, str):
        raise ToastError(bad_value("hlo_text", hlo_text, "HLO module text (compiled.as_text())"))
    n_devices = _module_n_devices(hlo_text)
    found: list[HloCollective] = []
    computation: str | None = None
    for line in hlo_text.splitlines():
        if line.startswith("}"):
            computation = None
            continue
        header = _COMPUTATION.match(line)
        if header is not None:
            computation = header.group("name")
            continue
        if not any(kind in line for kind in COLLECTIVE_KINDS):
            continue
        collective = _parse_line(line, n_devices, computation)
        if collective is not None:
            found.append(collective)
    return tuple(found)


def collective_bytes_by_kind(hlo_text: str) -> dict[str, int]:
    """Per-device result bytes summed per collective kind; every kind is a key (0 if absent).

    An async collective counts once (its `-start`). Comparable with the cost model's
    `hlo_result_bytes` (toast_core.cost.collectives).
    """
    totals = dict.fromkeys(COLLECTIVE_KINDS, 0)
    for collective in parse_collectives(hlo_text):
        totals[collective.kind] += collective.result_bytes
    return totals


def _axis_groups(mesh_shape: tuple[int, ...], axes: tuple[int, ...]) -> np.ndarray:
    """Device groups varying over mesh axes `axes` (in that order) of `arange(n).reshape(shape)`."""
    kept = [index for index in range(len(mesh_shape)) if index not in axes]
    ids = np.arange(math.prod(mesh_shape)).reshape(mesh_shape).transpose(kept + list(axes))
    return ids.reshape(-1, math.prod(mesh_shape[index] for index in axes))


def mesh_axes_of_group(
    groups: tuple[tuple[int, ...], ...],
    mesh_shape: tuple[int, ...],
    axis_names: tuple[str, ...],
) -> tuple[str, ...] | None:
    """The mesh axes a partition of the devices varies over, or None if it matches no set of axes.

    The mesh is a `jax.sharding.Mesh` built as `np.arange(n).reshape(mesh_shape)` with
    `axis_names` (device ids are positions in that array). A partition matches mesh axes S if each
    group is exactly the devices that differ only along S. The axes are returned in the order the
    first group walks them (major first: groups `(0,4,1,5,2,6,3,7)` on a 2x4 `(data, model)` mesh
    give `("model", "data")`), or in mesh order if the order within groups matches none.
    Size-1 mesh axes are never reported; singleton groups give `()`. Empty `groups` give None.
    """
    mesh_shape = tuple(int(size) for size in mesh_shape)
    if len(mesh_shape) != len(axis_names):
        raise ToastError(
            bad_value("axis_names", axis_names, f"one name per mesh dim of mesh_shape={mesh_shape}")
        )
    n_devices = math.prod(mesh_shape)
    if not groups:
        return None
    flat = sorted(device for group in groups for device in group)
    if flat != list(range(n_devices)):
        return None
    as_sets = {frozenset(group) for group in groups}
    as_tuples = {tuple(group) for group in groups}
    varying = [index for index, size in enumerate(mesh_shape) if size > 1]
    for count in range(len(varying) + 1):
        for subset in itertools.combinations(varying, count):
            expected = _axis_groups(mesh_shape, subset)
            if {frozenset(row.tolist()) for row in expected} != as_sets:
                continue
            for ordered in itertools.permutations(subset):
                rows = _axis_groups(mesh_shape, ordered)
                if {tuple(row.tolist()) for row in rows} == as_tuples:
                    return tuple(axis_names[index] for index in ordered)
            return tuple(axis_names[index] for index in subset)
    return None


def collective_ops_by_kind(hlo_text: str) -> dict[str, int]:
    """Collective instructions per kind (every kind a key): a combined collective with a tuple
    operand counts once, as does an async pair; a loop body's collectives once."""
    counts = dict.fromkeys(COLLECTIVE_KINDS, 0)
    for collective in parse_collectives(hlo_text):
        counts[collective.kind] += 1
    return counts


_OPERAND = re.compile(r"%([\w.\-]+)")
_INDEX = re.compile(r"index=(\d+)")


def instructions(hlo_text: str) -> dict[str, tuple[str, tuple, list[str], str]]:
    """name -> (opcode, result leaves, operand names, line) of every instruction in the text."""
    out = {}
    for line in hlo_text.splitlines():
        line = _COMMENT.sub("", line)
        instruction = _INSTRUCTION.match(line)
        if instruction is None:
            continue
        try:
            shape, pos = _parse_shape(line, instruction.end())
        except ValueError:
            continue
        opcode = _OPCODE.match(line, pos)
        if opcode is None:
            continue
        close = _skip_balanced(line, opcode.end() - 1, "(", ")")
        operands = _OPERAND.findall(line[opcode.end() : close])
        out[instruction.group("name")] = (opcode.group("opcode"), _leaves(shape), operands, line)
    return out
