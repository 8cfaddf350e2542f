"""A seeded generator of random valid JAX programs, kept as a spec that renders to Python source.

A `Program` is a list of input declarations (parameters, batch data, running statistics) and of
statements, each one assignment `vN = <expression>` over earlier values, drawn from the families a
user's model is built from: dot_general/einsum, elementwise and transcendental ops, reductions,
reshapes, transposes, broadcasts, concatenate/stack/tile, slices (strided too), gathers and
scatter-adds, cumulative ops, sort/top_k, convolutions with random dimension numbers, scan /
fori_loop / while_loop / cond, custom_jvp / custom_vjp, jax.checkpoint, dropout with jax.random
keys, BatchNorm with running statistics, top-k routing. A dim an integer input indexes has size >= 2
(`INDEXED_MIN`), so validation's index values, drawn in [0, 2), are in bounds. Every value no later statement reads is an
output of `forward`; the loss is the sum of their means. The program is either that forward
function or a train step around it: SGD, a hand-written Adam, or gradient accumulation over
micro-batches with `fori_loop`, `while_loop` or `scan`.

The spec is the single source of truth: `Program.source()` renders a standalone script, and
`Program.load()` executes exactly that script, so a reproduction file is the program that failed.
The minimizer edits the spec (drops statements, substitutes dim sizes) and renders again.

    prog = generate(seed=0, index=3)        # reproducible from (seed, index)
    ns = prog.load()                        # {"step": fn, "example_args": fn, ...}
    print(prog.source())

`generate` checks that the program traces (and, with `check="run"`, runs under plain `jax.jit`)
and draws again with the next attempt number when it does not.
"""

from __future__ import annotations

import dataclasses
import textwrap
from dataclasses import dataclass, field

import numpy as np

MODES = ("forward", "sgd", "adam", "accum_fori", "accum_while", "accum_scan")
MAX_ELEMENTS = 8192  # per value: keeps every compile and run small
SIZES = (2, 4, 8, 16, 32, 64, 6, 12, 24, 3, 5, 1)
SIZE_WEIGHTS = np.array([6, 8, 8, 6, 3, 1, 3, 2, 1, 2, 1, 1], dtype=float)
MICRO_BATCHES = 2

# Helpers a statement may call; only those used are rendered into a script.
HELPERS: dict[str, str] = {
    "_softclip": '''
        @jax.custom_jvp
        def _softclip(x):
            """tanh-shaped clip with a hand-written derivative (custom_jvp)."""
            return 2.0 * jnp.tanh(x / 2.0)

        @_softclip.defjvp
        def _softclip_jvp(primals, tangents):
            (x,), (t,) = primals, tangents
            y = _softclip(x)
            return y, t * (1.0 - y * y / 4.0)
    ''',
    "_scaled_tanh": '''
        @jax.custom_vjp
        def _scaled_tanh(x, s):
            """tanh(x) * s with a hand-written backward pass (custom_vjp)."""
            return jnp.tanh(x) * s

        def _scaled_tanh_fwd(x, s):
            y = jnp.tanh(x)
            return y * s, (y, s)

        def _scaled_tanh_bwd(res, g):
            y, s = res
            return g * s * (1.0 - y * y), jnp.sum(g * y).reshape(jnp.shape(s))

        _scaled_tanh.defvjp(_scaled_tanh_fwd, _scaled_tanh_bwd)
    ''',
    "_dropout": '''
        def _dropout(x, key, salt, rate=0.1):
            """Inverted dropout from a raw uint32[2] key passed as an input."""
            keep = jax.random.bernoulli(jax.random.fold_in(key, salt), 1.0 - rate, x.shape)
            return jnp.where(keep, x / (1.0 - rate), 0.0)
    ''',
    "_batchnorm": '''
        def _batchnorm(x, gamma, beta):
            """BatchNorm over every dim but the last; returns (y, batch mean, batch var)."""
            axes = tuple(range(x.ndim - 1))
            mean = jnp.mean(x, axis=axes)
            var = jnp.mean(jnp.square(x - mean), axis=axes)
            return (x - mean) * lax.rsqrt(var + 1e-5) * gamma + beta, mean, var
    ''',
    "_route": '''
        def _route(logits, k):
            """Top-k routing: softmax gates kept only on each row's k largest entries."""
            gates = jax.nn.softmax(logits, axis=-1)
            _, idx = lax.top_k(gates, k)
            mask = jnp.sum(jax.nn.one_hot(idx, logits.shape[-1], dtype=gates.dtype), axis=-2)
            return gates * mask
    ''',
    "_rnn": '''
        def _rnn(xs, w):
            """An RNN over the leading dim of xs with lax.scan: h = tanh(h @ w + x_t)."""
            def cell(h, x_t):
                h = jnp.tanh(h @ w + x_t)
                return h, h
            return lax.scan(cell, jnp.zeros(xs.shape[1:], xs.dtype), xs)[1]
    ''',
    "_decay_scan": '''
        def _decay_scan(xs):
            """A leaky running sum over the leading dim with lax.scan (carry and ys)."""
            def cell(c, x_t):
                c = 0.5 * c + x_t
                return c, jnp.sin(c)
            return lax.scan(cell, jnp.zeros_like(xs[0]), xs)[1]
    ''',
    "_concrete": '''
        def _concrete(args, seed=0):
            """Small random arrays for ShapeDtypeStructs (as toast_core.validate makes them)."""
            rng = np.random.default_rng(seed)
            def make(s):
                if jnp.issubdtype(s.dtype, jnp.floating):
                    return jnp.asarray(rng.normal(0, 0.02, s.shape), s.dtype)
                return jnp.asarray(rng.integers(0, 2, s.shape), s.dtype)
            return jax.tree.map(make, args)
    ''',
}


@dataclass(frozen=True)
class Input:
    """One input leaf: `group` is "params", "batch" or "stats"."""

    name: str
    group: str
    shape: tuple[int, ...]
    dtype: str = "float32"


@dataclass(frozen=True)
class Stmt:
    """`out = ...` as source lines with `{out}`, `{0}`, `{1}`... placeholders for the names.

    `stats` lists the running statistics this statement updates (names of "stats" inputs, whose
    new value is written as `new_stats[name]` by the lines); `helpers` the helper functions used.
    """

    out: str
    op: str
    args: tuple[str, ...]
    lines: tuple[str, ...]
    shape: tuple[int, ...]
    helpers: tuple[str, ...] = ()
    stats: tuple[str, ...] = ()

    def render(self, args: tuple[str, ...] | None = None) -> list[str]:
        names = self.args if args is None else args
        return [ln.format(*names, out=self.out) for ln in self.lines]


@dataclass(frozen=True)
class Program:
    seed: int
    index: int
    mode: str
    inputs: tuple[Input, ...]
    stmts: tuple[Stmt, ...]
    note: str = ""
    _cache: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    # ---- structure -------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return f"fuzz_{self.seed}_{self.index}"

    def outputs(self) -> list[str]:
        """Float values no statement reads: the forward function returns them all."""
        used = {a for s in self.stmts for a in s.args}
        return [s.out for s in self.stmts if s.out not in used]

    def group(self, g: str) -> list[Input]:
        return [i for i in self.inputs if i.group == g]

    def ops(self) -> list[str]:
        return [s.op for s in self.stmts]

    def replace(self, **kw) -> Program:
        return dataclasses.replace(self, _cache={}, **kw)

    # ---- rendering -------------------------------------------------------------------------
    def source(self) -> str:
        """A standalone script: imports, helpers, forward, loss, step, example_args, main."""
        if "source" in self._cache:
            return self._cache["source"]
        helpers = sorted({h for s in self.stmts for h in s.helpers} | {"_concrete"})
        out: list[str] = [
            f'"""Fuzz program seed={self.seed} index={self.index} mode={self.mode} '
            f"(ops: {', '.join(self.ops()) or 'none'}).{self.note}",
            "",
            "Generated by toast's fuzz/programs.py; run it with `python <this file>`.",
            '"""',
            "",
            "import os",
            "",
            'os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")',
            "",
            "import jax",
            "import jax.numpy as jnp",
            "import numpy as np",
            "from jax import lax",
            "",
        ]
        for h in helpers:
            out += ["", textwrap.dedent(HELPERS[h]).strip(), ""]
        out += ["", *self._forward_lines(), "", *self._step_lines(), "", *self._args_lines()]
        out += [
            "",
            'if __name__ == "__main__":',
            "    args = _concrete(example_args())",
            "    out = jax.jit(step)(*args)",
            "    print(jax.tree.map(lambda a: (a.shape, float(jnp.sum(a))), out))",
            "",
        ]
        self._cache["source"] = "\n".join(out)
        return self._cache["source"]

    def _signature(self) -> list[str]:
        return ["params", "batch"] + (["stats"] if self.group("stats") else [])

    def _forward_lines(self) -> list[str]:
        sig = self._signature()
        lines = [f"def forward({', '.join(sig)}):"]
        for inp in self.inputs:
            lines.append(f'    {inp.name} = {inp.group}["{inp.name}"]')
        if self.group("stats"):
            lines.append("    new_stats = dict(stats)")
        for s in self.stmts:
            lines += ["    " + ln for ln in s.render()]
        outs = self.outputs()
        ret = "(" + "".join(f"{o}, " for o in outs) + ")"
        if self.group("stats"):
            ret += ", new_stats"
        lines.append(f"    return {ret}")
        return lines

    def _step_lines(self) -> list[str]:
        has_stats = bool(self.group("stats"))
        sig = self._signature()
        call = ", ".join(sig)
        if self.mode == "forward":
            return [f"def step({call}):", f"    return forward({call})"]
        lines = [f"def loss_fn({call}):"]
        if has_stats:
            lines += [f"    outs, new_stats = forward({call})"]
        else:
            lines += [f"    outs = forward({call})"]
        lines += ["    loss = sum(jnp.mean(o) for o in outs) + 0.0"]
        lines += ["    return loss, new_stats" if has_stats else "    return loss, None"]
        lines += [""]
        if self.mode == "sgd":
            lines += [
                f"def step({call}):",
                f"    (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)({call})",
                "    new_params = jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)",
                "    return (new_params, aux, loss) if aux is not None else (new_params, loss)",
            ]
        elif self.mode == "adam":
            rest = ", ".join(sig[1:])
            lines += [
                f"def step(params, opt, {rest}):",
                f"    (loss, aux), g = jax.value_and_grad(loss_fn, has_aux=True)(params, {rest})",
                '    count = opt["count"] + 1.0',
                '    m = jax.tree.map(lambda m, g: 0.9 * m + 0.1 * g, opt["m"], g)',
                '    v = jax.tree.map(lambda v, g: 0.999 * v + 0.001 * g * g, opt["v"], g)',
                "    c1, c2 = 1.0 - 0.9**count, 1.0 - 0.999**count",
                "    new_params = jax.tree.map(",
                "        lambda p, m, v: p - 1e-3 * (m / c1) / (jnp.sqrt(v / c2) + 1e-8), params, m, v",
                "    )",
                '    new_opt = {"m": m, "v": v, "count": count}',
                "    if aux is not None:",
                "        return new_params, new_opt, aux, loss",
                "    return new_params, new_opt, loss",
            ]
        else:
            lines += self._accum_lines()
        return lines

    def _accum_lines(self) -> list[str]:
        """Gradient accumulation over the leading (micro-batch) dim of every batch leaf."""
        grad = "jax.grad(lambda p, b: loss_fn(p, b)[0])"
        head = [
            "def step(params, batch):",
            "    zeros = jax.tree.map(jnp.zeros_like, params)",
        ]
        tail = [
            f"    grads = jax.tree.map(lambda g: g / {MICRO_BATCHES}, grads)",
            "    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)",
        ]
        if self.mode == "accum_fori":
            body = [
                "    def body(i, acc):",
                "        micro = jax.tree.map(lambda b: b[i], batch)",
                f"        return jax.tree.map(jnp.add, acc, {grad}(params, micro))",
                "",
                f"    grads = lax.fori_loop(0, {MICRO_BATCHES}, body, zeros)",
            ]
        elif self.mode == "accum_while":
            body = [
                "    def body(carry):",
                "        i, acc = carry",
                "        micro = jax.tree.map(lambda b: lax.dynamic_index_in_dim(b, i, 0, False), batch)",
                f"        return i + 1, jax.tree.map(jnp.add, acc, {grad}(params, micro))",
                "",
                f"    grads = lax.while_loop(lambda c: c[0] < {MICRO_BATCHES}, body, (0, zeros))[1]",
            ]
        else:
            body = [
                "    def body(acc, micro):",
                f"        return jax.tree.map(jnp.add, acc, {grad}(params, micro)), None",
                "",
                "    grads = lax.scan(body, zeros, batch)[0]",
            ]
        return head + body + tail

    def _args_lines(self) -> list[str]:
        def leaf(i: Input, lead: tuple[int, ...] = ()) -> str:
            return f'"{i.name}": jax.ShapeDtypeStruct({lead + i.shape}, jnp.{i.dtype})'

        micro = (MICRO_BATCHES,) if self.mode.startswith("accum") else ()
        params = ", ".join(leaf(i) for i in self.group("params"))
        batch = ", ".join(leaf(i, micro) for i in self.group("batch"))
        lines = [
            "def example_args():",
            '    """The example arguments as ShapeDtypeStructs (nothing allocated)."""',
            f"    params = {{{params}}}",
            f"    batch = {{{batch}}}",
        ]
        args = ["params", "batch"]
        if self.mode == "adam":
            lines += [
                "    opt = {",
                '        "m": jax.tree.map(lambda s: s, params),',
                '        "v": jax.tree.map(lambda s: s, params),',
                '        "count": jax.ShapeDtypeStruct((), jnp.float32),',
                "    }",
            ]
            args = ["params", "opt", "batch"]
        if self.group("stats"):
            stats = ", ".join(leaf(i) for i in self.group("stats"))
            lines.append(f"    stats = {{{stats}}}")
            args.append("stats")
        lines.append(f"    return ({', '.join(args)},)")
        return lines

    # ---- serialization ---------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "seed": self.seed,
            "index": self.index,
            "mode": self.mode,
            "note": self.note,
            "inputs": [dataclasses.asdict(i) for i in self.inputs],
            "stmts": [dataclasses.asdict(s) for s in self.stmts],
        }

    @staticmethod
    def from_dict(d: dict) -> Program:
        def tup(x):
            return tuple(tup(y) for y in x) if isinstance(x, list) else x

        inputs = tuple(Input(**{k: tup(v) for k, v in i.items()}) for i in d["inputs"])
        stmts = tuple(Stmt(**{k: tup(v) for k, v in s.items()}) for s in d["stmts"])
        return Program(d["seed"], d["index"], d["mode"], inputs, stmts, d.get("note", ""))

    # ---- execution -------------------------------------------------------------------------
    def load(self) -> dict:
        """Executes the rendered script (without its main block): {"step", "example_args", ...}."""
        if "ns" not in self._cache:
            ns: dict = {"__name__": f"fuzz_program_{self.seed}_{self.index}"}
            exec(compile(self.source(), f"<{self.name}>", "exec"), ns)  # noqa: S102 - our own spec
            self._cache["ns"] = ns
        return self._cache["ns"]

    def step_and_args(self):
        ns = self.load()
        return ns["step"], ns["example_args"]()

    def value_shapes(self) -> dict[str, tuple[int, ...]]:
        """Shape of every statement's result (one jax.eval_shape of the forward body)."""
        import jax
        import jax.numpy as jnp

        ns = _helper_namespace()
        sig = self._signature()
        body = [ln for ln in self._forward_lines()[1:] if not ln.startswith("    return ")]
        names = ", ".join(f'"{s.out}": {s.out}' for s in self.stmts)
        src = f"def _all({', '.join(sig)}):\n" + "\n".join(body) + f"\n    return {{{names}}}\n"
        exec(src, ns)  # noqa: S102 - our own spec
        groups = {
            g: {i.name: jax.ShapeDtypeStruct(i.shape, jnp.dtype(i.dtype)) for i in self.group(g)}
            for g in ("params", "batch", "stats")
        }
        out = jax.eval_shape(ns["_all"], *(groups[g] for g in sig))
        return {k: tuple(v.shape) for k, v in out.items()}

    def check(self, run: bool = False) -> None:
        """Raises unless the program traces (and, with `run`, compiles and runs under jax.jit)."""
        import jax

        step, args = self.step_and_args()
        if run:
            out = jax.jit(step)(*self.load()["_concrete"](args))
            jax.block_until_ready(out)
        else:
            jax.eval_shape(step, *args)


# ---- generation ---------------------------------------------------------------------------


class _Gen:
    """Builds one program: a pool of float values with shapes, and statements over them."""

    def __init__(self, rng: np.random.Generator, mode: str):
        self.rng, self.mode = rng, mode
        self.inputs: list[Input] = []
        self.stmts: list[Stmt] = []
        self.shapes: dict[str, tuple[int, ...]] = {}  # float values a statement may read
        self.counter = 0
        self.salt = 0

    # -- random helpers
    def size(self, even: bool = False) -> int:
        p = SIZE_WEIGHTS / SIZE_WEIGHTS.sum()
        while True:
            s = int(self.rng.choice(SIZES, p=p))
            if not even or s % 2 == 0:
                return s

    def shape(self, rank: int) -> tuple[int, ...]:
        while True:
            shp = tuple(self.size() for _ in range(rank))
            if int(np.prod(shp)) <= MAX_ELEMENTS // 2:
                return shp

    def coin(self, p: float = 0.5) -> bool:
        return bool(self.rng.random() < p)

    def pick(self, seq):
        return seq[int(self.rng.integers(len(seq)))]

    def fresh(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def new_input(self, group: str, shape: tuple[int, ...], dtype: str = "float32", prefix=None):
        prefix = prefix or {"params": "w", "batch": "x", "stats": "s"}[group]
        name = self.fresh(prefix)
        self.inputs.append(Input(name, group, tuple(int(d) for d in shape), dtype))
        if group == "batch" and dtype == "float32":
            self.shapes[name] = tuple(shape)
        return name

    def value(self, min_rank: int = 0, max_rank: int = 4, pred=None) -> str | None:
        names = [
            n
            for n, s in self.shapes.items()
            if min_rank <= len(s) <= max_rank and (pred is None or pred(s))
        ]
        if not names:
            return None
        # prefer recent values so programs are chains rather than fans of inputs
        w = np.arange(1, len(names) + 1, dtype=float) ** 1.5
        return names[int(self.rng.choice(len(names), p=w / w.sum()))]


def _ix(rank: int, d: int, text: str) -> str:
    """Index expression selecting `text` on dim d: `[:, ::2]` for d=1."""
    parts = [":"] * rank
    parts[d] = text
    while parts and parts[-1] == ":":
        parts.pop()
    return "[" + ", ".join(parts) + "]" if parts else "[...]"


INDEXED_MIN = 2
"""Smallest size of a dim an integer input indexes (or of a segment count).

`toast_core.validate.concrete_args` draws integer inputs in [0, 2): on a dim of size 1 the index
1 is out of bounds, `jnp.take` fills NaN, and jax 0.10.2's XLA:CPU computes `exp` of that fill in a
fused loop as garbage that changes from run to run (finite, even negative: fuzz seed 16 program
1305 gave 69.3 sharded vs -inf unsharded with every value replicated), so the comparison would
judge XLA's NaN handling, not the plan. Wrapping the index (`i % n`) would also keep it in bounds,
but it adds index arithmetic XLA fuses into every reader and so changes what the program is."""


# Each op builder returns (op name, arg names, lines, helpers, stats) or None when no value fits.
def _unary(g: _Gen):
    a = g.value()
    if a is None:
        return None
    kind, expr = g.pick(
        [
            ("tanh", "jnp.tanh({0})"),
            ("exp", "jnp.exp({0})"),
            ("log1p", "jnp.log1p(jnp.abs({0}))"),
            ("erf", "lax.erf({0})"),
            ("erfc", "lax.erfc({0})"),
            ("gelu_exact", "jax.nn.gelu({0}, approximate=False)"),
            ("gelu_tanh", "jax.nn.gelu({0})"),
            ("sqrt", "jnp.sqrt({0} * {0} + 1.0)"),
            ("rsqrt", "lax.rsqrt({0} * {0} + 1.0)"),
            ("logistic", "jax.nn.sigmoid({0})"),
            ("relu", "jax.nn.relu({0})"),
            ("square", "{0} ** 2"),
            ("sin", "jnp.sin({0})"),
            ("softplus", "jax.nn.softplus({0})"),
            ("silu", "jax.nn.silu({0})"),
            ("abs", "jnp.abs({0})"),
            ("clip", "jnp.clip({0}, -0.5, 0.5)"),
            ("digamma", "jax.scipy.special.digamma({0} * {0} + 1.0)"),
            ("leaky", "jnp.where({0} > 0, {0}, 0.01 * {0})"),
            ("affine", "{0} * 0.5 + 0.1"),
            ("min_const", "jnp.minimum({0}, 0.3)"),
        ]
    )
    return kind, (a,), (f"{{out}} = {expr}",), (), ()


def _binary(g: _Gen):
    a = g.value()
    if a is None:
        return None
    shp = g.shapes[a]
    same = [n for n, s in g.shapes.items() if s == shp and n != a]
    vec = [n for n, s in g.shapes.items() if len(s) == 1 and shp and s == shp[-1:]]
    if same and g.coin(0.7):
        b = g.pick(same)
    elif vec and g.coin(0.5):
        b = g.pick(vec)
    elif g.coin(0.3):
        b = a  # both operands one value: a self-use
    else:
        b = g.new_input("batch", shp)
    kind, expr = g.pick(
        [
            ("add", "{0} + {1}"),
            ("sub", "{0} - {1}"),
            ("mul", "{0} * {1}"),
            ("max", "jnp.maximum({0}, {1})"),
            ("min", "jnp.minimum({0}, {1})"),
            ("div", "{0} / (1.0 + {1} * {1})"),
            ("where", "jnp.where({0} > 0.1, {0}, {1})"),
        ]
    )
    return kind, (a, b), (f"{{out}} = {expr}",), (), ()


def _param_elementwise(g: _Gen):
    a = g.value(min_rank=1)
    if a is None:
        return None
    shp = g.shapes[a]
    kind = g.pick(["bias", "scale", "scalar_scale"])
    if kind == "scalar_scale":
        w = g.new_input("params", ())
        return kind, (a, w), ("{out} = {0} * {1}",), (), ()
    w = g.new_input("params", shp[-1:])
    return kind, (a, w), ("{out} = {0} + {1}" if kind == "bias" else "{out} = {0} * {1}",), (), ()


_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def _dense(g: _Gen):
    a = g.value(min_rank=1, max_rank=4)
    if a is None:
        return None
    shp = g.shapes[a]
    k = int(g.rng.integers(len(shp)))
    f = g.size()
    if int(np.prod(shp)) // shp[k] * f > MAX_ELEMENTS:
        return None
    w = g.new_input("params", (shp[k], f))
    ins = _LETTERS[: len(shp)]
    out = ins.replace(ins[k], "") + "z"
    spec = f"{ins},{ins[k]}z->{out}"
    if k == len(shp) - 1 and g.coin(0.5):
        return "matmul", (a, w), ("{out} = {0} @ {1}",), (), ()
    return "einsum_dense", (a, w), (f'{{out}} = jnp.einsum("{spec}", {{0}}, {{1}})',), (), ()


def _einsum(g: _Gen):
    """einsum of two values (maybe one value twice) over a shared dim size, maybe a batch dim."""
    a = g.value(min_rank=1, max_rank=3)
    if a is None:
        return None
    sa = g.shapes[a]
    cands = [n for n, s in g.shapes.items() if 1 <= len(s) <= 3 and set(s) & set(sa)]
    b = g.pick(cands)
    sb = g.shapes[b]
    pairs = [(i, j) for i in range(len(sa)) for j in range(len(sb)) if sa[i] == sb[j]]
    ci, cj = g.pick(pairs)
    la = list(_LETTERS[: len(sa)])
    lb = list(_LETTERS[len(sa) : len(sa) + len(sb)])
    lb[cj] = la[ci]
    batch = [(i, j) for i, j in pairs if i != ci and j != cj]
    if batch and g.coin(0.4):
        bi, bj = g.pick(batch)
        lb[bj] = la[bi]
        keep_batch = la[bi]
    else:
        keep_batch = ""
    out = [c for c in la if c != la[ci]] + [c for c in lb if c not in la]
    if keep_batch and keep_batch not in out:
        out.insert(0, keep_batch)
    if len(out) > 4:
        return None
    sizes = {**dict(zip(la, sa)), **dict(zip(lb, sb))}
    if int(np.prod([sizes[c] for c in out])) > MAX_ELEMENTS:
        return None
    spec = f"{''.join(la)},{''.join(lb)}->{''.join(out)}"
    return "einsum", (a, b), (f'{{out}} = jnp.einsum("{spec}", {{0}}, {{1}})',), (), ()


def _reduce(g: _Gen):
    a = g.value(min_rank=1)
    if a is None:
        return None
    rank = len(g.shapes[a])
    d = int(g.rng.integers(rank))
    kd = ", keepdims=True" if g.coin(0.3) else ""
    kind, expr = g.pick(
        [
            ("sum", f"jnp.sum({{0}}, axis={d}{kd})"),
            ("max", f"jnp.max({{0}}, axis={d}{kd})"),
            ("min", f"jnp.min({{0}}, axis={d}{kd})"),
            ("mean", f"jnp.mean({{0}}, axis={d}{kd})"),
            ("prod", f"jnp.prod(1.0 + 0.1 * jnp.tanh({{0}}), axis={d}{kd})"),
            ("logsumexp", f"jax.nn.logsumexp({{0}}, axis={d}{kd})"),
            ("softmax", f"jax.nn.softmax({{0}}, axis={d})"),
            ("log_softmax", f"jax.nn.log_softmax({{0}}, axis={d})"),
            ("var", f"jnp.var({{0}}, axis={d}{kd})"),
        ]
    )
    return kind, (a,), (f"{{out}} = {expr}",), (), ()


def _reshape(g: _Gen):
    a = g.value(min_rank=1)
    if a is None:
        return None
    shp = g.shapes[a]
    r = len(shp)
    opts = []
    if r >= 2:
        d = int(g.rng.integers(r - 1))
        opts.append(
            (
                "reshape_merge",
                f"{{out}} = {{0}}.reshape({{0}}.shape[:{d}] + ({{0}}.shape[{d}] * {{0}}.shape[{d + 1}],) + {{0}}.shape[{d + 2}:])",
            )
        )
        opts.append(("ravel", "{out} = {0}.reshape(-1)"))
    evens = [d for d in range(r) if shp[d] % 2 == 0 and shp[d] > 2]
    if evens and r < 4:
        d = g.pick(evens)
        f = f"2, {{0}}.shape[{d}] // 2" if g.coin() else f"{{0}}.shape[{d}] // 2, 2"
        opts.append(
            (
                "reshape_split",
                f"{{out}} = {{0}}.reshape({{0}}.shape[:{d}] + ({f}) + {{0}}.shape[{d + 1}:])",
            )
        )
    if r < 4:
        d = int(g.rng.integers(r + 1))
        opts.append(("expand_dims", f"{{out}} = jnp.expand_dims({{0}}, {d})"))
    ones = [d for d in range(r) if shp[d] == 1]
    if ones:
        opts.append(("squeeze", f"{{out}} = jnp.squeeze({{0}}, {g.pick(ones)})"))
    kind, line = g.pick(opts)
    return kind, (a,), (line,), (), ()


def _transpose(g: _Gen):
    a = g.value(min_rank=2)
    if a is None:
        return None
    r = len(g.shapes[a])
    if g.coin():
        i, j = g.rng.choice(r, 2, replace=False)
        return "swapaxes", (a,), (f"{{out}} = jnp.swapaxes({{0}}, {int(i)}, {int(j)})",), (), ()
    perm = tuple(int(x) for x in g.rng.permutation(r))
    return "transpose", (a,), (f"{{out}} = jnp.transpose({{0}}, {perm})",), (), ()


def _broadcast(g: _Gen):
    a = g.value(max_rank=3)
    if a is None:
        return None
    shp = g.shapes[a]
    k = g.size()
    if int(np.prod(shp)) * k > MAX_ELEMENTS:
        return None
    if shp and g.coin(0.4):
        # outer product with another vector: a[..., None] * v
        v = g.new_input("batch", (k,))
        return "outer", (a, v), ("{out} = {0}[..., None] * {1}",), (), ()
    return (
        "broadcast",
        (a,),
        (f"{{out}} = jnp.broadcast_to({{0}}[None], ({k},) + {{0}}.shape)",),
        (),
        (),
    )


def _concat(g: _Gen):
    a = g.value(min_rank=1)
    if a is None:
        return None
    shp = g.shapes[a]
    r = len(shp)
    if 2 * int(np.prod(shp)) > MAX_ELEMENTS:
        return None
    d = int(g.rng.integers(r))
    same = [n for n, s in g.shapes.items() if s == shp and n != a]
    b = g.pick(same) if same and g.coin(0.6) else None
    second = "{1}" if b else "jnp.tanh({0})"
    args = (a, b) if b else (a,)
    kind = g.pick(["concatenate", "stack", "tile"] if r < 4 else ["concatenate", "tile"])
    if kind == "concatenate":
        line = f"{{out}} = jnp.concatenate([{{0}}, {second}], axis={d})"
    elif kind == "stack":
        line = f"{{out}} = jnp.stack([{{0}}, {second}], axis={int(g.rng.integers(r + 1))})"
    else:
        reps = [1] * r
        reps[d] = 2
        line = f"{{out}} = jnp.tile({{0}}, {tuple(reps)})"
        args = (a,)
    return kind, args, (line,), (), ()


def _slice(g: _Gen):
    a = g.value(min_rank=1, pred=lambda s: max(s) >= 2)
    if a is None:
        return None
    shp = g.shapes[a]
    r = len(shp)
    d = g.pick([i for i in range(r) if shp[i] >= 2])
    kind, text = g.pick(
        [
            ("slice_stride2", "::2"),
            ("slice_stride2_odd", "1::2"),
            ("slice_head", ":-1"),
            ("slice_tail", "1:"),
            ("slice_half", f":{shp[d] // 2}"),
            ("flip", "::-1"),
        ]
    )
    if kind in ("slice_stride2", "slice_stride2_odd") and g.coin(0.3):
        return (
            kind,
            (a,),
            (
                f"{{out}} = lax.slice_in_dim({{0}}, {text[0] if text[0] != ':' else 0}, None, 2, axis={d})",
            ),
            (),
            (),
        )
    return kind, (a,), (f"{{out}} = {{0}}{_ix(r, d, text)}",), (), ()


def _pad(g: _Gen):
    a = g.value(min_rank=1)
    if a is None:
        return None
    shp = g.shapes[a]
    r = len(shp)
    d = int(g.rng.integers(r))
    if int(np.prod(shp)) * 3 > MAX_ELEMENTS:
        return None
    if g.coin(0.3):
        cfg = [(0, 0, 0)] * r
        cfg[d] = (1, 0, 1)
        return "pad_interior", (a,), (f"{{out}} = lax.pad({{0}}, 0.0, {cfg})",), (), ()
    cfg = [(0, 0)] * r
    cfg[d] = (1, 2)
    mode = g.pick(["constant", "edge", "reflect"]) if shp[d] > 2 else "constant"
    return f"pad_{mode}", (a,), (f'{{out}} = jnp.pad({{0}}, {cfg}, mode="{mode}")',), (), ()


def _gather(g: _Gen):
    a = g.value(min_rank=1)
    if a is None:
        return None
    shp = g.shapes[a]
    r = len(shp)
    d = int(g.rng.integers(r))
    k = g.pick([1, 2, 3, 4, 8])
    if int(np.prod(shp)) // shp[d] * k > MAX_ELEMENTS:
        return None
    kind = g.pick(["take", "index", "take_along", "one_hot", "argmax_take"])
    if kind in ("take", "index", "take_along") and shp[d] < INDEXED_MIN:
        return None
    if kind == "take_along":
        idx = g.new_input("batch", shp[:d] + (k,) + shp[d + 1 :], "int32", prefix="i")
        return kind, (a, idx), (f"{{out}} = jnp.take_along_axis({{0}}, {{1}}, axis={d})",), (), ()
    if kind == "argmax_take":
        line = f"{{out}} = jnp.take_along_axis({{0}}, jnp.argmax({{0}}, axis={d}, keepdims=True), axis={d})"
        return kind, (a,), (line,), (), ()
    idx = g.new_input("batch", (k,), "int32", prefix="i")
    if kind == "one_hot":
        n = g.size()
        return kind, (idx,), (f"{{out}} = jax.nn.one_hot({{0}}, {n}) * 1.5",), (), ()
    if kind == "index" and d == 0:
        return kind, (a, idx), ("{out} = {0}[{1}]",), (), ()
    return "take", (a, idx), (f"{{out}} = jnp.take({{0}}, {{1}}, axis={d})",), (), ()


def _scatter(g: _Gen):
    a = g.value(min_rank=1)
    if a is None:
        return None
    shp = g.shapes[a]
    r = len(shp)
    d = int(g.rng.integers(r))
    if shp[d] < INDEXED_MIN:
        return None
    k = g.pick([1, 2, 3, 4])
    idx = g.new_input("batch", (k,), "int32", prefix="i")
    at = _ix(r, d, "{1}").replace("[...]", "[{1}]")
    kind = g.pick(["scatter_add", "scatter_add", "scatter_mul", "scatter_set", "segment_sum"])
    if kind == "segment_sum" and d == 0 and shp[0] >= k:
        n = max(INDEXED_MIN, g.size())
        line = f"{{out}} = jax.ops.segment_sum({{0}}[:{k}], {{1}}, num_segments={n})"
        return kind, (a, idx), (line,), (), ()
    method = {"scatter_mul": "multiply", "scatter_set": "set"}.get(kind, "add")
    kind = "scatter_add" if kind == "segment_sum" else kind
    upd = f"jnp.tanh({{0}}{at})"
    return kind, (a, idx), (f"{{out}} = {{0}}.at{at}.{method}({upd})",), (), ()


def _cumulative(g: _Gen):
    a = g.value(min_rank=1)
    if a is None:
        return None
    d = int(g.rng.integers(len(g.shapes[a])))
    kind, expr = g.pick(
        [
            ("cumsum", f"jnp.cumsum({{0}}, axis={d})"),
            ("cummax", f"lax.cummax({{0}}, axis={d})"),
            ("cummin", f"lax.cummin({{0}}, axis={d})"),
            ("cumlogsumexp", f"lax.cumlogsumexp({{0}}, axis={d})"),
            ("cumprod", f"jnp.cumprod(1.0 + 0.1 * {{0}}, axis={d})"),
            ("cumsum_reverse", f"lax.cumsum({{0}}, axis={d}, reverse=True)"),
        ]
    )
    return kind, (a,), (f"{{out}} = {expr}",), (), ()


def _sort(g: _Gen):
    a = g.value(min_rank=1)
    if a is None:
        return None
    shp = g.shapes[a]
    d = int(g.rng.integers(len(shp)))
    kind = g.pick(["sort", "top_k", "route", "argsort_take"])
    if kind == "top_k":
        k = int(g.rng.integers(1, min(shp[-1], 4) + 1))
        return kind, (a,), (f"{{out}} = lax.top_k({{0}}, {k})[0]",), (), ()
    if kind == "route" and len(shp) >= 1 and shp[-1] >= 2:
        k = int(g.rng.integers(1, min(shp[-1], 3) + 1))
        return "topk_route", (a,), (f"{{out}} = _route({{0}}, {k})",), ("_route",), ()
    if kind == "argsort_take":
        line = f"{{out}} = jnp.take_along_axis({{0}}, jnp.argsort({{0}}, axis={d}), axis={d})"
        return kind, (a,), (line,), (), ()
    return "sort", (a,), (f"{{out}} = jnp.sort({{0}}, axis={d})",), (), ()


def _conv(g: _Gen):
    """lax.conv_general_dilated, 1-D (rank-3 value) or 2-D (rank 4), random dimension numbers."""
    a = g.value(min_rank=3, max_rank=4)
    if a is None:
        return None
    shp = g.shapes[a]
    nsp = len(shp) - 2
    sp = "W" if nsp == 1 else "HW"
    lhs = "".join(g.rng.permutation(list("NC" + sp)))
    rhs = "".join(g.rng.permutation(list("OI" + sp)))
    out = "".join(g.rng.permutation(list("NC" + sp)))
    c_in = shp[lhs.index("C")]
    spatial = [shp[lhs.index(c)] for c in sp]
    ksize = [int(g.rng.integers(1, min(3, s) + 1)) for s in spatial]
    o = g.size()
    kdims = {"O": o, "I": c_in, **dict(zip(sp, ksize))}
    padding = g.pick(["VALID", "SAME"])
    strides = tuple(int(g.pick([1, 1, 2])) for _ in sp)
    n = shp[lhs.index("N")]
    out_elems = n * o * int(np.prod(spatial))
    if out_elems > MAX_ELEMENTS:
        return None
    w = g.new_input("params", tuple(kdims[c] for c in rhs))
    dn = (lhs, rhs, out)
    line = (
        f"{{out}} = lax.conv_general_dilated({{0}}, {{1}}, window_strides={strides}, "
        f'padding="{padding}", dimension_numbers={dn})'
    )
    return f"conv{nsp}d", (a, w), (line,), (), ()


def _loop(g: _Gen):
    a = g.value(min_rank=1)
    if a is None:
        return None
    shp = g.shapes[a]
    kinds = ["fori", "scan_decay", "cond", "while_stopgrad"]
    if len(shp) >= 2 and shp[-1] <= 32:
        kinds.append("rnn_scan")
    kind = g.pick(kinds)
    if kind == "fori":
        line = "{out} = lax.fori_loop(0, 3, lambda i, c: 0.9 * c + 0.1 * jnp.tanh(c), {0})"
        return "fori_loop", (a,), (line,), (), ()
    if kind == "scan_decay":
        return "scan", (a,), ("{out} = _decay_scan({0})",), ("_decay_scan",), ()
    if kind == "rnn_scan":
        w = g.new_input("params", (shp[-1], shp[-1]))
        return "scan_rnn", (a, w), ("{out} = _rnn({0}, {1})",), ("_rnn",), ()
    if kind == "cond":
        line = "{out} = lax.cond(jnp.sum({0}) > 0, lambda t: 2.0 * t, jnp.tanh, {0})"
        return "cond", (a,), (line,), (), ()
    line = (
        "{out} = lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, 0.9 * c[1] + 0.1 * "
        "jnp.tanh(c[1])), (0, lax.stop_gradient({0})))[1]"
    )
    return "while_loop", (a,), (line,), (), ()


def _custom(g: _Gen):
    a = g.value()
    if a is None:
        return None
    kind = g.pick(["custom_jvp", "custom_vjp", "checkpoint", "checkpoint_dense"])
    if kind == "custom_jvp":
        return kind, (a,), ("{out} = _softclip({0})",), ("_softclip",), ()
    if kind == "custom_vjp":
        s = g.new_input("params", ())
        return kind, (a, s), ("{out} = _scaled_tanh({0}, {1})",), ("_scaled_tanh",), ()
    shp = g.shapes[a]
    if kind == "checkpoint_dense" and shp:
        f = g.size()
        if int(np.prod(shp)) // shp[-1] * f > MAX_ELEMENTS:
            return None
        w = g.new_input("params", (shp[-1], f))
        line = "{out} = jax.checkpoint(lambda t, w: jax.nn.gelu(t @ w))({0}, {1})"
        return kind, (a, w), (line,), (), ()
    line = "{out} = jax.checkpoint(lambda t: jnp.sin(t) * jnp.tanh(t))({0})"
    return "checkpoint", (a,), (line,), (), ()


def _dropout(g: _Gen):
    a = g.value(min_rank=1)
    if a is None:
        return None
    keys = [i.name for i in g.inputs if i.dtype == "uint32"]
    key = keys[0] if keys and g.coin(0.7) else g.new_input("batch", (2,), "uint32", prefix="key")
    g.salt += 1
    return "dropout", (a, key), (f"{{out}} = _dropout({{0}}, {{1}}, {g.salt})",), ("_dropout",), ()


def _batchnorm(g: _Gen):
    a = g.value(min_rank=2)
    if a is None:
        return None
    c = g.shapes[a][-1]
    gamma = g.new_input("params", (c,), prefix="gamma")
    beta = g.new_input("params", (c,), prefix="beta")
    lines = ["{out}, _mean_{out}, _var_{out} = _batchnorm({0}, {1}, {2})"]
    if g.mode.startswith("accum"):  # running statistics need a stats carry; plain BN here
        return "batchnorm", (a, gamma, beta), tuple(lines), ("_batchnorm",), ()
    m = g.new_input("stats", (c,), prefix="mean")
    v = g.new_input("stats", (c,), prefix="var")
    lines += [
        f'new_stats["{m}"] = 0.9 * {{3}} + 0.1 * _mean_{{out}}',
        f'new_stats["{v}"] = 0.9 * {{4}} + 0.1 * _var_{{out}}',
    ]
    return "batchnorm_stats", (a, gamma, beta, m, v), tuple(lines), ("_batchnorm",), (m, v)


OP_BUILDERS = {
    "unary": (_unary, 10),
    "binary": (_binary, 6),
    "param_elementwise": (_param_elementwise, 3),
    "dense": (_dense, 7),
    "einsum": (_einsum, 3),
    "reduce": (_reduce, 5),
    "reshape": (_reshape, 4),
    "transpose": (_transpose, 3),
    "broadcast": (_broadcast, 2),
    "concat": (_concat, 3),
    "slice": (_slice, 3),
    "pad": (_pad, 1),
    "gather": (_gather, 3),
    "scatter": (_scatter, 2),
    "cumulative": (_cumulative, 2),
    "sort": (_sort, 2),
    "conv": (_conv, 3),
    "loop": (_loop, 2),
    "custom": (_custom, 2),
    "dropout": (_dropout, 1),
    "batchnorm": (_batchnorm, 1),
}


def _stmt_shape(g: _Gen, lines: tuple[str, ...], args: tuple[str, ...], out: str, helpers):
    """The shape of a new statement's result (jax.eval_shape of its lines alone), or None."""
    import jax
    import jax.numpy as jnp

    ns = _helper_namespace()
    params = [f"_a{i}" for i in range(len(args))]
    body = [ln.format(*params, out="_out") for ln in lines]
    src = f"def _one({', '.join(params)}):\n    new_stats = {{}}\n"
    src += "".join(f"    {b}\n" for b in body) + "    return _out\n"
    exec(src, ns)  # noqa: S102 - our own generated line
    structs = []
    for a in args:
        inp = next((i for i in g.inputs if i.name == a), None)
        if inp is not None:
            structs.append(jax.ShapeDtypeStruct(inp.shape, jnp.dtype(inp.dtype)))
        else:
            structs.append(jax.ShapeDtypeStruct(g.shapes[a], jnp.float32))
    try:
        res = jax.eval_shape(ns["_one"], *structs)
    except Exception:  # noqa: BLE001 - an op that does not fit its operands: draw another
        return None
    if res.dtype != jnp.float32 or int(np.prod(res.shape)) > MAX_ELEMENTS:
        return None
    return tuple(res.shape)


_HELPER_NS: dict = {}


def _helper_namespace() -> dict:
    if not _HELPER_NS:
        import jax
        import jax.numpy as jnp
        from jax import lax

        ns = {"jax": jax, "jnp": jnp, "lax": lax, "np": np}
        for src in HELPERS.values():
            exec(textwrap.dedent(src), ns)  # noqa: S102
        _HELPER_NS.update(ns)
    return dict(_HELPER_NS)


def _draw(seed: int, index: int, attempt: int, max_ops: int, families=None) -> Program:
    rng = np.random.default_rng([seed, index, attempt])
    mode = MODES[int(rng.choice(len(MODES), p=[0.3, 0.25, 0.2, 0.1, 0.05, 0.1]))]
    g = _Gen(rng, mode)
    for _ in range(1 if g.coin(0.7) else 2):
        g.new_input("batch", g.shape(int(g.rng.integers(1, 5))))
    names = [n for n in OP_BUILDERS if families is None or n in families]
    weights = np.array([OP_BUILDERS[n][1] for n in names], dtype=float)
    n_ops = int(rng.integers(1, max_ops + 1))
    if mode != "forward":  # a train step needs a parameter on the path to the loss
        _add(g, "dense" if "dense" in names or families is None else names[0])
    tries = 0
    while len(g.stmts) < n_ops and tries < 8 * max_ops:
        tries += 1
        _add(g, names[int(rng.choice(len(names), p=weights / weights.sum()))])
    used = {a for s in g.stmts for a in s.args}
    keep_unused = g.coin(0.1)  # a user's program may take an input it never reads
    inputs = [i for i in g.inputs if i.name in used or (keep_unused and i.group == "batch")]
    return Program(seed, index, mode, tuple(inputs), tuple(g.stmts))


def _add(g: _Gen, family: str) -> None:
    n_inputs = len(g.inputs)
    built = OP_BUILDERS[family][0](g)
    if built is None:
        del g.inputs[n_inputs:]
        return
    op, args, lines, helpers, stats = built
    out = g.fresh("v")
    shape = _stmt_shape(g, lines, args, out, helpers)
    if shape is None:
        for inp in g.inputs[n_inputs:]:
            g.shapes.pop(inp.name, None)
        del g.inputs[n_inputs:]
        return
    g.stmts.append(Stmt(out, op, tuple(args), tuple(lines), shape, tuple(helpers), tuple(stats)))
    g.shapes[out] = shape


def generate(
    seed: int, index: int, *, max_ops: int = 10, check: str = "trace", families=None
) -> Program:
    """The program number `index` of the stream `seed`: valid under jax (traced, or run with
    `check="run"`), reproducible, with at most `max_ops` statements from `families` (names of
    OP_BUILDERS; all by default)."""
    last = None
    for attempt in range(20):
        prog = _draw(seed, index, attempt, max_ops, families)
        if not prog.stmts or (prog.mode != "forward" and not prog.group("params")):
            continue  # nothing to compute, or a train step with nothing to train
        try:
            prog.check(run=check == "run")
        except Exception as exc:  # noqa: BLE001 - an invalid draw: draw again
            last = exc
            continue
        if attempt:
            prog = prog.replace(note=f" (draw {attempt})")
        return prog
    raise RuntimeError(f"no valid program for seed={seed} index={index}: {last!r}")
