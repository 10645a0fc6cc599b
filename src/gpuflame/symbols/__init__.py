"""Frame naming as the AKS flame-graph reading guide spells it, qualname recovery, and frame kinds."""

from gpuflame.symbols.names import (
    CACHED_FREE,
    MODULE,
    OUTSIDE_FRAMEWORK,
    SEPARATOR,
    TRAMPOLINE_NAME,
    display_name,
    matches,
    matches_exactly,
    normalize,
)

__all__ = [
    "CACHED_FREE",
    "MODULE",
    "OUTSIDE_FRAMEWORK",
    "SEPARATOR",
    "TRAMPOLINE_NAME",
    "display_name",
    "matches",
    "matches_exactly",
    "normalize",
]
