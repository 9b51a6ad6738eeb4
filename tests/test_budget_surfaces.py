"""One set of numbers on every surface (issue 15).

One analyst, a few queries of every kind (Laplace, Gaussian, partition selection) against a
real gateway served over HTTP, then the same budget read from: ``GET /v1/budget``, the
``budget`` of the last response, ``/metrics`` (``dpgate_budget_*`` gauges), the CLI
(``dpgate budget show --json`` and the line ``dpgate query`` prints) and the Python client.
They must all say the same.
"""

from __future__ import annotations

import json
import re
import shutil
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from werkzeug.serving import make_server

from dpgate_client import Client
from gateway.cli import main as dpgate
from gateway.cli.render import number
from gateway.core.config_load import load_config
from tests.conftest import ADMIN_KEY, demo_config_dict


@pytest.fixture
def served(
    demo_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[str, str, str]]:
    """(gateway URL, config path, alice's key) for a gateway served on a free port."""
    from gateway.http.app import create_app
    from gateway.pipeline.gateway import Gateway

    monkeypatch.setenv("DPGATE_ADMIN_KEY", ADMIN_KEY)
    db = tmp_path / "hospital.db"
    shutil.copy(demo_db, db)
    config_path = tmp_path / "dpgate.yaml"
    config_path.write_text(yaml.safe_dump(demo_config_dict(db, tmp_path / "ledger.db")))
    gateway = Gateway(load_config(config_path))
    key = gateway.ledger.create_analyst("alice", 6.0, 1e-6, "month")
    server = make_server("127.0.0.1", 0, create_app(gateway.config, gateway=gateway), threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.port}", str(config_path), key
    finally:
        server.shutdown()
        thread.join()
        gateway.ledger.close()


def metric(text: str, name: str, analyst: str) -> float:
    found = re.search(rf'^{name}{{analyst="{re.escape(analyst)}"}} (\S+)$', text, re.M)
    assert found, f"{name} for {analyst} not in /metrics"
    return float(found.group(1))


def test_the_four_surfaces_agree(served: tuple[str, str, str]) -> None:
    url, config_path, key = served
    client = Client(url, key)
    last: Any = None
    for sql, params in (
        ("SELECT sex, COUNT(*) AS n FROM patients GROUP BY sex", {"epsilon": 0.3}),
        ("SELECT disease, COUNT(*) AS n FROM patients GROUP BY disease", {"epsilon": 0.2}),
        ("SELECT zip, COUNT(*) AS n FROM patients GROUP BY zip", {"epsilon": 0.4}),
        ("SELECT COUNT(*) AS n FROM patients WHERE age > 50", {"accuracy": 8.0}),
    ):
        last = client.query(sql, **params)
        assert last.charge is not None and last.charge["epsilon"] > 0
    basic_so_far = client.budget()
    assert basic_so_far.basis == "basic"
    last = client.query(
        "SELECT smoker, COUNT(*) AS n FROM patients GROUP BY smoker",
        epsilon=0.5,
        mechanism="gaussian",
        delta=1e-8,
    )
    response = dict(last.raw["budget"])

    # 1. GET /v1/budget (through the client's transport: the raw JSON)
    budget_json = dict(client.budget().raw)
    # 2. the client's parsed budget
    parsed = client.budget()
    # 3. /metrics
    with urllib.request.urlopen(f"{url}/metrics") as resp:
        metrics = resp.read().decode()
    # 4. the CLI
    runner = CliRunner()
    shown = runner.invoke(dpgate, ["budget", "show", "alice", "--config", config_path, "--json"])
    assert shown.exit_code == 0, shown.output
    cli_json = json.loads(shown.output)[0]
    printed = runner.invoke(
        dpgate, ["query", "--url", url, "--key", key, "--dry-run", "SELECT COUNT(*) FROM patients"]
    )
    assert printed.exit_code == 0, printed.output

    spent = budget_json["epsilon_spent"]
    assert budget_json["basis"] == "zcdp"  # the Gaussian query ended basic composition
    assert budget_json["queries"] == 5 and budget_json["period"] == "month"
    assert budget_json["period_ends_at"] is not None
    for field in (
        "epsilon",
        "epsilon_spent",
        "epsilon_remaining",
        "delta_spent",
        "queries",
        "period",
        "period_ends_at",
        "basis",
        "rho_spent",
    ):
        assert response[field] == budget_json[field] == cli_json[field], field
    assert (
        parsed.epsilon_spent == spent
        and parsed.epsilon_remaining == (budget_json["epsilon_remaining"])
    )
    assert parsed.period == "month" and parsed.period_ends_at is not None
    assert parsed.period_ends_at.isoformat() == budget_json["period_ends_at"]
    # /metrics keeps every digit (machines read it); JSON carries 12 (budget.records)
    same = {"rel": 1e-11, "abs": 1e-300}
    assert metric(metrics, "dpgate_budget_epsilon_spent", "alice") == pytest.approx(spent, **same)
    assert metric(metrics, "dpgate_budget_epsilon", "alice") == budget_json["epsilon"]
    assert metric(metrics, "dpgate_budget_epsilon_remaining", "alice") == pytest.approx(
        budget_json["epsilon_remaining"], **same
    )
    assert metric(metrics, "dpgate_budget_delta_spent", "alice") == pytest.approx(
        budget_json["delta_spent"], **same
    )
    assert metric(metrics, "dpgate_budget_queries", "alice") == 5
    assert f"ε {number(spent)} spent of {number(6.0)}" in printed.output
