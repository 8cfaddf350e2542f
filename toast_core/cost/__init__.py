"""The cost model: pure functions over a `MeshSpec` and a `HardwareSpec` (DESIGN.md §4)."""

from __future__ import annotations
