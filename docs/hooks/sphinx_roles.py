"""A griffe extension for the API page: the docstrings' Sphinx roles read as code.

gpuflame's docstrings cross-reference in reStructuredText's way
(``:func:`stop```, ``:class:`Recording```), which Markdown would show
literally; mkdocstrings reads them through this extension (mkdocs.yml),
so the page shows ``stop`` and ``Recording`` as code. Nothing is fetched
or imported: it rewrites the docstring text griffe read from src/.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:func|class|meth|attr|mod|data|exc|obj|const):`~?([^`]+)`")
DOUBLE = re.compile(r"``([^`]+)``")


def plain(text: str) -> str:
    """``:func:`stop``` -> `` `stop` ``, and reST's double backticks -> Markdown's single ones."""
    return DOUBLE.sub(r"`\1`", ROLE.sub(r"`\1`", text))


class SphinxRoles(griffe.Extension):
    """Rewrite each docstring once the tree is built (aliases resolved)."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = plain(obj.docstring.value)
