"""The viewer's fixed list of categories (its colour-by-category mode) is the vocabulary's, in its order.

model/categories.py owns the names; viewer.js cannot import it, so this
test keeps the two in step: a category added to one and not the other
would be painted grey and left out of the legend.
"""

from __future__ import annotations

import json
import re

from gpuflame.model.categories import CATEGORIES
from gpuflame.render.html import viewer_asset


def js_list(source: str, name: str) -> list[str]:
    found = re.search(rf"const {name} = (\[[^\]]*\]);", source)
    assert found, name
    return json.loads(found.group(1))


def test_viewer_lists_every_category_with_a_colour_of_its_own() -> None:
    source = viewer_asset("viewer.js")
    assert js_list(source, "CATEGORIES") == list(CATEGORIES)
    colours = js_list(source, "CATEGORY_COLORS")
    assert len(colours) == len(CATEGORIES) and len(set(colours)) == len(colours)
