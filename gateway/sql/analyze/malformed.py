"""Pass 1a: refuse SQL that sqlglot's tolerant parser accepts but no database would.

sqlglot reads ``GROUP BY`` with nothing after it, trailing and leading commas
(``SELECT COUNT(*), FROM t``, ``IN ('F',)``), ``IN ()``, ``COUNT()`` and a dangling
``AS`` without complaint, dropping what is missing. dpgate must not answer — and charge
for — a query that is not the one the analyst meant, so these are syntax errors here,
found on the token stream (where the missing piece is still visible) and reported at
the offending token, quoted. ``tests/fixtures/analyze.yaml`` (section ``malformed``)
lists them.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlglot.tokens import Token, TokenType

from gateway.core.errors import SqlSyntaxError

#: Tokens that start a clause: what follows a list, never an item of it.
CLAUSES = frozenset(
    {
        TokenType.SELECT,
        TokenType.FROM,
        TokenType.WHERE,
        TokenType.GROUP_BY,
        TokenType.HAVING,
        TokenType.ORDER_BY,
        TokenType.LIMIT,
        TokenType.OFFSET,
        TokenType.UNION,
        TokenType.INTERSECT,
        TokenType.EXCEPT,
    }
)
#: What must be followed by at least one item (a set operation is followed by a SELECT).
NEEDS_ITEM = (CLAUSES - {TokenType.UNION, TokenType.INTERSECT, TokenType.EXCEPT}) | {
    TokenType.DISTINCT,
    TokenType.ALIAS,
}
#: Where a list or an expression has ended.
ENDS = frozenset({TokenType.SEMICOLON, TokenType.R_PAREN}) | CLAUSES
#: Tokens after which a list begins, so a comma there has nothing before it.
OPENS = frozenset(
    {
        TokenType.SELECT,
        TokenType.DISTINCT,
        TokenType.GROUP_BY,
        TokenType.ORDER_BY,
        TokenType.L_PAREN,
        TokenType.COMMA,
        TokenType.FROM,
    }
)
#: Aggregates that need an argument (``COUNT(*)`` is the parameterless spelling).
AGGREGATES = frozenset({"COUNT", "SUM", "AVG", "MIN", "MAX"})


def check_tokens(sql: str, tokens: Sequence[Token]) -> None:
    """Raise ``SqlSyntaxError`` at the first construct sqlglot would silently repair."""
    for i, token in enumerate(tokens):
        before = tokens[i - 1] if i > 0 else None
        after = tokens[i + 1] if i + 1 < len(tokens) else None
        kind = token.token_type
        if kind == TokenType.COMMA:
            if before is None or before.token_type in OPENS:
                raise syntax_error(sql, token, "there is no item before this comma")
            if after is None or after.token_type in ENDS or after.token_type == TokenType.COMMA:
                raise syntax_error(
                    sql, token, f"a comma must be followed by an item, not {_what(sql, after)}"
                )
        elif kind in NEEDS_ITEM and (after is None or after.token_type in ENDS):
            raise syntax_error(
                sql, token, f"nothing follows {_quote(sql, token)} but {_what(sql, after)}"
            )
        elif kind == TokenType.L_PAREN and _is(after, TokenType.R_PAREN) and before is not None:
            if before.token_type == TokenType.IN:
                raise syntax_error(sql, before, "IN () lists no values")
            if before.text.upper() in AGGREGATES:
                name = before.text.upper()
                raise syntax_error(
                    sql,
                    before,
                    f"{name}() needs an argument: "
                    + ("COUNT(*) or COUNT(column)" if name == "COUNT" else f"{name}(column)"),
                )


def _is(token: Token | None, kind: TokenType) -> bool:
    return token is not None and token.token_type == kind


def syntax_error(sql: str, token: Token, problem: str) -> SqlSyntaxError:
    """A syntax error at ``token``: its position, and the token quoted as written."""
    line, column = position(sql, token.start)
    return SqlSyntaxError(
        f"syntax error at line {line}, column {column}, at {_quote(sql, token)}: {problem}",
        line=line,
        column=column,
        near=source_text(sql, token),
    )


def position(sql: str, offset: int) -> tuple[int, int]:
    """1-based line and column of a character offset in ``sql``."""
    offset = max(0, min(offset, len(sql)))
    line = sql.count("\n", 0, offset) + 1
    column = offset - (sql.rfind("\n", 0, offset) + 1) + 1
    return line, column


def source_text(sql: str, token: Token) -> str:
    """The token as the analyst wrote it (quotes included), kept short."""
    text = sql[token.start : token.end + 1] or token.text
    return text if len(text) <= 40 else text[:37] + "..."


def _quote(sql: str, token: Token) -> str:
    return f"'{source_text(sql, token)}'"


def _what(sql: str, token: Token | None) -> str:
    if token is None or token.token_type == TokenType.SEMICOLON:
        return "the end of the query"
    return _quote(sql, token)
