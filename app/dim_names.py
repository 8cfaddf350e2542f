"""What a named dim is, in words a reader knows: "batch", "sequence", "features", "hidden".

The analysis labels a named dim by the first input holding it (`128 (batch.y.1)`), which says
where it was found, not what it is. The structure of its members tells more:

* a data input's leading dim is the **batch**; its last dim, in a float input, the **features**;
  the dims between are the **sequence** (rank 2-3) or **spatial** dims (rank 4+ images); an
  integer input's last dim (token ids) is the **sequence**;
* a dim of parameters only, that is the last dim of one weight and the first of another, joins
  two matmuls: a **hidden** dim (the MLP's hidden units, a transformer's width); in convolution
  kernels `[kh, kw, cin, cout]` the leading dims are the **kernel window**, the others
  **channels**;
* any other parameter dim is a **weight dim**; a dim of intermediates only is named after the op
  that first produces it (`intermediate of dot_general at gpt.py:97`), never by an internal value
  name like `slice#237.1`.

    namer = DimNamer(ana)
    namer.role(ana.named_dims[3])      # "sequence"
    namer.describe(ana.named_dims[3])  # "sequence (batch.targets.1)"
"""

from __future__ import annotations

import re
import threading
import weakref

import toast_core as tc

_INTERNAL = re.compile(r"(\w+)#\d+(?:\.\d+)?")


def public_text(text: str) -> str:
    """`dot_general#126[8, 4]` -> `dot_general[8, 4]`: internal value numbers dropped."""
    return _INTERNAL.sub(r"\1", text)


def _short(name: str) -> str:
    """`params.blocks[*].mlp.w_fc` -> `mlp.w_fc` (the last two path parts)."""
    return ".".join(re.sub(r"\[\d+\]", "[*]", name).split(".")[-2:])


class DimNamer:
    """Names the named dims of one analysis; `DimNamer.of(ana)` shares one per analysis, which
    remembers its answers (naming walks a named dim's members: ~0.5 ms each, and the Search
    page's named dim picker names all 726 of llama3-70b's on every rerun)."""

    _shared: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
    _shared_lock = threading.Lock()

    def __init__(self, ana: tc.Analysis):
        self.ana = ana
        self.prog = ana.program
        self._producer: dict[int, int] | None = None
        self._described: dict[int, str] = {}

    @classmethod
    def of(cls, ana: tc.Analysis) -> DimNamer:
        with cls._shared_lock:
            namer = cls._shared.get(ana)
            if namer is None:
                namer = cls._shared[ana] = cls(ana)
            return namer

    def _where_made(self, vid: int) -> str:
        if self._producer is None:
            self._producer = {r: op.index for op in self.prog.ops for r in op.results}
        op = self._producer.get(vid)
        return public_text(self.prog.ops[op].where()) if op is not None else "the program"

    def role(self, nd: tc.NamedDim) -> str:
        prog = self.prog
        data = [(v, d, s) for v, d, s in nd.members if prog.values[v].role == "input"]
        if data:
            if any(d == 0 for _, d, _ in data):
                return "batch"
            v, d, _ = data[0]
            val = prog.values[v]
            is_float = "float" in val.dtype
            if d == val.rank - 1:
                if not is_float:
                    return "sequence"
                return "channels" if val.rank >= 4 else "features"
            return "spatial" if val.rank >= 4 else "sequence"
        params = [
            (v, d, prog.values[v].rank)
            for v, d, _ in nd.members
            if prog.values[v].role == "parameter" and prog.values[v].rank >= 2
        ]
        if any(rank >= 3 and d < rank - 2 for _, d, rank in params):
            return "kernel window"  # a convolution kernel's spatial dims [kh, kw, cin, cout]
        if params:
            first = any(d == 0 for _, d, _ in params)
            last = any(d == rank - 1 for _, d, rank in params)
            if any(rank >= 3 for _, _, rank in params):
                return "channels"
            joins = first and last and len({v for v, _, _ in params}) > 1
            return "hidden" if joins else "weight dim"
        if any(prog.values[v].role == "state" for v, _, _ in nd.members):
            return "optimizer state dim"
        return "intermediate"

    def holder(self, nd: tc.NamedDim) -> str:
        """Where it shows: up to two inputs or parameters holding it (`mlp.w_fc.1, wte.0`), or
        the op that first produces it."""
        prog = self.prog
        seen: list[str] = []
        for role in ("input", "parameter", "state"):
            for v, d, _ in nd.members:
                val = prog.values[v]
                if val.role == role:
                    text = f"{_short(val.name)}.{d}"
                    if text not in seen:
                        seen.append(text)
            if seen:
                break
        if seen:
            return ", ".join(seen[:2]) + (" ..." if len(seen) > 2 else "")
        v = nd.members[0][0] if nd.members else -1
        return f"of {self._where_made(v)}" if v >= 0 else ""

    def describe(self, nd: tc.NamedDim) -> str:
        text = self._described.get(nd.id)
        if text is None:
            text = self._described[nd.id] = f"{self.role(nd)} ({self.holder(nd)})"
        return text


def op_title(prog, op: int) -> str:
    """`dot_general(mlp.w_fc, [8, 1024, 768]) → [8, 1024, 3072] at gpt.py:95`: an op by what it
    reads (inputs and parameters by name, intermediates by shape), what it makes and where it
    was written; never by an internal value name like `slice#237.1`."""
    o = prog.ops[op]

    def arg(vid: int) -> str:
        v = prog.values[vid]
        if v.role in ("input", "parameter", "state"):
            return _short(v.name)
        return str(list(v.shape))

    args = ", ".join(arg(v) for v in o.operands[:3]) + (", ..." if len(o.operands) > 3 else "")
    made = ", ".join(str(list(prog.values[r].shape)) for r in o.results[:2])
    where = f" at {o.source}" if o.source else ""
    return public_text(f"{o.primitive}({args}) → {made}{where}")
