"""Pass 0b: limits on the token stream, checked before the parser recurses.

sqlglot's parser descends once per nesting level (a parenthesis, a function call, a
subquery, a CASE, a prefix NOT or minus): SQL nested some 500 deep exhausts Python's
recursion before any later pass could refuse it, and a long flat chain (``age > 1 AND
…`` over 96 kB) costs seconds of CPU to parse and walk. Both are measured here on the
tokens, in one linear pass, and refused — free — at a depth and a length no accepted
query comes near: the analyzer's own caps (``gateway.sql.analyze.totality``: 32 levels and
512 nodes per expression, IN lists of 1,000 values) are far inside them. A chain of ANDs
or ORs is one level, not one per term (the parser's tree for it is left-deep, the query
is flat): its length is bounded by counting its connectives here.

Once parsed, the statement's tree is measured in the same walk that drops the parser's
positions (``check_tree``), before any later pass copies, resolves or prints it: its
depth (a chain of binary operators, ``a + b + c …``, is one level per operator in the
tree though the text shows no bracket), its size and its longest list. Past these the
later passes would refuse it anyway (an accepted row expression has at most 32 levels
and 512 nodes), but only after work that grows with the tree; here the refusal costs
the parse and one walk.

A NUL character is refused too: no backend stores one in text (PostgreSQL rejects it,
SQLite's C strings end at it), so a literal holding one would pass the analyzer and
fail at the database, charged.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from sqlglot import exp
from sqlglot.tokens import Token, TokenType

from gateway.core.errors import UnsupportedQuery

#: Deepest nesting of parentheses, CASE … END and prefix operators in one statement.
MAX_NESTING = 64
#: Most tokens in one statement: an IN list of 1,000 values is 2,000 of them.
MAX_TOKENS = 8_000
#: Most ANDs and ORs in one statement. A chain of them (``x = 1 OR x = 2 OR …``) is one
#: level of nesting however long it is (``gateway.sql.analyze.totality``), so its length is
#: bounded here, before the parser and the later passes spend time per term: an
#: expression holds at most 512 nodes (``totality.MAX_NODES``), some 128 comparisons.
MAX_CONNECTIVES = 512
#: Most words and symbols in the text, counted before tokenizing: a token is one or two
#: of them, except a string literal or quoted name (``gateway.sql.analyze.totality`` caps
#: their characters at 1,024 in all), so past this many the tokens are past MAX_TOKENS.
MAX_PIECES = 2 * MAX_TOKENS + 1_024
#: Deepest tree of one statement, a chain of one connective counted as one level (as
#: ``totality`` counts it). An accepted statement is far shallower: its row expressions
#: nest at most 32 levels (``totality.MAX_DEPTH``) under a few levels of clauses and
#: wrapper subqueries.
MAX_TREE_DEPTH = 128
#: Most nodes in one statement's tree, the values of IN lists aside (a list is matched
#: by lookup, and its length has a cap of its own: ``totality.MAX_IN_LIST``): four row
#: expressions of the largest size ``totality.MAX_NODES`` allows.
MAX_STATEMENT_NODES = 2_048
#: Most items in any other list: select list, GROUP BY, ORDER BY, function arguments,
#: CASE branches, joins.
MAX_LIST_ITEMS = 256
_PIECE = re.compile(r"\w+|[^\w\s]")

_OPEN = frozenset({TokenType.L_PAREN, TokenType.L_BRACKET, TokenType.L_BRACE, TokenType.CASE})
_CLOSE = frozenset({TokenType.R_PAREN, TokenType.R_BRACKET, TokenType.R_BRACE, TokenType.END})
#: Operators that nest what follows them without a parenthesis.
_PREFIX = frozenset({TokenType.NOT, TokenType.DASH, TokenType.PLUS, TokenType.TILDE})
_CONNECTIVES = frozenset({TokenType.AND, TokenType.OR})


def check_text(sql: str) -> None:
    """Refuse a NUL character anywhere in the text (no backend can hold it), and text of
    more than ``MAX_PIECES`` words and symbols: counted by one regular expression (in
    C), before the tokenizer's Python loop spends 200 ms on 100,000 of them."""
    if "\x00" in sql:
        raise UnsupportedQuery(
            "the query holds a NUL character (U+0000), which no database accepts in text",
            construct="NUL character",
        )
    if too_many_pieces(sql):
        raise _limit(
            f"the query has more than {MAX_PIECES:,} words and symbols", "max_tokens", MAX_TOKENS
        )


def too_many_pieces(sql: str) -> bool:
    """Whether ``sql`` has more than ``MAX_PIECES`` words and symbols (one regular
    expression, in C): past it the text is refused before anything tokenizes it."""
    return len(_PIECE.findall(sql)) > MAX_PIECES


def check_nesting(tokens: Sequence[Token]) -> None:
    """Raise ``UnsupportedQuery`` (``detail.limit``) if the statement has more than
    ``MAX_TOKENS`` tokens or ``MAX_CONNECTIVES`` ANDs and ORs, or nests deeper than
    ``MAX_NESTING``."""
    if len(tokens) > MAX_TOKENS:
        raise _limit(f"the query has more than {MAX_TOKENS:,} tokens", "max_tokens", MAX_TOKENS)
    outer: list[int] = []  # the nesting outside each open bracket
    depth = run = 0  # nesting of the open brackets; prefix operators just read
    connectives = 0
    for token in tokens:
        kind = token.token_type
        if kind in _CONNECTIVES:
            connectives += 1
            if connectives > MAX_CONNECTIVES:
                raise _limit(
                    f"the query has more than {MAX_CONNECTIVES} ANDs and ORs",
                    "max_connectives",
                    MAX_CONNECTIVES,
                )
        if kind in _OPEN:
            outer.append(depth)
            depth += run + 1
            run = 0
        elif kind in _CLOSE:
            depth = outer.pop() if outer else 0
            run = 0
        elif kind in _PREFIX:
            run += 1
        else:
            run = 0
        if depth + run > MAX_NESTING:
            raise _limit(
                f"the query nests deeper than {MAX_NESTING} levels", "max_nesting", MAX_NESTING
            )


def check_tree(statement: exp.Expr) -> None:
    """Raise ``UnsupportedQuery`` (``detail.limit``) if the parsed statement is deeper
    than ``MAX_TREE_DEPTH``, has more than ``MAX_STATEMENT_NODES`` nodes or a list of
    more than ``MAX_LIST_ITEMS`` items. Drops each node's position in the text (``meta``)
    on the way: it is the parser's, for its own errors, and left in place every copy of
    the tree (its canonical text is generated from one) deep-copies a dict per identifier
    and literal. One iterative walk: no recursion on any tree."""
    nodes = 0
    stack: list[tuple[exp.Expr, int]] = [(statement, 0)]
    while stack:
        node, depth = stack.pop()
        node._meta = None
        nodes += 1
        if depth > MAX_TREE_DEPTH:
            raise _limit(
                f"the query nests deeper than {MAX_TREE_DEPTH} levels (each operator of a "
                "chain like a + b + c is a level; a chain of ANDs or of ORs is one)",
                "max_tree_depth",
                MAX_TREE_DEPTH,
            )
        if nodes > MAX_STATEMENT_NODES:
            raise _limit(
                f"the query has more than {MAX_STATEMENT_NODES:,} terms (IN lists aside)",
                "max_statement_nodes",
                MAX_STATEMENT_NODES,
            )
        chain = type(node) if isinstance(node, exp.Connector) else None
        for key, value in node.args.items():
            if type(value) is list:
                if isinstance(node, exp.In) and key == "expressions":
                    nodes -= sum(type(v) is exp.Literal for v in value)
                elif len(value) > MAX_LIST_ITEMS:
                    raise _limit(
                        f"a list in the query has more than {MAX_LIST_ITEMS} items",
                        "max_list_items",
                        MAX_LIST_ITEMS,
                    )
                for child in value:
                    if isinstance(child, exp.Expr):
                        stack.append((child, depth if type(child) is chain else depth + 1))
            elif isinstance(value, exp.Expr):
                stack.append((value, depth if type(value) is chain else depth + 1))


def _limit(message: str, limit: str, value: int) -> UnsupportedQuery:
    return UnsupportedQuery(
        f"{message} (limit: {limit} = {value})", construct=f"limit {limit}", limit=limit
    )
