"""The layer rules of docs/architecture.md, pinned as import contracts.

Every import statement of every module (function-level imports included) is read with
``ast``; each rule names which modules may not import what. A rule that no longer
matches any module fails too, so the contracts cannot silently go stale.

``gateway/`` is a stack of rooms (packages), each importing only rooms below it:

    cli                        the ``dpgate`` command (may import any room)
    server                     the serving process (gunicorn / waitress, its workers)
    http, pgwire               the two front ends (http may ask pgwire's probe for /readyz)
    pipeline                   the stages of one query and the Gateway composing them
    sql, audit, ops            SQL in and out; the auditor; metrics, logs, rate limits
    core                       the config, the error codes, the query model
    (console, demo: the web console's charts, the demo data set, beside the front ends)

``ROOMS`` below says which rooms each room may import; ``test_the_rooms_form_a_stack``
checks that no arrow runs back up, ``test_a_room_imports_only_rooms_below_it`` that the
code keeps to it (one rule per room, so one per boundary).
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("gateway", "budget", "mechanisms", "dpgate_client")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> Iterator[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    package = _module_name(path).rsplit(".", 1)[0] if path.name != "__init__.py" else None
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against the importing package
                anchor = (package or _module_name(path)).split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base]) if base else ".".join(anchor)
            yield base
            for alias in node.names:  # ``from gateway.sql import execute`` names a module
                yield f"{base}.{alias.name}"


MODULES = {
    _module_name(p): sorted(set(_imports(p)))
    for package in PACKAGES
    for p in sorted((ROOT / package).rglob("*.py"))
}


def _matches(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


# The rooms of gateway/, bottom first, and the rooms each may import (besides itself and
# ``gateway`` itself: the version constants of gateway/__init__.py).
ROOMS: dict[str, tuple[str, ...]] = {
    "core": (),
    "ops": ("core",),
    "sql": ("core",),
    "audit": ("core", "ops"),  # ops: heap.py, the malloc settings its arrays need
    "pipeline": ("core", "ops", "sql", "audit"),
    "console": (),
    "demo": ("core",),
    # the front ends reach the auditor only through the pipeline; pgwire rewrites
    # catalogue queries itself (sqlglot's dialects, the analyzer's input limits)
    "pgwire": ("core", "ops", "sql", "pipeline"),
    "http": ("core", "ops", "pipeline", "console", "pgwire"),
    # serve.py loads gateway.http.app by name (importlib), in the worker that serves it
    "server": ("core", "ops", "http", "pgwire"),
    "cli": ("core", "ops", "sql", "pipeline", "demo", "server"),
}


def test_the_rooms_form_a_stack() -> None:
    """No arrow runs back up: a room may import only rooms listed before it."""
    order = list(ROOMS)
    for room, below in ROOMS.items():
        later = [r for r in below if order.index(r) >= order.index(room)]
        assert not later, f"gateway.{room} may import rooms above it: {later}"


def test_every_module_is_in_a_room() -> None:
    """gateway/ holds rooms only: no loose module beside them (and no unlisted room)."""
    gateway = ROOT / "gateway"
    loose = sorted(p.name for p in gateway.glob("*.py") if p.name != "__init__.py")
    assert not loose, f"modules outside any room: {loose} (docs/architecture.md)"
    rooms = sorted(p.name for p in gateway.iterdir() if (p / "__init__.py").exists())
    assert rooms == sorted(ROOMS), "gateway/'s packages and ROOMS differ"
    for room in rooms:
        doc = ast.get_docstring(ast.parse((gateway / room / "__init__.py").read_text()))
        assert doc, f"gateway/{room}/__init__.py does not say what the room is for"


@pytest.mark.parametrize("room", list(ROOMS))
def test_a_room_imports_only_rooms_below_it(room: str) -> None:
    allowed = tuple(f"gateway.{r}" for r in (room, *ROOMS[room]))
    subjects = [m for m in MODULES if _matches(m, (f"gateway.{room}",))]
    assert subjects, f"gateway.{room} holds no module: update ROOMS"
    broken = [
        f"{m} imports {name}"
        for m in subjects
        for name in MODULES[m]
        if _matches(name, ("gateway",))
        and name != "gateway"
        and not _matches(name, allowed)
        and not (name.count(".") == 1 and name.split(".")[1].isupper())  # gateway.VERSION_TEXT
    ]
    assert not broken, f"gateway.{room} may import only {ROOMS[room] or 'itself'}: " + "; ".join(
        broken
    )


# Finer rules, within and across rooms: (who, except whom, may not import, why). The
# exceptions exempt importers only: a name is never exempt for being an exception's.
RULES: list[tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...], str]] = [
    (
        ("gateway", "budget", "mechanisms"),
        ("gateway.http", "gateway.server.serve"),
        ("flask", "werkzeug"),
        "Flask is imported only by the HTTP front end (gateway/http/, and the server's runner)",
    ),
    (("budget", "mechanisms"), (), ("gateway",), "budget/ and mechanisms/ know no gateway"),
    (
        ("gateway.audit",),
        (),
        ("sqlalchemy", "gateway.sql", "gateway.pipeline", "budget"),
        "the auditor never reaches the protected database (nor the ledger)",
    ),
    (
        ("gateway",),
        ("gateway.pipeline.gateway", "gateway.cli"),
        ("gateway.sql.execute",),
        "only the pipeline (and the CLI's checks) run statements on the protected database",
    ),
    (
        ("gateway.sql",),
        (
            "gateway.sql.execute",
            "gateway.sql.engines",
            "gateway.sql.join_keys",
            "gateway.sql.public_lookups",
        ),
        ("sqlalchemy",),
        "the SQL layer reads and writes SQL text; only execute, engines/, the join-key "
        "catalogue and the public lookups' rows open connections",
    ),
    (
        ("gateway.pipeline",),
        ("gateway.pipeline.gateway",),
        ("gateway.pipeline.gateway",),
        "a stage never imports the pipeline that composes the stages",
    ),
    (
        ("gateway.pipeline.noising",),
        (),
        ("gateway.pipeline.postprocess",),
        "noise comes before post-processing",
    ),
    (
        (
            "gateway.sql.analyze",
            "gateway.pipeline.planning",
            "gateway.pipeline.request",
            "gateway.sql.compile",
        ),
        (),
        ("budget", "gateway.pipeline.charges", "gateway.pipeline.identity"),
        "planning is a function of the request and the public config: no ledger",
    ),
    (
        ("dpgate_client",),
        (),
        ("gateway", "budget", "mechanisms"),
        "the client talks HTTP only",
    ),
    (
        (
            "gateway.pipeline.post_query",
            "gateway.sql.released_table",
            "gateway.sql.analyze.nested",
        ),
        (),
        (
            "sqlalchemy",
            "gateway.sql.execute",
            "gateway.sql.compile",
            "gateway.pipeline.gateway",
            "gateway.pipeline.charges",
            "budget.ledger",
        ),
        "a nested aggregation's outer query sees released rows only, never the database",
    ),
]


@pytest.mark.parametrize("who, allowed, forbidden, why", RULES, ids=[r[3] for r in RULES])
def test_layer_rule(
    who: tuple[str, ...], allowed: tuple[str, ...], forbidden: tuple[str, ...], why: str
) -> None:
    subjects = [m for m in MODULES if _matches(m, who) and not _matches(m, allowed)]
    assert subjects, f"the rule '{why}' matches no module: update it"
    broken = [
        f"{m} imports {name}" for m in subjects for name in MODULES[m] if _matches(name, forbidden)
    ]
    assert not broken, f"{why}: " + "; ".join(broken)


def test_the_stages_exist_with_one_entry_each() -> None:
    """docs/architecture.md lists the pipeline's stages; each is a module of its own."""
    stages = {
        "gateway.pipeline.request": "check_request",
        "gateway.pipeline.planning": "Planner",
        "gateway.pipeline.identity": "identify",
        "gateway.pipeline.answer_cache": "AnswerCache",
        "gateway.pipeline.charges": "Charges",
        "gateway.pipeline.audit_policy": "AuditPolicy",
        "gateway.sql.compile": "compile_plan",
        "gateway.sql.execute": "run_aggregate",
        "gateway.pipeline.noising": "add_noise",
        "gateway.pipeline.postprocess": "finish",
        "gateway.pipeline.release": "Release",
    }
    for module, entry in stages.items():
        assert hasattr(importlib.import_module(module), entry), f"{module}.{entry}"
    text = (ROOT / "docs" / "architecture.md").read_text()
    for module in stages:
        assert module.rsplit(".", 1)[1] in text, f"docs/architecture.md does not place {module}"


def test_the_tree_in_docs_is_the_real_tree() -> None:
    """docs/architecture.md's tree names every room and every module of gateway/."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    tree = text.split("```", 2)[1]
    for path in sorted((ROOT / "gateway").rglob("*.py")):
        rel = path.relative_to(ROOT / "gateway")
        if path.name == "__init__.py" or len(rel.parts) > 2:
            continue  # a room's own modules are named in its room, sub-packages as folders
        if rel.parts[0] in ("cli", "pgwire", "audit", "http", "console", "demo", "analyze"):
            continue  # described by their package's entry
        assert f"{rel.parts[0]}/" in tree, f"docs/architecture.md: no room {rel.parts[0]}/"
        assert path.name in tree, f"docs/architecture.md's tree does not place gateway/{rel}"
