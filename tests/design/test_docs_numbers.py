"""Numbers that drift stay out of the docs: no test count, no suite or test time (issue 32 item 10).

README said 1404 tests and 7 minutes when the suite was 1,896 tests and took 18 minutes on another machine.
Measured figures that a script produces (README's "Performance", from benchmarks/) stay, with their script.
"""

from __future__ import annotations

import re

from tests.helpers import REPO

#: A count of tests, or a time in minutes: what pytest's own last line says on the reader's machine.
DRIFTING = re.compile(r"\b\d[\d,]* tests\b|\b\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)? min\b")


def _prose(path) -> str:
    """The file's text without README's section of measured performance (each figure names its script)."""
    text = path.read_text()
    start = text.find("\n## Performance")
    if start < 0:
        return text
    end = text.find("\n## ", start + 1)
    return text[:start] + (text[end:] if end >= 0 else "")


def test_no_doc_states_a_test_count_or_a_time_in_minutes():
    found = {
        f"{path.relative_to(REPO)}: {match.group(0)!r}"
        for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
        for match in DRIFTING.finditer(_prose(path))
    }
    assert not found, sorted(found)
