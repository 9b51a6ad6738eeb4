"""The auditor has no handle on the protected database (docs/design.md, invariant 8:
the auditor never touches the data).

Two checks: no module under ``gateway/audit/`` imports anything that can reach a
database (read from the source, so a lazy import inside a function is caught too), and
importing the package in a fresh interpreter loads none of those modules.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import gateway.audit

AUDIT_DIR = Path(gateway.audit.__file__).parent
FORBIDDEN = (
    "sqlalchemy",
    "sqlite3",
    "psycopg",
    "duckdb",
    "budget",
    "gateway.sql.execute",
    "gateway.pipeline.gateway",
    "gateway.sql.compile",
    "gateway.cache",
    "gateway.http",
    "flask",
)
ALLOWED_GATEWAY = (
    "gateway.core.plan",
    "gateway.core.config",
    "gateway.core.domain",
    "gateway.audit",
    "gateway.core.errors",
    "gateway.core.joins",  # the relation a join reads: config in, config out
    "gateway.ops.heap",  # glibc malloc settings: no data, no database
)


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "__import__") or (
            isinstance(node, ast.Attribute) and node.attr == "import_module"
        ):
            names.add("<dynamic import>")
    return names


def test_audit_sources_import_nothing_that_reaches_the_database() -> None:
    files = sorted(AUDIT_DIR.glob("*.py"))
    assert files
    for f in files:
        for name in _imports(f):
            assert name != "<dynamic import>", f"{f.name} imports dynamically"
            assert not any(name == b or name.startswith(b + ".") for b in FORBIDDEN), (
                f"{f.name} imports {name}"
            )
            if name.startswith("gateway"):
                assert name.startswith(ALLOWED_GATEWAY), f"{f.name} imports {name}"


def test_importing_the_auditor_loads_no_database_module() -> None:
    roots = ("sqlalchemy", "sqlite3", "psycopg", "duckdb", "budget", "flask")
    modules = ("gateway.sql.execute", "gateway.pipeline.gateway", "gateway.sql.compile")
    code = (
        "import sys, gateway.audit\n"
        f"bad = [m for m in sys.modules if m.split('.')[0] in {roots!r} or m in {modules!r}]\n"
        "print(','.join(sorted(bad)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == ""
