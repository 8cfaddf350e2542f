"""Small U-Net denoiser: convolutions, down/up sampling and skip connections, NHWC.

Brings `conv_general_dilated` into the zoo, whose spatial dims H, W are related across the
network by 2x pooling (a reshape splitting H into [H/2, 2] then a mean) and 2x upsampling (a
broadcast then a reshape merging [H, 2]), and whose channel dims meet at the skip concatenates.
Trained to predict the noise added to an image (DDPM-style epsilon loss) with Adam.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp

from demos.adam import adam_init, adam_update
from demos.workload import Init, Workload, bind, resolve_config


@dataclass(frozen=True)
class UNetConfig:
    batch: int = 8  # B
    image: int = 32  # H = W; must be divisible by 2**(len(channels) - 1)
    in_channels: int = 3  # image channels
    channels: tuple[int, ...] = (16, 32, 64)  # conv width per resolution level, top to bottom
    noise_std: float = 0.5  # sigma of the Gaussian noise added to the clean images
    lr: float = 1e-3  # Adam learning rate
    dtype: str = "float32"


SIZES = {
    "tiny": UNetConfig(),
    "large": UNetConfig(batch=64, image=256, channels=(128, 256, 512, 1024), dtype="bfloat16"),
}


def init_params(init: Init, cfg: UNetConfig) -> dict:
    """Two 3x3 convs per level on the way down, the bottom, and on the way up; He init."""

    def conv(c_in, c_out, size=3):
        std = (2 / (size * size * c_in)) ** 0.5
        return {"w": init.normal((size, size, c_in, c_out), std), "b": init.zeros((c_out,))}

    def double(c_in, c_out):
        return {"conv1": conv(c_in, c_out), "conv2": conv(c_out, c_out)}

    chans = cfg.channels
    ins = (cfg.in_channels,) + chans[:-2]
    return {
        "down": [double(i, o) for i, o in zip(ins, chans[:-1])],
        "mid": double(chans[-2], chans[-1]),
        # Each up level sees the upsampled deeper features concatenated with the skip.
        "up": [double(deep + skip, skip) for deep, skip in zip(chans[:0:-1], chans[-2::-1])],
        "out": conv(chans[0], cfg.in_channels, size=1),
    }


def make_batch(init: Init, cfg: UNetConfig) -> dict:
    """Clean images in [0, 1) and the unit noise to add, both [B, H, W, C]."""
    shape = (cfg.batch, cfg.image, cfg.image, cfg.in_channels)
    return {"images": init.uniform(shape), "noise": init.normal(shape)}


def conv(p: dict, x: jax.Array) -> jax.Array:
    """'SAME' convolution plus bias, [B, H, W, Ci] -> [B, H, W, Co]."""
    y = jax.lax.conv_general_dilated(
        x, p["w"], window_strides=(1, 1), padding="SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
    )
    return y + p["b"]


def double_conv(p: dict, x: jax.Array) -> jax.Array:
    return jax.nn.relu(conv(p["conv2"], jax.nn.relu(conv(p["conv1"], x))))


def downsample(x: jax.Array) -> jax.Array:
    """2x2 average pool via reshape + mean, [B, H, W, C] -> [B, H/2, W/2, C]."""
    B, H, W, C = x.shape
    return x.reshape(B, H // 2, 2, W // 2, 2, C).mean((2, 4))


def upsample(x: jax.Array) -> jax.Array:
    """Nearest-neighbour 2x via broadcast + reshape, [B, H, W, C] -> [B, 2H, 2W, C]."""
    B, H, W, C = x.shape
    return jnp.broadcast_to(x[:, :, None, :, None], (B, H, 2, W, 2, C)).reshape(B, 2 * H, 2 * W, C)


def forward(params: dict, x: jax.Array) -> jax.Array:
    """Predicted noise [B, H, W, C] for noisy images [B, H, W, C]."""
    skips = []
    for p in params["down"]:
        x = double_conv(p, x)
        skips.append(x)
        x = downsample(x)
    x = double_conv(params["mid"], x)
    for p, skip in zip(params["up"], reversed(skips)):
        x = double_conv(p, jnp.concatenate([upsample(x), skip], axis=-1))
    return conv(params["out"], x)


def loss_fn(params: dict, batch: dict, *, noise_std: float) -> jax.Array:
    """MSE between the predicted and the true noise (epsilon objective)."""
    noisy = batch["images"] + noise_std * batch["noise"]
    err = forward(params, noisy).astype(jnp.float32) - batch["noise"]
    return jnp.mean(err**2)


def train_step(params: dict, opt_state: dict, batch: dict, *, cfg: UNetConfig):
    """One Adam step: returns (new_params, new_opt_state, loss)."""
    loss, grads = jax.value_and_grad(loss_fn)(params, batch, noise_std=cfg.noise_std)
    params, opt_state = adam_update(params, grads, opt_state, lr=cfg.lr)
    return params, opt_state, loss


def make_unet(size: str = "tiny", train: bool = True, **overrides) -> Workload:
    """U-Net as a Workload: `train_step(params, opt_state, batch)` or `forward(params, images)`."""
    cfg = resolve_config("make_unet", SIZES, size, overrides)
    if cfg.image % 2 ** (len(cfg.channels) - 1):
        raise ValueError(f"make_unet: image must divide by 2**(levels-1), got image={cfg.image}")
    init = Init(abstract=size != "tiny", dtype=cfg.dtype)
    params = init_params(init, cfg)
    opt_state, batch = init.run(adam_init, params), make_batch(init, cfg)
    dims = f"B={cfg.batch} {cfg.image}x{cfg.image}x{cfg.in_channels} channels={cfg.channels}"
    if train:
        fn, args = bind(train_step, cfg=cfg), (params, opt_state, batch)
        return Workload("unet", f"U-Net denoiser, Adam train step, {dims}", fn, args, (0, 1), cfg)
    args = (params, batch["images"])
    return Workload("unet", f"U-Net denoiser, forward, {dims}", forward, args, (0,), cfg)
