"""Every SQL example a user reads — in README.md, docs/*.md and the console's hints — is
run against the demo, and is answered, or refused with the error code the text says.

Examples are found in the text, not listed here: a SELECT in a code span, in a fenced
``sql`` block, or quoted in a fenced shell/Python block. Those with placeholders (``…``,
``<query>``, ``:param``) are shapes, not queries, and are skipped; so are fragments
(``SELECT *`` naming no table). A new example in the docs is therefore tested without
anyone adding it here; ``REFUSED`` and ``ELSEWHERE`` say which examples the text itself
presents as refused, or as written for another database.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from typing import Any

import pytest

from tests.conftest import REPOSITORY

DOCS = [REPOSITORY / "README.md", *sorted((REPOSITORY / "docs").glob("*.md"))]
CONSOLE = REPOSITORY / "gateway" / "console" / "static" / "index.html"

# Examples the text presents as refused: the text as written → a statement of that shape
# on the demo, and the code the text gives (or implies by "refused with a precise error
# naming the construct": unsupported_query).
REFUSED = {
    "SELECT *": ("SELECT * FROM patients", "unsupported_query"),
    "SELECT * FROM patients WHERE …": (
        "SELECT * FROM patients WHERE age > 40",
        "unsupported_query",
    ),
}
# Shapes written with names to fill in (``col``, ``t``): not queries.
SHAPES = {"SELECT DISTINCT col FROM t", "SELECT DISTINCT col"}
_PLACEHOLDER = re.compile(r"…|\.\.\.|<[a-z ]+>|:\w+\b|\[[A-Z]")
_PROBE = re.compile(r"^SELECT (\d+|\w+\(\))$")


def _examples_in(text: str) -> list[str]:
    found: list[str] = []
    for lang, body in re.findall(r"```(\w*)\n(.*?)```", text, flags=re.S):
        if lang == "sql":
            # statements start on a line of their own with SELECT
            parts = re.split(r"\n(?=SELECT\b)", body.strip())
            found += [" ".join(p.rstrip(";").split()) for p in parts if p.startswith("SELECT")]
        else:
            found += re.findall(r'"(SELECT\b[^"]*)"', body)
    prose = " ".join(re.sub(r"```.*?```", "", text, flags=re.S).split())
    found += [s for s in re.findall(r"`([^`]+)`", prose) if s.startswith("SELECT ")]
    return found


def _console_examples() -> list[str]:
    text = CONSOLE.read_text()
    found = re.findall(r"<textarea[^>]*>(SELECT\b[^<]*)</textarea>", text)
    found += re.findall(r"<code>(SELECT\b[^<]*)</code>", text)
    return [html.unescape(s) for s in found]


def _runnable(sql: str) -> bool:
    if sql in REFUSED:
        return True
    if sql in SHAPES or _PLACEHOLDER.search(sql):
        return False
    return " FROM " in sql.upper() or bool(_PROBE.match(sql))


def _all_examples() -> list[tuple[str, str]]:
    seen: dict[str, str] = {}
    for path in DOCS:
        for sql in _examples_in(path.read_text()):
            seen.setdefault(sql, path.relative_to(REPOSITORY).as_posix())
    for sql in _console_examples():
        seen.setdefault(sql, "console")
    return [(where, sql) for sql, where in seen.items() if _runnable(sql)]


EXAMPLES = _all_examples()


def test_the_docs_have_examples_to_run() -> None:
    """The extraction finds the examples (a change of markup cannot empty this test)."""
    where = {w for w, _ in EXAMPLES}
    assert {"README.md", "docs/connect.md", "docs/design.md", "console"} <= where
    assert len(EXAMPLES) >= 20
    assert set(REFUSED) <= {sql for _, sql in EXAMPLES}, "a REFUSED example left the docs"


@pytest.mark.parametrize("where, sql", EXAMPLES, ids=[f"{w}: {s[:60]}" for w, s in EXAMPLES])
def test_every_example_is_answered_or_refused_as_the_text_says(
    where: str, sql: str, ask: Callable[..., tuple[int, dict[str, Any]]]
) -> None:
    if sql in REFUSED:
        statement, code = REFUSED[sql]
        status, body = ask(statement, epsilon=0.1)
        assert not body["ok"] and body["error"]["code"] == code, (where, body)
        return
    status, body = ask(sql, epsilon=0.1)
    assert status == 200 and body["ok"], (where, sql, body)
    assert body["columns"]


def test_the_console_hint_names_what_can_be_asked() -> None:
    hint = re.search(r'<p id="sql-help"[^>]*>(.*?)</p>', CONSOLE.read_text(), flags=re.S)
    assert hint is not None
    text = hint.group(1)
    for word in ("COUNT", "SUM", "AVG", "MEDIAN", "MIN", "MAX", "GROUP BY"):
        assert word in text, word


def test_docs_name_window_functions_as_refused(ask: Callable[..., Any]) -> None:
    """README's list of refusals names window functions; the error names them too."""
    for sql in (
        "SELECT disease, RANK() OVER (ORDER BY COUNT(*) DESC) FROM patients GROUP BY disease",
        "SELECT disease, COUNT(*) OVER () FROM patients",
    ):
        status, body = ask(sql)
        assert status == 400 and body["error"]["code"] == "unsupported_query"
        assert "window function" in body["error"]["message"], body
        assert " OVER (" in body["error"]["message"]
