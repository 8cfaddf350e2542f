"""A `while_loop` accumulating a gradient (fuzz seed 17 #752, `loop_buffers`): the body's new
accumulator is written over the carry it reads (XLA's `while` keeps one buffer per state
element), and the counter, started from a literal 0, is copied into the loop's state. The model
had counted the new accumulator apart (1.79x XLA's bytes; now 1.18x, the block's last padding).
And a sum of broadcasts is no library reduction (`cpu_buffers._is_spread`, seed 17 #869: 19.6x)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax import lax
from xla_memory import replicated_memory

import toast_core as tc
from toast_core.apply.validate import predicted_cpu_memory_bytes
from toast_core.cost.cpu_buffers import library_reduction_inputs
from toast_core.cost.loop_buffers import buffer_aliases
from toast_core.ir import primitives as prim

HW = tc.hardware("tpu-v5e")
MESH = tc.MeshSpec({"data": 2, "fsdp": 2, "model": 2})


def _accumulate(params, batch):
    """Seed 17 #752: two micro-batches' gradients summed in a `while_loop`."""

    def loss(p, x):
        return jnp.mean(jnp.einsum("a,az->z", x, p["w2"])) + jnp.mean(jax.nn.sigmoid(x))

    def body(carry):
        i, acc = carry
        micro = lax.dynamic_index_in_dim(batch["x1"], i, 0, False)
        return i + 1, jax.tree.map(jnp.add, acc, jax.grad(loss)(params, micro))

    zeros = jax.tree.map(jnp.zeros_like, params)
    grads = lax.while_loop(lambda c: c[0] < 2, body, (0, zeros))[1]
    return jax.tree.map(lambda p, g: p - 0.1 * g / 2, params, grads)


def _args():
    return {"w2": jax.ShapeDtypeStruct((8, 2), jnp.float32)}, {
        "x1": jax.ShapeDtypeStruct((2, 8), jnp.float32)
    }


def _analysis():
    return tc.analyze(tc.trace(_accumulate, *_args()))


def test_a_while_accumulator_is_updated_in_place_and_its_counter_copied():
    prog = _analysis().program
    (start,) = [op for op in prog.ops if op.primitive == prim.WHILE_START]
    (end,) = [op for op in prog.ops if op.primitive == prim.WHILE_END]
    alias = buffer_aliases(prog)
    consts = int(dict(start.params)["num_consts"])
    counter, acc = start.results[consts : consts + 2]
    new_counter, new_acc = end.operands[:2]
    assert counter not in alias  # copy(constant 0), XLA's state
    assert alias[new_counter] == counter
    assert alias[new_acc] == alias.get(acc, acc)  # `acc + g` written over acc
    assert alias[end.results[1]] == alias.get(acc, acc)


def test_a_while_accumulation_step_memory():
    ana = _analysis()
    # XLA (measured, replicated on 2x2x2, `test_..._matches_xla`): 128 of arguments, 64 of
    # output (the accumulator's allocation), a 132-byte block (table, counter copy, counter):
    # 324. The block ends where its top buffer, the 4-byte counter, ends (`buffers.top_padding`;
    # rounded up to 64 bytes it was 384).
    assert predicted_cpu_memory_bytes(ana, tc.Strategy(name="replicated"), MESH, HW) == 324.0


@pytest.mark.slow
def test_a_while_accumulation_step_matches_xla():
    predicted, compiled = replicated_memory(_accumulate, _args(), MESH)
    assert predicted == compiled


def _spread_product(params, batch):
    """Seed 17 #869's reduction: the sum of a scalar's broadcast times a vector's."""
    spread = jnp.broadcast_to(batch["s"], (2, 16, 8, 32))
    return (jnp.sum(spread * batch["x"][None, None, None, :], axis=-1),)


def test_a_sum_of_broadcasts_stores_no_library_inputs():
    args = (
        {},
        {
            "s": jax.ShapeDtypeStruct((), jnp.float32),
            "x": jax.ShapeDtypeStruct((32,), jnp.float32),
        },
    )
    prog = tc.analyze(tc.trace(_spread_product, *args)).program
    # the model fuses the broadcasts into the product's loop, as XLA would
    is_mat = [prog.producers()[v.id] is None or v.is_output for v in prog.values]
    assert library_reduction_inputs(prog, is_mat) == []
