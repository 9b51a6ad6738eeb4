"""Pass 1: SQL text → exactly one SELECT expression, or a precise refusal.

Syntax errors carry line and column and quote the offending token (a misspelt keyword
is named as such: ``SELEC`` → did you mean SELECT?); what sqlglot would parse by dropping
a missing piece is refused by ``malformed`` first. Several statements, non-SELECT
statements and set operations are refused by name before anything looks at tables or
columns.
"""

from __future__ import annotations

import difflib

from sqlglot import exp
from sqlglot.errors import ParseError, TokenError
from sqlglot.tokens import Token, TokenType

from gateway.core.errors import SqlSyntaxError, UnsupportedQuery
from gateway.sql.analyze.limits import check_nesting, check_text, check_tree
from gateway.sql.analyze.malformed import check_tokens, syntax_error
from gateway.sql.dialects import dialect as shared_dialect

#: Analysts write PostgreSQL-flavoured SQL: double-quoted identifiers, typed division.
READ_DIALECT = "postgres"

#: Keywords a misspelt word is compared with, to say which one was meant.
KEYWORDS = (
    "SELECT",
    "FROM",
    "WHERE",
    "GROUP",
    "ORDER",
    "BY",
    "HAVING",
    "LIMIT",
    "OFFSET",
    "DISTINCT",
    "BETWEEN",
    "AND",
    "NOT",
    "NULL",
    "LIKE",
    "CASE",
    "WHEN",
    "THEN",
    "ELSE",
    "END",
    "COUNT",
)
SEMICOLON = TokenType.SEMICOLON

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
    check_text(sql)
    dialect = shared_dialect(READ_DIALECT)
    try:
        tokens = dialect.tokenize(sql)
    except TokenError as e:
        line, col = _position_of_token_error(sql, str(e))
        raise SqlSyntaxError(
            f"syntax error at line {line}, column {col}: cannot read the query text "
            "(an unterminated string or quoted name?)",
            line=line,
            column=col,
        ) from None
    check_nesting(tokens)
    _check_first_word(sql, tokens)
    check_tokens(sql, tokens)
    try:
        statements = [s for s in dialect.parser().parse(tokens, sql) if s is not None]
    except ParseError as e:
        raise _syntax_error(sql, tokens, e) from None
    except Exception:  # sqlglot failing on text it did not expect (``WHERE #> 1``)
        # Its own bug, not the analyst's: said plainly, and free, instead of a 500.
        raise SqlSyntaxError(
            "the query cannot be parsed (the SQL parser failed on it)", line=1, column=1
        ) from None
    if not statements:
        raise SqlSyntaxError("the query is empty", line=1, column=1)
    if len(statements) > 1:
        raise UnsupportedQuery(
            "send one statement per request (found several separated by ';')",
            construct="several statements",
        )
    statement = _without_negate_flags(statements[0])
    check_tree(statement)  # and drops the parser's positions: dpgate points at tokens
    if isinstance(statement, exp.Subquery):
        statement = statement.unnest()
    if not isinstance(statement, exp.Select):
        name = _statement_name(statement)
        raise UnsupportedQuery(
            f"{name} is not supported: dpgate answers aggregate SELECT queries only",
            construct=name,
        )
    return statement


def _without_negate_flags(tree: exp.Expr) -> exp.Expr:
    """``x IS NOT NULL``, ``x NOT LIKE p`` and ``x NOT ILIKE p`` written ``NOT x IS NULL``,
    ``NOT x LIKE p``, ``NOT x ILIKE p``. sqlglot 30 parses them into a node with a
    ``negate`` flag, which every later pass would have to know of: the auditor read
    ``IS NOT NULL`` as ``IS NULL`` (another region than the SQL's: docs/design.md,
    invariant 10), and the compiler rebuilt a LIKE without it (``NOT LIKE`` ran as
    ``LIKE``). One spelling, the one they all read, is written here, once."""

    def positive(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Is | exp.Like | exp.ILike) and node.args.get("negate"):
            node.set("negate", None)
            return exp.Not(this=node)
        return node

    return tree.transform(positive, copy=False)


def _check_first_word(sql: str, tokens: list[Token]) -> None:
    """A statement starts with a keyword; a plain word there is a misspelt one (SELEC)."""
    starts = [t for i, t in enumerate(tokens) if i == 0 or tokens[i - 1].token_type == SEMICOLON]
    for token in starts:
        if token.token_type != TokenType.VAR:
            continue
        close = difflib.get_close_matches(token.text.upper(), ("SELECT", "WITH"), 1, 0.75)
        if close:
            raise syntax_error(sql, token, f"not a keyword (did you mean {close[0]}?)")


def _syntax_error(sql: str, tokens: list[Token], error: ParseError) -> SqlSyntaxError:
    """sqlglot's first error, at the offending token and quoting it.

    A misspelt keyword (``FORM``) is usually read as an alias, and sqlglot then stumbles
    on the next word: the misspelling is the offending token, so it is named instead.
    """
    first = error.errors[0] if error.errors else {}
    line = int(first.get("line") or 1)
    col = int(first.get("col") or 1)
    end = _offset(sql, line, col)
    at = next((t for t in tokens if t.start <= end <= t.end), None)
    before = [t for t in tokens if at is None or t.end < at.start]
    for token in reversed(before[-3:]):
        suggestion = _did_you_mean(token)
        if token.token_type == TokenType.VAR and suggestion:
            return syntax_error(sql, token, f"unexpected word{suggestion}")
    desc = str(first.get("description") or "cannot parse the query")
    if at is None:  # past the last token: the query stops too early
        last = tokens[-1] if tokens else None
        if last is None:
            return SqlSyntaxError("the query is empty", line=1, column=1)
        return syntax_error(sql, last, f"the query ends too early ({_problem(desc)})")
    return syntax_error(sql, at, _problem(desc))


def _problem(description: str) -> str:
    """sqlglot's description, in words about the quoted token, without its reprs."""
    if description.startswith("Invalid expression / Unexpected token"):
        return "unexpected here"
    if description.startswith("Required keyword"):
        return "incomplete: something is missing after it"
    if description.startswith("Expecting "):
        expected = description[len("Expecting ") :].strip()
        return f"expected '{expected}' after it"
    if description.startswith("Expected table name"):
        return "expected a table name after it"
    return description.split(" <Token", 1)[0].split(". Line", 1)[0]


def _did_you_mean(token: Token) -> str:
    close = difflib.get_close_matches(token.text.upper(), KEYWORDS, n=1, cutoff=0.75)
    return f" (did you mean {close[0]}?)" if close else ""


def _offset(sql: str, line: int, col: int) -> int:
    """The 0-based offset of a 1-based line and column."""
    lines = sql.split("\n")
    return sum(len(x) + 1 for x in lines[: line - 1]) + col - 1


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
