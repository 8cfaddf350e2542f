"""Llama-style decoder: RMSNorm, RoPE, grouped-query attention, SwiGLU, untied output head.

Differences from `demos/gpt.py` that matter for sharding: K/V have fewer heads (KV < H) and are
repeated up to H, so the head dim of q and of k/v are related by a reshape-and-broadcast; RoPE
splits the head dim Dh into halves; the SwiGLU MLP has two input projections sharing the hidden
dim F; and the output head [D, V] is its own weight.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp

from demos.adam import adam_update
from demos.gpt import cross_entropy, decoder_workload
from demos.workload import Init, Workload, resolve_config


def check_heads(cfg) -> None:
    """Heads must tile D, KV heads must tile the heads, and RoPE needs an even head dim."""
    D, H, KV = cfg.d_model, cfg.n_heads, cfg.n_kv_heads
    if D % H or H % KV or (D // H) % 2:
        raise ValueError(
            f"{type(cfg).__name__}: expected d_model % n_heads == 0, n_heads % n_kv_heads == 0 "
            f"and an even head dim, got d_model={D}, n_heads={H}, n_kv_heads={KV}"
        )


@dataclass(frozen=True)
class LlamaConfig:
    vocab: int = 256  # V
    seq: int = 32  # S
    d_model: int = 64  # D
    n_heads: int = 4  # H query heads, head dim Dh = D // H
    n_kv_heads: int = 2  # KV key/value heads; H must be a multiple of KV
    n_layers: int = 2  # L
    d_ff: int = 128  # F, SwiGLU hidden width
    batch: int = 8  # B
    rope_base: float = 10000.0  # RoPE wavelength base (Llama 3 uses 500000)
    lr: float = 3e-4  # Adam learning rate
    dtype: str = "float32"  # params and activations; the loss is always float32

    def __post_init__(self):
        check_heads(self)


_L3 = dict(vocab=128256, seq=4096, n_kv_heads=8, batch=8, rope_base=500000.0, dtype="bfloat16")
SIZES = {
    "tiny": LlamaConfig(),
    "llama3-8b": LlamaConfig(**_L3, d_model=4096, n_heads=32, n_layers=32, d_ff=14336),
    "llama3-70b": LlamaConfig(**_L3, d_model=8192, n_heads=64, n_layers=80, d_ff=28672),
}


def init_params(init: Init, cfg: LlamaConfig) -> dict:
    """N(0, 0.02) weights, unit RMSNorm scales."""
    D, F = cfg.d_model, cfg.d_ff
    kv_dim = cfg.n_kv_heads * (D // cfg.n_heads)

    def block():
        return {
            "attn_norm": init.ones((D,)),
            "attn": gqa_params(init, D, kv_dim),
            "mlp_norm": init.ones((D,)),
            "mlp": {
                "w_gate": init.normal((D, F), 0.02),
                "w_up": init.normal((D, F), 0.02),
                "w_down": init.normal((F, D), 0.02),
            },
        }

    return {
        "embed": init.normal((cfg.vocab, D), 0.02),
        "blocks": [block() for _ in range(cfg.n_layers)],
        "norm": init.ones((D,)),
        "lm_head": init.normal((D, cfg.vocab), 0.02),
    }


def gqa_params(init: Init, D: int, kv_dim: int) -> dict:
    """wq, wo [D, D]; wk, wv [D, KV * Dh]."""
    shapes = {"wq": (D, D), "wk": (D, kv_dim), "wv": (D, kv_dim), "wo": (D, D)}
    return {w: init.normal(shape, 0.02) for w, shape in shapes.items()}


def rms_norm(scale: jax.Array, x: jax.Array, eps: float = 1e-5) -> jax.Array:
    """RMSNorm over the last dim: no mean subtraction, no bias."""
    ms = jnp.mean(jnp.square(x.astype(jnp.float32)), axis=-1, keepdims=True)
    return (x * jax.lax.rsqrt(ms + eps)).astype(x.dtype) * scale


def rope(x: jax.Array, base: float) -> jax.Array:
    """Rotary position embedding on [B, S, H, Dh], rotating the two halves of Dh as pairs."""
    S, Dh = x.shape[1], x.shape[-1]
    inv_freq = base ** (-jnp.arange(0, Dh // 2, dtype=jnp.float32) / (Dh // 2))
    angle = jnp.arange(S, dtype=jnp.float32)[:, None] * inv_freq  # [S, Dh/2]
    cos, sin = (f(angle)[None, :, None, :].astype(x.dtype) for f in (jnp.cos, jnp.sin))
    x1, x2 = x[..., : Dh // 2], x[..., Dh // 2 :]
    return jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)


def attention(p: dict, x: jax.Array, cfg) -> jax.Array:
    """Causal grouped-query attention, [B, S, D] -> [B, S, D]; K/V repeated from KV to H heads."""
    B, S, D = x.shape
    H, KV = cfg.n_heads, cfg.n_kv_heads
    Dh = D // H
    q = rope((x @ p["wq"]).reshape(B, S, H, Dh), cfg.rope_base)
    k = rope((x @ p["wk"]).reshape(B, S, KV, Dh), cfg.rope_base)
    v = (x @ p["wv"]).reshape(B, S, KV, Dh)
    k, v = jnp.repeat(k, H // KV, axis=2), jnp.repeat(v, H // KV, axis=2)
    scores = jnp.einsum("bshd,bthd->bhst", q, k) * Dh**-0.5
    causal = jnp.tril(jnp.ones((S, S), bool))
    scores = jnp.where(causal, scores, jnp.finfo(scores.dtype).min)
    out = jnp.einsum("bhst,bthd->bshd", jax.nn.softmax(scores, axis=-1), v)
    return out.reshape(B, S, D) @ p["wo"]


def swiglu(p: dict, x: jax.Array) -> jax.Array:
    """silu(x @ w_gate) * (x @ w_up) @ w_down, [B, S, D] -> [B, S, D]."""
    return (jax.nn.silu(x @ p["w_gate"]) * (x @ p["w_up"])) @ p["w_down"]


def block(p: dict, x: jax.Array, cfg: LlamaConfig) -> jax.Array:
    x = x + attention(p["attn"], rms_norm(p["attn_norm"], x), cfg)
    return x + swiglu(p["mlp"], rms_norm(p["mlp_norm"], x))


def forward(params: dict, tokens: jax.Array, *, cfg: LlamaConfig) -> jax.Array:
    """Logits [B, S, V] for int tokens [B, S]; positions come from RoPE, not an embedding."""
    x = jnp.take(params["embed"], tokens, axis=0)
    for p in params["blocks"]:
        x = block(p, x, cfg)
    return rms_norm(params["norm"], x) @ params["lm_head"]


def loss_fn(params: dict, batch: dict, *, cfg: LlamaConfig) -> jax.Array:
    return cross_entropy(forward(params, batch["tokens"], cfg=cfg), batch["targets"])


def train_step(params: dict, opt_state: dict, batch: dict, *, cfg: LlamaConfig):
    """One Adam step: returns (new_params, new_opt_state, loss)."""
    loss, grads = jax.value_and_grad(loss_fn)(params, batch, cfg=cfg)
    params, opt_state = adam_update(params, grads, opt_state, lr=cfg.lr)
    return params, opt_state, loss


def make_llama(size: str = "tiny", train: bool = True, **overrides) -> Workload:
    """Llama as a Workload: `train_step(params, opt_state, batch)` or `forward(params, tokens)`."""
    cfg = resolve_config("make_llama", SIZES, size, overrides)
    title = "Llama decoder"
    return decoder_workload("llama", title, cfg, size, init_params, forward, train_step, train)
