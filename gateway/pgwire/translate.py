"""PostgreSQL expressions in a catalogue query, as DuckDB computes them.

The passes ``gateway.pgwire.rewrite`` applies to a catalogue query's tree: PostgreSQL's
names and ``pg_catalog.``-qualified calls, its operators (``~``, ``!~``, …), its
functions (``current_setting``, ``format``, ``quote_ident``, … — answered from the
connection's ``SessionContext`` where they read the session) and its casts (``::regclass``,
``::oid``, …). Only the emulated catalogue is read; nothing here touches data.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from sqlglot import exp
from sqlglot.errors import SqlglotError

from gateway.core.errors import UnsupportedQuery
from gateway.pgwire.catalog import VERSION_TEXT
from gateway.pgwire.catalog_settings import DATABASE, OWNER
from gateway.pgwire.commands import UnknownSetting


@dataclass(frozen=True)
class SessionContext:
    """What catalogue functions answer for this connection."""

    user: str
    process_id: int
    settings: dict[str, str]


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
