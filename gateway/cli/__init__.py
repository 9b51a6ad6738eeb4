"""The ``dpgate`` command: serve, demo, query, config check, and the admin commands."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from gateway.cli.render import print_answer, print_dry_run
from gateway.cli.schema_report import SchemaReport, schema_report
from gateway.core.config import ConfigError
from gateway.core.config_load import load_config


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="dpgate")
def main() -> None:
    """dpgate: a differentially private SQL query gateway."""


@main.command()
@click.option(
    "--config",
    "config_path",
    envvar="DPGATE_CONFIG",
    required=True,
    type=click.Path(dir_okay=False),
    help="The dpgate YAML config (or env DPGATE_CONFIG).",
)
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8080, show_default=True, type=int)
@click.option("--workers", default=1, show_default=True, type=int)
def serve(config_path: str, host: str, port: int, workers: int) -> None:
    """Serve the gateway with a production WSGI server (gunicorn; waitress as fallback)."""
    from gateway.server.serve import run

    try:
        load_config(config_path)
    except ConfigError:
        pass  # run() reports every problem of the config and exits with status 2
    else:
        check_port(host, port, "--port P")
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
@click.option(
    "--pg-port",
    default=None,
    type=int,
    help="the PostgreSQL protocol's port (default: the HTTP port + 7352, 8080 → 15432)",
)
@click.option("--no-serve", is_flag=True, help="build the demo and print the key, then exit")
@click.option(
    "--fresh",
    is_flag=True,
    help="start afresh: forget the earlier demo's answers, spent budget and analysts",
)
def demo(
    directory: str,
    host: str,
    port: int,
    workers: int,
    pg_port: int | None,
    no_serve: bool,
    fresh: bool,
) -> None:
    """Build the demo hospital database and config, print a demo analyst key, and serve.

    Run again, it resumes the earlier demo (same ledger: what was spent stays spent) and
    says so; --fresh starts a new ledger.
    """
    from gateway.cli.demo import prepare

    if not no_serve:
        check_port(host, port, _make_or("PORT=8081", "--port 8081"))
    if pg_port is None:
        pg_port = port + 7352 if port + 7352 <= 65535 else port - 7352
    demo_run = prepare(Path(directory), fresh=fresh, postgres_port=pg_port)
    admin_key = demo_run.admin_key
    os.environ["DPGATE_ADMIN_KEY"] = admin_key  # what the served gateway reads
    admin_note = {
        "environment": "(from DPGATE_ADMIN_KEY)",
        "kept": f"(the earlier demo's, kept in {_shown(demo_run.config.parent / 'admin.key')})",
        "new": f"(new; kept in {_shown(demo_run.config.parent / 'admin.key')} for the next demo)",
    }[demo_run.admin_key_source]
    url = f"http://{host}:{port}"
    dpgate = self_command()
    config = _shown(demo_run.config)
    sql = "SELECT disease, COUNT(*) AS n FROM patients WHERE age >= 40 GROUP BY disease"
    join = (
        "SELECT z.region, COUNT(*) AS n FROM patients p "
        "LEFT JOIN zip_regions z ON p.zip = z.zip GROUP BY z.region"
    )
    key = demo_run.key
    click.echo(
        f"""
dpgate demo
  data:    {_shown(demo_run.database)}  (12,000 synthetic patients, their visits, zip regions)
  config:  {config}
  ledger:  {_shown(demo_run.ledger)}

  demo analyst key: {key}
  admin key:        {admin_key}  {admin_note}
  web console:      {url}/ui/  (sign in with either key)
"""
    )
    if demo_run.resumed is not None:
        click.echo(
            f"""  Resumed the earlier demo: its ledger keeps what was spent and who was added
  ({demo_run.resumed}). The key above is new; older demo keys no longer work.
  To start afresh: {_make_or("FRESH=1", "--fresh")}
"""
        )
    click.echo(
        f"""Try it{" (in another terminal: this one serves)" if not no_serve else ""}:
  curl -s {url}/v1/query \\
    -H 'Authorization: Bearer {key}' -H 'Content-Type: application/json' \\
    -d '{{"sql": "{sql}", "epsilon": 0.5}}'

  curl -s {url}/v1/budget -H 'Authorization: Bearer {key}'
  {dpgate} query --url {url} --key {key} "SELECT COUNT(*) FROM patients"
  {dpgate} query --url {url} --key {key} "{join}"
  {dpgate} query --url {url} --key {key} --dry-run "SELECT zip, COUNT(*) FROM patients GROUP BY zip"
  {dpgate} budget show demo --config {config}
  PGPASSWORD={key} psql "host={host} port={pg_port} user=demo dbname=dpgate sslmode=disable"
"""
    )
    if no_serve:
        return
    click.echo(f"serving on {url} (Ctrl-C to stop)")
    from gateway.server.serve import run

    run(str(demo_run.config), host=host, port=port, workers=workers)


def check_port(host: str, port: int, how_to_change: str) -> None:
    """Fail at once, naming the port, if another program already listens on it."""
    import errno
    import socket

    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except (socket.gaierror, UnicodeError, OverflowError):
        raise click.ClickException(f"cannot serve on {host}:{port}: no such address") from None
    with socket.socket(family, kind, proto) as probe:
        # As gunicorn and waitress bind: a port left in TIME_WAIT is free, a listener not.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise click.ClickException(
                    f"port {port} on {host} is already in use by another program; "
                    f"choose another port: {how_to_change}"
                ) from None
            raise click.ClickException(
                f"cannot serve on {host}:{port}: {e.strerror}; choose another port: {how_to_change}"
            ) from None


def self_command() -> str:
    """How to run this same ``dpgate`` again from the current directory, as printed.

    ``dpgate`` if that is what the shell finds; else the script's path (``.venv/bin/dpgate``
    after ``make demo``), or ``python -m gateway.cli`` when run as a module.
    """
    import shlex
    import shutil

    script = Path(sys.argv[0])
    if script.name != "dpgate" or not script.is_file():
        return f"{shlex.quote(sys.executable)} -m gateway.cli"
    found = shutil.which("dpgate")
    if found and Path(found).resolve() == script.resolve():
        return "dpgate"
    return shlex.quote(str(_shown(script)))


def _shown(path: Path) -> str:
    """A path as a user would type it here: relative when under the current directory."""
    absolute = path.absolute()
    try:
        return str(absolute.relative_to(Path.cwd()))
    except ValueError:
        return str(absolute)


def _make_or(make_variable: str, option: str) -> str:
    """The way to pass an option, as ``make demo`` (MAKELEVEL is set) or the CLI takes it."""
    if os.environ.get("MAKELEVEL"):
        return f"make demo {make_variable}"
    return f"{self_command()} demo {option}"


@main.command()
@click.argument("sql")
@click.option("--url", envvar="DPGATE_URL", default="http://127.0.0.1:8080", show_default=True)
@click.option("--key", envvar="DPGATE_KEY", required=True, help="analyst API key ($DPGATE_KEY)")
@click.option("--epsilon", type=float, default=None)
@click.option(
    "--accuracy",
    type=float,
    default=None,
    help="instead of --epsilon: the 95%% half-width wanted; the smallest ε meeting it is used",
)
@click.option("--delta", type=float, default=None)
@click.option("--mechanism", type=click.Choice(["laplace", "gaussian"]), default=None)
@click.option("--dry-run", is_flag=True)
@click.option("--json", "as_json", is_flag=True, help="print the raw JSON response")
def query(
    sql: str,
    url: str,
    key: str,
    epsilon: float | None,
    accuracy: float | None,
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
    if accuracy is not None:
        body["accuracy"] = {"ci95_halfwidth": accuracy}
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
    elif answer.get("dry_run"):
        print_dry_run(answer)
    else:
        print_answer(answer)
    if not answer.get("ok"):
        sys.exit(1)


@main.group()
def config() -> None:
    """Configuration commands."""


@config.command("check")
@click.argument("path", required=False)
@click.option("--config", "config_option", type=click.Path(dir_okay=False))
@click.option(
    "--measure",
    is_flag=True,
    help="Also time statements on the protected database and print the cost model's "
    "coefficients and row counts to declare (docs/operations.md, 'Release deadlines').",
)
@click.option("--repeat", default=5, show_default=True, type=click.IntRange(1, 100))
def config_check(path: str | None, config_option: str | None, measure: bool, repeat: int) -> None:
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
    report = _check_against_database(cfg)
    if report.problems:
        click.echo(f"{target}: the config is valid, but:", err=True)
        for problem in report.problems:
            click.echo(f"  - {problem}", err=True)
        sys.exit(2)
    tables = ", ".join(t.name for t in cfg.tables.values())
    click.echo(f"{target}: OK ({len(cfg.tables)} table(s): {tables})")
    for note in report.notes:
        click.echo(note)
    notes = _nullability_report(cfg)
    if notes:
        click.echo("Nullable only by the catalogue (declare `nullable:` to decide):")
        for note in notes:
            click.echo(f"  - {note}")
    if measure:
        from gateway.cli.measure_report import measure_config, measure_lines

        for line in measure_lines(cfg, measure_config(cfg, repeat)):
            click.echo(line)


def _nullability_report(cfg: object) -> list[str]:
    """Columns nullable only because the catalogue says so, and what `nullable: false`
    would change (gateway/cli/nullability.py). Catalogue metadata, never rows."""
    from gateway.cli.nullability import nullability_notes
    from gateway.core.config import Config
    from gateway.sql.execute import nullability_by_schema, open_protected_engine

    assert isinstance(cfg, Config)
    engine = open_protected_engine(cfg.database.url, statement_timeout_ms=5000)
    try:
        return nullability_notes(cfg, nullability_by_schema(engine, cfg.tables))
    finally:
        engine.dispose()


def _check_against_database(cfg: object) -> SchemaReport:
    """Declared tables and columns exist in the protected database, what its catalogue
    says of them (``gateway/cli/schema_report.py``), and the declared join keys are
    stored as declared (``gateway/sql/join_keys.py``, ``key_type_problems``)."""
    import sqlalchemy as sa

    from gateway.core.config import Config
    from gateway.sql.engines.catalogue import read_schema
    from gateway.sql.execute import open_protected_engine
    from gateway.sql.join_keys import key_type_problems

    assert isinstance(cfg, Config)
    try:
        engine = open_protected_engine(cfg.database.url, statement_timeout_ms=5000)
    except Exception as e:  # the database itself is unreachable, or its driver missing
        return SchemaReport(
            (f"database.url: cannot open the protected database ({_reason(e)})",), ()
        )
    try:
        report = schema_report(cfg, read_schema(engine, cfg.tables))
        if report.problems:
            return report
        try:
            keys = key_type_problems(engine, cfg.tables)
        except (sa.exc.SQLAlchemyError, NotImplementedError) as e:
            keys = [f"database.url: cannot read the join keys' storage ({type(e).__name__})"]
        return SchemaReport(tuple(keys), report.notes)
    finally:
        engine.dispose()


def _reason(e: BaseException) -> str:
    """An exception's class, and for a missing driver the module to install."""
    if isinstance(e, ImportError) and e.name:
        return f"{type(e).__name__}: {e.name} is not installed; see docs/operations.md"
    return type(e).__name__


def _register() -> None:
    from gateway.cli.admin import register_admin_commands

    register_admin_commands(main)


_register()
