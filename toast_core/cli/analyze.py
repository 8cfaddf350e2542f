"""`toast analyze`: named dims, conflicts and their options."""

from __future__ import annotations

import json

from toast_core.cli.common import (
    analyze_target,
    table,
)
from toast_core.fmt import fmt_bytes


def cmd_analyze(args) -> int:
    _, _, ana, dt = analyze_target(args)
    summary = ana.summary() | {"analysis_s": dt}
    if args.json:
        doc = {
            "summary": summary,
            "named_dims": [
                {
                    "name": nd.name,
                    "size": nd.size,
                    "label": nd.label,
                    "bytes_covered": nd.bytes_covered,
                    "members": len(nd.members),
                    "has_reduction": nd.has_reduction,
                    "replication_ops": list(nd.replication_ops),
                    "persistent": nd.is_persistent,
                }
                for nd in ana.named_dims
            ],
            "conflicts": [
                {
                    "name": c.name,
                    "kind": c.kind,
                    "named_dims": [f"N{d}" for d in c.named_dims],
                    "description": c.description,
                    "sites": [s.text for s in c.sites],
                    "options": [
                        {"bytes": o.bytes, "description": o.description} for o in c.options
                    ],
                }
                for c in ana.conflicts
            ],
            "dim_groups": [[f"N{d}" for d in g] for g in ana.dim_groups],
            "conflict_groups": [[f"K{c}" for c in g] for g in ana.conflict_groups],
            "diagnostics": list(ana.diagnostics),
        }
        print(json.dumps(doc, indent=2))
        return 0
    s = summary
    print(
        f"{s['program']}: {s['ops']} ops, {s['tensor_dims']} tensor dims -> {s['named_dims']} named "
        f"dims ({s['dim_groups']} repeated-layer groups), {s['conflicts']} conflicts; "
        f"analysis {dt:.3f} s"
    )
    rows = [
        [
            nd.name,
            nd.size,
            nd.label,
            fmt_bytes(nd.bytes_covered),
            len(nd.members),
            "yes" if nd.has_reduction else "",
            len(nd.replication_ops) or "",
            "param" if nd.is_persistent else ("data" if nd.is_input else ""),
        ]
        for nd in sorted(ana.named_dims, key=lambda n: -n.bytes_covered)
    ]
    print("\nNamed dims")
    print(
        table(rows, ["id", "size", "label", "bytes", "members", "reduces", "replicate@", "holds"])
    )
    if ana.dim_groups or ana.conflict_groups:
        print("\nRepeated-layer decision groups (the search decides each group at once; a pin on")
        print("one member singles that layer out)")
        for g in ana.dim_groups:
            nd = ana.named_dims[g[0]]
            print(f"  {len(g)} x {nd.label}: {' '.join(f'N{d}' for d in g)}")
        for g in ana.conflict_groups:
            c = ana.conflicts[g[0]]
            print(f"  {len(g)} x {c.kind} conflict: {' '.join(f'K{k}' for k in g)}")
    if ana.conflicts:
        print("\nConflicts")
        for c in ana.conflicts:
            print(f"  {c.name} [{c.kind}] {c.description}")
            for site in c.sites[:2]:
                print(f"      at {site.text}")
            for o in c.options:
                print(f"      option {o.index}: {o.description} ({fmt_bytes(o.bytes)})")
    for d in ana.diagnostics:
        print(f"diagnostic: {d}")
    return 0
