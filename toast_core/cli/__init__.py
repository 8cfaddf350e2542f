"""The `toast` command line: analyze, search, compare and validate a JAX program.

    toast analyze gpt
    toast search gpt --mesh data=2,model=4 --hardware tpu-v5e --budget 10s --out s.json
    toast compare gpt --mesh data=2,model=4 --hardware h100-80gb
    toast validate gpt --mesh data=2,model=4 --strategy s.json
    toast sweep gpt mlp --mesh data=8 --mesh data=2,model=4 --simulations 20 [--ray auto]
    toast search gpt --devices 256 --hardware tpu-v5e --budget 60s   (mesh shapes ranked)
    toast fit moe --size mixtral-8x7b --hardware tpu-v5e             (fewest devices that fit)

TARGET is a zoo name (`gpt`, `llama`, ... with `--size`) or `path/to/file.py:function` where the
function returns `(fn, example_args)` (or a demos Workload). Human tables by default, `--json` for
machines; bad input exits non-zero with a one-line error.
"""

from __future__ import annotations

from toast_core.cli.parser import build_parser, main
from toast_core.cli.sweep import search_case

__all__ = ["build_parser", "main", "search_case"]
