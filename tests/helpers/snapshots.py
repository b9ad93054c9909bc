"""Reports as text: `assert_snapshot` (tests/snapshots/NAME; conftest.py's `snapshot` fixture decides
whether a missing or changed one is written) and `Page` (the elements of an HTML report)."""

from __future__ import annotations

from html.parser import HTMLParser

import pytest

from tests.helpers.paths import SNAPSHOTS, TESTS


def assert_snapshot(name: str, text: str, update: bool = False) -> None:
    """Compare `text` with tests/snapshots/`name`; write it instead when `update`.

    A missing snapshot fails: a new one is written on purpose (conftest.py: --update-snapshots or
    BSA_UPDATE_SNAPSHOTS=1), never by a run that happens not to find it.
    """
    path = SNAPSHOTS / name
    how = "rerun with --update-snapshots (or BSA_UPDATE_SNAPSHOTS=1)"
    if update:
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    elif not path.exists():
        pytest.fail(f"snapshot {path.relative_to(TESTS.parent)} is missing; {how} to create it", pytrace=False)
    assert text == path.read_text(), f"{name} changed; {how} if that is intended"


class Page(HTMLParser):
    """Collect elements as (tag, attributes, text inside) and the text of <title> elements."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str], list[str]]] = []
        self.stack: list[tuple[str, dict[str, str], list[str]]] = []
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        element = (tag, {k: v or "" for k, v in attrs}, [])
        self.elements.append(element)
        if tag not in ("input", "meta", "br", "line", "rect", "polygon", "col"):
            self.stack.append(element)
        elif tag in ("rect", "polygon"):
            self.stack.append(element)

    def handle_endtag(self, tag: str) -> None:
        while self.stack:
            if self.stack.pop()[0] == tag:
                break

    def handle_data(self, data: str) -> None:
        for element in self.stack:
            element[2].append(data)

    def find(self, tag: str, **attrs: str) -> list[tuple[str, dict[str, str], list[str]]]:
        return [e for e in self.elements if e[0] == tag and all(e[1].get(k) == v for k, v in attrs.items())]

    @staticmethod
    def text(element: tuple[str, dict[str, str], list[str]]) -> str:
        return "".join(element[2])
