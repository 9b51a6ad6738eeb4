"""The cost model's measure of a statement's expressions: operations per row
(``gateway/sql/row_work.py``), not characters."""

from __future__ import annotations

import math

import pytest
import sqlglot

from gateway.core.config import ConfigError
from gateway.core.config_load import parse_config
from gateway.pipeline.gateway import Gateway
from gateway.sql.compile import compile_plan
from gateway.sql.row_work import row_operations


def ops(sql: str) -> float:
    return row_operations(sqlglot.parse_one(sql, read="sqlite"))


def test_structure_names_and_literals_cost_nothing() -> None:
    """Column lists, aliases, quoted names and derived tables weigh nothing; what is
    evaluated does."""
    wide = 'SELECT "a" AS "a", "b" AS "b", "c" AS "c" FROM (SELECT "a", "b", "c" FROM "t") AS s'
    assert ops(wide) == 0
    assert ops("SELECT COUNT(*) FROM t WHERE a > 1") == 2  # the comparison, the count
    assert ops("SELECT COUNT(*) FROM t WHERE NOT a IS NULL AND b < 2") == 5


def test_an_in_list_is_a_lookup_not_a_scan() -> None:
    """k literals weigh 1 + log2(k + 1), so a long domain list costs little more than a
    short one; a subquery is one probe plus its own operations."""
    two = ops("SELECT COUNT(*) FROM t WHERE a IN ('x', 'y')")
    many = ops(f"SELECT COUNT(*) FROM t WHERE a IN ({', '.join(repr(str(i)) for i in range(63))})")
    assert two == pytest.approx(2 + math.log2(3))
    assert many == pytest.approx(2 + 6)
    assert ops("SELECT COUNT(*) FROM t WHERE a IN (SELECT b FROM u WHERE c > 0)") == 4


def test_the_same_operations_written_longer_weigh_the_same() -> None:
    """What the old per-character term charged for: long names and long literals."""
    short = ops("SELECT SUM(a) FROM t WHERE b = 'x'")
    long = ops(
        'SELECT SUM("a_rather_long_column_name") FROM "a_rather_long_table_name" '
        "WHERE \"another_long_column_name\" = 'a literal much longer than one letter'"
    )
    assert short == long == 2


def test_compiled_statements_count_their_domain_filter(gateway: Gateway) -> None:
    """The domain filter, spliced into the text after generation, is counted once per
    placement: the compiled count equals a count of the final statement's own tree."""
    gw = gateway
    for sql in (
        "SELECT COUNT(*) FROM patients",
        "SELECT city, AVG(age) FROM patients WHERE income > 1000 GROUP BY city",
        "SELECT department, COUNT(*) FROM visits GROUP BY department",
    ):
        plan = gw.analyze(sql)
        table = gw.config.tables[plan.table]
        compiled = compile_plan(plan, table, "sqlite")
        assert compiled.row_ops == pytest.approx(ops(compiled.sql)), sql
        assert 0 < compiled.row_ops < len(compiled.sql) / 10


def test_the_old_per_character_setting_is_refused_with_its_replacement() -> None:
    raw = {
        "database": {"url": "sqlite:///:memory:"},
        "tables": {},
        "execution": {"char_ns": 1},
    }
    with pytest.raises(ConfigError, match=r"replaced by execution\.op_ns"):
        parse_config(raw)
