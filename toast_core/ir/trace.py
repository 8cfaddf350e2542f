"""Trace a JAX function into our IR. The only module of toast_core that touches jaxpr objects.

`trace(fn, *args)` runs `jax.make_jaxpr` (args may be arrays or `jax.ShapeDtypeStruct` pytrees, so a
175B-parameter model traces without allocating) and walks the jaxpr once:

* call primitives (`jit`/`pjit`, `closed_call`, `custom_jvp_call`, `custom_vjp_call`, `remat2`...) are
  inlined, their names kept in `Op.call_path`;
* `scan`, `while` and `cond` are flattened into `<prim>_start`, body ops and `<prim>_end` so that the
  analysis sees their bodies; body ops carry a `trip_count` for the cost model;
* literals become `literal` values, closed-over constants `constant` values.

The walk also records *steps*: the top-level equations in execution order with the value ids of their
operands and results. `run_with_constraints` replays those steps on real arrays, calling back before
each step (to constrain operands at cut uses) and after it (to constrain results). That replay is how
a strategy is applied to the user's real function.
"""

from __future__ import annotations

import enum
import hashlib
import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.extend.core as jex
import numpy as np

from toast_core.errors import TraceError, bad_value
from toast_core.gcpause import gc_paused
from toast_core.ir import primitives as prim
from toast_core.ir.program import Op, Program, Value

CALL_PRIMITIVES = frozenset(
    {
        "jit",
        "pjit",
        "closed_call",
        "core_call",
        "custom_jvp_call",
        "custom_vjp_call",
        "custom_vjp_call_jaxpr",
        "remat",
        "remat2",
        "checkpoint",
        "custom_lin",
    }
)
REGION_PRIMITIVES = frozenset({"scan", "while", "cond"})
#: Suffix of the call name of a `jax.checkpoint` that JAX lowers without an optimization barrier.
UNBARRED = "[no barrier]"


@dataclass(frozen=True)
class _Step:
    """A top-level equation to replay: its operands (value id, or ('lit', value)) and result ids."""

    eqn: Any
    operands: tuple
    results: tuple[int, ...]
    op_index: int = -1
    # Per operand, the (op index, operand position) of the IR op that reads it; a loop's operands
    # are read by its `*_start` op (None: no op reads it, e.g. a while's cond consts).
    readers: tuple[tuple[int, int] | None, ...] = ()
    # A scan's or while's body, replayed with the plan's constraints inside it: (ids of the
    # body's inputs, its steps, ids of its outputs); None for other steps.
    body: tuple | None = None


@dataclass(frozen=True)
class TraceHandle:
    """What `apply` needs to re-run the traced program on real arrays."""

    steps: tuple[_Step, ...]
    consts: tuple[tuple[int, Any], ...]
    in_tree: Any
    out_tree: Any
    input_ids: tuple[int, ...]
    output_ids: tuple[int, ...]
    input_paths: tuple[str, ...]
    output_paths: tuple[str, ...]


def _source_of_traceback(traceback) -> str:
    try:
        from jax._src import source_info_util

        frame = source_info_util.user_frame(traceback)
    except Exception:  # noqa: BLE001 - source info is best effort
        return ""
    if frame is None:
        return ""
    return f"{os.path.basename(frame.file_name)}:{frame.start_line}"


def _name_stack_text(name_stack) -> str:
    try:
        return str(name_stack)
    except Exception:  # noqa: BLE001
        return ""


_SCALARS = frozenset((type(None), bool, int, float, str))


def _plain(value: Any) -> Any:
    """Converts a jaxpr param into plain hashable Python (ints, strs, tuples), or raises TypeError."""
    if type(value) in _SCALARS or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, np.integer | np.floating | np.bool_):
        return value.item()
    if isinstance(value, np.dtype) or type(value).__name__.endswith("DType"):
        return str(value)
    if hasattr(value, "_asdict"):  # NamedTuple dimension numbers (gather, scatter, conv)
        return tuple((k, _plain(v)) for k, v in value._asdict().items())
    if isinstance(value, tuple | list):
        return tuple(_plain(v) for v in value)
    if isinstance(value, enum.Enum):
        return str(value.name)
    if isinstance(value, np.ndarray) and value.size <= 16:
        return tuple(value.ravel().tolist())
    raise TypeError(type(value).__name__)


def _plain_params(params: dict) -> tuple[tuple[str, object], ...]:
    out = []
    for key, value in params.items():
        if isinstance(value, jex.ClosedJaxpr | jex.Jaxpr) or callable(value):
            continue
        try:
            out.append((key, _plain(value)))
        except TypeError:
            out.append((key, repr(value)[:80]))
    return tuple(out)


def _op_params(eqn) -> tuple[tuple[str, object], ...]:
    """The eqn's plain params, plus what lowering reads from the global config: whether threefry
    random bits are partitionable (XLA then generates each device's shard, not the whole array)."""
    params = _plain_params(eqn.params)
    if eqn.primitive.name == "random_bits":
        params += (("threefry_partitionable", bool(jax.config.jax_threefry_partitionable)),)
    return params


#: dtype -> its name, and shape -> the plain tuple of ints: a 40k-op program has a few dozen of
#: each, and converting them afresh per value is a tenth of the walk. Equal shapes then share
#: one tuple.
_DTYPE_NAMES: dict = {}
_SHAPES: dict = {}


def _dtype_name(aval) -> str:
    dtype = getattr(aval, "dtype", "float32")
    try:
        name = _DTYPE_NAMES.get(dtype)
    except TypeError:  # an unhashable dtype-like
        return str(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype)
    return name


def _shape(aval) -> tuple[int, ...]:
    shape = getattr(aval, "shape", ())
    try:
        out = _SHAPES.get(shape)
    except TypeError:  # an unhashable shape (a list)
        return tuple(int(d) for d in shape)
    if out is None:
        out = tuple(int(d) for d in shape)
        if len(_SHAPES) < 1 << 16:
            _SHAPES[shape] = out
    return out


class _Builder:
    """Accumulates values, ops and replay steps during the single jaxpr walk.

    The eqns of a 40k-op program share a few hundred tracebacks (equal by their frames), a few
    name stacks and params dicts (the eqns JAX inlines from one cached jaxpr, once per layer):
    their conversions are memoized for the walk, by equality for tracebacks and by identity for
    the others (the object is kept alive with its entry, so its id is not reused). Converting
    each afresh was half of the walk."""

    def __init__(self) -> None:
        self.values: list[Value] = []
        self.ops: list[Op] = []
        self.steps: list[_Step] = []
        self.consts: list[tuple[int, Any]] = []
        self.diagnostics: list[str] = []
        self.bodies: dict[int, tuple] = {}  # start op index -> (body inputs, steps, outputs)
        self._sources: dict = {}  # traceback -> "file.py:line"
        self._name_stacks: dict[int, tuple[Any, str]] = {}  # id -> (name stack, its text)
        self._params: dict[int, tuple[Any, Any, tuple]] = {}  # id -> (params, primitive, plain)

    def source(self, eqn) -> str:
        """`file.py:line` of the user frame that made `eqn` ("" when unknown)."""
        traceback = getattr(eqn.source_info, "traceback", None)
        try:
            return self._sources[traceback]
        except KeyError:
            text = self._sources[traceback] = _source_of_traceback(traceback)
            return text
        except TypeError:  # an unhashable traceback
            return _source_of_traceback(traceback)

    def name_stack(self, eqn) -> str:
        stack = getattr(eqn.source_info, "name_stack", None)
        hit = self._name_stacks.get(id(stack))
        if hit is None or hit[0] is not stack:
            hit = self._name_stacks[id(stack)] = (stack, _name_stack_text(stack))
        return hit[1]

    def op_params(self, eqn) -> tuple[tuple[str, object], ...]:
        if not eqn.params:  # nothing to convert, and no memo entry for its own empty dict
            return ()
        hit = self._params.get(id(eqn.params))
        if hit is None or hit[0] is not eqn.params or hit[1] is not eqn.primitive:
            hit = self._params[id(eqn.params)] = (eqn.params, eqn.primitive, _op_params(eqn))
        return hit[2]

    def new_value(self, aval, role: str, name: str = "", source: str = "") -> int:
        vid = len(self.values)
        self.values.append(
            Value(vid, _shape(aval), _dtype_name(aval), role, name or f"%{vid}", source)
        )
        return vid

    def add_op(self, primitive: str, operands, results, params=(), **kw) -> int:
        idx = len(self.ops)
        self.ops.append(Op(idx, primitive, tuple(operands), tuple(results), tuple(params), **kw))
        return idx

    def read(self, env: dict, atom) -> int:
        """Value id of a jaxpr operand; a Literal becomes a fresh `literal` value."""
        if isinstance(atom, jex.Literal):
            vid = self.new_value(atom.aval, "literal", f"lit({atom.val})")
            self.consts.append((vid, atom.val))  # the replay may read it through a call boundary
            return vid
        return env[atom]

    def walk(
        self,
        jaxpr: jex.Jaxpr,
        env: dict,
        call_path: tuple[str, ...],
        trip_count: int,
        depth: int,
        top_level: bool,
    ) -> None:
        for eqn in jaxpr.eqns:
            self._eqn(eqn, env, call_path, trip_count, depth, top_level)

    def _bind_results(self, eqn, env, name_prefix: str, source: str) -> list[int]:
        ids = []
        for var in eqn.outvars:
            vid = self.new_value(
                var.aval, "intermediate", f"{name_prefix}#{len(self.values)}", source
            )
            if not isinstance(var, jex.DropVar):
                env[var] = vid
            ids.append(vid)
        return ids

    def _eqn(self, eqn, env, call_path, trip_count, depth, top_level) -> None:
        prim = eqn.primitive.name
        if prim in CALL_PRIMITIVES:
            sub = _call_body(eqn)
            if sub is not None:
                self._inline(eqn, sub, env, call_path, trip_count, depth, top_level)
                return
        source = self.source(eqn)
        name_stack = self.name_stack(eqn)
        if prim in REGION_PRIMITIVES:
            kw = dict(source=source, name_stack=name_stack, call_path=call_path)
            operand_ids = [self.read(env, a) for a in eqn.invars]
            start = len(self.ops)  # the region's (first) `*_start` op
            getattr(self, f"_region_{prim}")(eqn, env, operand_ids, trip_count, depth, kw)
            if top_level:
                result_ids = [env.get(v, -1) for v in eqn.outvars]
                readers = _region_readers(eqn, start)
                body = self.bodies.get(start)
                self.steps.append(
                    _Step(
                        eqn, _step_operands(eqn, operand_ids), tuple(result_ids), -1, readers, body
                    )
                )
            return
        self._op(eqn, prim, env, source, name_stack, call_path, trip_count, depth, top_level)

    def _op(self, eqn, prim, env, source, name_stack, call_path, trip_count, depth, top_level):
        """An eqn that becomes one op: the walk's inner loop (40k times at GPT-3 175B), written
        out flat (`read` and `_bind_results` inlined)."""
        operand_ids = []
        step_operands = []
        for atom in eqn.invars:
            if isinstance(atom, jex.Literal):
                operand_ids.append(self.read(env, atom))
                step_operands.append(("lit", atom.val))
            else:
                vid = env[atom]
                operand_ids.append(vid)
                step_operands.append(vid)
        values = self.values
        result_ids = []
        for var in eqn.outvars:
            vid = len(values)
            aval = var.aval
            values.append(
                Value(vid, _shape(aval), _dtype_name(aval), "intermediate", f"{prim}#{vid}", source)
            )
            if not isinstance(var, jex.DropVar):
                env[var] = vid
            result_ids.append(vid)
        op_index = len(self.ops)
        results = tuple(result_ids)
        self.ops.append(
            Op(
                op_index,
                prim,
                tuple(operand_ids),
                results,
                self.op_params(eqn),
                source,
                name_stack,
                call_path,
                trip_count,
                depth,
            )
        )
        if top_level:
            readers = tuple([(op_index, pos) for pos in range(len(operand_ids))])
            self.steps.append(_Step(eqn, tuple(step_operands), results, op_index, readers))

    def _inline(self, eqn, sub, env, call_path, trip_count, depth, top_level) -> None:
        closed_consts = sub.consts if isinstance(sub, jex.ClosedJaxpr) else ()
        inner = sub.jaxpr if isinstance(sub, jex.ClosedJaxpr) else sub
        inner_env: dict = {}
        for var, const in zip(inner.constvars, closed_consts):
            inner_env[var] = self._constant(var, const)
        operand_ids = [self.read(env, a) for a in eqn.invars]
        for var, vid in zip(inner.invars, operand_ids):
            inner_env[var] = vid
        name = str(eqn.params.get("name", eqn.primitive.name))
        if "differentiated" in eqn.params and not (
            eqn.params["differentiated"] and any(np.atleast_1d(eqn.params.get("prevent_cse")))
        ):
            # a checkpoint JAX lowers with no optimization barrier (not differentiated, or
            # prevent_cse=False): its ops are plain ops to XLA (`simplify.barred`)
            name += UNBARRED
        self.walk(inner, inner_env, call_path + (name,), trip_count, depth, top_level)
        for outer, inner_out in zip(eqn.outvars, inner.outvars):
            if isinstance(outer, jex.DropVar):
                continue
            if isinstance(inner_out, jex.Literal):
                env[outer] = self.read(env, inner_out)
            else:
                env[outer] = inner_env[inner_out]

    def _constant(self, var, const) -> int:
        vid = self.new_value(var.aval, "constant", "")
        self.values[vid] = _renamed(self.values[vid], f"const#{vid}")
        self.consts.append((vid, const))
        return vid

    def _body_inputs(self, jaxpr: jex.Jaxpr, consts, prefix: str, source: str) -> tuple[dict, list]:
        env: dict = {}
        for var, const in zip(jaxpr.constvars, consts):
            env[var] = self._constant(var, const)
        ids = []
        for var in jaxpr.invars:
            vid = self.new_value(var.aval, "intermediate", "", source)
            self.values[vid] = _renamed(self.values[vid], f"{prefix}#{vid}")
            env[var] = vid
            ids.append(vid)
        return env, ids

    def _walk_body(self, jaxpr, env, call_path, trip_count: int, depth: int) -> tuple:
        """Walks a loop body one level deeper and returns its replay steps (kept apart from the
        enclosing computation's)."""
        outer, self.steps = self.steps, []
        try:
            self.walk(jaxpr, env, call_path, trip_count, depth + 1, True)
            return tuple(self.steps)
        finally:
            self.steps = outer

    def _body_outputs(self, jaxpr: jex.Jaxpr, env: dict) -> list[int]:
        return [self.read(env, v) for v in jaxpr.outvars]

    def _region_scan(self, eqn, env, operand_ids, trip_count, depth, kw) -> None:
        closed = eqn.params["jaxpr"]
        length = int(eqn.params["length"])
        body_env, body_in = self._body_inputs(closed.jaxpr, closed.consts, "scan_in", kw["source"])
        params = _plain_params(eqn.params) + ((prim.LOOP_IDENTITY, _loop_identity(eqn, ())),)
        start = self.add_op(prim.SCAN_START, operand_ids, body_in, params, region_depth=depth, **kw)
        steps = self._walk_body(closed.jaxpr, body_env, kw["call_path"], trip_count * length, depth)
        body_out = self._body_outputs(closed.jaxpr, body_env)
        self.bodies[start] = (tuple(body_in), steps, tuple(body_out))
        n_consts, n_carry = int(eqn.params["num_consts"]), int(eqn.params["num_carry"])
        carry_in = body_in[n_consts : n_consts + n_carry]
        results = self._bind_results(eqn, env, "scan", kw["source"])
        self.add_op(
            prim.SCAN_END,
            list(body_out) + list(carry_in),
            results,
            params,
            region_depth=depth,
            **kw,
        )

    def _region_while(self, eqn, env, operand_ids, trip_count, depth, kw) -> None:
        cond_n, body_n = int(eqn.params["cond_nconsts"]), int(eqn.params["body_nconsts"])
        body = eqn.params["body_jaxpr"]
        carry_ids = operand_ids[cond_n + body_n :]
        body_operands = operand_ids[cond_n : cond_n + body_n] + carry_ids
        body_env, body_in = self._body_inputs(body.jaxpr, body.consts, "while_in", kw["source"])
        params = _plain_params(eqn.params) + (
            ("num_consts", body_n),
            (prim.LOOP_IDENTITY, _loop_identity(eqn, operand_ids[:cond_n])),
        )
        start = self.add_op(
            prim.WHILE_START, body_operands, body_in, params, region_depth=depth, **kw
        )
        self.diagnostics.append(
            f"while loop at {kw['source'] or '?'}: trip count unknown, its body is costed once"
        )
        steps = self._walk_body(body.jaxpr, body_env, kw["call_path"], trip_count, depth)
        body_out = self._body_outputs(body.jaxpr, body_env)
        self.bodies[start] = (tuple(body_in), steps, tuple(body_out))
        results = self._bind_results(eqn, env, "while", kw["source"])
        self.add_op(
            prim.WHILE_END,
            list(body_out) + body_in[body_n:],
            results,
            params,
            region_depth=depth,
            **kw,
        )

    def _region_cond(self, eqn, env, operand_ids, trip_count, depth, kw) -> None:
        branch_outs: list[int] = []
        for b, branch in enumerate(eqn.params["branches"]):
            benv, bin_ids = self._body_inputs(
                branch.jaxpr, branch.consts, f"cond{b}_in", kw["source"]
            )
            self.add_op(
                prim.COND_START,
                operand_ids[1:],
                bin_ids,
                # The branch index is not an operand (no dim of it links to the branch), but
                # computing it is work the program does: the cost model keeps it alive.
                (("branch", b), ("predicate", operand_ids[0])),
                region_depth=depth,
                **kw,
            )
            self.walk(branch.jaxpr, benv, kw["call_path"], trip_count, depth + 1, False)
            branch_outs += self._body_outputs(branch.jaxpr, benv)
        results = self._bind_results(eqn, env, "cond", kw["source"])
        n_branches = len(eqn.params["branches"])
        self.add_op(
            prim.COND_END,
            branch_outs,
            results,
            (("n_branches", n_branches),),
            region_depth=depth,
            **kw,
        )


def _loop_identity(eqn, cond_const_ids) -> str:
    """A digest of a loop's body (and a while's condition): their jaxprs' text and consts, and
    the values a while's condition reads besides the carry (`cond_const_ids`, which feed no op).
    The trace keeps no jaxpr, so without it two loops differing only in their condition (`i < 3`,
    `i < 5`) would look alike. XLA's HloCSE merges two `while`s of equal operands, condition
    and body (fuzz seed 19 #690: two identical `while_loop`s on one input compile to one; two
    identical `fori_loop`s, scans, too)."""
    digest = hashlib.sha1()
    for key in ("cond_jaxpr", "body_jaxpr", "jaxpr"):
        closed = eqn.params.get(key)
        if not isinstance(closed, jex.ClosedJaxpr):
            continue
        digest.update(str(closed.jaxpr).encode())
        for const in closed.consts:
            try:
                arr = np.asarray(const)
                digest.update(f"{arr.dtype}{arr.shape}".encode() + arr.tobytes())
            except Exception:  # noqa: BLE001 - a const with no value to read: this loop alone
                digest.update(f"const#{id(const)}".encode())
    digest.update(repr(tuple(cond_const_ids)).encode())
    return digest.hexdigest()[:16]


def _renamed(value: Value, name: str) -> Value:
    return Value(value.id, value.shape, value.dtype, value.role, name, value.source)


def _region_readers(eqn, start: int) -> tuple[tuple[int, int] | None, ...]:
    """Which operand of the `*_start` op at index `start` each operand of a loop eqn is: a scan's
    operands in order; a while's body consts and carries (its cond consts feed no op). A cond's
    operands are read by one start op per branch, whose shardings may differ: none is chosen."""
    n = len(eqn.invars)
    if eqn.primitive.name == "scan":
        return tuple((start, pos) for pos in range(n))
    if eqn.primitive.name == "while":
        cond_n = int(eqn.params["cond_nconsts"])
        return tuple(None if pos < cond_n else (start, pos - cond_n) for pos in range(n))
    return (None,) * n


def _step_operands(eqn, operand_ids) -> tuple:
    return tuple(
        ("lit", a.val) if isinstance(a, jex.Literal) else vid
        for a, vid in zip(eqn.invars, operand_ids)
    )


def _call_body(eqn):
    for key in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
        sub = eqn.params.get(key)
        if isinstance(sub, jex.ClosedJaxpr | jex.Jaxpr):
            return sub
    return None


def _dead_code_eliminated(closed: jex.ClosedJaxpr) -> jex.ClosedJaxpr:
    """Drops equations whose results nothing uses (make_jaxpr keeps them; they would only add
    noise named dims). Effectful equations are kept by JAX's own DCE rules."""
    try:
        from jax._src.interpreters import partial_eval as pe

        jaxpr, _ = pe.dce_jaxpr(closed.jaxpr, [True] * len(closed.jaxpr.outvars), instantiate=True)
    except Exception:  # noqa: BLE001 - DCE is an optimisation; fall back to the full program
        return closed
    if len(jaxpr.invars) != len(closed.jaxpr.invars):
        return closed
    return jex.ClosedJaxpr(jaxpr, closed.consts)


@dataclass(frozen=True)
class _Leaf:
    """One input leaf: its name (`params.blocks[3].attn.wq`), its path inside its own argument
    (`.blocks[3].attn.wq`; "" for a bare array), the index of that argument, and the leaf."""

    name: str
    sub_path: str
    arg_index: int
    leaf: Any


def _input_leaves(fn: Callable, args: tuple) -> list[_Leaf]:
    """The input leaves of `fn(*args)` in flattened order (one pytree walk: 3k leaves at GPT-3
    175B), named after `fn`'s positional parameters."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        params = []
    names = []
    for p in params:
        if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            break
        names.append(p.name)
    out = []
    for i, arg in enumerate(args):
        base = names[i] if i < len(names) else f"arg{i}"
        for path, leaf in jax.tree_util.tree_flatten_with_path(arg)[0]:
            sub_path = _keystr(path)
            out.append(_Leaf(base + sub_path, sub_path, i, leaf))
    return out


def _keystr(path) -> str:
    parts = []
    for key in path:
        if isinstance(key, jax.tree_util.DictKey):
            parts.append(f".{key.key}")
        elif isinstance(key, jax.tree_util.SequenceKey):
            parts.append(f"[{key.idx}]")
        elif isinstance(key, jax.tree_util.GetAttrKey):
            parts.append(f".{key.name}")
        else:
            parts.append(f".{key}")
    return "".join(parts)


def _fn_name(fn: Callable) -> str:
    """`fn.__name__`, looking through `functools.partial`; "fn" for nameless callables."""
    while not hasattr(fn, "__name__") and hasattr(fn, "func"):
        fn = fn.func
    return str(getattr(fn, "__name__", "fn"))


def _check_leaves(leaves: list[_Leaf]) -> None:
    """Every leaf must be an array, a `jax.ShapeDtypeStruct` or a Python/NumPy scalar; the error
    names the first bad leaf by its path (`batch.mask`) and shows its value and type."""
    for x in leaves:
        name, leaf = x.name, x.leaf
        ok = isinstance(leaf, jax.ShapeDtypeStruct | jax.Array | np.ndarray | np.generic)
        ok = ok or isinstance(leaf, bool | int | float | complex)
        if not ok:
            raise TraceError(
                bad_value(
                    name, leaf, f"an array or jax.ShapeDtypeStruct leaf, not {type(leaf).__name__}"
                )
            )


def trace(fn: Callable, *args: Any, param_argnums: tuple[int, ...] | None = None) -> Program:
    """Traces `fn(*args)` into a `Program`.

    `args` are pytrees of arrays or `jax.ShapeDtypeStruct`s. Input leaves of the positional
    arguments in `param_argnums` are parameters (default: the first argument when there are
    several); an input leaf that the function returns again at the same shape and dtype under a
    matching path (an updated parameter or optimizer state) is marked `state` if it is not already
    a parameter.
    """
    if not callable(fn):
        raise TraceError(bad_value("fn", fn, "a callable JAX function"))
    # JAX's tracing and our walk allocate millions of objects and free few early: full
    # collections over them cost a quarter of the trace of a 40k-op program (see `gcpause`).
    with gc_paused():
        leaves = _input_leaves(fn, args)
        _check_leaves(leaves)
        return _trace(fn, args, leaves, param_argnums)


def _trace(
    fn: Callable, args: tuple, leaves: list[_Leaf], param_argnums: tuple[int, ...] | None
) -> Program:
    try:
        closed, out_shape = jax.make_jaxpr(fn, return_shape=True)(*args)
    except Exception as exc:  # noqa: BLE001 - any failure of the user's code is a trace error
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TraceError(
            f"tracing `fn={_fn_name(fn)!r}` failed: {type(exc).__name__}: {first}"
        ) from exc
    if param_argnums is None:
        param_argnums = (0,) if len(args) > 1 else ()
    closed = _dead_code_eliminated(closed)
    fn_name = _fn_name(fn)
    in_names = [x.name for x in leaves]
    in_subpaths = [x.sub_path for x in leaves]
    arg_of_leaf = [x.arg_index for x in leaves]
    out_leaves_with_path = jax.tree_util.tree_flatten_with_path(out_shape)[0]
    out_names = [f"out{_keystr(p)}" for p, _ in out_leaves_with_path]
    out_keys = {(_keystr(p[1:]), tuple(s.shape), str(s.dtype)) for p, s in out_leaves_with_path}

    b = _Builder()
    env: dict = {}
    jaxpr = closed.jaxpr
    for var, const in zip(jaxpr.constvars, closed.consts):
        env[var] = b._constant(var, const)
    input_ids = []
    persistent_by_key: dict[tuple, int] = {}  # (path inside its argument, shape, dtype) -> input
    for i, var in enumerate(jaxpr.invars):
        arg_index = arg_of_leaf[i] if i < len(arg_of_leaf) else -1
        name = in_names[i] if i < len(in_names) else f"in{i}"
        role = "parameter" if arg_index in param_argnums else "input"
        if role == "input":
            # A leaf inside a container (not a bare array argument) that comes back out under the
            # same path within its output is updated state: `opt_state.mu.w` -> `out[1].mu.w`.
            sub_path = in_subpaths[i] if i < len(in_subpaths) else ""
            key = (sub_path, _shape(var.aval), _dtype_name(var.aval))
            if sub_path and key in out_keys and len(_shape(var.aval)) > 0:
                role = "state"
        vid = b.new_value(var.aval, role, name)
        env[var] = vid
        input_ids.append(vid)
        if role in ("parameter", "state"):
            sub_path = in_subpaths[i] if i < len(in_subpaths) else ""
            key = (sub_path, _shape(var.aval), _dtype_name(var.aval))
            persistent_by_key.setdefault(key, vid)
    b.walk(jaxpr, env, (), 1, 0, True)

    output_ids = []
    for k, atom in enumerate(jaxpr.outvars):
        vid = b.read(env, atom)
        if vid in output_ids or b.values[vid].output_name is not None:
            # The same value returned twice, or an input returned as is: copy it so each output
            # has its own value.
            src = vid
            vid = b.new_value(_AvalLike(b.values[src]), "intermediate", "")
            op_index = b.add_op("copy", [src], [vid], source="")
            b.steps.append(_Step(None, (src,), (vid,), op_index, ((op_index, 0),)))
        v = b.values[vid]
        path, _ = out_leaves_with_path[k]
        updates = persistent_by_key.get((_keystr(path[1:]), v.shape, v.dtype))
        name = out_names[k] if v.role == "intermediate" and not v.name.startswith("out") else v.name
        b.values[vid] = Value(v.id, v.shape, v.dtype, v.role, name, v.source, out_names[k], updates)
        output_ids.append(vid)
    handle = TraceHandle(
        steps=tuple(b.steps),
        consts=tuple(b.consts),
        in_tree=jax.tree_util.tree_structure(args),
        out_tree=jax.tree_util.tree_structure(out_shape),
        input_ids=tuple(input_ids),
        output_ids=tuple(output_ids),
        input_paths=tuple(in_names),
        output_paths=tuple(out_names),
    )
    return Program(
        name=fn_name,
        values=tuple(b.values),
        ops=tuple(b.ops),
        inputs=tuple(input_ids),
        outputs=tuple(output_ids),
        diagnostics=tuple(b.diagnostics),
        handle=handle,
    )


@dataclass(frozen=True)
class _AvalLike:
    shape: tuple
    dtype: str

    def __init__(self, value: Value) -> None:
        object.__setattr__(self, "shape", value.shape)
        object.__setattr__(self, "dtype", value.dtype)


def run_with_constraints(
    program: Program,
    flat_args: list,
    before_use: Callable[[int, int, int, Any], Any] | None = None,
    after_value: Callable[[int, Any], Any] | None = None,
) -> list:
    """Replays the traced program on `flat_args` (flattened inputs, traced or concrete).

    `before_use(op_index, operand_position, value_id, array) -> array` may replace an operand just
    before an op reads it (a cut: the use is resharded; a scan's or while's operands are read
    by its `*_start` op, a cond's by none);
    `after_value(value_id, array) -> array` may replace a value once it is defined (constrain it to
    its planned sharding). Returns the flattened outputs.
    """
    handle: TraceHandle = program.handle
    if handle is None:
        raise TraceError("program has no trace handle: it was not produced by `trace`")
    env: dict[int, Any] = dict(handle.consts)
    for vid, arr in zip(handle.input_ids, flat_args):
        env[vid] = after_value(vid, arr) if after_value else arr
    _replay(handle.steps, env, handle.consts, before_use, after_value)
    return [env[vid] for vid in handle.output_ids]


def _replay(steps, env: dict, consts, before_use, after_value) -> None:
    """Binds `steps` in order on `env` (value id -> array), constraining as `run_with_constraints`
    says; a loop with a recorded body is bound with that body replayed the same way."""
    for step in steps:
        ins = []
        for pos, ref in enumerate(step.operands):
            if isinstance(ref, tuple):
                ins.append(ref[1])
                continue
            arr = env[ref]
            reader = step.readers[pos] if step.readers else None
            if before_use is not None and reader is not None:
                arr = before_use(reader[0], reader[1], ref, arr)
            ins.append(arr)
        if step.eqn is None:  # an output copy
            outs = ins
        elif step.body is not None and (before_use is not None or after_value is not None):
            outs = _bind_loop(step, ins, consts, before_use, after_value)
        else:
            outs = step.eqn.primitive.bind(*ins, **step.eqn.params)
            if not step.eqn.primitive.multiple_results:
                outs = [outs]
        for vid, arr in zip(step.results, outs):
            if vid < 0:
                continue
            env[vid] = after_value(vid, arr) if after_value else arr


def _type_of(var) -> tuple:
    return (tuple(var.aval.shape), var.aval.dtype, getattr(var.aval, "weak_type", False))


def _bind_loop(step: _Step, ins: list, consts, before_use, after_value) -> list:
    """Binds a scan or while whose body replays the traced body with the constraints inside it
    (a new body jaxpr of the same signature), so that XLA follows the plan within the loop
    rather than propagating its own shardings into it."""
    body_in, body_steps, body_out = step.body
    eqn = step.eqn
    key = "jaxpr" if eqn.primitive.name == "scan" else "body_jaxpr"
    closed = eqn.params[key]

    def body(*args):
        env = dict(consts)
        for vid, arr in zip(body_in, args):
            env[vid] = after_value(vid, arr) if after_value else arr
        _replay(body_steps, env, consts, before_use, after_value)
        return [env[vid] for vid in body_out]

    avals = [
        jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype, weak_type=v.aval.weak_type)
        for v in closed.jaxpr.invars
    ]
    new_body = jax.make_jaxpr(body)(*avals)
    if list(map(_type_of, new_body.jaxpr.outvars)) != list(map(_type_of, closed.jaxpr.outvars)):
        return eqn.primitive.bind(*ins, **eqn.params)  # keep the original body: same outputs
    return eqn.primitive.bind(*ins, **{**eqn.params, key: new_body})


def xla_hlo_cost_analysis(hlo_text: str) -> dict[str, float]:
    """XLA's own cost analysis (`flops`, `transcendentals`, `bytes accessed`, ...) of an HLO module
    given as text, on the CPU client: what `compiled.cost_analysis()` reports, for a module we
    edited (`toast_core.apply.hlo_loops` re-parses a program with a loop body as its entry). Kept
    here because it needs jaxlib internals and this is the one module of the core that uses them.
    """
    from jax._src.lib import xla_client
    from jaxlib import _hlo

    module = _hlo.hlo_module_from_text(hlo_text)
    client = jax.devices("cpu")[0].client
    return dict(xla_client._xla.hlo_module_cost_analysis(client, module))
