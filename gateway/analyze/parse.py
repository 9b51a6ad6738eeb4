"""Pass 1: SQL text → exactly one SELECT expression, or a precise refusal.

Syntax errors carry line and column; several statements, non-SELECT statements and
set operations are refused by name before anything looks at tables or columns.
"""

from __future__ import annotations

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError

from gateway.errors import SqlSyntaxError, UnsupportedQuery

#: Analysts write PostgreSQL-flavoured SQL: double-quoted identifiers, typed division.
READ_DIALECT = "postgres"

_STATEMENT_NAMES: dict[type[exp.Expr], str] = {
    exp.Insert: "INSERT",
    exp.Update: "UPDATE",
    exp.Delete: "DELETE",
    exp.Create: "CREATE",
    exp.Drop: "DROP",
    exp.Alter: "ALTER",
    exp.Merge: "MERGE",
    exp.Union: "UNION",
    exp.Intersect: "INTERSECT",
    exp.Except: "EXCEPT",
    exp.Values: "VALUES",
    exp.Describe: "DESCRIBE",
    exp.Use: "USE",
    exp.Set: "SET",
    exp.Pragma: "PRAGMA",
    exp.Copy: "COPY",
    exp.Transaction: "BEGIN",
    exp.Commit: "COMMIT",
    exp.Rollback: "ROLLBACK",
}


def parse_select(sql: str) -> exp.Select:
    """Parse ``sql`` into a single SELECT; raise ``SqlSyntaxError`` or ``UnsupportedQuery``."""
    if not sql.strip():
        raise SqlSyntaxError("the query is empty", line=1, column=1)
    try:
        statements = [s for s in sqlglot.parse(sql, read=READ_DIALECT) if s is not None]
    except ParseError as e:
        first = e.errors[0] if e.errors else {}
        line = int(first.get("line") or 1)
        col = int(first.get("col") or 1)
        desc = str(first.get("description") or "cannot parse the query")
        # sqlglot's description repeats its token repr; keep the human part only.
        desc = desc.split(" <Token", 1)[0].split(". Line", 1)[0]
        raise SqlSyntaxError(
            f"syntax error at line {line}, column {col}: {desc}", line=line, column=col
        ) from None
    except TokenError as e:
        line, col = _position_of_token_error(sql, str(e))
        raise SqlSyntaxError(
            f"syntax error at line {line}, column {col}: cannot read the query text "
            "(an unterminated string or quoted name?)",
            line=line,
            column=col,
        ) from None
    if not statements:
        raise SqlSyntaxError("the query is empty", line=1, column=1)
    if len(statements) > 1:
        raise UnsupportedQuery(
            "send one statement per request (found several separated by ';')",
            construct="several statements",
        )
    statement = statements[0]
    if isinstance(statement, exp.Subquery):
        statement = statement.unnest()
    if not isinstance(statement, exp.Select):
        name = _statement_name(statement)
        raise UnsupportedQuery(
            f"{name} is not supported: dpgate answers aggregate SELECT queries only",
            construct=name,
        )
    return statement


def _statement_name(statement: exp.Expr) -> str:
    for cls, name in _STATEMENT_NAMES.items():
        if isinstance(statement, cls):
            return name
    if isinstance(statement, exp.Command):
        return str(statement.this).upper() or "command"
    return statement.key.upper()


def _position_of_token_error(sql: str, message: str) -> tuple[int, int]:
    """Best effort: sqlglot's TokenError names a line and column in its text."""
    import re

    m = re.search(r"[Ll]ine (\d+), [Cc]ol(?:umn)?:? (\d+)", message)
    if m:
        return int(m.group(1)), int(m.group(2))
    lines = sql.splitlines() or [""]
    return len(lines), len(lines[-1]) + 1
