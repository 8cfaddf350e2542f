"""Mesh and hardware specs: `MeshSpec`, `HardwareSpec`, `HARDWARE_PRESETS`, `hardware`."""

from __future__ import annotations

from toast_core.mesh.spec import HARDWARE_PRESETS, HardwareSpec, MeshSpec, hardware

__all__ = ["HARDWARE_PRESETS", "HardwareSpec", "MeshSpec", "hardware"]
