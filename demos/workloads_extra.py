"""Seven train steps written independently of the other zoo models, each exercising one thing the
cost model once got wrong (issue 10): a decoder with fused QKV, einsum attention, tied embeddings
and a hand-written Adam; dropout from a PRNG key passed in; BatchNorm with running statistics
returned as state; gradient accumulation in a `fori_loop`; a conv net with max-pool; a ViT-like
class token made with `jnp.tile`; label smoothing.

Every factory follows the zoo's conventions (`make_x(size="tiny", train=False, **overrides)`
returns a `Workload`; the forward shares the train step's params). The default ("tiny") sizes
validate on 8 simulated CPU devices in seconds; "base" sizes are shapes only.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax import lax

from demos.workload import Init, Workload, bind, resolve_config


def _xent(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """Mean cross-entropy against a distribution over classes, in float32."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return -jnp.mean(jnp.sum(targets * logp, axis=-1))


def _sgd(params: dict, grads: dict, lr: float) -> dict:
    return jax.tree.map(lambda p, g: (p - lr * g).astype(p.dtype), params, grads)


def _make(factory, sizes, size, overrides):
    cfg = resolve_config(factory, sizes, size, overrides)
    return cfg, Init(abstract=size != "tiny", dtype=cfg.dtype)


# (a) Decoder: fused QKV, einsum attention, tied embeddings, hand-written Adam.


@dataclass(frozen=True)
class DecoderConfig:
    batch: int = 16
    seq: int = 128
    vocab: int = 512
    d_model: int = 256
    n_heads: int = 8
    n_layers: int = 2
    lr: float = 3e-4
    dtype: str = "float32"


DECODER_SIZES = {
    "tiny": DecoderConfig(),
    "base": DecoderConfig(
        batch=64, seq=1024, vocab=32768, d_model=1024, n_heads=16, n_layers=8, dtype="bfloat16"
    ),
}


def _decoder_params(init: Init, c: DecoderConfig) -> dict:
    d = c.d_model
    layer = lambda: {  # noqa: E731
        "norm1": init.ones((d,)),
        "qkv": init.normal((d, 3 * d), d**-0.5),
        "proj": init.normal((d, d), (2 * c.n_layers * d) ** -0.5),
        "norm2": init.ones((d,)),
        "up": init.normal((d, 4 * d), d**-0.5),
        "down": init.normal((4 * d, d), (2 * c.n_layers * 4 * d) ** -0.5),
    }
    return {
        "tok": init.normal((c.vocab, d), 0.02),
        "pos": init.normal((c.seq, d), 0.01),
        "layers": [layer() for _ in range(c.n_layers)],
        "norm_f": init.ones((d,)),
    }


def _rms(x: jax.Array, scale: jax.Array) -> jax.Array:
    x32 = x.astype(jnp.float32)
    return (x32 * lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + 1e-6)).astype(x.dtype) * scale


def decoder_logits(params: dict, tokens: jax.Array, *, n_heads: int) -> jax.Array:
    """[B, S] int ids -> [B, S, V] logits; the output head is the token table (tied)."""
    b, s = tokens.shape
    h = params["tok"][tokens] + params["pos"][None, :s]
    d = h.shape[-1]
    causal = jnp.tril(jnp.ones((s, s), bool))
    for lyr in params["layers"]:
        qkv = (_rms(h, lyr["norm1"]) @ lyr["qkv"]).reshape(b, s, 3, n_heads, d // n_heads)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        att = jnp.einsum("bqhe,bkhe->bhqk", q, k) * (d // n_heads) ** -0.5
        att = jax.nn.softmax(jnp.where(causal, att, -1e9).astype(jnp.float32), -1).astype(h.dtype)
        h = h + jnp.einsum("bhqk,bkhe->bqhe", att, v).reshape(b, s, d) @ lyr["proj"]
        h = h + jax.nn.gelu(_rms(h, lyr["norm2"]) @ lyr["up"]) @ lyr["down"]
    return _rms(h, params["norm_f"]) @ params["tok"].T


def _adam(params, grads, state, lr, b1=0.9, b2=0.999, eps=1e-8):
    """Adam written out: moments in float32, bias correction from an int32 step counter."""
    t = state["t"] + 1
    m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g.astype(jnp.float32), state["m"], grads)
    v = jax.tree.map(
        lambda v, g: b2 * v + (1 - b2) * jnp.square(g.astype(jnp.float32)), state["v"], grads
    )
    tf = t.astype(jnp.float32)
    c1, c2 = 1 - b1**tf, 1 - b2**tf

    def upd(p, m, v):
        return (p - lr * (m / c1) / (jnp.sqrt(v / c2) + eps)).astype(p.dtype)

    return jax.tree.map(upd, params, m, v), {"m": m, "v": v, "t": t}


def decoder_step(params, opt, batch, *, n_heads: int, lr: float):
    """Next-token loss on `tokens` (targets are the tokens shifted by one), then Adam."""

    def loss_fn(p):
        logits = decoder_logits(p, batch["tokens"][:, :-1], n_heads=n_heads)
        onehot = jax.nn.one_hot(batch["tokens"][:, 1:], logits.shape[-1], dtype=jnp.float32)
        return _xent(logits, onehot)

    loss, grads = jax.value_and_grad(loss_fn)(params)
    params, opt = _adam(params, grads, opt, lr)
    return params, opt, loss


def make_decoder(size: str = "tiny", train: bool = False, **overrides) -> Workload:
    c, init = _make("make_decoder", DECODER_SIZES, size, overrides)
    if c.d_model % c.n_heads:
        raise ValueError(f"make_decoder: d_model must divide by n_heads, got n_heads={c.n_heads}")
    params = _decoder_params(init, c)
    tokens = init.randint((c.batch, c.seq + 1), c.vocab)
    if not train:
        fwd = bind(decoder_logits, n_heads=c.n_heads)
        return Workload(
            "decoder",
            "independent decoder, forward",
            fwd,
            (params, tokens[:, :-1]),
            (0,),
            c,
            {"tokens": c.vocab},
        )
    f32 = Init(abstract=init.abstract, dtype="float32")
    moments = lambda: jax.tree.map(lambda x: f32.zeros(x.shape), params)  # noqa: E731
    opt = {"m": moments(), "v": moments(), "t": f32.zeros((), jnp.int32)}
    fn = bind(decoder_step, n_heads=c.n_heads, lr=c.lr)
    desc = (
        f"independent decoder (fused QKV, tied embeddings, hand Adam), L={c.n_layers} "
        f"D={c.d_model} H={c.n_heads} S={c.seq} B={c.batch}"
    )
    return Workload(
        "decoder", desc, fn, (params, opt, {"tokens": tokens}), (0, 1), c, {"tokens": c.vocab}
    )


# (b) Dropout with the PRNG key passed in; (g) label smoothing. Both on an MLP classifier.


@dataclass(frozen=True)
class ClassifierConfig:
    batch: int = 32
    d_in: int = 64
    hidden: int = 256
    classes: int = 16
    rate: float = 0.1  # dropout rate, or label-smoothing epsilon
    lr: float = 1e-2
    dtype: str = "float32"


CLASSIFIER_SIZES = {
    "tiny": ClassifierConfig(),
    "base": ClassifierConfig(batch=4096, d_in=4096, hidden=16384, classes=1024, dtype="bfloat16"),
}


def _classifier_params(init: Init, c: ClassifierConfig) -> dict:
    return {
        "w1": init.normal((c.d_in, c.hidden), c.d_in**-0.5),
        "b1": init.zeros((c.hidden,)),
        "w2": init.normal((c.hidden, c.hidden), c.hidden**-0.5),
        "w3": init.normal((c.hidden, c.classes), c.hidden**-0.5),
    }


def dropout_logits(params: dict, x: jax.Array, key_data: jax.Array, *, rate: float) -> jax.Array:
    """MLP with inverted dropout after each hidden layer; `key_data` is a raw uint32[2] key,
    wrapped into a typed key here and split per layer (random_wrap, random_split, random_bits)."""
    keys = jax.random.split(jax.random.wrap_key_data(key_data), 2)
    h = jax.nn.relu(x @ params["w1"] + params["b1"])
    for key, w in zip(keys, (params["w2"], None)):
        keep = jax.random.bernoulli(key, 1.0 - rate, h.shape)
        h = jnp.where(keep, h / (1.0 - rate), 0).astype(h.dtype)
        if w is not None:
            h = jax.nn.relu(h @ w)
    return h @ params["w3"]


def dropout_step(params, batch, key_data, *, rate: float, lr: float):
    def loss_fn(p):
        logits = dropout_logits(p, batch["x"], key_data, rate=rate)
        return _xent(logits, jax.nn.one_hot(batch["label"], logits.shape[-1]))

    loss, grads = jax.value_and_grad(loss_fn)(params)
    return _sgd(params, grads, lr), loss


def _classifier_batch(init: Init, c: ClassifierConfig) -> dict:
    return {"x": init.normal((c.batch, c.d_in)), "label": init.randint((c.batch,), c.classes)}


def make_dropout(size: str = "tiny", train: bool = False, **overrides) -> Workload:
    c, init = _make("make_dropout", CLASSIFIER_SIZES, size, overrides)
    params, batch = _classifier_params(init, c), _classifier_batch(init, c)
    key = (
        init.randint((2,), 2**31 - 1).astype(jnp.uint32)
        if not init.abstract
        else (jax.ShapeDtypeStruct((2,), jnp.uint32))
    )
    if not train:
        fwd = bind(dropout_logits, rate=c.rate)
        return Workload(
            "dropout", "MLP with dropout, forward", fwd, (params, batch["x"], key), (0,), c
        )
    fn = bind(dropout_step, rate=c.rate, lr=c.lr)
    desc = f"MLP classifier with dropout (PRNG key passed in), B={c.batch} F={c.hidden}"
    return Workload("dropout", desc, fn, (params, batch, key), (0,), c, {"label": c.classes})


def smooth_logits(params: dict, x: jax.Array) -> jax.Array:
    h = jax.nn.relu(x @ params["w1"] + params["b1"])
    return jax.nn.relu(h @ params["w2"]) @ params["w3"]


def smooth_step(params, mom, batch, *, eps: float, lr: float):
    """Cross-entropy against (1 - eps) one-hot + eps / classes, then SGD with momentum."""

    def loss_fn(p):
        logits = smooth_logits(p, batch["x"])
        n = logits.shape[-1]
        target = jax.nn.one_hot(batch["label"], n) * (1.0 - eps) + eps / n
        return _xent(logits, target)

    loss, grads = jax.value_and_grad(loss_fn)(params)
    mom = jax.tree.map(lambda m, g: 0.9 * m + g, mom, grads)
    return _sgd(params, mom, lr), mom, loss


def make_label_smoothing(size: str = "tiny", train: bool = False, **overrides) -> Workload:
    c, init = _make("make_label_smoothing", CLASSIFIER_SIZES, size, overrides)
    params, batch = _classifier_params(init, c), _classifier_batch(init, c)
    if not train:
        return Workload(
            "label-smoothing",
            "MLP classifier, forward",
            smooth_logits,
            (params, batch["x"]),
            (0,),
            c,
        )
    mom = jax.tree.map(lambda x: init.zeros(x.shape), params)
    fn = bind(smooth_step, eps=c.rate, lr=c.lr)
    desc = f"MLP classifier, label smoothing eps={c.rate}, momentum SGD, B={c.batch}"
    return Workload(
        "label-smoothing", desc, fn, (params, mom, batch), (0, 1), c, {"label": c.classes}
    )


# (c) BatchNorm with running statistics, updated and returned.


def bn_logits(params, stats, x, *, train: bool, momentum: float = 0.9):
    """Linear -> BatchNorm -> relu -> linear. Training normalizes by the batch statistics and
    returns the running ones updated; inference uses the running ones."""
    z = x @ params["w1"]
    if train:
        mean, var = jnp.mean(z, 0), jnp.var(z, 0)
        stats = {
            "mean": momentum * stats["mean"] + (1 - momentum) * mean,
            "var": momentum * stats["var"] + (1 - momentum) * var,
        }
    else:
        mean, var = stats["mean"], stats["var"]
    z = (z - mean) * lax.rsqrt(var + 1e-5) * params["gamma"] + params["beta"]
    return jax.nn.relu(z) @ params["w2"], stats


def bn_forward(params, stats, x):
    return bn_logits(params, stats, x, train=False)[0]


def bn_step(params, stats, batch, *, lr: float):
    def loss_fn(p):
        logits, new_stats = bn_logits(p, stats, batch["x"], train=True)
        return _xent(logits, jax.nn.one_hot(batch["label"], logits.shape[-1])), new_stats

    (loss, new_stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    new_stats = jax.tree.map(lax.stop_gradient, new_stats)
    return _sgd(params, grads, lr), new_stats, loss


def make_batchnorm(size: str = "tiny", train: bool = False, **overrides) -> Workload:
    c, init = _make("make_batchnorm", CLASSIFIER_SIZES, size, overrides)
    params = {
        "w1": init.normal((c.d_in, c.hidden), c.d_in**-0.5),
        "gamma": init.ones((c.hidden,)),
        "beta": init.zeros((c.hidden,)),
        "w2": init.normal((c.hidden, c.classes), c.hidden**-0.5),
    }
    stats = {"mean": init.zeros((c.hidden,)), "var": init.ones((c.hidden,))}
    batch = _classifier_batch(init, c)
    if not train:
        return Workload(
            "batchnorm",
            "BatchNorm MLP, inference",
            bn_forward,
            (params, stats, batch["x"]),
            (0,),
            c,
        )
    desc = f"MLP with BatchNorm (running statistics returned as state), B={c.batch}"
    return Workload(
        "batchnorm",
        desc,
        bind(bn_step, lr=c.lr),
        (params, stats, batch),
        (0, 1),
        c,
        {"label": c.classes},
    )


# (d) Gradient accumulation in a fori_loop.


@dataclass(frozen=True)
class AccumConfig:
    micro: int = 4  # microbatches per step
    batch: int = 16  # rows per microbatch
    d_in: int = 64
    hidden: int = 256
    d_out: int = 32
    lr: float = 1e-2
    dtype: str = "float32"


ACCUM_SIZES = {
    "tiny": AccumConfig(),
    "base": AccumConfig(micro=8, batch=512, d_in=4096, hidden=16384, d_out=4096, dtype="bfloat16"),
}


def accum_forward(params: dict, x: jax.Array) -> jax.Array:
    return jnp.tanh(x @ params["w1"]) @ params["w2"]


def accum_step(params, batch, *, lr: float):
    """Mean squared error gradients summed over microbatches in a `fori_loop`, one SGD step."""
    micro = batch["x"].shape[0]

    def loss_fn(p, x, y):
        return jnp.mean(jnp.square(accum_forward(p, x).astype(jnp.float32) - y))

    def body(i, carry):
        gsum, lsum = carry
        x = lax.dynamic_index_in_dim(batch["x"], i, keepdims=False)
        y = lax.dynamic_index_in_dim(batch["y"], i, keepdims=False)
        loss, g = jax.value_and_grad(loss_fn)(params, x, y)
        return jax.tree.map(jnp.add, gsum, g), lsum + loss

    zeros = jax.tree.map(jnp.zeros_like, params)
    gsum, lsum = lax.fori_loop(0, micro, body, (zeros, jnp.zeros((), jnp.float32)))
    grads = jax.tree.map(lambda g: g / micro, gsum)
    return _sgd(params, grads, lr), lsum / micro


def make_grad_accum(size: str = "tiny", train: bool = False, **overrides) -> Workload:
    c, init = _make("make_grad_accum", ACCUM_SIZES, size, overrides)
    params = {
        "w1": init.normal((c.d_in, c.hidden), c.d_in**-0.5),
        "w2": init.normal((c.hidden, c.d_out), c.hidden**-0.5),
    }
    batch = {
        "x": init.normal((c.micro, c.batch, c.d_in)),
        "y": init.normal((c.micro, c.batch, c.d_out)),
    }
    if not train:
        return Workload(
            "grad-accum", "tanh MLP, forward", accum_forward, (params, batch["x"][0]), (0,), c
        )
    desc = f"MLP, gradients accumulated over {c.micro} microbatches in a fori_loop, B={c.batch}"
    return Workload("grad-accum", desc, bind(accum_step, lr=c.lr), (params, batch), (0,), c)


# (e) A small conv net with max-pool; (f) a ViT-like class token via jnp.tile.


@dataclass(frozen=True)
class ImageConfig:
    batch: int = 16
    image: int = 16  # height = width
    channels: int = 3
    width: int = 32  # conv channels / ViT model width
    patch: int = 4  # ViT patch side
    n_heads: int = 4
    classes: int = 10
    lr: float = 1e-2
    dtype: str = "float32"


IMAGE_SIZES = {
    "tiny": ImageConfig(),
    "base": ImageConfig(
        batch=256, image=224, width=256, patch=16, n_heads=8, classes=1000, dtype="bfloat16"
    ),
}


def _conv(x: jax.Array, w: jax.Array) -> jax.Array:
    return lax.conv_general_dilated(
        x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
    )


def _maxpool(x: jax.Array) -> jax.Array:
    """2x2 max-pool, stride 2 (reduce_window; its gradient is select_and_scatter_add)."""
    return lax.reduce_window(x, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")


def convnet_logits(params: dict, images: jax.Array) -> jax.Array:
    h = _maxpool(jax.nn.relu(_conv(images, params["c1"])))
    h = _maxpool(jax.nn.relu(_conv(h, params["c2"])))
    return h.reshape(h.shape[0], -1) @ params["head"]


def image_step(params, batch, *, logits_fn, lr: float):
    """Cross-entropy on `logits_fn(params, images)`, one SGD step."""

    def loss_fn(p):
        logits = logits_fn(p, batch["images"])
        return _xent(logits, jax.nn.one_hot(batch["label"], logits.shape[-1]))

    loss, grads = jax.value_and_grad(loss_fn)(params)
    return _sgd(params, grads, lr), loss


def _image_batch(init: Init, c: ImageConfig) -> dict:
    return {
        "images": init.normal((c.batch, c.image, c.image, c.channels)),
        "label": init.randint((c.batch,), c.classes),
    }


def make_convnet(size: str = "tiny", train: bool = False, **overrides) -> Workload:
    c, init = _make("make_convnet", IMAGE_SIZES, size, overrides)
    w = c.width
    flat = (c.image // 4) ** 2 * 2 * w
    params = {
        "c1": init.normal((3, 3, c.channels, w), (9 * c.channels) ** -0.5),
        "c2": init.normal((3, 3, w, 2 * w), (9 * w) ** -0.5),
        "head": init.normal((flat, c.classes), flat**-0.5),
    }
    batch = _image_batch(init, c)
    if not train:
        return Workload(
            "convnet", "conv net, forward", convnet_logits, (params, batch["images"]), (0,), c
        )
    desc = f"2 conv + 2x2 max-pool + linear, SGD, B={c.batch} {c.image}x{c.image}"
    return Workload(
        "convnet",
        desc,
        bind(image_step, logits_fn=convnet_logits, lr=c.lr),
        (params, batch),
        (0,),
        c,
        {"label": c.classes},
    )


def vit_logits(params: dict, images: jax.Array, *, patch: int, n_heads: int) -> jax.Array:
    """Patches -> linear embed; a learned class token tiled over the batch and prepended; one
    pre-norm attention + MLP block; the class token's output is classified."""
    b, hw, _, ch = images.shape
    p = patch
    n = (hw // p) ** 2
    patches = images.reshape(b, hw // p, p, hw // p, p, ch).transpose(0, 1, 3, 2, 4, 5)
    x = patches.reshape(b, n, p * p * ch) @ params["embed"]
    cls = jnp.tile(params["cls"], (b, 1, 1))
    x = jnp.concatenate([cls, x], axis=1) + params["pos"]
    heads = n_heads
    d = x.shape[-1]

    def ln(y):
        mu = jnp.mean(y, -1, keepdims=True)
        return (y - mu) * lax.rsqrt(jnp.var(y, -1, keepdims=True) + 1e-6)

    q, k, v = ((ln(x) @ params[w]).reshape(b, n + 1, heads, d // heads) for w in ("wq", "wk", "wv"))
    att = jax.nn.softmax(jnp.einsum("bqhe,bkhe->bhqk", q, k) * (d // heads) ** -0.5, -1)
    x = x + jnp.einsum("bhqk,bkhe->bqhe", att, v).reshape(b, n + 1, d) @ params["wo"]
    x = x + jax.nn.gelu(ln(x) @ params["up"]) @ params["down"]
    return ln(x[:, 0]) @ params["head"]


def make_vit(size: str = "tiny", train: bool = False, **overrides) -> Workload:
    c, init = _make("make_vit", IMAGE_SIZES, size, overrides)
    if c.image % c.patch or c.width % c.n_heads:
        raise ValueError(
            f"make_vit: patch must divide image and n_heads width, got patch="
            f"{c.patch} n_heads={c.n_heads}"
        )
    d, pdim, n = c.width, c.patch * c.patch * c.channels, (c.image // c.patch) ** 2
    params = {
        "embed": init.normal((pdim, d), pdim**-0.5),
        "cls": init.normal((1, 1, d), 0.02),
        "pos": init.normal((n + 1, d), 0.02),
        **{w: init.normal((d, d), d**-0.5) for w in ("wq", "wk", "wv", "wo")},
        "up": init.normal((d, 4 * d), d**-0.5),
        "down": init.normal((4 * d, d), (4 * d) ** -0.5),
        "head": init.normal((d, c.classes), d**-0.5),
    }
    batch = _image_batch(init, c)
    logits = bind(vit_logits, patch=c.patch, n_heads=c.n_heads)
    if not train:
        return Workload("vit", "ViT block, forward", logits, (params, batch["images"]), (0,), c)
    desc = f"ViT-like: class token via jnp.tile, 1 block, D={d} patches={n}, SGD, B={c.batch}"
    return Workload(
        "vit",
        desc,
        bind(image_step, logits_fn=logits, lr=c.lr),
        (params, batch),
        (0,),
        c,
        {"label": c.classes},
    )


EXTRA_ZOO = {
    "decoder": make_decoder,
    "dropout": make_dropout,
    "batchnorm": make_batchnorm,
    "grad-accum": make_grad_accum,
    "convnet": make_convnet,
    "vit": make_vit,
    "label-smoothing": make_label_smoothing,
}

EXTRA_SIZES = {
    "decoder": tuple(DECODER_SIZES),
    "dropout": tuple(CLASSIFIER_SIZES),
    "batchnorm": tuple(CLASSIFIER_SIZES),
    "grad-accum": tuple(ACCUM_SIZES),
    "convnet": tuple(IMAGE_SIZES),
    "vit": tuple(IMAGE_SIZES),
    "label-smoothing": tuple(CLASSIFIER_SIZES),
}
