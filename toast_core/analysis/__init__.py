"""Named Dimension Analysis: factor rules, named dims, conflicts. See README.md here."""

from toast_core.analysis.analysis import Analysis, analyze
from toast_core.analysis.conflicts import Conflict, ConflictOption, Site
from toast_core.analysis.nda import MEdge, NamedDim
from toast_core.analysis.rules import RULES

__all__ = [
    "RULES",
    "Analysis",
    "Conflict",
    "ConflictOption",
    "MEdge",
    "NamedDim",
    "Site",
    "analyze",
]
