"""Our factor rules against Shardy's, op by op: how many ops agree, per primitive, and why not.

Lowers each zoo train step with `jax.jit(...).lower(...)` (no compile), runs Shardy's
`sdy-populate-op-sharding-rules` pass, matches StableHLO ops to our IR ops and compares the rules
as relations. The machinery and the allow-list of known differences (with their reasons) live in
`tests/test_shardy_oracle.py`; this script prints the table and writes
`bench/results/shardy_crosscheck.json`.

    .venv/bin/python bench/shardy_crosscheck.py [--models mlp,gpt] [--all]
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

from _common import save, set_devices

ROOT = Path(__file__).resolve().parent.parent


def load_oracle():
    """The test module, loaded by path (it is not a package)."""
    path = ROOT / "tests" / "test_shardy_oracle.py"
    spec = importlib.util.spec_from_file_location("test_shardy_oracle", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--models", default="mlp,gpt")
    p.add_argument("--all", action="store_true", help="every zoo model's train step")
    args = p.parse_args()
    set_devices()
    oracle = load_oracle()
    from demos import MODEL_ZOO

    names = sorted(MODEL_ZOO) if args.all else args.models.split(",")
    payload, agree, total = {}, 0, 0
    for name in names:
        check = oracle.zoo_check(name)
        print(oracle.table(check), end="\n\n")
        agree, total = agree + check.n_agreeing, total + check.n_compared
        payload[name] = {
            "agreeing": check.n_agreeing,
            "compared": check.n_compared,
            "coverage": round(check.coverage, 4),
            "per_primitive": {
                prim: [check.agreeing[prim], n] for prim, n in check.compared.most_common()
            },
            "differences": [
                {"primitive": prim, "ops": len(ops), "notes": [list(n) for n in notes]}
                for (prim, notes), ops in sorted(check.disagreements.items())
            ],
            "not_allowed": len(check.not_allowed()),
        }
    print(f"total: {agree}/{total} ops agree with Shardy ({', '.join(names)})")
    print(f"wrote {save('shardy_crosscheck', payload)}")


if __name__ == "__main__":
    main()
