"""The admin CLI commands, run through click's test runner on a real config and ledger."""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from budget import Ledger
from gateway.cli.admin import register_admin_commands


@pytest.fixture
def cli() -> click.Group:
    @click.group()
    def dpgate() -> None:
        pass

    register_admin_commands(dpgate)
    return dpgate


@pytest.fixture
def config(tmp_path: Path) -> str:
    path = tmp_path / "dpgate.yaml"
    path.write_text(
        """
database: {url: "sqlite:///data.db"}
ledger: {url: "sqlite:///ledger.db"}
privacy:
  composition: zcdp
  global_budget: {epsilon: 50.0, delta: 1.0e-5}
tables:
  t:
    columns:
      x: {type: integer, lower: 0, upper: 10}
"""
    )
    return str(path)


def run(cli: click.Group, config: str, *args: str) -> str:
    result = CliRunner().invoke(cli, [*args, "--config", config])
    assert result.exit_code == 0, result.output
    return result.output


def test_analyst_lifecycle(cli: click.Group, config: str, tmp_path: Path) -> None:
    out = run(cli, config, "analyst", "add", "alice", "--epsilon", "2", "--delta", "1e-6")
    key = out.strip().splitlines()[-1]
    ledger = Ledger.from_url(f"sqlite:///{tmp_path}/ledger.db")
    got = ledger.authenticate(key)
    assert got is not None and got.name == "alice"

    listed = json.loads(run(cli, config, "analyst", "list", "--json"))
    assert [a["name"] for a in listed] == ["alice"] and listed[0]["epsilon"] == 2.0
    assert "alice" in run(cli, config, "analyst", "list")

    run(cli, config, "analyst", "disable", "alice")
    got = ledger.authenticate(key)
    assert got is not None and got.disabled
    run(cli, config, "analyst", "enable", "alice")

    new_key = run(cli, config, "key", "rotate", "alice").strip().splitlines()[-1]
    assert ledger.authenticate(key) is None and ledger.authenticate(new_key) is not None

    out = run(cli, config, "budget", "set", "alice", "--epsilon", "3")
    assert "of 3" in out
    shown = json.loads(run(cli, config, "budget", "show", "--json"))
    assert [s["name"] for s in shown] == ["alice", "(global)"]
    assert shown[1]["epsilon"] == 50.0
    single = json.loads(run(cli, config, "budget", "show", "alice", "--json"))
    assert single[0]["epsilon"] == 3.0 and single[0]["composition"] == "zcdp"


def test_audit_log_command(cli: click.Group, config: str, tmp_path: Path) -> None:
    run(cli, config, "analyst", "list")  # creates the ledger
    ledger = Ledger.from_url(f"sqlite:///{tmp_path}/ledger.db")
    ledger.log_request(
        request_id="r1",
        analyst="alice",
        endpoint="/v1/query",
        sql="SELECT COUNT(*) FROM t",
        outcome="budget_exhausted",
        error_code="budget_exhausted",
        status=403,
    )
    ledger.close()  # a SQLite ledger writes the request log in its next batch: flush it
    out = run(cli, config, "audit-log")
    assert "403 budget_exhausted" in out and "SELECT COUNT(*) FROM t" in out
    assert "budget_exhausted budget_exhausted" not in out  # the code is printed once
    entries = json.loads(run(cli, config, "audit-log", "--analyst", "alice", "--json"))
    assert [e["request_id"] for e in entries] == ["r1"]
    assert json.loads(run(cli, config, "audit-log", "--since", "2999-01-01", "--json")) == []


def test_errors_are_reported_not_raised(cli: click.Group, config: str) -> None:
    runner = CliRunner()
    run(cli, config, "analyst", "add", "alice", "--epsilon", "1", "--delta", "0")
    for args in (
        ["analyst", "add", "alice", "--epsilon", "1", "--delta", "0"],
        ["analyst", "add", "bob", "--epsilon", "-1", "--delta", "0"],
        ["analyst", "disable", "nobody"],
        ["key", "rotate", "nobody"],
        ["budget", "show", "nobody"],
        ["budget", "set", "alice"],
        ["audit-log", "--since", "yesterday"],
    ):
        result = runner.invoke(cli, [*args, "--config", config])
        assert result.exit_code != 0, args
        # a clean click error (exit code), never an unhandled exception
        assert result.exception is None or isinstance(result.exception, SystemExit), args
        assert "Traceback" not in result.output


def test_bad_config_is_a_clear_error(cli: click.Group, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("ledger: {}\n")
    result = CliRunner().invoke(cli, ["analyst", "list", "--config", str(bad)])
    assert result.exit_code != 0 and "invalid config" in result.output


def test_periods_and_the_global_budget(cli: click.Group, config: str) -> None:
    run(cli, config, "analyst", "add", "pat", "--epsilon", "1", "--delta", "0", "--period", "day")
    shown = json.loads(run(cli, config, "budget", "show", "pat", "--json"))[0]
    assert shown["period"] == "day" and shown["period_ends_at"]
    assert "period: day, renews" in run(cli, config, "budget", "show", "pat")
    out = run(cli, config, "budget", "set", "pat", "--period", "month")
    assert "period: month, renews" in out
    # the global budget: the config's (ε 50) until an admin sets one in the ledger
    out = run(cli, config, "budget", "set", "--global", "--epsilon", "40", "--period", "week")
    assert out.startswith("(global)") and "period: week" in out and "of 40" in out
    everything = json.loads(run(cli, config, "budget", "show", "--json"))
    assert everything[-1]["name"] == "(global)" and everything[-1]["epsilon"] == 40.0
    for wrong in (
        ["budget", "set", "--epsilon", "1"],  # neither a name nor --global
        ["budget", "set", "pat", "--global", "--epsilon", "1"],
        ["budget", "set", "pat"],  # nothing to set
        ["analyst", "add", "x", "--epsilon", "1", "--delta", "0", "--period", "year"],
    ):
        result = CliRunner().invoke(cli, [*wrong, "--config", config])
        assert result.exit_code != 0, wrong
