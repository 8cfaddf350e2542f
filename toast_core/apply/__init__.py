"""Applying strategies to real JAX functions and validating them against XLA."""

from toast_core.apply.export import plan_module
from toast_core.apply.shard import jax_mesh, mesh_spec_of, partition_specs, shard
from toast_core.apply.validate import ValidationReport, concrete_args, validate

__all__ = [
    "ValidationReport",
    "concrete_args",
    "jax_mesh",
    "mesh_spec_of",
    "plan_module",
    "partition_specs",
    "shard",
    "validate",
]
