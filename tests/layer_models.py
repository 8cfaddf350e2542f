"""Small causal-LM train steps written in five styles, for the repeated-layer grouping tests.

Each builder returns `(fn, args)` for one Adam train step `(params, opt_state, batch) ->
(params, opt_state, loss)` of a pre-norm transformer with `n_layers` blocks. The blocks are the
same computation in every style; what differs is how the layers and their parameters are named:

* `flax_linen`: auto-named submodules (`Block_0`, `Block_1`, ...) or explicit names that share
  no index pattern (`name="first"`, `name="second"`...);
* `flax_nnx`: an `nnx.List` of blocks, split into a state pytree;
* `equinox`: a list of `eqx.Module` blocks (parameters are pytree attributes);
* `plain_dict`: hand-written pure functions over `{"layer0": {...}, "layer1": {...}}`
  (Haiku-style: the layer function takes its params dict explicitly).

Shapes are tiny and abstract (`jax.ShapeDtypeStruct`): the tests only trace and analyze.
"""

from __future__ import annotations

import equinox as eqx
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import nnx

VOCAB, SEQ, D, HEADS, BATCH = 64, 16, 32, 4, 8
_EXPLICIT = ("first", "second", "third", "fourth", "fifth", "sixth")


def _attend(q, k, v):
    """Causal attention of [B, S, H, Dh] heads."""
    scores = jnp.einsum("bshd,bthd->bhst", q, k) / jnp.sqrt(q.shape[-1])
    mask = jnp.tril(jnp.ones((q.shape[1], q.shape[1]), dtype=bool))
    probs = jax.nn.softmax(jnp.where(mask, scores, -1e9), axis=-1)
    return jnp.einsum("bhst,bthd->bshd", probs, v)


def _loss(logits, tokens):
    return optax.softmax_cross_entropy_with_integer_labels(logits[:, :-1], tokens[:, 1:]).mean()


def _abstract(tree):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)


def _batch():
    return {"tokens": jax.ShapeDtypeStruct((BATCH, SEQ), jnp.int32)}


def _adam_step(loss_of_params, params):
    tx = optax.adam(1e-3)

    def step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_of_params)(params, batch["tokens"])
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    params = _abstract(params)
    return step, (params, jax.eval_shape(tx.init, params), _batch())


# -- Flax linen -----------------------------------------------------------------------------------


class _LinenBlock(nn.Module):
    @nn.compact
    def __call__(self, x):
        b, s, _ = x.shape
        h = nn.LayerNorm()(x)
        q, k, v = (nn.Dense(D)(h).reshape(b, s, HEADS, D // HEADS) for _ in range(3))
        x = x + nn.Dense(D)(_attend(q, k, v).reshape(b, s, D))
        h = nn.gelu(nn.Dense(4 * D)(nn.LayerNorm()(x)))
        return x + nn.Dense(D)(h)


class _LinenLM(nn.Module):
    n_layers: int
    explicit_names: bool = False

    @nn.compact
    def __call__(self, tokens):
        x = nn.Embed(VOCAB, D)(tokens)
        for i in range(self.n_layers):
            x = _LinenBlock(name=_EXPLICIT[i] if self.explicit_names else None)(x)
        return nn.Dense(VOCAB)(nn.LayerNorm()(x))


def flax_linen(n_layers: int, explicit_names: bool = False):
    model = _LinenLM(n_layers, explicit_names)
    params = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((BATCH, SEQ), jnp.int32))
    return _adam_step(lambda p, t: _loss(model.apply(p, t), t), params)


# -- Flax NNX -------------------------------------------------------------------------------------


class _NnxBlock(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.ln1, self.ln2 = nnx.LayerNorm(D, rngs=rngs), nnx.LayerNorm(D, rngs=rngs)
        self.wq, self.wk, self.wv, self.wo = (nnx.Linear(D, D, rngs=rngs) for _ in range(4))
        self.up, self.down = nnx.Linear(D, 4 * D, rngs=rngs), nnx.Linear(4 * D, D, rngs=rngs)

    def __call__(self, x):
        b, s, _ = x.shape
        h = self.ln1(x)
        q, k, v = (w(h).reshape(b, s, HEADS, D // HEADS) for w in (self.wq, self.wk, self.wv))
        x = x + self.wo(_attend(q, k, v).reshape(b, s, D))
        return x + self.down(nnx.gelu(self.up(self.ln2(x))))


class _NnxLM(nnx.Module):
    def __init__(self, n_layers: int, rngs: nnx.Rngs):
        self.embed = nnx.Embed(VOCAB, D, rngs=rngs)
        self.blocks = nnx.List([_NnxBlock(rngs) for _ in range(n_layers)])
        self.ln = nnx.LayerNorm(D, rngs=rngs)
        self.head = nnx.Linear(D, VOCAB, rngs=rngs)

    def __call__(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def flax_nnx(n_layers: int):
    graphdef, params = nnx.split(_NnxLM(n_layers, nnx.Rngs(0)))
    return _adam_step(lambda p, t: _loss(nnx.merge(graphdef, p)(t), t), params)


# -- Equinox --------------------------------------------------------------------------------------


class _EqxBlock(eqx.Module):
    ln1: eqx.nn.LayerNorm
    ln2: eqx.nn.LayerNorm
    qkv: tuple
    wo: eqx.nn.Linear
    up: eqx.nn.Linear
    down: eqx.nn.Linear

    def __init__(self, key):
        ks = jax.random.split(key, 6)
        self.ln1, self.ln2 = eqx.nn.LayerNorm(D), eqx.nn.LayerNorm(D)
        self.qkv = tuple(eqx.nn.Linear(D, D, key=k) for k in ks[:3])
        self.wo = eqx.nn.Linear(D, D, key=ks[3])
        self.up, self.down = eqx.nn.Linear(D, 4 * D, key=ks[4]), eqx.nn.Linear(4 * D, D, key=ks[5])

    def __call__(self, x):  # x: [S, D], one sequence (vmapped over the batch)
        s = x.shape[0]
        h = jax.vmap(self.ln1)(x)
        q, k, v = (jax.vmap(w)(h).reshape(1, s, HEADS, D // HEADS) for w in self.qkv)
        x = x + jax.vmap(self.wo)(_attend(q, k, v).reshape(s, D))
        return x + jax.vmap(self.down)(jax.nn.gelu(jax.vmap(self.up)(jax.vmap(self.ln2)(x))))


class _EqxLM(eqx.Module):
    embed: eqx.nn.Embedding
    blocks: list
    ln: eqx.nn.LayerNorm
    head: eqx.nn.Linear

    def __init__(self, n_layers: int, key):
        ks = jax.random.split(key, n_layers + 2)
        self.embed = eqx.nn.Embedding(VOCAB, D, key=ks[0])
        self.blocks = [_EqxBlock(k) for k in ks[2:]]
        self.ln = eqx.nn.LayerNorm(D)
        self.head = eqx.nn.Linear(D, VOCAB, key=ks[1])

    def __call__(self, tokens):  # tokens: [S]
        x = jax.vmap(self.embed)(tokens)
        for block in self.blocks:
            x = block(x)
        return jax.vmap(self.head)(jax.vmap(self.ln)(x))


def equinox(n_layers: int):
    params = eqx.filter_eval_shape(_EqxLM, n_layers, jax.random.key(0))
    return _adam_step(lambda p, t: _loss(jax.vmap(p)(t), t), params)


# -- plain dicts, Haiku-style pure functions --------------------------------------------------------


def _dense_init(n_in, n_out):
    return {"w": jax.ShapeDtypeStruct((n_in, n_out), jnp.float32)}


def _norm(p, x):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) * jax.lax.rsqrt(var + 1e-5) * p["scale"]


def _plain_block(p, x):
    b, s, _ = x.shape
    h = _norm(p["ln1"], x)
    q, k, v = ((h @ p[n]["w"]).reshape(b, s, HEADS, D // HEADS) for n in ("q", "k", "v"))
    x = x + _attend(q, k, v).reshape(b, s, D) @ p["o"]["w"]
    return x + jax.nn.gelu(_norm(p["ln2"], x) @ p["up"]["w"]) @ p["down"]["w"]


def plain_dict(n_layers: int):
    scale = {"scale": jax.ShapeDtypeStruct((D,), jnp.float32)}
    block = {n: _dense_init(D, D) for n in ("q", "k", "v", "o")}
    block.update(up=_dense_init(D, 4 * D), down=_dense_init(4 * D, D), ln1=scale, ln2=scale)
    params = {f"layer{i}": block for i in range(n_layers)}
    params.update(embed=jax.ShapeDtypeStruct((VOCAB, D), jnp.float32), ln=scale)
    params.update(head=_dense_init(D, VOCAB))

    def forward(p, tokens):
        x = p["embed"][tokens]
        for i in range(n_layers):
            x = _plain_block(p[f"layer{i}"], x)
        return _norm(p["ln"], x) @ p["head"]["w"]

    tx = optax.adam(1e-3)
    opt_state = jax.eval_shape(tx.init, params)

    def step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(lambda p, t: _loss(forward(p, t), t))(
            params, batch["tokens"]
        )
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return step, (params, opt_state, _batch())


STYLES = {
    "flax_linen": flax_linen,
    "flax_linen_explicit": lambda n: flax_linen(n, explicit_names=True),
    "flax_nnx": flax_nnx,
    "equinox": equinox,
    "plain_dict": plain_dict,
}
