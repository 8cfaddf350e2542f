"""The MCTS tree on a toy environment, against a golden file of visit counts.

Three decisions worth +0.3, +0.2 and -0.4, taken in any order (the transposition table makes the
tree a DAG); the reward of a state is 0.5 plus the sum of its decisions. Forty simulations of
select (UCT) / expand / backup must reproduce `golden/toy_tree.json` exactly: a change to the
tree, the expansion order or the selection policy shows up here first. Regenerate with
`TOAST_UPDATE_GOLDEN=1`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from toast_core.search.selection import uct
from toast_core.search.tree import Tree, backup, expansion_order
from toast_core.search.types import Resolve, Shard, Stop

GOLDEN = Path(__file__).parent / "golden" / "toy_tree.json"
WORTH = (0.3, 0.2, -0.4)


@dataclass(frozen=True)
class ToyState:
    chosen: frozenset

    @property
    def key(self):
        return tuple(sorted(self.chosen))


def legal_actions(state: ToyState):
    return [Shard(u, 0) for u in range(len(WORTH)) if u not in state.chosen] + [Stop()]


def apply(state: ToyState, action) -> ToyState:
    if isinstance(action, Shard):
        return ToyState(state.chosen | {action.unit})
    return state


def reward(state: ToyState) -> float:
    return 0.5 + sum(WORTH[u] for u in state.chosen)


def simulate(n: int) -> Tree:
    tree = Tree(legal_actions)
    root_state = ToyState(frozenset())
    for _ in range(n):
        node = tree.node(root_state)
        path = [node]
        while not node.terminal and not node.untried and node.children:
            node = uct(node)
            path.append(node)
        if not node.terminal and node.untried:
            node = tree.expand(node, apply)
            path.append(node)
        backup(path, reward(node.state))
    return tree


def snapshot(tree: Tree) -> dict:
    return {
        "/".join(map(str, key)) or "root": [node.visits, round(node.value, 6)]
        for key, node in sorted(tree.table.items())
    }


def test_toy_tree_matches_the_golden_file():
    got = snapshot(simulate(40))
    if os.environ.get("TOAST_UPDATE_GOLDEN"):
        GOLDEN.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    assert got == json.loads(GOLDEN.read_text())


def test_the_search_prefers_the_good_decisions():
    tree = simulate(200)
    root = tree.node(ToyState(frozenset()))
    visits = {a.unit: c.visits for a, c in root.children.items() if isinstance(a, Shard)}
    assert visits[0] > visits[2] and visits[1] > visits[2]


def test_expansion_order_is_large_units_first_then_resolutions_then_stop():
    actions = [Resolve(0, 0), Resolve(0, 1), Shard(0, 0), Shard(1, 0), Stop()]
    stack = expansion_order(actions)
    popped = [stack.pop() for _ in range(len(stack))]
    assert popped == [Shard(0, 0), Shard(1, 0), Resolve(0, 0), Resolve(0, 1), Stop()]


def test_actions_of_different_kinds_never_compare_equal():
    assert Shard(1, 2) != Resolve(1, 2)
    assert len({Shard(1, 2), Resolve(1, 2), Stop(), Stop()}) == 3
