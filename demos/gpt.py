"""GPT decoder (nanoGPT-like) with a hand-written Adam train step.

Token + learned position embeddings, pre-LayerNorm blocks of causal multi-head attention and a
GELU MLP, a final LayerNorm and logits tied to the token embedding. Attention keeps separate
wq/wk/wv/wo [D, D] weights and reshapes to heads [B, S, H, Dh], so head-parallel sharding shows
up as splitting D into (H, Dh). Blocks are a Python list, so pytree paths read
`params.blocks[3].attn.wq`; `demos/gpt_scan.py` is the same model with stacked blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp

from demos.adam import adam_init, adam_update
from demos.workload import Init, Workload, bind, resolve_config


@dataclass(frozen=True)
class GPTConfig:
    vocab: int = 256  # V, token ids in [0, V)
    seq: int = 32  # S, context length (also the number of learned positions)
    d_model: int = 64  # D
    n_heads: int = 4  # H, head dim Dh = D // H
    n_layers: int = 2  # L
    d_ff: int = 256  # F, MLP hidden width
    batch: int = 8  # B
    lr: float = 3e-4  # Adam learning rate
    dtype: str = "float32"  # params and activations; the loss is always float32

    def __post_init__(self):
        if self.d_model % self.n_heads:
            raise ValueError(
                f"GPTConfig: d_model must be a multiple of n_heads, "
                f"got d_model={self.d_model}, n_heads={self.n_heads}"
            )


_BIG = dict(vocab=50304, seq=2048, batch=8, dtype="bfloat16")
SIZES = {
    "tiny": GPTConfig(),
    "small": GPTConfig(vocab=512, seq=64, d_model=128, n_heads=4, n_layers=4, d_ff=512),
    "gpt2": GPTConfig(**{**_BIG, "seq": 1024}, d_model=768, n_heads=12, n_layers=12, d_ff=3072),
    "gpt-1.3b": GPTConfig(**_BIG, d_model=2048, n_heads=16, n_layers=24, d_ff=8192),
    "gpt-6.7b": GPTConfig(**_BIG, d_model=4096, n_heads=32, n_layers=32, d_ff=16384),
    "gpt3-175b": GPTConfig(**_BIG, d_model=12288, n_heads=96, n_layers=96, d_ff=49152),
}
CONCRETE_SIZES = ("tiny", "small")


def init_params(init: Init, cfg: GPTConfig) -> dict:
    """GPT-2 init: N(0, 0.02), residual projections scaled by 1/sqrt(2L), LayerNorm identity."""
    D, F = cfg.d_model, cfg.d_ff
    std, resid_std = 0.02, 0.02 / (2 * cfg.n_layers) ** 0.5

    def ln():
        return {"scale": init.ones((D,)), "bias": init.zeros((D,))}

    def block():
        attn = {w: init.normal((D, D), std) for w in ("wq", "wk", "wv")}
        attn["wo"] = init.normal((D, D), resid_std)
        mlp = {
            "w_fc": init.normal((D, F), std),
            "b_fc": init.zeros((F,)),
            "w_proj": init.normal((F, D), resid_std),
            "b_proj": init.zeros((D,)),
        }
        return {"ln1": ln(), "attn": attn, "ln2": ln(), "mlp": mlp}

    return {
        "wte": init.normal((cfg.vocab, D), std),
        "wpe": init.normal((cfg.seq, D), std),
        "blocks": [block() for _ in range(cfg.n_layers)],
        "ln_f": ln(),
    }


def make_batch(init: Init, cfg) -> dict:
    """Random token batch for any decoder config: tokens, targets int32 [B, S] in [0, V)."""
    shape = (cfg.batch, cfg.seq)
    return {"tokens": init.randint(shape, cfg.vocab), "targets": init.randint(shape, cfg.vocab)}


def layer_norm(p: dict, x: jax.Array, eps: float = 1e-5) -> jax.Array:
    """LayerNorm over the last dim [.., D]."""
    mean = x.mean(-1, keepdims=True)
    var = jnp.square(x - mean).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + eps) * p["scale"] + p["bias"]


def attention(p: dict, x: jax.Array, n_heads: int) -> jax.Array:
    """Causal multi-head self-attention, [B, S, D] -> [B, S, D]."""
    B, S, D = x.shape
    q, k, v = (jnp.reshape(x @ p[w], (B, S, n_heads, D // n_heads)) for w in ("wq", "wk", "wv"))
    scores = jnp.einsum("bshd,bthd->bhst", q, k) * (D // n_heads) ** -0.5
    causal = jnp.tril(jnp.ones((S, S), bool))
    scores = jnp.where(causal, scores, jnp.finfo(scores.dtype).min)
    out = jnp.einsum("bhst,bthd->bshd", jax.nn.softmax(scores, axis=-1), v)
    return out.reshape(B, S, D) @ p["wo"]


def mlp(p: dict, x: jax.Array) -> jax.Array:
    """GELU MLP, [B, S, D] -> [B, S, F] -> [B, S, D]."""
    return jax.nn.gelu(x @ p["w_fc"] + p["b_fc"]) @ p["w_proj"] + p["b_proj"]


def block(p: dict, x: jax.Array, cfg: GPTConfig) -> jax.Array:
    """Pre-LayerNorm residual block."""
    x = x + attention(p["attn"], layer_norm(p["ln1"], x), cfg.n_heads)
    return x + mlp(p["mlp"], layer_norm(p["ln2"], x))


def embed(params: dict, tokens: jax.Array) -> jax.Array:
    """Token + position embeddings, int [B, S] -> [B, S, D]."""
    return jnp.take(params["wte"], tokens, axis=0) + params["wpe"][: tokens.shape[1]]


def unembed(params: dict, x: jax.Array) -> jax.Array:
    """Final LayerNorm then logits tied to wte, [B, S, D] -> [B, S, V]."""
    return layer_norm(params["ln_f"], x) @ params["wte"].T


def cross_entropy(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """Mean next-token negative log-likelihood, computed in float32."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return -jnp.take_along_axis(logp, targets[..., None], axis=-1).mean()


def forward(params: dict, tokens: jax.Array, *, cfg: GPTConfig) -> jax.Array:
    """Logits [B, S, V] for int tokens [B, S]."""
    x = embed(params, tokens)
    for p in params["blocks"]:
        x = block(p, x, cfg)
    return unembed(params, x)


def loss_fn(params: dict, batch: dict, *, cfg: GPTConfig) -> jax.Array:
    return cross_entropy(forward(params, batch["tokens"], cfg=cfg), batch["targets"])


def train_step(params: dict, opt_state: dict, batch: dict, *, cfg: GPTConfig):
    """One Adam step: returns (new_params, new_opt_state, loss)."""
    loss, grads = jax.value_and_grad(loss_fn)(params, batch, cfg=cfg)
    params, opt_state = adam_update(params, grads, opt_state, lr=cfg.lr)
    return params, opt_state, loss


def make_gpt(size: str = "tiny", train: bool = True, **overrides) -> Workload:
    """GPT as a Workload: `train_step(params, opt_state, batch)` or `forward(params, tokens)`."""
    cfg = resolve_config("make_gpt", SIZES, size, overrides)
    title = "GPT decoder"
    return decoder_workload("gpt", title, cfg, size, init_params, forward, train_step, train)


def decoder_workload(name, title, cfg, size, init_params, forward_fn, step_fn, train) -> Workload:
    """A token-in, loss-out decoder as a Workload; shared by gpt, gpt-scan, llama and moe.

    `init_params(init, cfg)` builds the params, concrete at CONCRETE_SIZES, else shapes only.
    """
    init = Init(abstract=size not in CONCRETE_SIZES, dtype=cfg.dtype)
    params = init_params(init, cfg)
    opt_state, batch = init.run(adam_init, params), make_batch(init, cfg)
    dims = " ".join(f"{k}={getattr(cfg, f)}" for k, f in _DIM_NAMES if hasattr(cfg, f))
    if train:
        fn, args, argnums = bind(step_fn, cfg=cfg), (params, opt_state, batch), (0, 1)
        what = "Adam train step"
    else:
        fn, args, argnums = bind(forward_fn, cfg=cfg), (params, batch["tokens"]), (0,)
        what = "forward"
    bounds = {"tokens": cfg.vocab, "targets": cfg.vocab}
    return Workload(name, f"{title}, {what}, {dims}", fn, args, argnums, cfg, bounds)


_DIM_NAMES = (
    ("L", "n_layers"),
    ("D", "d_model"),
    ("H", "n_heads"),
    ("KV", "n_kv_heads"),
    ("E", "n_experts"),
    ("S", "seq"),
    ("V", "vocab"),
)
