"""The IR: `Program`, `Value`, `Op`, and `trace` (the only code that reads jaxprs)."""

from toast_core.ir.program import Op, Program, Value, dtype_itemsize
from toast_core.ir.trace import run_with_constraints, trace

__all__ = ["Op", "Program", "Value", "dtype_itemsize", "run_with_constraints", "trace"]
