"""Compiling a lowered program once, however many times it is judged.

XLA's verdict on a plan does not depend on the hardware preset it is priced for: the compiled
program (its HLO, `cost_analysis()`, `memory_analysis()`) is the same for tpu-v5e and h100-80gb,
only the formulas that price it differ. Yet one plan is compiled many times over: by
`tc.search(verify=k)` for every preset it runs under, by `tc.validate` right after, again when the
explorer's user switches presets, and by the fidelity bench for each preset of a mesh. Compiling
is what costs (seconds per plan on simulated devices); pricing the result is cheap.

So compiles are memoised by what XLA actually receives: the lowered module's text (which names the
mesh, every sharding and the program itself), the mesh's devices and the compiler options. Equal
keys are equal inputs to a deterministic compiler, so a hit returns exactly what a fresh compile
would, for any function; nothing is keyed by Python identity. The memo keeps the last
`MAX_ENTRIES` executables (a validation also runs them for numerics).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

#: Executables kept (least recently used dropped first). Tiny programs compile to a few hundred
#: KB; abstract-shape compiles of large models hold no weights.
MAX_ENTRIES = 64

_memo: OrderedDict[str, object] = OrderedDict()
_stats = {"hits": 0, "compiles": 0}


def compile_lowered(lowered, mesh, options: dict | None = None):
    """`lowered.compile(compiler_options=options)`, reusing an earlier compile of the same input.

    `mesh` is the `jax.sharding.Mesh` it was lowered for: its devices join the key, since the
    executable runs on those very devices (the module's text names their order, not which).
    """
    options = dict(options or {})
    devices = ",".join(str(d.id) for d in mesh.devices.flat)
    text = lowered.as_text()
    key = hashlib.sha256(
        "\0".join((text, devices, repr(sorted(options.items())))).encode()
    ).hexdigest()
    hit = _memo.get(key)
    if hit is not None:
        _memo.move_to_end(key)
        _stats["hits"] += 1
        return hit
    compiled = lowered.compile(compiler_options=options) if options else lowered.compile()
    _stats["compiles"] += 1
    _memo[key] = compiled
    while len(_memo) > MAX_ENTRIES:
        _memo.popitem(last=False)
    return compiled


def stats() -> dict[str, int]:
    """Hits and compiles since the start (or the last `clear`)."""
    return dict(_stats, entries=len(_memo))


def clear() -> None:
    """Forget every executable (tests; or to free their memory)."""
    _memo.clear()
    _stats.update(hits=0, compiles=0)
