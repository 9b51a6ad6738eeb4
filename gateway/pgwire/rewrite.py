"""Where a statement goes, and catalogue SQL rewritten onto the emulated catalogue.

``classify`` sorts one statement of a client into:

- ``session``: SET, SHOW, RESET, BEGIN/COMMIT/ROLLBACK, DISCARD, DEALLOCATE — answered
  by the session itself, from public settings;
- ``catalog``: a SELECT that reads only ``pg_catalog`` / ``information_schema`` tables (or
  no table at all: ``SELECT version()``) — answered by ``gateway.pgwire.catalog`` from the
  config;
- ``query``: everything else — sent, as text, through the same pipeline as
  ``POST /v1/query`` (which refuses what it does not support, free).

Catalogue SQL is parsed by sqlglot as PostgreSQL, its catalogue names mapped onto the
emulated tables, PostgreSQL-only functions and casts replaced by equivalents, and
generated for DuckDB. A catalogue query naming any table that is not emulated (a
protected table among them) is refused, never half-answered.
"""

from __future__ import annotations

import itertools
import re
from typing import Literal

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, SqlglotError
from sqlglot.tokens import TokenType

from gateway.core.errors import UnsupportedQuery
from gateway.pgwire.catalog import CATALOG_SCHEMA, INFO_SCHEMA
from gateway.pgwire.catalog_tables import CATALOG_TABLES, INFORMATION_SCHEMA_TABLES
from gateway.pgwire.translate import (
    SessionContext,
    _casts,
    _function_name,
    _functions,
    _is_pg_catalog,
    _operators,
    _pg_name,
)
from gateway.sql.analyze.limits import check_nesting, check_text, too_many_pieces
from gateway.sql.dialects import dialect

Route = Literal["session", "catalog", "query", "empty"]

_SESSION = re.compile(
    r"^\s*(SET|SHOW|RESET|BEGIN|START|COMMIT|END|ROLLBACK|ABORT|DISCARD|DEALLOCATE|"
    r"SAVEPOINT|RELEASE|LISTEN|UNLISTEN|CLOSE)\b",
    re.IGNORECASE,
)
_TABLE_FUNCTIONS = ("generate_series", "unnest", "pg_get_keywords")
_SCHEMAS = {"pg_catalog": CATALOG_SCHEMA, "information_schema": INFO_SCHEMA}


def split_statements(sql: str) -> list[str]:
    """The statements of a simple Query message, split at top-level semicolons.

    Uses sqlglot's tokenizer so semicolons in strings, identifiers and comments do not
    split; text that does not tokenise is one statement (the pipeline reports the error).
    """
    if too_many_pieces(sql):  # refused whole by the pipeline, before anything tokenizes it
        return [sql]
    try:
        tokens = dialect("postgres").tokenize(sql)
    except SqlglotError:
        return [sql] if sql.strip() else []
    parts: list[str] = []
    start = 0
    for token in tokens:
        if token.token_type == TokenType.SEMICOLON:
            parts.append(sql[start : token.start])
            start = token.end + 1
    parts.append(sql[start:])
    return [p for p in parts if p.strip()]


def classify(sql: str) -> tuple[Route, exp.Expr | None]:
    """Where ``sql`` goes, and its parse tree when it is a catalogue query."""
    if not sql.strip() or not _strip_comments(sql).strip():
        return "empty", None
    if _SESSION.match(_strip_comments(sql)):
        return "session", None
    postgres = dialect("postgres")
    try:  # the input limits first: what is past one is the pipeline's to refuse, by name
        check_text(sql)
        tokens = postgres.tokenize(sql)
        check_nesting(tokens)
    except (UnsupportedQuery, SqlglotError):
        return "query", None
    try:
        tree = next(iter(postgres.parser().parse(tokens, sql)), None)
        if tree is None:
            raise ParseError(f"No expression was parsed from '{sql}'")
    except (SqlglotError, TypeError, ValueError, RecursionError) as e:
        # sqlglot's own failures too (``WHERE #> 1`` is a TypeError): the gateway's
        # parser, behind its input limits, says what is wrong with the query
        quoted = _quote_keyword_aliases(sql) if isinstance(e, SqlglotError) else None
        if quoted is None:
            return "query", None
        try:  # `… AS select` (Metabase's privileges query): PostgreSQL takes a keyword
            tree = sqlglot.parse_one(quoted, read="postgres")  # after AS as a name
        except (SqlglotError, TypeError, ValueError, RecursionError):
            return "query", None
    if not isinstance(tree, exp.Query):
        return "query", None
    tables = list(tree.find_all(exp.Table))
    ctes = {c.alias_or_name.lower() for c in tree.find_all(exp.CTE)}
    if all(_is_catalog_table(t, ctes) for t in tables):
        return "catalog", tree
    return "query", None


def _quote_keyword_aliases(sql: str) -> str | None:
    """``sql`` with each keyword written right after AS double-quoted (None: none)."""
    try:
        tokens = sqlglot.Tokenizer(dialect="postgres").tokenize(sql)
    except SqlglotError:
        return None
    spans = [
        (token.start, token.end)
        for before, token in itertools.pairwise(tokens)
        if before.token_type == TokenType.ALIAS
        and token.token_type not in (TokenType.VAR, TokenType.IDENTIFIER, TokenType.STRING)
        and token.text.isidentifier()
    ]
    if not spans:
        return None
    out = sql
    for start, end in reversed(spans):
        out = out[:start] + '"' + out[start : end + 1].lower() + '"' + out[end + 1 :]
    return out


def _strip_comments(sql: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", sql, flags=re.DOTALL)
    return re.sub(r"--[^\n]*", " ", text)


def _is_catalog_table(table: exp.Table, ctes: set[str]) -> bool:
    if not isinstance(table.this, exp.Identifier):
        return _table_function(table) is not None
    name = table.name.lower()
    db = table.db.lower()
    if db in ("pg_catalog", "information_schema"):
        return True
    if not db:
        return name in CATALOG_TABLES or name in ctes
    return False


def _table_function(table: exp.Table) -> str | None:
    inner = table.this
    if isinstance(inner, exp.ExplodingGenerateSeries | exp.GenerateSeries):
        return "generate_series"
    if isinstance(inner, exp.StringToArray):
        return "string_to_array"  # one row, one array (Grafana's search_path walk)
    if isinstance(inner, exp.Anonymous) and str(inner.this).lower() in _TABLE_FUNCTIONS:
        return str(inner.this).lower()
    return None


#: Functions that turn a short statement into a huge allocation (the statement timeout
#: interrupts between operators, not inside one). No catalogue query of a client uses them.
_AMPLIFIERS = frozenset(
    {
        "repeat",
        "lpad",
        "rpad",
        "pad",
        "space",
        "range",
        "list_resize",
        "array_resize",
        "printf",
        "generate_series",
        "explodinggenerateseries",
        "generatedaterange",
    }
)


def rewrite_catalog(tree: exp.Expr, context: SessionContext) -> str:
    """The catalogue query as DuckDB SQL over the emulated tables.

    Its result columns are named as PostgreSQL names them (``name_columns``), and it may
    call only the functions in ``_ALLOWED_FUNCTIONS`` once rewritten: whatever else the
    engine underneath offers stays out of reach, so no answer tells what it runs on.
    """
    tree = name_columns(tree.copy())
    for func in tree.find_all(exp.Func):
        name = _function_name(func)
        key = name.replace("_", "")
        if isinstance(func.parent, exp.Table) and key in (
            "generateseries",
            "unnest",
            "explodinggenerateseries",
        ):
            continue  # generate_series(…) as a table: rows stream, under the timeout
        if key in _AMPLIFIERS or type(func).__name__.lower() in _AMPLIFIERS:
            raise UnsupportedQuery(
                f"{name}() is not available in catalogue queries", construct="catalog"
            )
    ctes = {c.alias_or_name.lower() for c in tree.find_all(exp.CTE)}
    for table in list(tree.find_all(exp.Table)):
        if _table_function(table) == "pg_get_keywords":
            table.set("this", exp.to_identifier("dpg_keywords"))
            table.set("db", exp.to_identifier(CATALOG_SCHEMA))
            table.set("catalog", None)
            continue
        if not isinstance(table.this, exp.Identifier):
            table.set("db", None)  # pg_catalog.generate_series(…) → generate_series(…)
            table.set("catalog", None)
            _name_function_column(table)
            continue
        name, db = table.name.lower(), table.db.lower()
        if not db and name in ctes:
            continue
        if db == "information_schema":
            if name not in INFORMATION_SCHEMA_TABLES:
                raise UnsupportedQuery(
                    f"information_schema.{name} is not available through dpgate",
                    construct="catalog",
                )
            schema = INFO_SCHEMA
        else:
            if name not in CATALOG_TABLES or name.startswith("dpg_"):
                raise UnsupportedQuery(
                    f"pg_catalog.{name} is not available through dpgate", construct="catalog"
                )
            schema = CATALOG_SCHEMA
        table.set("db", exp.to_identifier(schema))
        table.set("catalog", None)
        table.set("this", exp.to_identifier(name))
    for column in tree.find_all(exp.Column):
        qualifier = column.args.get("db")
        if isinstance(qualifier, exp.Identifier) and qualifier.name.lower() in _SCHEMAS:
            column.set("db", exp.to_identifier(_SCHEMAS[qualifier.name.lower()]))
            column.set("catalog", None)
    for rewrite in (_unqualify, _operators, _casts):
        tree = tree.transform(rewrite)
    tree = tree.transform(lambda node: _functions(node, context))
    _check_functions(tree)
    return tree.sql(dialect="duckdb")


def _name_function_column(table: exp.Table) -> None:
    """A function in FROM, aliased ``f(…) AS x``, has one column named ``x`` too, as in
    PostgreSQL; a scalar one (string_to_array) becomes a one-row subquery."""
    alias = table.args.get("alias")
    if not isinstance(alias, exp.TableAlias) or not alias.name or alias.columns:
        return
    name = alias.name
    if isinstance(table.this, exp.StringToArray):
        row = exp.select(exp.alias_(table.this.copy(), name)).subquery(name)
        table.replace(row)
        return
    alias.set("columns", [exp.to_identifier(name)])


def _unqualify(node: exp.Expr) -> exp.Expr:
    if isinstance(node, exp.Dot) and _is_pg_catalog(node.this):
        return node.expression  # pg_catalog.func(...) → func(...)
    if isinstance(node, exp.Collate):
        return node.this
    if isinstance(node, exp.ByteString):
        return exp.Literal.string(str(node.this))
    return node


class UndefinedFunction(UnsupportedQuery):
    """A function the emulated catalogue does not offer (SQLSTATE 42883)."""


#: What a rewritten catalogue query may call: standard SQL functions (sqlglot's typed
#: nodes, by class name), and by name the catalogue's own macros and the few engine
#: functions the rewrites produce. Everything else is refused as PostgreSQL refuses an
#: unknown function, so no engine-only function (typeof, uuid, pragma_*, …) answers.
_ALLOWED_FUNCTIONS = frozenset(
    {
        "And", "Or", "Xor", "Cast", "TryCast", "If", "Case", "Array", "Coalesce", "Nullif",
        "Greatest", "Least", "Count", "Sum", "Min", "Max", "Avg", "ArrayAgg", "GroupConcat",
        "Lower", "Upper", "Initcap", "Length", "Substring", "Concat", "ConcatWs", "Trim",
        "Replace", "Left", "Right", "StrPosition", "SplitPart", "StartsWith", "Reverse",
        "RegexpLike", "RegexpILike", "RegexpReplace", "Abs", "Round", "Floor", "Ceil",
        "Exists", "Unnest", "GenerateSeries", "ExplodingGenerateSeries", "ArrayToString",
        "ArraySize", "ArrayContains", "StringToArray", "Split", "ArrayPosition",
        "RowNumber", "Rank", "DenseRank",
    }
)  # fmt: skip
_ALLOWED_BY_NAME = frozenset(
    {
        "dpg_format_type", "dpg_table_is_visible", "dpg_regclass", "dpg_regclass_name",
        "dpg_regtype", "dpg_regtype_name", "dpg_regnamespace_name", "len", "json_object",
        "array_to_string", "replace", "string_to_array", "regexp_matches",
    }
)  # fmt: skip


def _check_functions(tree: exp.Expr) -> None:
    for func in tree.find_all(exp.Func):
        if isinstance(func, exp.Anonymous):
            allowed = str(func.this).lower() in _ALLOWED_BY_NAME
        else:
            allowed = type(func).__name__ in _ALLOWED_FUNCTIONS
        if not allowed:
            raise UndefinedFunction(
                f"function {_function_name(func)}() does not exist in dpgate's catalogue",
                construct="catalog",
            )


def name_columns(tree: exp.Expr) -> exp.Expr:
    """The query with each unnamed result column named as PostgreSQL would name it.

    PostgreSQL (``FigureColname``): a column reference is named after the column, a
    function call after the function, a cast after what it casts (or the type), CASE
    ``case``, a scalar subquery after its own column, EXISTS ``exists``, ARRAY
    ``array``, anything else ``?column?``. The engine below would name them after the
    expression's text, which is neither PostgreSQL's nor free of its own spelling.
    """
    select = tree
    while isinstance(select, exp.SetOperation):
        select = select.this
    if not isinstance(select, exp.Select):
        return tree
    named: list[exp.Expr] = []
    for item in select.expressions:
        if isinstance(item, exp.Alias | exp.Star | exp.Column) or (
            isinstance(item, exp.Column) and isinstance(item.this, exp.Star)
        ):
            named.append(item)
            continue
        named.append(exp.alias_(item, _pg_name(item) or "?column?", quoted=True))
    select.set("expressions", named)
    return tree
