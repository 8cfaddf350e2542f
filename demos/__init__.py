"""The model zoo: pure JAX programs to shard, small enough to run on CPU, sizable to real ones.

`MODEL_ZOO[name](size=..., train=..., **config_overrides)` returns a `Workload`; `SIZES[name]`
lists the size names. The first size of each model ("tiny") carries concrete float32 arrays;
real sizes carry `jax.ShapeDtypeStruct`s only, so tracing them never allocates.
"""

from __future__ import annotations

from collections.abc import Callable

from demos import equinox_mlp, flax_mlp, gns, gpt, gpt_scan, llama, mlp, moe, unet
from demos.workload import Workload
from demos.workloads_extra import EXTRA_SIZES, EXTRA_ZOO

MODEL_ZOO: dict[str, Callable[..., Workload]] = {
    "mlp": mlp.make_mlp,
    "gpt": gpt.make_gpt,
    "gpt-scan": gpt_scan.make_gpt_scan,
    "llama": llama.make_llama,
    "moe": moe.make_moe,
    "unet": unet.make_unet,
    "gns": gns.make_gns,
    "flax": flax_mlp.make_flax,
    "equinox": equinox_mlp.make_equinox,
    **EXTRA_ZOO,  # written independently of the models above, one per past blind spot
}

SIZES: dict[str, tuple[str, ...]] = {
    "mlp": tuple(mlp.SIZES),
    "gpt": tuple(gpt.SIZES),
    "gpt-scan": tuple(gpt_scan.SIZES),
    "llama": tuple(llama.SIZES),
    "moe": tuple(moe.SIZES),
    "unet": tuple(unet.SIZES),
    "gns": tuple(gns.SIZES),
    "flax": tuple(flax_mlp.SIZES),
    "equinox": tuple(equinox_mlp.SIZES),
    **EXTRA_SIZES,
}

#: Scaled-down twins of shape-only sizes, to check a plan's numerics where the real size is too
#: big to run on simulated CPU devices: the same layers and heads (so the same named dims and
#: conflicts, in the same order, and a plan moves over by name), small widths divisible by 8,
#: float32 (numerics are compared at rtol 1e-4). `twin = MODEL_ZOO[m](size=s, **overrides)`.
NUMERICS_TWINS: dict[tuple[str, str], dict] = {
    ("gpt", "gpt2"): {"vocab": 512, "seq": 64, "d_model": 96, "d_ff": 384, "dtype": "float32"},
}

__all__ = ["MODEL_ZOO", "NUMERICS_TWINS", "SIZES", "Workload"]
