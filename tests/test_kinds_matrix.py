"""docs/kinds.md's matrix is what the backends' flags say (django_distlock.testing.matrix)."""

from __future__ import annotations

import re
from pathlib import Path

from django_distlock.testing import matrix

DOC = Path(__file__).resolve().parent.parent / "docs" / "kinds.md"


def test_the_docs_table_is_what_the_flags_say() -> None:
    text = DOC.read_text()
    found = re.search(r"<!-- matrix:start -->\n(.*)<!-- matrix:end -->", text, re.S)
    assert found, "docs/kinds.md lost its matrix markers"
    assert found.group(1) == matrix.markdown(), (
        "docs/kinds.md's matrix differs from the backends' flags: run "
        "`python -m django_distlock.testing.matrix` and paste its output between the markers."
    )


def test_no_reason_is_left_for_a_kind_a_backend_now_offers() -> None:
    assert matrix.stale_reasons() == [], "drop these REASONS entries: the cells are yes now"


def test_every_no_has_a_reason_and_flags_decide_the_cells() -> None:
    table = matrix.cells()
    assert all(cell == "yes" or cell.startswith("no: ") for row in table[1:] for cell in row[1:])
    labels = table[0]
    rows = {row[0]: row for row in table[1:]}
    assert rows["reentrant"][labels.index("ZooKeeper")] == "yes"
    assert rows["fencing"][labels.index("Redlock")].startswith("no: ")
    assert rows["across processes"][labels.index("locmem")].startswith("no: ")
