"""The docs name what the code has: the handler API they show (``locks.<name>``)."""

from __future__ import annotations

import re
from pathlib import Path

from django_distlock.handler import LockHandler

DOCS = Path(__file__).resolve().parent.parent / "docs"


def test_every_locks_attribute_the_docs_name_exists() -> None:
    named = {
        (page.name, attribute)
        for page in sorted(DOCS.glob("*.md"))
        for code in re.findall(r"```.*?```|`[^`\n]+`", page.read_text(), re.S)
        for attribute in re.findall(r"(?<![\w.])locks\.([A-Za-z_]\w*)", code)
    }
    assert named, "no `locks.<name>` found in docs/: the pattern is stale"
    missing = sorted((page, name) for page, name in named if not hasattr(LockHandler, name))
    assert missing == [], f"docs name LockHandler attributes that do not exist: {missing}"
