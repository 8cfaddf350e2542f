"""Small numpy helpers the analysis leans on in its hot paths.

`np.unique` without `return_*` options takes a hash-table path in numpy 2.3+ and then sorts the
distinct keys; on the analysis's keys (a few hundred thousand int64 codes at 50k equations) that
is several times slower than one sort and a comparison, so the plain case has its own helper.
"""

from __future__ import annotations

import numpy as np


def unique(keys) -> np.ndarray:
    """The distinct entries of `keys`, sorted (as `np.unique(keys)` returns them)."""
    out = np.sort(np.asarray(keys).ravel())
    if len(out) < 2:
        return out
    return out[np.r_[True, out[1:] != out[:-1]]]
