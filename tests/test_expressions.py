"""Row expressions are total and cheap: the rules, against fixtures.

tests/fixtures/expressions.yaml lists accepted expressions (with what their compiled SQL
must contain per dialect) and refused ones (with the construct and cap they name). The
property test over generated expressions and adversarial rows is tests/test_totality.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.core.config import Config
from gateway.core.config_load import parse_config
from gateway.core.errors import UnsupportedQuery
from gateway.core.plan import QueryPlan
from gateway.demo.hospital import catalogued, config_yaml
from gateway.sql.analyze import analyze
from gateway.sql.analyze import totality as caps
from gateway.sql.compile import compile_plan

FIXTURES = yaml.safe_load((Path(__file__).parent / "fixtures" / "expressions.yaml").read_text())


@pytest.fixture(scope="module")
def demo_config() -> Config:
    return catalogued(
        parse_config(yaml.safe_load(config_yaml("/nonexistent/h.db", "/nonexistent/l.db")))
    )


@pytest.mark.parametrize("case", FIXTURES["total"], ids=lambda c: c["sql"][30:90])
def test_accepted_expressions_compile_to_their_total_form(
    case: dict[str, Any], demo_config: Config
) -> None:
    plan = analyze(case["sql"], demo_config.tables)
    assert isinstance(plan, QueryPlan)
    for dialect in ("sqlite", "postgres", "duckdb"):
        sql = compile_plan(plan, demo_config.tables[plan.table], dialect).sql
        for fragment in case.get("compiled", {}).get(dialect, []):
            assert fragment in sql, f"{dialect}: {fragment!r} not in {sql}"


@pytest.mark.parametrize("case", FIXTURES["refused"], ids=lambda c: c["sql"][30:90])
def test_expressions_that_could_fail_are_refused_by_name(
    case: dict[str, Any], demo_config: Config
) -> None:
    with pytest.raises(UnsupportedQuery) as info:
        analyze(case["sql"], demo_config.tables)
    detail = info.value.detail
    if "construct" in case:
        assert detail.get("construct") == case["construct"], info.value.message
    if "limit" in case:
        assert detail.get("limit") == case["limit"]
        assert case["limit"] in info.value.message  # the message names the limit


def balanced(terms: list[str]) -> str:
    """``terms`` joined by OR as a balanced tree (shallow, however many terms)."""
    if len(terms) == 1:
        return terms[0]
    half = len(terms) // 2
    return f"({balanced(terms[:half])} OR {balanced(terms[half:])})"


def where(condition: str) -> str:
    return f"SELECT COUNT(*) FROM patients WHERE {condition}"


@pytest.mark.parametrize(
    ("sql", "limit"),
    [
        (where(f"zip = '{'x' * (caps.MAX_STRING_LITERAL + 1)}'"), "max_string_literal"),
        (where(f"age IN ({', '.join(['1'] * (caps.MAX_IN_LIST + 1))})"), "max_in_list"),
        (where("(" * (caps.MAX_DEPTH + 1) + "age > 1" + ")" * (caps.MAX_DEPTH + 1)), "max_depth"),
        (where(balanced(["(age > 1 AND age < 2)"] * 128)), "max_nodes"),
        (where(" OR ".join([f"zip = '{'x' * 200}'"] * 6)), "max_string_chars"),
        (where(" OR ".join(["zip LIKE '%1'"] * (caps.MAX_LIKES + 1))), "max_likes"),
    ],
    ids=["string literal", "IN list", "depth", "size", "string characters", "LIKE count"],
)
def test_per_row_cost_is_capped(sql: str, limit: str, demo_config: Config) -> None:
    with pytest.raises(UnsupportedQuery) as info:
        analyze(sql, demo_config.tables)
    assert info.value.detail.get("limit") == limit
    assert limit in info.value.message


def test_arithmetic_needs_declared_bounds() -> None:
    config = parse_config(
        {
            "database": {"url": "sqlite:///unused.db"},
            "ledger": {"url": "sqlite:///unused-ledger.db"},
            "tables": {"t": {"columns": {"n": {"type": "integer"}, "r": {"type": "real"}}}},
        }
    )
    for expression in ("n + 1", "ABS(n)", "ROUND(r)", "-n", "n % 2", "CAST(n AS INTEGER)"):
        with pytest.raises(UnsupportedQuery) as info:
            analyze(f"SELECT COUNT(*) FROM t WHERE {expression} > 1", config.tables)
        assert "declare" in info.value.message or "bounds" in info.value.message, expression
    # Comparing, counting and grouping an unbounded column never fails.
    analyze("SELECT COUNT(n) FROM t WHERE n > 3 AND r < 2.5 AND n IN (1, 2)", config.tables)


def test_the_caps_themselves_are_accepted(demo_config: Config) -> None:
    at_the_caps = [
        where(f"zip = '{'x' * caps.MAX_STRING_LITERAL}'"),
        where(f"age IN ({', '.join(['1'] * caps.MAX_IN_LIST)})"),
        where(" AND ".join([f"age NOT IN ({', '.join(['1'] * caps.MAX_IN_LIST)})"] * 3)),
        where(" OR ".join(["zip LIKE '%1'"] * caps.MAX_LIKES)),
        where(f"zip LIKE '{'%a' * caps.MAX_LIKE_WILDCARDS}'"),
        where(f"zip LIKE '{'a' * caps.MAX_LIKE_PATTERN}'"),
    ]
    for sql in at_the_caps:
        assert isinstance(analyze(sql, demo_config.tables), QueryPlan), sql[:80]
