"""The layer rules of docs/architecture.md, pinned as import contracts.

Every import statement of every module (function-level imports included) is read with
``ast``; each rule names which modules may not import what. A rule that no longer
matches any module fails too, so the contracts cannot silently go stale.
"""

from __future__ import annotations

import ast
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
            for alias in node.names:  # ``from gateway import execute`` names a module
                yield f"{base}.{alias.name}"


MODULES = {
    _module_name(p): sorted(set(_imports(p)))
    for package in PACKAGES
    for p in sorted((ROOT / package).rglob("*.py"))
}


def _matches(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


# (who, may not import, why)
RULES: list[tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...], str]] = [
    (
        ("gateway", "budget", "mechanisms"),
        ("gateway.http", "gateway.serve", "gateway.openapi"),
        ("flask", "werkzeug"),
        "Flask is imported only by the HTTP front end (gateway/http/, serve, openapi)",
    ),
    (("budget", "mechanisms"), (), ("gateway",), "budget/ and mechanisms/ know no gateway"),
    (
        ("gateway.audit",),
        (),
        ("sqlalchemy", "gateway.execute", "gateway.compile", "gateway.pipeline", "budget"),
        "the auditor never reaches the protected database (nor the ledger)",
    ),
    (
        ("gateway",),
        ("gateway.pipeline", "gateway.cli", "gateway.serve"),
        ("gateway.execute",),
        "only the pipeline (and the CLI's checks) run statements on the protected database",
    ),
    (
        ("gateway",),
        ("gateway.http", "gateway.cli", "gateway.serve", "gateway.openapi"),
        ("gateway.http",),
        "nothing below the front end imports it",
    ),
    (
        ("gateway",),
        ("gateway.pipeline", "gateway.http", "gateway.cli", "gateway.serve"),
        ("gateway.pipeline",),
        "a stage never imports the pipeline that composes the stages",
    ),
    (("gateway.noising",), (), ("gateway.postprocess",), "noise comes before post-processing"),
    (
        ("gateway.analyze", "gateway.planning", "gateway.request", "gateway.compile"),
        (),
        ("budget", "gateway.charges", "gateway.identity"),
        "planning is a function of the request and the public config: no ledger",
    ),
    (
        ("dpgate_client",),
        (),
        ("gateway", "budget", "mechanisms"),
        "the client talks HTTP only",
    ),
    (
        ("gateway.post_query", "gateway.released_table", "gateway.analyze.nested"),
        (),
        (
            "sqlalchemy",
            "gateway.execute",
            "gateway.compile",
            "gateway.pipeline",
            "gateway.charges",
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
        f"{m} imports {name}"
        for m in subjects
        for name in MODULES[m]
        if _matches(name, forbidden) and not _matches(name, allowed)
    ]
    assert not broken, f"{why}: " + "; ".join(broken)


def test_the_stages_exist_with_one_entry_each() -> None:
    """docs/architecture.md lists the pipeline's stages; each is a module of its own."""
    stages = {
        "gateway.request": "check_request",
        "gateway.planning": "Planner",
        "gateway.identity": "identify",
        "gateway.answer_cache": "AnswerCache",
        "gateway.charges": "Charges",
        "gateway.audit_policy": "AuditPolicy",
        "gateway.compile": "compile_plan",
        "gateway.execute": "run_aggregate",
        "gateway.noising": "add_noise",
        "gateway.postprocess": "finish",
        "gateway.release": "Release",
    }
    import importlib

    for module, entry in stages.items():
        assert hasattr(importlib.import_module(module), entry), f"{module}.{entry}"
    text = (ROOT / "docs" / "architecture.md").read_text()
    for module in stages:
        assert module.split(".")[1] in text, f"docs/architecture.md does not place {module}"
