"""SQL analysis against fixtures: supported queries and their plans, refused ones and why.

The fixture file (tests/fixtures/analyze.yaml) is the reference list of what dpgate
accepts, in the spirit of sqlglot's optimizer fixtures.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.core.config import Config
from gateway.core.config_load import parse_config
from gateway.core.errors import GatewayError, SqlSyntaxError
from gateway.core.plan import ProbePlan, QueryPlan
from gateway.demo.hospital import catalogued, config_yaml
from gateway.sql.analyze import analyze
from gateway.sql.analyze.parse import parse_select
from gateway.sql.analyze.select import uncut_sql

FIXTURES = yaml.safe_load((Path(__file__).parent / "fixtures" / "analyze.yaml").read_text())


@pytest.fixture(scope="module")
def demo_config() -> Config:
    return catalogued(
        parse_config(yaml.safe_load(config_yaml("/nonexistent/h.db", "/nonexistent/l.db")))
    )


def summary(plan: QueryPlan) -> dict[str, Any]:
    return {
        "outputs": [f"{o.name}:{o.kind}" + (":hidden" if o.hidden else "") for o in plan.outputs],
        "measures": [m.kind for m in plan.measures],
        "groups": [
            f"{g.name}:{'public' if g.domain is not None else 'selection'}" for g in plan.group_keys
        ],
    }


@pytest.mark.parametrize(
    "case", FIXTURES["supported"] + FIXTURES["joins_supported"], ids=lambda c: c["sql"][:60]
)
def test_supported(case: dict[str, Any], demo_config: Config) -> None:
    plan = analyze(case["sql"], demo_config.tables)
    assert isinstance(plan, QueryPlan)
    if "table" in case:  # the table whose rows a join's relation has
        assert plan.table == case["table"] and plan.join is not None
    got = summary(plan)
    for key in ("outputs", "measures", "groups"):
        if key in case:
            assert got[key] == case[key]
    if "post" in case:  # nested aggregation: the outer query's columns and accuracy rule
        assert plan.post_query is not None
        post = plan.post_query
        pairs = zip(post.columns, post.accuracy, strict=True)
        assert [f"{name}:{rule.kind}" for (name, _), rule in pairs] == case["post"]
    elif "inner_sql" not in case:
        assert plan.post_query is None
    if "inner_sql" in case:  # what is charged, audited and cached: the inner query alone
        assert plan.canonical_sql == case["inner_sql"]
    if plan.post_query is None:  # the text a cut is cached under, however it was found
        assert plan.uncut_sql == uncut_sql(parse_select(case["sql"]))


@pytest.mark.parametrize(
    "case", FIXTURES["refused"] + FIXTURES["joins_refused"], ids=lambda c: c["sql"][:60] or "empty"
)
def test_refused(case: dict[str, Any], demo_config: Config) -> None:
    with pytest.raises(GatewayError) as info:
        analyze(case["sql"], demo_config.tables)
    assert info.value.code == case["code"], info.value.message
    if "construct" in case:
        assert info.value.detail.get("construct") == case["construct"]
    assert info.value.message  # a message a person can read


@pytest.mark.parametrize("case", FIXTURES["malformed"], ids=lambda c: c["sql"][:60])
def test_malformed(case: dict[str, Any], demo_config: Config) -> None:
    with pytest.raises(SqlSyntaxError) as info:
        analyze(case["sql"], demo_config.tables)
    error = info.value
    assert error.detail["near"] == case["near"]
    assert (error.detail["line"], error.detail["column"]) == (1, case["column"])
    assert case["sql"][case["column"] - 1 :].startswith(case["near"])
    assert f"at '{case['near']}'" in error.message


def test_syntax_errors_carry_line_and_column(demo_config: Config) -> None:
    with pytest.raises(SqlSyntaxError) as info:
        analyze("SELECT COUNT(*)\nFROM patients\nWHERE age >", demo_config.tables)
    assert info.value.detail["line"] == 3
    assert info.value.detail["column"] >= 1


def test_canonical_sql_ignores_spelling(demo_config: Config) -> None:
    a = analyze("select count(*) from PATIENTS where AGE > 30", demo_config.tables)
    b = analyze("SELECT   COUNT(*)\nFROM patients WHERE age > 30", demo_config.tables)
    assert isinstance(a, QueryPlan) and isinstance(b, QueryPlan)
    assert a.canonical_sql == b.canonical_sql


def test_public_domains_come_from_the_schema(demo_config: Config) -> None:
    plan = analyze("SELECT disease, COUNT(*) FROM patients GROUP BY disease", demo_config.tables)
    assert isinstance(plan, QueryPlan)
    assert plan.group_keys[0].domain == demo_config.tables["patients"].columns["disease"].values
    plan = analyze("SELECT age / 10, COUNT(*) FROM patients GROUP BY 1", demo_config.tables)
    assert isinstance(plan, QueryPlan)
    assert plan.group_keys[0].domain == tuple(range(0, 11))


def test_sensitivity_follows_the_contribution_bound(demo_config: Config) -> None:
    plan = analyze("SELECT COUNT(*), SUM(length_of_stay) FROM visits", demo_config.tables)
    assert isinstance(plan, QueryPlan)
    rows = demo_config.tables["visits"].max_rows_per_unit
    assert plan.measures[0].sensitivity.l1 == rows
    assert plan.measures[1].sensitivity.l1 == rows * 30


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT 1",
        "select version()",
        "SELECT current_schema()",
        "SELECT DISTINCT sex FROM patients",
    ],
)
def test_bi_probes_are_constants(sql: str, demo_config: Config) -> None:
    assert isinstance(analyze(sql, demo_config.tables), ProbePlan)


def test_a_parsed_statement_carries_no_parser_positions() -> None:
    """Positions in errors come from the tokens; the nodes' own (``meta``) are dropped
    after parsing, so that copying a tree — every canonical text is generated from a
    copy — does not deep-copy a dict per identifier and literal."""
    from gateway.sql.analyze.parse import parse_select

    select = parse_select("SELECT sex, COUNT(*) AS n FROM t WHERE age >= 40 GROUP BY sex")
    assert all(node._meta is None for node in select.walk())
    assert all(node._meta is None for node in select.copy().walk())
