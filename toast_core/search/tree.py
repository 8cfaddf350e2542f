"""The search tree: nodes in a transposition table keyed by canonical state.

Decisions commute (sharding N1 then N2 is sharding N2 then N1), so states are keyed canonically
and the tree is a DAG: a state reached by two paths is one node. Each node keeps its untried
actions in expansion order (popped from the end: the units that cover the most bytes first, then
resolutions, stop last), its children by action, its visit count and summed reward. A node
lists its actions only when first asked (most leaves of a short search are never selected
again, and listing is a legality pass over every unit).
"""

from __future__ import annotations

from collections.abc import Callable

from toast_core.search.types import Action, Remat, Resolve, Shard, Stop, action_order
from toast_core.strategy import State


class Node:
    __slots__ = (
        "state",
        "visits",
        "value",
        "children",
        "_untried",
        "_terminal",
        "_list",
        "_ordered",
    )

    def __init__(
        self,
        state: State,
        actions: list[Action] | None = None,
        list_actions: Callable[[State], list[Action]] | None = None,
    ) -> None:
        """A node with its untried `actions` in expansion order, or, lazily, those
        `list_actions(state)` lists (the first time `untried` or `terminal` is read)."""
        self.state = state
        self.visits = 0
        self.value = 0.0
        self.children: dict[Action, Node] = {}
        self._untried = self._terminal = None
        self._list = list_actions
        if actions is not None:
            self._set_untried(actions)
        self._ordered: list[Node] | None = None

    def _set_untried(self, actions: list[Action]) -> None:
        self._untried, self._terminal, self._list = actions, len(actions) <= 1, None

    @property
    def untried(self) -> list[Action]:
        """Untried actions, popped from the end."""
        if self._untried is None:
            self._set_untried(expansion_order(self._list(self.state)))
        return self._untried

    @property
    def terminal(self) -> bool:
        """Whether only stop (or nothing) was ever legal here."""
        if self._untried is None:
            self._set_untried(expansion_order(self._list(self.state)))
        return self._terminal

    def ordered_children(self) -> list[Node]:
        """Children in action order (sorted again only after an expansion: selection asks at
        every visit)."""
        if self._ordered is None or len(self._ordered) != len(self.children):
            items = sorted(self.children.items(), key=lambda kv: action_order(kv[0]))
            self._ordered = [c for _, c in items]
        return self._ordered

    def is_exhausted(self) -> bool:
        """Every child expanded, terminal and fully tried."""
        return not self.untried and all(
            c.terminal and not c.untried for c in self.children.values()
        )


def expansion_order(actions: list[Action]) -> list[Action]:
    """Untried actions as a stack: popped from the end, large units first, then resolutions,
    remat, stop last."""
    shard = [a for a in actions if isinstance(a, Shard)]
    resolve = [a for a in actions if isinstance(a, Resolve)]
    remat = [a for a in actions if isinstance(a, Remat)]
    stop = [a for a in actions if isinstance(a, Stop)]
    return stop + list(reversed(remat)) + list(reversed(resolve)) + list(reversed(shard))


class Tree:
    """Nodes by state key; `legal_actions` lists a new node's actions."""

    def __init__(self, legal_actions: Callable[[State], list[Action]]) -> None:
        self.legal_actions = legal_actions
        self.table: dict[tuple, Node] = {}

    def __len__(self) -> int:
        return len(self.table)

    def node(self, state: State) -> Node:
        key = state.key
        n = self.table.get(key)
        if n is None:
            n = self.table[key] = Node(state, list_actions=self.legal_actions)
        return n

    def expand(self, node: Node, apply: Callable[[State, Action], State]) -> Node:
        """Adds the next untried action's child (a stop child is a fresh terminal leaf)."""
        action = node.untried.pop()
        child_state = apply(node.state, action)
        child = Node(child_state, []) if isinstance(action, Stop) else self.node(child_state)
        node.children[action] = child
        return child


def backup(path: list[Node], reward: float) -> None:
    for n in path:
        n.visits += 1
        n.value += reward
