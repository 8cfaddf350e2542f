"""The fine classes whose cuts divide each op's work, as the cost model prices it.

The strategy layer's layout lists, per op, every fine class of its atoms but replicate factors
(`Layout.op_work_fine`). XLA's simplifier runs an elementwise op or an outer product whose result
is uniform along a dim on the broadcast's core (`simplify.broadcast_work_dims`), so cutting that
dim does not divide its work on a device (measured: `broadcast_to(x[16, 8, 1][None], (12, ...))
* w[1]` with the broadcast dim cut 3 ways is 128 flops per device, the whole core; fuzz seed 18
#498). That rule is the cost model's, so it is applied here, where the cost layer reads the
layout, not in the layout: the strategy layer does not import the cost layer.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from toast_core.analysis import Analysis
from toast_core.cost.simplify import broadcast_work_dims
from toast_core.strategy.layout import layout
from toast_core.strategy.memo import per_analysis


@per_analysis(max_keys=1)
def op_work_fine(ana: Analysis) -> sp.csr_matrix:
    """[ops, fine]: the layout's work rows less the fine classes of each op's broadcast dims."""
    lay = layout(ana)
    rows, cols = [], []
    for op, dims in zip(ana.program.ops, broadcast_work_dims(ana.program)):
        for d in dims:
            for f in lay.value_dim_fine[op.results[0]][d]:
                rows.append(op.index)
                cols.append(f)
    work = lay.op_work_fine.tocsr()
    if not rows:
        return work
    skip = sp.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=work.shape, dtype=work.dtype)
    skip.data[:] = 1  # a fine class listed twice is skipped once
    out = (work - work.multiply(skip)).tocsr()
    out.eliminate_zeros()
    out.sort_indices()
    return out
