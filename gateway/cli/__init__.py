"""The ``dpgate`` command: serve, demo, query, config check, and the admin commands."""

from __future__ import annotations

import json
import os
import secrets
import sys
from pathlib import Path
from typing import Any

import click

from gateway.config import ConfigError, load_config


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="dpgate")
def main() -> None:
    """dpgate: a differentially private SQL query gateway."""


@main.command()
@click.option("--config", "config_path", required=True, type=click.Path(dir_okay=False))
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8080, show_default=True, type=int)
@click.option("--workers", default=1, show_default=True, type=int)
def serve(config_path: str, host: str, port: int, workers: int) -> None:
    """Serve the gateway with a production WSGI server (gunicorn; waitress as fallback)."""
    from gateway.serve import run

    run(config_path, host=host, port=port, workers=workers)


@main.command()
@click.option(
    "--dir",
    "directory",
    default="demo-data",
    show_default=True,
    type=click.Path(file_okay=False),
    help="where to write the demo database and config",
)
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8080, show_default=True, type=int)
@click.option("--workers", default=2, show_default=True, type=int)
@click.option("--no-serve", is_flag=True, help="build the demo and print the key, then exit")
def demo(directory: str, host: str, port: int, workers: int, no_serve: bool) -> None:
    """Build the demo hospital database and config, print a demo analyst key, and serve."""
    import budget
    from gateway.demo.hospital import build, config_yaml

    root = Path(directory).resolve()
    root.mkdir(parents=True, exist_ok=True)
    db, ledger_path, config_path = root / "hospital.db", root / "ledger.db", root / "dpgate.yaml"
    if not db.exists():
        build(db)
    config_path.write_text(config_yaml(str(db), str(ledger_path)))
    config = load_config(config_path)
    ledger = budget.Ledger.from_url(
        config.ledger.url,
        composition=config.privacy.composition,
        global_budget=config.privacy.global_budget,
    )
    ledger.migrate()
    try:
        key = ledger.create_analyst("demo", 10.0, 1e-6)
    except budget.AnalystExists:
        key = ledger.rotate_key("demo")
    ledger.close()
    admin_key = os.environ.get("DPGATE_ADMIN_KEY")
    if not admin_key:
        admin_key = secrets.token_urlsafe(24)
        os.environ["DPGATE_ADMIN_KEY"] = admin_key
    url = f"http://{host}:{port}"
    sql = "SELECT disease, COUNT(*) AS n FROM patients WHERE age >= 40 GROUP BY disease"
    click.echo(
        f"""
dpgate demo
  data:    {db}  (12,000 synthetic patients, their visits)
  config:  {config_path}
  ledger:  {ledger_path}

  demo analyst key: {key}
  admin key:        {admin_key}

Try it:
  curl -s {url}/v1/query \\
    -H 'Authorization: Bearer {key}' -H 'Content-Type: application/json' \\
    -d '{{"sql": "{sql}", "epsilon": 0.5}}'

  curl -s {url}/v1/budget -H 'Authorization: Bearer {key}'
  dpgate query --url {url} --key {key} "SELECT COUNT(*) FROM patients"
"""
    )
    if no_serve:
        return
    click.echo(f"serving on {url} (Ctrl-C to stop)")
    from gateway.serve import run

    run(str(config_path), host=host, port=port, workers=workers)


@main.command()
@click.argument("sql")
@click.option("--url", envvar="DPGATE_URL", default="http://127.0.0.1:8080", show_default=True)
@click.option("--key", envvar="DPGATE_KEY", required=True, help="analyst API key ($DPGATE_KEY)")
@click.option("--epsilon", type=float, default=None)
@click.option("--delta", type=float, default=None)
@click.option("--mechanism", type=click.Choice(["laplace", "gaussian"]), default=None)
@click.option("--dry-run", is_flag=True)
@click.option("--json", "as_json", is_flag=True, help="print the raw JSON response")
def query(
    sql: str,
    url: str,
    key: str,
    epsilon: float | None,
    delta: float | None,
    mechanism: str | None,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Send one query to a running dpgate as an analyst and print the answer."""
    import urllib.error
    import urllib.request

    body: dict[str, object] = {"sql": sql, "dry_run": dry_run}
    for name, value in (("epsilon", epsilon), ("delta", delta), ("mechanism", mechanism)):
        if value is not None:
            body[name] = value
    req = urllib.request.Request(
        url.rstrip("/") + "/v1/query",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            answer = json.loads(resp.read())
    except urllib.error.HTTPError as e:
        answer = json.loads(e.read() or b"{}")
    except urllib.error.URLError as e:
        raise click.ClickException(f"cannot reach {url}: {e.reason}") from None
    if as_json:
        click.echo(json.dumps(answer, indent=2))
    elif not answer.get("ok"):
        err = answer.get("error", {})
        click.echo(
            f"error {answer.get('status')} {err.get('code')}: {err.get('message')}", err=True
        )
    else:
        _print_release(answer)
    if not answer.get("ok"):
        sys.exit(1)


def _print_release(answer: dict[str, Any]) -> None:
    columns = [str(c["name"]) for c in answer["columns"]]
    rows = [[("" if v is None else str(v)) for v in r] for r in answer["rows"]]
    widths = [max([len(c)] + [len(r[i]) for r in rows]) for i, c in enumerate(columns)]
    click.echo("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)))
    for r in rows:
        click.echo("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)))
    accuracy = answer.get("accuracy") or {}
    for name, acc in accuracy.items():
        if "ci95_halfwidth" in acc:
            click.echo(f"  {name}: ±{acc['ci95_halfwidth']:g} (95%), stddev {acc['stddev']:.3g}")
    budget = answer.get("budget") or {}
    if answer.get("cached"):
        click.echo("(cached: identical earlier answer, no charge)")
    click.echo(
        f"budget: ε spent {budget.get('epsilon_spent')}, "
        f"remaining {budget.get('epsilon_remaining')}"
    )


@main.group()
def config() -> None:
    """Configuration commands."""


@config.command("check")
@click.argument("path", required=False)
@click.option("--config", "config_option", type=click.Path(dir_okay=False))
def config_check(path: str | None, config_option: str | None) -> None:
    """Validate a config file and say precisely what is wrong."""
    target = path or config_option
    if not target:
        raise click.UsageError("give the config file: dpgate config check FILE")
    try:
        cfg = load_config(target)
    except ConfigError as e:
        click.echo(f"{target}: invalid", err=True)
        for problem in e.problems:
            click.echo(f"  - {problem}", err=True)
        sys.exit(2)
    problems = _check_against_database(cfg)
    if problems:
        click.echo(f"{target}: the config is valid, but:", err=True)
        for problem in problems:
            click.echo(f"  - {problem}", err=True)
        sys.exit(2)
    tables = ", ".join(t.name for t in cfg.tables.values())
    click.echo(f"{target}: OK ({len(cfg.tables)} table(s): {tables})")


def _check_against_database(cfg: object) -> list[str]:
    """Declared tables and columns exist in the protected database."""
    import sqlalchemy as sa

    from gateway.config import Config
    from gateway.execute import open_protected_engine

    assert isinstance(cfg, Config)
    try:
        engine = open_protected_engine(cfg.database.url, statement_timeout_ms=5000)
        inspector = sa.inspect(engine)
    except Exception as e:  # the database itself is unreachable
        return [f"database.url: cannot open the protected database ({type(e).__name__})"]
    problems = []
    try:
        for t in cfg.tables.values():
            if not inspector.has_table(t.sql_name, schema=t.schema):
                problems.append(f"tables.{t.name}: no such table in the protected database")
                continue
            present = {
                c["name"].lower() for c in inspector.get_columns(t.sql_name, schema=t.schema)
            }
            for c in t.columns.values():
                if c.name.lower() not in present:
                    problems.append(f"tables.{t.name}.columns.{c.name}: no such column")
    except sa.exc.SQLAlchemyError as e:
        problems.append(f"database.url: cannot read the schema ({type(e).__name__})")
    finally:
        engine.dispose()
    return problems


def _register() -> None:
    from gateway.cli.admin import register_admin_commands

    register_admin_commands(main)


_register()
