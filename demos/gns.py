"""Graph network simulator (encode-process-decode, Sanchez-Gonzalez et al. 2020).

The zoo's gather/scatter program: each message-passing step gathers node latents at the edges'
senders and receivers (`nodes[senders]`) and sums the updated edge latents back into their
receivers (`jax.ops.segment_sum`, a scatter-add). Sharding the node dim N or the edge dim E
therefore has to agree with data-dependent indices, unlike the dense models.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp

from demos.adam import adam_init, adam_update
from demos.workload import Init, Workload, bind, resolve_config


@dataclass(frozen=True)
class GNSConfig:
    n_nodes: int = 64  # N (a batch of graphs is just a bigger disjoint graph)
    n_edges: int = 256  # E
    node_features: int = 16  # Fn, input node features (e.g. velocity history)
    edge_features: int = 8  # Fe, input edge features (e.g. relative displacement)
    latent: int = 64  # L, width of every latent and MLP hidden layer
    n_steps: int = 2  # K message-passing steps, each with its own weights
    out_features: int = 8  # per-node prediction (e.g. acceleration), padded to shard
    lr: float = 1e-3  # Adam learning rate
    dtype: str = "float32"


SIZES = {
    "tiny": GNSConfig(),
    "large": GNSConfig(n_nodes=65536, n_edges=1 << 20, latent=128, n_steps=10, dtype="bfloat16"),
}


def init_params(init: Init, cfg: GNSConfig) -> dict:
    """Two-layer MLPs everywhere (the paper uses LayerNorm too; omitted for brevity)."""
    L = cfg.latent

    def mlp(d_in, d_out):
        def dense(i, o):
            return {"w": init.normal((i, o), i**-0.5), "b": init.zeros((o,))}

        return [dense(d_in, L), dense(L, d_out)]

    return {
        "node_enc": mlp(cfg.node_features, L),
        "edge_enc": mlp(cfg.edge_features, L),
        "steps": [{"edge": mlp(3 * L, L), "node": mlp(2 * L, L)} for _ in range(cfg.n_steps)],
        "dec": mlp(L, cfg.out_features),
    }


def make_batch(init: Init, cfg: GNSConfig) -> dict:
    """A random graph: features, int32 [E] endpoints, and per-node regression targets."""
    N, E = cfg.n_nodes, cfg.n_edges
    return {
        "nodes": init.normal((N, cfg.node_features)),
        "edges": init.normal((E, cfg.edge_features)),
        "senders": init.randint((E,), N),
        "receivers": init.randint((E,), N),
        "targets": init.normal((N, cfg.out_features)),
    }


def mlp(layers: list, x: jax.Array) -> jax.Array:
    """Dense layers with relu between them (none after the last)."""
    for i, p in enumerate(layers):
        x = x @ p["w"] + p["b"]
        x = jax.nn.relu(x) if i < len(layers) - 1 else x
    return x


def forward(params: dict, graph: dict) -> jax.Array:
    """Per-node predictions [N, out] for a graph dict (nodes, edges, senders, receivers)."""
    senders, receivers = graph["senders"], graph["receivers"]
    v = mlp(params["node_enc"], graph["nodes"])  # [N, L]
    e = mlp(params["edge_enc"], graph["edges"])  # [E, L]
    for p in params["steps"]:
        e = e + mlp(p["edge"], jnp.concatenate([e, v[senders], v[receivers]], axis=-1))
        inbox = jax.ops.segment_sum(e, receivers, num_segments=v.shape[0])  # [N, L]
        v = v + mlp(p["node"], jnp.concatenate([v, inbox], axis=-1))
    return mlp(params["dec"], v)


def loss_fn(params: dict, graph: dict) -> jax.Array:
    err = forward(params, graph).astype(jnp.float32) - graph["targets"]
    return jnp.mean(err**2)


def train_step(params: dict, opt_state: dict, graph: dict, *, lr: float):
    """One Adam step: returns (new_params, new_opt_state, loss)."""
    loss, grads = jax.value_and_grad(loss_fn)(params, graph)
    params, opt_state = adam_update(params, grads, opt_state, lr=lr)
    return params, opt_state, loss


def make_gns(size: str = "tiny", train: bool = True, **overrides) -> Workload:
    """GNS as a Workload: `train_step(params, opt_state, graph)` or `forward(params, graph)`."""
    cfg = resolve_config("make_gns", SIZES, size, overrides)
    init = Init(abstract=size != "tiny", dtype=cfg.dtype)
    params = init_params(init, cfg)
    opt_state, graph = init.run(adam_init, params), make_batch(init, cfg)
    bounds = {"senders": cfg.n_nodes, "receivers": cfg.n_nodes}
    dims = f"N={cfg.n_nodes} E={cfg.n_edges} latent={cfg.latent} K={cfg.n_steps}"
    if train:
        fn, args, argnums = bind(train_step, lr=cfg.lr), (params, opt_state, graph), (0, 1)
        desc = f"Graph network simulator, Adam train step, {dims}"
    else:
        inputs = {k: graph[k] for k in ("nodes", "edges", "senders", "receivers")}
        fn, args, argnums = forward, (params, inputs), (0,)
        desc = f"Graph network simulator, forward, {dims}"
    return Workload("gns", desc, fn, args, argnums, cfg, bounds)
