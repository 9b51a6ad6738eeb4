"""Reading the config's ``tables:``: columns (types, bounds, declared values), privacy
units, references and the joins they allow, each problem reported with its field's path.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from gateway.core.config import (
    COLUMN_TYPES,
    MAX_BOUND_MAGNITUDE,
    ColumnConfig,
    Reference,
    TableConfig,
)
from gateway.core.config_access import parse_grants
from gateway.core.config_nulls import parse_null_when
from gateway.core.config_problems import _Validator


def _tables(v: _Validator, raw: Any) -> dict[str, TableConfig]:
    if not isinstance(raw, Mapping) or not raw:
        v.problem("tables: declare at least one table")
        return {}
    tables: dict[str, TableConfig] = {}
    for tname, traw in raw.items():
        path = f"tables.{tname}"
        if not isinstance(traw, Mapping):
            v.problem(f"{path}: must be a mapping")
            continue
        v.no_unknown(
            traw,
            path,
            {
                "privacy_unit",
                "max_rows_per_unit",
                "max_groups_per_unit",
                "columns",
                "schema",
                "source",
                "deadline_ms",
                "max_rows_read_per_unit",
                "rows",
                "public",
                "key",
                "references",
                "grants",
            },
        )
        columns: dict[str, ColumnConfig] = {}
        craw = traw.get("columns")
        if not isinstance(craw, Mapping) or not craw:
            v.problem(f"{path}.columns: declare at least one column")
            craw = {}
        for cname, cdef in craw.items():
            col = _column(v, f"{path}.columns.{cname}", str(cname), cdef)
            if col is not None:
                columns[str(cname).lower()] = col
        unit = traw.get("privacy_unit")
        if unit is not None and str(unit).lower() not in columns:
            v.problem(f"{path}.privacy_unit: '{unit}' is not a declared column")
        columns = _null_conditions(v, path, traw, columns, unit)
        tables[str(tname).lower()] = TableConfig(
            name=str(tname),
            columns=columns,
            privacy_unit=str(unit).lower() if unit is not None else None,
            max_rows_per_unit=v.integer(traw, f"{path}.max_rows_per_unit", 1, low=1) or 1,
            max_groups_per_unit=v.integer(traw, f"{path}.max_groups_per_unit", None, low=1),
            schema=str(traw["schema"]) if traw.get("schema") else None,
            source=str(traw["source"]) if traw.get("source") else None,
            deadline_ms=v.integer(traw, f"{path}.deadline_ms", None, low=1),
            max_rows_read_per_unit=v.integer(traw, f"{path}.max_rows_read_per_unit", None, low=1),
            rows=v.integer(traw, f"{path}.rows", None, low=0),
            grants=parse_grants(v, f"{path}.grants", traw.get("grants")),
        )
    return _joins(v, raw, tables)


def _null_conditions(
    v: _Validator,
    path: str,
    traw: Mapping[str, Any],
    columns: dict[str, ColumnConfig],
    unit: Any,
) -> dict[str, ColumnConfig]:
    """Each column's ``null_when`` read over the table's declared columns
    (``gateway.core.config_nulls``). A column NULL where a condition holds may be NULL:
    undeclared, its ``nullable`` is true (the catalogue cannot make the rows where the
    condition holds impossible); declared false, it contradicts the condition."""
    out = dict(columns)
    for name, col in columns.items():
        if col.null_when is None:
            continue
        where = f"{path}.columns.{col.name}.null_when"
        if traw.get("public") is True:
            v.problem(
                f"{where}: a public table's rows are public as they are; null_when "
                "declares the domain of a protected table"
            )
            continue
        if col.nullable is False:
            v.problem(f"{where}: the column is declared nullable: false, so it is never NULL")
            continue
        text, problems = parse_null_when(
            col.null_when, name, columns, str(unit).lower() if unit is not None else None
        )
        for problem in problems:
            v.problem(f"{where}: {problem}")
        out[name] = replace(col, null_when=text, nullable=True)
    return out


def _joins(
    v: _Validator, raw: Mapping[str, Any], tables: dict[str, TableConfig]
) -> dict[str, TableConfig]:
    """``public``, ``key`` and ``references``, checked across tables (docs/design.md,
    "Joins"); a table with no ``privacy_unit`` whose reference reaches a protected table's
    privacy unit takes the referencing column as its own (a privacy-unit path)."""
    for name, t in list(tables.items()):
        traw = next(r for k, r in raw.items() if str(k).lower() == name)
        path = f"tables.{t.name}"
        public = traw.get("public", False)
        if not isinstance(public, bool):
            v.problem(f"{path}.public: must be true or false")
            public = False
        key = traw.get("key")
        if key is not None and str(key).lower() not in t.columns:
            v.problem(f"{path}.key: '{key}' is not a declared column")
            key = None
        if public:
            if key is None and "key" not in traw:
                v.problem(
                    f"{path}.key: a public table needs a key — the column, unique in the "
                    "table, that other tables' references join on"
                )
            for setting in ("privacy_unit", "max_rows_per_unit", "max_groups_per_unit"):
                if setting in traw:
                    v.problem(
                        f"{path}.{setting}: a public table has no privacy unit (its rows "
                        "are public)"
                    )
            if "references" in traw:
                v.problem(f"{path}.references: a public table cannot reference other tables")
        elif key is not None:
            v.problem(f"{path}.key: only a public table (public: true) declares a key")
        tables[name] = replace(t, public=public, key=str(key).lower() if key else None)
    _derive_units(raw, tables)
    for name, t in list(tables.items()):
        traw = next(r for k, r in raw.items() if str(k).lower() == name)
        refs = traw.get("references")
        if refs is None or t.public:
            continue
        path = f"tables.{t.name}.references"
        if not isinstance(refs, Mapping) or not refs:
            v.problem(f"{path}: must be a mapping {{column: table.column}}")
            continue
        found: list[Reference] = []
        for column, target in refs.items():
            reference = _reference(v, f"{path}.{column}", t, str(column).lower(), target, tables)
            if reference is None:
                continue
            if any(r.table == reference.table for r in found):
                v.problem(f"{path}.{column}: a second reference to '{reference.table}'")
                continue
            found.append(reference)
        unit = t.privacy_unit
        for r in found:
            if tables[r.table].public:
                continue
            if unit is None:
                unit = r.column  # the privacy-unit path: this column names the person
            elif unit != r.column:
                v.problem(
                    f"{path}.{r.column}: references {r.table}'s privacy unit, so it must be "
                    f"this table's privacy unit (privacy_unit is '{unit}')"
                )
        tables[name] = replace(t, references=tuple(found), privacy_unit=unit)
    for name, t in tables.items():
        traw = next(r for k, r in raw.items() if str(k).lower() == name)
        if t.privacy_unit is None and traw.get("max_rows_per_unit", 1) != 1 and not t.public:
            v.problem(
                f"tables.{t.name}.max_rows_per_unit: needs a privacy_unit (without one, "
                "each row is its own unit)"
            )
    for name in tables:
        _reachable(v, name, tables)
    return tables


def _derive_units(raw: Mapping[str, Any], tables: dict[str, TableConfig]) -> None:
    """Give a table without ``privacy_unit`` the column that references another table's
    privacy unit (repeated, so that paths of several steps resolve)."""
    changed = True
    while changed:
        changed = False
        for name, t in tables.items():
            traw = next(r for k, r in raw.items() if str(k).lower() == name)
            refs = traw.get("references")
            if t.privacy_unit is not None or t.public or not isinstance(refs, Mapping):
                continue
            for column, target in refs.items():
                if isinstance(target, Mapping):
                    target = target.get("to")
                if not isinstance(target, str) or target.count(".") != 1:
                    continue
                tname, tcolumn = (part.lower() for part in target.split("."))
                other = tables.get(tname)
                if (
                    other is not None
                    and not other.public
                    and other.privacy_unit == tcolumn
                    and str(column).lower() in t.columns
                ):
                    tables[name] = replace(t, privacy_unit=str(column).lower())
                    changed = True
                    break


def _reference(
    v: _Validator,
    path: str,
    table: TableConfig,
    column: str,
    target: Any,
    tables: Mapping[str, TableConfig],
) -> Reference | None:
    """One ``column: table.column`` entry, or None (with the problem reported)."""
    if column not in table.columns:
        v.problem(f"{path}: '{column}' is not a declared column of {table.name}")
        return None
    every_row_matches = False
    if isinstance(target, Mapping):
        v.no_unknown(target, path, {"to", "every_row_matches"})
        every_row_matches = target.get("every_row_matches", False)
        if not isinstance(every_row_matches, bool):
            v.problem(f"{path}.every_row_matches: must be true or false")
            every_row_matches = False
        target = target.get("to")
    if not isinstance(target, str) or target.count(".") != 1:
        v.problem(
            f"{path}: must name the referenced column as table.column (or as "
            "{to: table.column, every_row_matches: true})"
        )
        return None
    tname, tcolumn = (part.lower() for part in target.split("."))
    other = tables.get(tname)
    if other is None:
        v.problem(f"{path}: '{tname}' is not a declared table")
        return None
    if tcolumn not in other.columns:
        v.problem(f"{path}: '{tcolumn}' is not a declared column of {other.name}")
        return None
    if other.name.lower() == table.name.lower():
        v.problem(f"{path}: a table cannot reference itself (a self-join multiplies rows)")
        return None
    if table.columns[column].type != other.columns[tcolumn].type:
        v.problem(
            f"{path}: {table.name}.{column} is {table.columns[column].type} but "
            f"{other.name}.{tcolumn} is {other.columns[tcolumn].type}"
        )
        return None
    if other.public:
        if tcolumn != other.key:
            v.problem(
                f"{path}: {other.name} is public and joins on its key '{other.key}' only (a "
                "non-unique column could match one row many times)"
            )
            return None
    elif other.privacy_unit is None or tcolumn != other.privacy_unit:
        v.problem(
            f"{path}: {other.name} is protected, so a reference to it must name its privacy "
            f"unit (a privacy-unit path), not '{tcolumn}'"
        )
        return None
    elif other.max_rows_per_unit != 1:
        v.problem(
            f"{path}: {other.name} may hold {other.max_rows_per_unit} rows per unit; a "
            "referenced table must hold one (max_rows_per_unit: 1), or joining it would "
            "multiply each of a person's rows"
        )
        return None
    return Reference(
        column=column, table=tname, target=tcolumn, every_row_matches=every_row_matches
    )


def _reachable(v: _Validator, name: str, tables: Mapping[str, TableConfig]) -> None:
    """References from ``name`` form a tree: no table is reached twice, nor ``name``."""
    seen: set[str] = set()
    stack = [name]
    while stack:
        current = stack.pop()
        for r in tables[current].references:
            if r.table == name or r.table in seen:
                v.problem(
                    f"tables.{tables[name].name}.references: '{r.table}' is reached twice "
                    "(a cycle, or two paths): each joined table must be reached one way"
                )
                return
            seen.add(r.table)
            stack.append(r.table)


def _column(v: _Validator, path: str, name: str, raw: Any) -> ColumnConfig | None:
    if not isinstance(raw, Mapping):
        v.problem(f"{path}: must be a mapping like {{type: integer, lower: 0, upper: 120}}")
        return None
    v.no_unknown(raw, path, {"type", "lower", "upper", "values", "nullable", "null_when"})
    ctype = v.choice(raw, f"{path}.type", COLUMN_TYPES, None)
    if ctype is None:
        return None
    reported = len(v.problems)
    lower = v.number(raw, f"{path}.lower", None)
    upper = v.number(raw, f"{path}.upper", None)
    if len(v.problems) > reported:
        pass  # a bound that is not a number is reported once, without a follow-on
    elif (lower is None) != (upper is None):
        v.problem(f"{path}: declare both lower and upper, or neither")
    elif lower is not None and upper is not None and lower > upper:
        v.problem(f"{path}: lower ({lower}) is above upper ({upper})")
    if (lower is not None) and ctype not in ("integer", "real"):
        v.problem(f"{path}: bounds are only for integer and real columns")
    for which, bound in (("lower", lower), ("upper", upper)):
        if bound is None:
            continue
        if ctype == "integer" and not float(bound).is_integer():
            # The compiled SQL clamps to the bound and rounds half away from zero, so a
            # fractional bound would let one row move a SUM by more than it says.
            v.problem(f"{path}.{which}: an integer column needs a whole-number bound, got {bound}")
        if abs(bound) > MAX_BOUND_MAGNITUDE:
            v.problem(f"{path}.{which}: bounds beyond ±{MAX_BOUND_MAGNITUDE:.0e} are not supported")
    values_raw = raw.get("values")
    values: tuple[Any, ...] | None = None
    if values_raw is not None:
        if not isinstance(values_raw, list) or not values_raw:
            v.problem(f"{path}.values: must be a non-empty list")
        elif len(set(map(repr, values_raw))) != len(values_raw):
            v.problem(f"{path}.values: has duplicates")
        elif any(x is None for x in values_raw):
            v.problem(f"{path}.values: NULL is not a value (declare nullable: true)")
        elif ctype == "text":
            values = tuple(str(x) for x in values_raw)  # YAML reads 1051 as a number
        else:
            values = tuple(values_raw)
    if values is not None and lower is not None and upper is not None:
        outside = [
            x
            for x in values
            if not isinstance(x, int | float) or isinstance(x, bool) or not lower <= x <= upper
        ]
        if outside:
            v.problem(f"{path}.values: {outside[0]!r} is not a number within [lower, upper]")
    nullable = raw.get("nullable")
    if nullable is not None and not isinstance(nullable, bool):
        v.problem(f"{path}.nullable: must be true or false")
        nullable = None
    null_when = raw.get("null_when")
    if null_when is not None and not isinstance(null_when, str):
        v.problem(f"{path}.null_when: must be a SQL condition, as a string")
        null_when = None
    return ColumnConfig(
        name=name,
        type=ctype,  # type: ignore[arg-type]
        lower=lower,
        upper=upper,
        values=values,
        nullable=nullable,
        null_when=null_when,
    )
