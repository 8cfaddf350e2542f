"""Search over the named-dim decision space: baselines, MCTS, exhaustive enumeration."""

from toast_core.search import baselines
from toast_core.search.mcts import SearchEvent, SearchResult, search, search_iter
from toast_core.search.pins import Pin, parse_pin, parse_pins
from toast_core.search.space import DecisionSpace, State, check_pins

__all__ = [
    "DecisionSpace",
    "Pin",
    "SearchEvent",
    "SearchResult",
    "State",
    "baselines",
    "check_pins",
    "parse_pin",
    "parse_pins",
    "search",
    "search_iter",
]
