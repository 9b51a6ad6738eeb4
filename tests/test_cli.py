"""The `dpgate` command: config check says precisely what is wrong, demo builds and
prints a working key and says when it resumes, ports are checked before serving, query
talks to a gateway and prints what an answer cost and how accurate it is."""

from __future__ import annotations

import re
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from flask import Flask
from werkzeug.serving import make_server

from gateway.cli import main
from gateway.demo.hospital import config_yaml


def test_config_check_accepts_the_demo_config(demo_db: Path, tmp_path: Path) -> None:
    path = tmp_path / "dpgate.yaml"
    path.write_text(config_yaml(str(demo_db), str(tmp_path / "ledger.db")))
    result = CliRunner().invoke(main, ["config", "check", str(path)])
    assert result.exit_code == 0, result.output
    assert "OK" in result.output and "patients" in result.output


def test_config_check_lists_every_problem_with_its_path(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "database": {"url": "sqlite:///x.db", "colour": "red"},
                "privacy": {"epsilon": -1, "composition": "basic"},
                "audit": {"mode": "maybe"},
                "tables": {
                    "t": {
                        "privacy_unit": "uid",
                        "columns": {"age": {"type": "integer", "lower": 10, "upper": 5}},
                    }
                },
            }
        )
    )
    result = CliRunner().invoke(main, ["config", "check", str(path)])
    assert result.exit_code == 2
    out = result.output
    for expected in (
        "ledger: missing",
        "database.colour: unknown setting",
        "privacy.epsilon: must be > 0",
        "privacy.composition: 'basic' is not one of combined, zcdp, pure",
        "audit.mode: 'maybe' is not one of refuse, flag, off",
        "tables.t.privacy_unit: 'uid' is not a declared column",
        "tables.t.columns.age: lower (10.0) is above upper (5.0)",
    ):
        assert expected in out, out


def test_config_check_compares_with_the_database(demo_db: Path, tmp_path: Path) -> None:
    raw = yaml.safe_load(config_yaml(str(demo_db), str(tmp_path / "l.db")))
    raw["tables"]["patients"]["columns"]["height"] = {"type": "integer"}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    result = CliRunner().invoke(main, ["config", "check", str(path)])
    assert result.exit_code == 2
    assert "tables.patients.columns.height: no such column" in result.output


def test_config_check_reports_invalid_yaml(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("database: {url: [unclosed\n")
    result = CliRunner().invoke(main, ["config", "check", str(path)])
    assert result.exit_code == 2 and "not valid YAML" in result.output


def test_demo_builds_data_and_prints_a_working_key(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["demo", "--dir", str(tmp_path / "d"), "--no-serve"])
    assert result.exit_code == 0, result.output
    key = next(
        line.split(":", 1)[1].strip()
        for line in result.output.splitlines()
        if "demo analyst key" in line
    )
    assert (tmp_path / "d" / "hospital.db").exists()
    import budget
    from gateway.core.config_load import load_config

    config = load_config(tmp_path / "d" / "dpgate.yaml")
    ledger = budget.Ledger.from_url(config.ledger.url)
    analyst = ledger.authenticate(key)
    assert analyst is not None and analyst.name == "demo"
    assert "curl" in result.output and "/v1/query" in result.output
    # Running it again keeps the data and gives a fresh key.
    again = CliRunner().invoke(main, ["demo", "--dir", str(tmp_path / "d"), "--no-serve"])
    assert again.exit_code == 0 and key not in again.output


def test_config_check_reports_a_bad_number_once(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "database": {"url": "sqlite:///x.db"},
                "ledger": {"url": "sqlite:///l.db"},
                "privacy": {"max_epsilon_per_query": -1},
                "tables": {"t": {"columns": {"age": {"type": "integer", "lower": "zero"}}}},
            }
        )
    )
    result = CliRunner().invoke(main, ["config", "check", str(path)])
    assert result.exit_code == 2
    problems = [line for line in result.output.splitlines() if line.startswith("  - ")]
    assert problems == [
        "  - line 6: privacy.max_epsilon_per_query: must be > 0",
        "  - line 11: tables.t.columns.age.lower: must be a number, got str",
    ]


@pytest.fixture
def by_hand(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run the CLI as typed in a shell, not from make (which sets MAKELEVEL)."""
    monkeypatch.delenv("MAKELEVEL", raising=False)


@pytest.mark.usefixtures("by_hand")
def test_demo_rerun_says_it_resumes_and_fresh_starts_over(tmp_path: Path) -> None:
    where = str(tmp_path / "d")
    first = CliRunner().invoke(main, ["demo", "--dir", where, "--no-serve"])
    assert first.exit_code == 0 and "Resumed" not in first.output
    again = CliRunner().invoke(main, ["demo", "--dir", where, "--no-serve"])
    assert again.exit_code == 0
    assert "Resumed the earlier demo" in again.output
    assert "demo: ε 0 spent of 10 in 0 queries; analysts: demo" in again.output
    assert "demo --fresh" in again.output
    fresh = CliRunner().invoke(main, ["demo", "--dir", where, "--no-serve", "--fresh"])
    assert fresh.exit_code == 0 and "Resumed" not in fresh.output


@pytest.mark.parametrize("under_make", [False, True])
def test_demo_names_a_busy_port_and_how_to_choose_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, under_make: bool
) -> None:
    if under_make:
        monkeypatch.setenv("MAKELEVEL", "1")
    else:
        monkeypatch.delenv("MAKELEVEL", raising=False)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = CliRunner().invoke(main, ["demo", "--dir", str(tmp_path), "--port", str(port)])
    assert result.exit_code == 1
    assert f"port {port} on 127.0.0.1 is already in use" in result.output
    hint = "make demo PORT=8081" if under_make else "demo --port 8081"
    assert hint in result.output
    assert "serving on" not in result.output and not (tmp_path / "ledger.db").exists()


def test_serve_names_a_busy_port(tmp_path: Path, demo_db: Path) -> None:
    path = tmp_path / "dpgate.yaml"
    path.write_text(config_yaml(str(demo_db), str(tmp_path / "ledger.db")))
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = CliRunner().invoke(main, ["serve", "--config", str(path), "--port", str(port)])
    assert result.exit_code == 1 and f"port {port} on 127.0.0.1 is already in use" in result.output


@pytest.fixture
def served(app: Flask) -> Iterator[str]:
    """The test app behind a real HTTP server in a thread (``dpgate query`` speaks HTTP)."""
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def query(url: str, key: str, *args: str) -> str:
    result = CliRunner().invoke(main, ["query", "--url", url, "--key", key, *args])
    assert result.exit_code == 0, result.output
    return result.output


def test_query_prints_rows_accuracy_cost_and_budget(served: str, analyst_key: str) -> None:
    out = query(served, analyst_key, "--epsilon", "0.3", "SELECT COUNT(*) AS n FROM patients")
    lines = out.splitlines()
    assert lines[0] == "n" and lines[1].lstrip("-").isdigit()
    assert re.search(r"^  n: ± [\d.]+ \(95%\), stddev [\d.]+$", out, re.M)
    assert "cost: ε 0.3, ρ 0.045 (laplace)" in out
    # Budgets print with six significant digits, as `dpgate budget show` prints them.
    budget_line = next(line for line in lines if line.startswith("budget:"))
    assert re.fullmatch(r"budget: ε [\d.]+ spent of 10, [\d.]+ remaining", budget_line)
    assert all(len(d.replace(".", "")) <= 6 for d in re.findall(r"[\d.]+", budget_line))
    again = query(served, analyst_key, "--epsilon", "0.3", "SELECT COUNT(*) AS n FROM patients")
    assert "cached: the identical earlier answer, at no charge" in again


def test_query_prints_avg_intervals(served: str, analyst_key: str) -> None:
    out = query(
        served,
        analyst_key,
        "--epsilon",
        "0.5",
        "SELECT sex, AVG(glucose) AS g FROM patients GROUP BY sex",
    )
    header, female, male = out.splitlines()[:3]
    assert header.split() == ["sex", "g", "g", "95%", "interval"]
    assert re.fullmatch(r"F\s+[\d.]+\s+\[[\d.]+, [\d.]+\]", female)
    assert male.startswith("M ")


def test_query_dry_run_says_so_with_cost_fit_and_accuracy(served: str, analyst_key: str) -> None:
    out = query(
        served,
        analyst_key,
        "--dry-run",
        "--epsilon",
        "0.5",
        "SELECT zip, COUNT(*) AS n FROM patients GROUP BY zip",
    )
    assert out.startswith("dry run: nothing was read from the data and nothing was charged")
    assert re.search(
        r"^would cost: ε 0.5, partition-selection δ [\d.e-]+, ρ 0.125 \(laplace\)$", out, re.M
    )
    assert "would fit your budget: yes" in out
    assert re.search(r"^  n: ± [\d.]+ \(95%\) expected$", out, re.M)
    assert "note: The values of zip are not declared public" in out
    assert "budget: ε 0 spent of 10, 10 remaining" in out


def test_query_says_why_an_answer_is_empty(served: str, analyst_key: str) -> None:
    out = query(
        served, analyst_key, "SELECT zip, COUNT(*) FROM patients WHERE age = 100 GROUP BY zip"
    )
    assert "No group reached the threshold." in out


def test_delta_line_says_what_the_halves_of_delta_are_for() -> None:
    from gateway.cli.render import delta_line

    line = delta_line(
        {"delta": 1e-6, "selection_delta_budget": 5e-7, "delta_spent": 0, "delta_remaining": 5e-7}
    )
    assert line == (
        "δ: 1e-06 in all; 5e-07 for partition selection (0 spent, 5e-07 remaining), "
        "the rest converts the zCDP total to (ε, δ)"
    )


def test_budget_figures_in_json_carry_twelve_digits() -> None:
    """0.7 + 0.7 is 1.4000000000000001 in floats: the JSON says 1.4 (a stated precision)."""
    from budget import Charge

    assert Charge(0.7 + 0.7, 0.1 + 0.2).to_json() == {"epsilon": 1.4, "delta": 0.3}
    assert Charge(1 / 3, 1e-7 / 3).to_json() == {
        "epsilon": 0.333333333333,
        "delta": 3.33333333333e-08,
    }


def test_a_second_demo_keeps_the_admin_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A second ``dpgate demo`` must not silently invalidate the admin key in use: it is
    kept in the demo folder (owner-only) and reused; ``--fresh`` makes a new one."""
    monkeypatch.delenv("DPGATE_ADMIN_KEY", raising=False)
    where = str(tmp_path / "d")

    def admin_key(*flags: str) -> tuple[str, str]:
        # the command exports the key for the server it starts: forget it between runs
        monkeypatch.delenv("DPGATE_ADMIN_KEY", raising=False)
        result = CliRunner().invoke(main, ["demo", "--dir", where, "--no-serve", *flags])
        assert result.exit_code == 0, result.output
        line = next(x for x in result.output.splitlines() if "admin key:" in x)
        return line.split()[2], line

    first, first_line = admin_key()
    assert "new; kept in" in first_line
    assert (tmp_path / "d" / "admin.key").stat().st_mode & 0o777 == 0o600
    again, again_line = admin_key()
    assert again == first and "the earlier demo's" in again_line
    fresh, _ = admin_key("--fresh")
    assert fresh != first


def test_config_check_gives_lines_and_names_a_typo_first(demo_db: Path, tmp_path: Path) -> None:
    """A misspelt setting is reported on its line with the setting it resembles, and the
    problems it causes are said to perhaps follow from it (not presented as new ones)."""
    text = config_yaml(str(demo_db), str(tmp_path / "ledger.db"))
    lines = text.splitlines()
    at = next(i for i, x in enumerate(lines) if x.strip() == "privacy_unit: patient_id") + 1
    path = tmp_path / "typo.yaml"
    path.write_text(text.replace("    privacy_unit: patient_id", "    privacy_unti: patient_id", 1))
    result = CliRunner().invoke(main, ["config", "check", str(path)])
    assert result.exit_code == 2
    problems = [x.removeprefix("  - ") for x in result.output.splitlines()[1:]]
    assert problems[0] == (
        f"line {at}: tables.patients.privacy_unti: unknown setting — did you mean 'privacy_unit'?"
    )
    assert len(problems) > 1  # the reference from visits to patients, now unit-less
    assert all(
        re.match(r"line \d+: ", p)
        and p.endswith(f"(perhaps only because of the typo at line {at})")
        for p in problems[1:]
    ), problems
