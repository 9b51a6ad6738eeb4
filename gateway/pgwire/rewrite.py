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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, SqlglotError
from sqlglot.tokens import TokenType

from gateway.core.errors import UnsupportedQuery
from gateway.pgwire.catalog import CATALOG_SCHEMA, INFO_SCHEMA, VERSION_TEXT
from gateway.pgwire.catalog_settings import DATABASE, OWNER
from gateway.pgwire.catalog_tables import CATALOG_TABLES, INFORMATION_SCHEMA_TABLES
from gateway.pgwire.commands import UnknownSetting
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


@dataclass(frozen=True)
class SessionContext:
    """What catalogue functions answer for this connection."""

    user: str
    process_id: int
    settings: dict[str, str]


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


def _casts(node: exp.Expr) -> exp.Expr:
    if isinstance(node, exp.Div) and _integral(node.this) and _integral(node.expression):
        return exp.IntDiv(this=node.this, expression=node.expression)  # PostgreSQL's int / int
    return _cast(node) if isinstance(node, exp.Cast) else node


def _integral(node: exp.Expr) -> bool:
    """Integer-typed by its spelling alone: an integer literal or a cast to an integer."""
    if isinstance(node, exp.Paren):
        return _integral(node.this)
    if isinstance(node, exp.Literal):
        return not node.is_string and node.name.isdigit()
    return isinstance(node, exp.Cast) and node.to.is_type(*exp.DataType.INTEGER_TYPES)


def _operators(node: exp.Expr) -> exp.Expr:
    if isinstance(node, exp.Operator):
        op = str(node.args.get("operator") or "").split(".")[-1].strip()
        builder = _OPERATORS.get(op)
        if builder is None:
            raise UnsupportedQuery(f"operator {op} is not available", construct="catalog")
        return builder(node.this, node.expression)
    return node


def _functions(node: exp.Expr, context: SessionContext) -> exp.Expr:
    if isinstance(node, exp.CurrentUser | exp.SessionUser) or (
        isinstance(node, exp.Column)
        and not node.table
        and node.name.lower() == "user"
        and not node.this.args.get("quoted")
    ):  # `user` unquoted is PostgreSQL's keyword for current_user
        return exp.Literal.string(context.user)
    if isinstance(node, exp.CurrentSchema):
        return exp.Literal.string("public")
    if isinstance(node, exp.CurrentSchemas):
        return exp.Array(
            expressions=[exp.Literal.string("pg_catalog"), exp.Literal.string("public")]
        )
    if isinstance(node, exp.CurrentDatabase | exp.CurrentCatalog):
        return exp.Literal.string(DATABASE)
    if isinstance(node, exp.Func):
        name = _function_name(node)
        replacement = _FUNCTIONS.get(name)
        if replacement is not None:
            args = [a.transform(lambda n: _functions(n, context)) for a in _arguments(node)]
            return replacement(args, context)
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


def _pg_name(node: exp.Expr) -> str | None:
    """PostgreSQL's name for an unaliased result column (None: ``?column?``)."""
    if isinstance(node, exp.Paren):
        return _pg_name(node.this)
    if isinstance(node, exp.Column):
        return None if isinstance(node.this, exp.Star) else node.name
    if isinstance(node, exp.Dot):
        return _pg_name(node.expression)
    if isinstance(node, exp.Alias):
        return node.alias
    if isinstance(node, exp.Cast):
        return _pg_name(node.this) or _type_name(node.to) or None
    if isinstance(node, exp.Case):
        return "case"
    if isinstance(node, exp.Exists):
        return "exists"
    if isinstance(node, exp.Array):
        return "array"
    if isinstance(node, exp.Subquery):
        inner = node.this
        if isinstance(inner, exp.Select) and inner.expressions:
            first = inner.expressions[0]
            return first.alias if isinstance(first, exp.Alias) else _pg_name(first)
        return None
    if isinstance(node, exp.Bracket):
        return _pg_name(node.this)
    if isinstance(node, exp.CurrentVersion):
        return "version"
    if isinstance(node, exp.Anonymous):
        return str(node.this).lower()
    if isinstance(node, exp.Func):
        text = node.sql(dialect="postgres")
        head = text.split("(", 1)[0].strip()
        return head.split(".")[-1].strip('"').lower() or None
    return None


def _is_pg_catalog(node: exp.Expr) -> bool:
    return isinstance(node, exp.Identifier | exp.Column) and node.name.lower() == "pg_catalog"


def _function_name(node: exp.Func) -> str:
    if isinstance(node, exp.Anonymous):
        return str(node.this).lower()
    return node.sql_name().lower()


def _arguments(node: exp.Func) -> list[exp.Expr]:
    if isinstance(node, exp.Anonymous):
        return list(node.expressions)
    args: list[exp.Expr] = []
    for value in node.args.values():
        if isinstance(value, list):
            args.extend(v for v in value if isinstance(v, exp.Expr))
        elif isinstance(value, exp.Expr):
            args.append(value)
    return args


def _regex(this: exp.Expr, pattern: exp.Expr) -> exp.Expr:
    return exp.RegexpLike(this=this, expression=pattern)


_OPERATORS: dict[str, Callable[[exp.Expr, exp.Expr], exp.Expr]] = {
    "~": _regex,
    "!~": lambda a, b: exp.Not(this=_regex(a, b)),
    "~*": lambda a, b: exp.RegexpILike(this=a, expression=b),
    "=": lambda a, b: exp.EQ(this=a, expression=b),
    "<>": lambda a, b: exp.NEQ(this=a, expression=b),
    "~~": lambda a, b: exp.Like(this=a, expression=b),
}


def _const(value: object) -> Callable[[list[exp.Expr], SessionContext], exp.Expr]:
    def build(_args: list[exp.Expr], _context: SessionContext) -> exp.Expr:
        if value is None:
            return exp.Null()
        if isinstance(value, bool):
            return exp.Boolean(this=value)
        if isinstance(value, int):
            return exp.Literal.number(value)
        return exp.Literal.string(str(value))

    return build


def _call(name: str) -> Callable[[list[exp.Expr], SessionContext], exp.Expr]:
    def build(args: list[exp.Expr], _context: SessionContext) -> exp.Expr:
        return exp.Anonymous(this=name, expressions=args)

    return build


def _format_type(args: list[exp.Expr], _context: SessionContext) -> exp.Expr:
    return exp.Anonymous(this="dpg_format_type", expressions=[args[0], exp.Null()])


def _current_setting(args: list[exp.Expr], context: SessionContext) -> exp.Expr:
    """A setting of the session (PostgreSQL's names, case-insensitive); an unknown one is
    an error (42704) unless the second argument, missing_ok, is true."""
    if args and isinstance(args[0], exp.Literal):
        wanted = args[0].name.lower()
        for name, value in context.settings.items():
            if name.lower() == wanted:
                return exp.Literal.string(value)
        missing_ok = len(args) > 1 and isinstance(args[1], exp.Boolean) and args[1].this
        if not missing_ok:
            raise UnknownSetting(f'unrecognized configuration parameter "{args[0].name[:64]}"')
    return exp.Null()


def _format(args: list[exp.Expr], _context: SessionContext) -> exp.Expr:
    """``format('…%s…%I…', …)`` as a concatenation (no width or position specifiers:
    those could make a short statement allocate without bound)."""
    if not args or not (isinstance(args[0], exp.Literal) and args[0].is_string):
        raise UnsupportedQuery("format() needs a literal format string", construct="catalog")
    parts = re.split(r"(%[sIL%])", args[0].name)
    values = iter(args[1:])
    pieces: list[exp.Expr] = []
    for part in parts:
        if part == "%%":
            pieces.append(exp.Literal.string("%"))
        elif part in ("%s", "%I", "%L"):
            value = next(values, None)
            if value is None:
                raise UnsupportedQuery("too few arguments for format()", construct="catalog")
            text: exp.Expr = exp.cast(value, exp.DataType.build("VARCHAR"))
            if part == "%I":
                text = _quote_ident([text], _context)
            elif part == "%L":
                doubled = exp.Anonymous(
                    this="replace",
                    expressions=[text, exp.Literal.string("'"), exp.Literal.string("''")],
                )
                text = exp.DPipe(
                    this=exp.DPipe(this=exp.Literal.string("'"), expression=doubled),
                    expression=exp.Literal.string("'"),
                )
            pieces.append(text)
        elif "%" in part:
            raise UnsupportedQuery(
                "format() supports only %s, %I, %L and %% here", construct="catalog"
            )
        elif part:
            pieces.append(exp.Literal.string(part))
    if not pieces:
        return exp.Literal.string("")
    result = pieces[0]
    for piece in pieces[1:]:
        result = exp.DPipe(this=result, expression=piece)
    return result


def _set_config(args: list[exp.Expr], _context: SessionContext) -> exp.Expr:
    return args[1] if len(args) > 1 else exp.Null()


def _quote_ident(args: list[exp.Expr], _context: SessionContext) -> exp.Expr:
    """PostgreSQL's quote_ident: quoted only when it must be (not all lower-case letters,
    digits and underscores; keywords are not singled out)."""
    doubled = exp.Anonymous(
        this="replace",
        expressions=[args[0], exp.Literal.string('"'), exp.Literal.string('""')],
    )
    quoted = exp.DPipe(
        this=exp.DPipe(this=exp.Literal.string('"'), expression=doubled),
        expression=exp.Literal.string('"'),
    )
    plain = exp.RegexpLike(this=args[0], expression=exp.Literal.string("^[a-z_][a-z0-9_$]*$"))
    return exp.Case(ifs=[exp.If(this=plain, true=args[0])], default=quoted)


def _array_length(args: list[exp.Expr], _context: SessionContext) -> exp.Expr:
    return exp.Anonymous(this="len", expressions=args[:1])


def _backend_pid(_args: list[exp.Expr], context: SessionContext) -> exp.Expr:
    return exp.Literal.number(context.process_id)


_FUNCTIONS: dict[str, Callable[[list[exp.Expr], SessionContext], exp.Expr]] = {
    "version": _const(VERSION_TEXT),
    "current_version": _const(VERSION_TEXT),
    "format": _format,
    "parse_ident": lambda args, _c: exp.Anonymous(
        this="string_to_array",
        expressions=[
            exp.Anonymous(
                this="replace",
                expressions=[args[0], exp.Literal.string('"'), exp.Literal.string("")],
            ),
            exp.Literal.string("."),
        ],
    ),
    "array_lower": _const(1),
    "current_schemas": lambda _args, _c: exp.Array(
        expressions=[exp.Literal.string("pg_catalog"), exp.Literal.string("public")]
    ),
    "pg_get_userbyid": _const(OWNER),
    "pg_encoding_to_char": _const("UTF8"),
    "pg_get_expr": _const(None),
    "pg_get_indexdef": _const(None),
    "pg_get_constraintdef": _const(None),
    "pg_get_viewdef": _const(None),
    "pg_get_triggerdef": _const(None),
    "pg_get_partkeydef": _const(None),
    "pg_get_function_identity_arguments": _const(None),
    "pg_get_statisticsobjdef_columns": _const(None),
    "obj_description": _const(None),
    "col_description": _const(None),
    "shobj_description": _const(None),
    "has_table_privilege": _const(True),
    "has_schema_privilege": _const(True),
    "has_database_privilege": _const(True),
    "has_column_privilege": _const(True),
    "has_any_column_privilege": _const(True),
    "pg_has_role": _const(False),
    "pg_relation_is_publishable": _const(False),
    "pg_is_in_recovery": _const(False),
    "pg_type_is_visible": _const(True),
    "pg_collation_is_visible": _const(True),
    "pg_get_serial_sequence": _const(None),
    "pg_function_is_visible": _const(True),
    "pg_is_other_temp_schema": _const(False),
    "pg_my_temp_schema": _const(0),
    "pg_tablespace_location": _const(""),
    "pg_total_relation_size": _const(None),
    "pg_relation_size": _const(None),
    "pg_table_size": _const(None),
    "pg_indexes_size": _const(None),
    "pg_size_pretty": _const(None),
    "pg_postmaster_start_time": _const(None),
    "inet_server_addr": _const(None),
    "inet_server_port": _const(None),
    "txid_current": _const(None),
    "format_type": _format_type,
    "pg_table_is_visible": _call("dpg_table_is_visible"),
    "to_regtype": _call("dpg_regtype"),
    "to_regclass": _call("dpg_regclass"),
    "current_setting": _current_setting,
    "set_config": _set_config,
    "quote_ident": _quote_ident,
    "pg_backend_pid": _backend_pid,
    "array_upper": _array_length,
    "json_build_object": _call("json_object"),
    "array_length": _array_length,
}


_UINT = exp.DataType.build("UINTEGER", dialect="duckdb")
_NAMED = {
    "regtype": "dpg_regtype_name",
    "regclass": "dpg_regclass_name",
    "regnamespace": "dpg_regnamespace_name",
}


def _cast(node: exp.Cast) -> exp.Expr:
    target = node.to
    spelled = target.sql(dialect="postgres")
    if "pg_catalog." in spelled.lower():
        unqualified = re.sub(r"(?i)pg_catalog\.", "", spelled)
        try:
            target = exp.DataType.build(unqualified, dialect="postgres")
        except SqlglotError:
            target = exp.DataType.build("TEXT")
        node = exp.Cast(this=node.this, to=target)
    kind = _type_name(target)
    value = node.this
    inner_kind = _type_name(value.to) if isinstance(value, exp.Cast) else None
    if kind in ("text", "varchar", "name") and inner_kind in _NAMED:
        assert isinstance(value, exp.Cast)
        oid = exp.cast(value.this.transform(_casts), _UINT)
        return exp.Anonymous(this=_NAMED[inner_kind], expressions=[oid])
    value = value.transform(_casts)
    if kind == "regclass":
        if isinstance(value, exp.Literal) and value.is_string:
            return exp.Anonymous(this="dpg_regclass", expressions=[value])
        return exp.cast(value, _UINT)
    if kind == "regtype":
        if isinstance(value, exp.Literal) and value.is_string:
            return exp.Anonymous(this="dpg_regtype", expressions=[value])
        return exp.cast(value, _UINT)
    if kind in ("text", "varchar", "name", "char", "bpchar"):
        return exp.cast(value, exp.DataType.build("VARCHAR"))
    if kind in ("regproc", "regprocedure"):
        if isinstance(value, exp.Literal) and value.is_string:
            return exp.Literal.string(value.name.split(".")[-1])
        return exp.cast(value, exp.DataType.build("VARCHAR"))
    if kind in ("oid", "regnamespace", "regoper", "xid"):
        return exp.cast(value, exp.DataType.build("BIGINT"))
    if kind in ("int2vector", "oidvector"):
        return exp.cast(value, exp.DataType.build("VARCHAR"))
    return exp.Cast(this=value, to=target)


def _type_name(target: exp.Expr) -> str:
    if isinstance(target, exp.DataType):
        if target.this == exp.DataType.Type.USERDEFINED:
            kind = target.args.get("kind")
            if isinstance(kind, exp.Dot):
                return kind.expression.name.lower()
            if isinstance(kind, exp.Identifier):
                return kind.name.lower()
            return str(kind or "").lower().split(".")[-1].strip('"')
        kind = target.this
        return str(getattr(kind, "value", kind)).lower()
    if isinstance(target, exp.ObjectIdentifier):
        return target.name.lower()
    return ""
