"""Admin commands: analysts, keys, budgets and the audit log, straight on the ledger.

    dpgate analyst add NAME --epsilon E --delta D [--period P]   prints the new API key (once)
    dpgate analyst list [--json]
    dpgate analyst disable NAME / analyst enable NAME
    dpgate key rotate NAME                            prints the new API key (once)
    dpgate budget show [NAME] [--json]                one analyst, or all (+ the global budget)
    dpgate budget set NAME [--epsilon E] [--delta D] [--period P]
    dpgate budget set --global [--epsilon E] [--delta D] [--period P]
    dpgate audit-log [--analyst A] [--actor W] [--since T] [--until T] [--limit N] [--json]
    dpgate audit-log verify [--anchor SEQ:HASH] [--against EXPORT.jsonl]
    dpgate audit-log export [--after SEQ] [--output FILE]
    dpgate admin add NAME --role admin|auditor        prints the admin's key (once)
    dpgate admin list [--json] / admin disable NAME / admin enable NAME
    dpgate grant … / dpgate group …                   table grants (gateway/cli/access.py)

Every change (``analyst add``/``disable``/``enable``, ``key rotate``, ``budget set``,
``budget set --global``) writes one audit-log row in its own transaction, naming who
(``--actor``, default the OS user), the action and its parameters (never the key).

``--period`` is ``day``, ``week``, ``month`` or ``none`` (the default): the budget renews
at the end of each period (UTC).

Each takes ``--config FILE`` (or ``DPGATE_CONFIG``): the ledger URL, the composition and
the global budget come from it. They work while the gateway is serving: the ledger
serializes its writers.
"""

from __future__ import annotations

import getpass
import json
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import click

import budget
from gateway.cli.render import delta_line, number, period_line
from gateway.core.config import ConfigError
from gateway.core.config_load import load_config

CONFIG_OPTION = click.option(
    "--config",
    "config_path",
    envvar="DPGATE_CONFIG",
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="The dpgate YAML config (or env DPGATE_CONFIG).",
)
JSON_OPTION = click.option("--json", "as_json", is_flag=True, help="Print JSON.")
ACTOR_OPTION = click.option(
    "--actor",
    default=None,
    help="Who makes the change, for the audit log (default: the OS user).",
)


def _caller(actor: str | None, command: str) -> budget.AdminCaller:
    """The audit log's who and where for a CLI change."""
    if actor is None:
        try:
            actor = getpass.getuser()
        except (KeyError, OSError):  # no name for this uid (a container)
            actor = "unknown"
    if not actor.strip():
        raise click.BadParameter("must not be empty", param_hint="--actor")
    return budget.AdminCaller(
        actor=f"cli:{actor.strip()}"[:64],
        request_id=uuid.uuid4().hex,
        endpoint=f"cli {command}",
    )


def _period_option(default: str | None) -> Any:
    return click.option(
        "--period",
        type=click.Choice(budget.PERIODS),
        default=default,
        show_default=default is not None,
        help="Renew the budget at the end of each day, week or month (UTC); none: never.",
    )


def open_ledger(config_path: str) -> budget.Ledger:
    """The ledger a config names, migrated (so admin commands work on a fresh database)."""
    try:
        config = load_config(config_path)
    except ConfigError as e:
        raise click.ClickException(str(e)) from None
    ledger = budget.Ledger.from_url(
        config.ledger.url,
        **config.privacy.ledger_options(),
    )
    with _ledger_errors():
        ledger.migrate()
    return ledger


@contextmanager
def _ledger_errors() -> Iterator[None]:
    try:
        yield
    except (budget.LedgerError, ValueError) as e:
        raise click.ClickException(str(e)) from None


def _print_status(status: budget.BudgetStatus) -> None:
    state = " (disabled)" if status.disabled else ""
    click.echo(f"{status.name}{state}  [{status.composition}]  queries: {status.queries}")
    click.echo("  " + period_line(status.to_json()))
    click.echo(
        f"  ε: {number(status.epsilon_spent)} spent of {number(status.epsilon)}, "
        f"{number(status.epsilon_remaining)} remaining "
        f"({_basis(status)})"
    )
    click.echo("  " + delta_line(status.to_json()))
    click.echo(
        f"  ρ: {number(status.rho_spent)} spent of {number(status.rho_budget)}; largest next "
        f"Laplace query: ε = {number(status.max_next_laplace_epsilon)}"
    )


def _basis(status: budget.BudgetStatus) -> str:
    """Which total ε spent is, and the other one."""
    basic, zcdp = number(status.epsilon_spent_basic), number(status.epsilon_spent_zcdp)
    if status.composition == "pure":
        return "basic composition"
    if status.composition == "zcdp":
        return "zCDP"
    chosen = "basic composition" if status.basis == "basic" else "zCDP"
    return f"by {chosen}, the smaller of two totals: basic composition {basic}, zCDP {zcdp}"


def _print_statuses(statuses: list[budget.BudgetStatus], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps([s.to_json() for s in statuses], indent=2))
        return
    if not statuses:
        click.echo("no analysts")
    for s in statuses:
        _print_status(s)


@click.group("analyst")
def analyst_group() -> None:
    """Create, list, disable and enable analysts."""


@analyst_group.command("add")
@click.argument("name")
@click.option("--epsilon", type=float, required=True, help="Total ε budget.")
@click.option("--delta", type=float, required=True, help="Total δ budget.")
@_period_option("none")
@CONFIG_OPTION
@ACTOR_OPTION
def analyst_add(
    name: str, epsilon: float, delta: float, period: str, config_path: str, actor: str | None
) -> None:
    """Create analyst NAME with budget (ε, δ); prints their API key (shown only once)."""
    caller = _caller(actor, "analyst add")
    ledger = open_ledger(config_path)
    with _ledger_errors():
        key = ledger.create_analyst(
            name,
            epsilon,
            delta,
            period,  # type: ignore[arg-type]
            caller=caller,
        )
    click.echo(f"created analyst {name}; API key (shown once, store it now):", err=True)
    click.echo(key)


@analyst_group.command("list")
@CONFIG_OPTION
@JSON_OPTION
def analyst_list(config_path: str, as_json: bool) -> None:
    """Every analyst with their budget."""
    with _ledger_errors():
        _print_statuses(open_ledger(config_path).list_analysts(), as_json)


ANALYST_DISABLE_HELP = "Disable analyst NAME: their key is refused; their ledger entries stay."
ADMIN_DISABLE_HELP = "Disable admin NAME: their key is refused."


def _add_toggles(
    group: click.Group,
    kind: str,
    update: Callable[..., object],
    disable_help: str,
) -> None:
    """The ``disable NAME`` and ``enable NAME`` commands of ``group`` (analysts, admins):
    ``update`` (``Ledger.update_analyst``, ``Ledger.update_admin``) sets the named one's
    flag in the ledger, as the caller."""

    def toggle(disabled: bool) -> Callable[..., None]:
        def command(name: str, config_path: str, actor: str | None) -> None:
            caller = _caller(actor, f"{kind} {'disable' if disabled else 'enable'}")
            with _ledger_errors():
                update(open_ledger(config_path), name, disabled=disabled, caller=caller)
            click.echo(f"{kind} {name} {'disabled' if disabled else 'enabled'}")

        return click.argument("name")(CONFIG_OPTION(ACTOR_OPTION(command)))

    group.command("disable", help=disable_help)(toggle(True))
    group.command("enable", help=f"Enable a disabled {kind} again.")(toggle(False))


_add_toggles(analyst_group, "analyst", budget.Ledger.update_analyst, ANALYST_DISABLE_HELP)


@click.group("key")
def key_group() -> None:
    """Analyst API keys."""


@key_group.command("rotate")
@click.argument("name")
@CONFIG_OPTION
@ACTOR_OPTION
def key_rotate(name: str, config_path: str, actor: str | None) -> None:
    """Give analyst NAME a new API key (printed once); the old key stops working."""
    caller = _caller(actor, "key rotate")
    with _ledger_errors():
        key = open_ledger(config_path).rotate_key(name, caller=caller)
    click.echo(f"new API key for {name} (shown once; the old key no longer works):", err=True)
    click.echo(key)


@click.group("budget")
def budget_group() -> None:
    """Show and set privacy budgets."""


@budget_group.command("show")
@click.argument("name", required=False)
@CONFIG_OPTION
@JSON_OPTION
def budget_show(name: str | None, config_path: str, as_json: bool) -> None:
    """Show analyst NAME's budget, or every analyst's and the global one."""
    ledger = open_ledger(config_path)
    with _ledger_errors():
        if name is not None:
            _print_statuses([ledger.budget_status(name)], as_json)
            return
        statuses = ledger.list_analysts()
        global_status = ledger.global_status()
    _print_statuses(statuses + ([global_status] if global_status else []), as_json)


@budget_group.command("set")
@click.argument("name", required=False)
@click.option(
    "--global",
    "is_global",
    is_flag=True,
    help="Set the dataset-wide budget (all analysts together) instead of an analyst's.",
)
@click.option("--epsilon", type=float, default=None, help="New total ε budget.")
@click.option("--delta", type=float, default=None, help="New total δ budget.")
@_period_option(None)
@CONFIG_OPTION
@ACTOR_OPTION
def budget_set(
    name: str | None,
    is_global: bool,
    epsilon: float | None,
    delta: float | None,
    period: str | None,
    config_path: str,
    actor: str | None,
) -> None:
    """Set analyst NAME's budget or period, or the global one (what is spent stays spent)."""
    if is_global == (name is not None):
        raise click.UsageError("give an analyst NAME or --global (not both)")
    if epsilon is None and delta is None and period is None:
        raise click.UsageError("give --epsilon, --delta and/or --period")
    caller = _caller(actor, "budget set --global" if name is None else "budget set")
    ledger = open_ledger(config_path)
    with _ledger_errors():
        if name is None:
            status = ledger.set_global_budget(
                epsilon=epsilon,
                delta=delta,
                period=period,  # type: ignore[arg-type]
                caller=caller,
            )
        else:
            status = ledger.update_analyst(
                name,
                epsilon=epsilon,
                delta=delta,
                period=period,  # type: ignore[arg-type]
                caller=caller,
            )
    _print_status(status)


def _parse_time(_ctx: Any, _param: Any, value: str | None) -> datetime | None:
    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise click.BadParameter("expected an ISO 8601 time, e.g. 2026-01-31T12:00") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


@click.group("audit-log", invoke_without_command=True)
@click.option("--analyst", default=None, help="Only this analyst's requests.")
@click.option("--actor", default=None, help="Only what this actor did (an admin, cli:USER).")
@click.option("--since", default=None, callback=_parse_time, help="ISO 8601 (UTC if no zone).")
@click.option("--until", default=None, callback=_parse_time, help="ISO 8601 (UTC if no zone).")
@click.option("--limit", type=click.IntRange(1, 100_000), default=100, show_default=True)
@click.option(
    "--config",
    "config_path",
    envvar="DPGATE_CONFIG",
    default=None,
    type=click.Path(exists=True, dir_okay=False),
    help="The dpgate YAML config (or env DPGATE_CONFIG).",
)
@JSON_OPTION
@click.pass_context
def audit_log(
    ctx: click.Context,
    analyst: str | None,
    actor: str | None,
    since: datetime | None,
    until: datetime | None,
    limit: int,
    config_path: str | None,
    as_json: bool,
) -> None:
    """The request audit log, newest first; ``verify`` checks its hash chain, ``export``
    writes it as JSON lines."""
    if ctx.invoked_subcommand is not None:
        return
    if config_path is None:
        raise click.UsageError("give --config FILE (or set DPGATE_CONFIG)")
    with _ledger_errors():
        entries = open_ledger(config_path).audit_log(
            analyst=analyst, since=since, until=until, limit=limit, actor=actor
        )
    if as_json:
        click.echo(json.dumps([e.to_json() for e in entries], indent=2))
        return
    for e in entries:
        who = e.actor or e.analyst or "-"
        # A refused request's outcome is its error code: print it once.
        code = f" {e.error_code}" if e.error_code and e.error_code != e.outcome else ""
        what = f" {e.action}" if e.action else ""
        params = f" {json.dumps(e.params, sort_keys=True)}" if e.params else ""
        sql = f"  {e.sql}" if e.sql else ""
        click.echo(
            f"{e.created_at.isoformat(timespec='seconds')} {e.status} {e.outcome}{code} "
            f"{who} {e.endpoint}{what}{params}{sql}"
        )


def _parse_anchor(_ctx: Any, _param: Any, value: str | None) -> tuple[int, str] | None:
    if value is None:
        return None
    seq, _, digest = value.partition(":")
    if not seq.isdigit() or len(digest) != 64:
        raise click.BadParameter("expected SEQ:HASH, as `verify` prints the head")
    return int(seq), digest.lower()


def _read_export(path: str) -> list[dict[str, Any]]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for number_, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                raise click.ClickException(f"{path}:{number_}: not a JSON line") from None
            if not isinstance(row, dict) or not {"seq", "hash", "prev_hash"} <= set(row):
                raise click.ClickException(f"{path}:{number_}: not an audit-log export row")
            rows.append(row)
    return rows


@audit_log.command("verify")
@click.option(
    "--anchor",
    default=None,
    callback=_parse_anchor,
    help="A head kept outside (SEQ:HASH, as printed here before): it must still be there.",
)
@click.option(
    "--against",
    "against",
    default=None,
    type=click.Path(exists=True, dir_okay=False),
    help="An export kept outside: every row of it must still be in the chain unchanged.",
)
@CONFIG_OPTION
@JSON_OPTION
def audit_log_verify(
    anchor: tuple[int, str] | None, against: str | None, config_path: str, as_json: bool
) -> None:
    """Check the audit log's hash chain; name the first row altered or removed.

    Exits 1 when the chain is broken. Rows removed from the end, or a log rewritten
    whole, are found only against a head (--anchor) or an export (--against) kept
    outside the database."""
    kept = _read_export(against) if against else []
    with _ledger_errors():
        verdict = open_ledger(config_path).verify_audit_log(anchor=anchor, kept=kept)
    brk = verdict.first_break
    if as_json:
        click.echo(
            json.dumps(
                {
                    "ok": verdict.ok,
                    "rows": verdict.rows,
                    "head": {"seq": verdict.head_seq, "hash": verdict.head_hash},
                    "first_break": None
                    if brk is None
                    else {"seq": brk.seq, "id": brk.row_id, "kind": brk.kind, "detail": brk.detail},
                },
                indent=2,
            )
        )
    elif brk is None:
        click.echo(f"ok: {verdict.rows} rows; head {verdict.head_seq}:{verdict.head_hash}")
    else:
        click.echo(f"BROKEN at row {brk.seq} ({brk.kind}): {brk.detail}")
    if brk is not None:
        sys.exit(1)


@audit_log.command("export")
@click.option("--after", type=click.IntRange(0), default=0, help="Only rows after this seq.")
@click.option(
    "--output",
    "-o",
    default="-",
    type=click.File("w", encoding="utf-8", lazy=True),
    help="The file to write (default: standard output).",
)
@CONFIG_OPTION
def audit_log_export(after: int, output: Any, config_path: str) -> None:
    """Write the audit log, in chain order, as JSON lines with each row's hashes: a copy
    an outside system can keep (and give back to `verify --against`)."""
    with _ledger_errors():
        for row in open_ledger(config_path).export_audit_log(after):
            output.write(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n")


@click.group("admin")
def admin_group() -> None:
    """Named admins with their own keys: role admin (everything) or auditor (read only)."""


@admin_group.command("add")
@click.argument("name")
@click.option("--role", type=click.Choice(budget.ADMIN_ROLES), required=True)
@CONFIG_OPTION
@ACTOR_OPTION
def admin_add(name: str, role: str, config_path: str, actor: str | None) -> None:
    """Create admin NAME with ROLE; prints their key (shown only once)."""
    caller = _caller(actor, "admin add")
    with _ledger_errors():
        key = open_ledger(config_path).create_admin(
            name,
            role,  # type: ignore[arg-type]
            caller=caller,
        )
    click.echo(f"created admin {name} ({role}); key (shown once, store it now):", err=True)
    click.echo(key)


@admin_group.command("list")
@CONFIG_OPTION
@JSON_OPTION
def admin_list(config_path: str, as_json: bool) -> None:
    """Every named admin and their role."""
    with _ledger_errors():
        admins = open_ledger(config_path).list_admins()
    if as_json:
        click.echo(json.dumps([a.to_json() for a in admins], indent=2))
        return
    for a in admins:
        click.echo(f"{a.name}  {a.role}{'  (disabled)' if a.disabled else ''}")


_add_toggles(admin_group, "admin", budget.Ledger.update_admin, ADMIN_DISABLE_HELP)


ADMIN_COMMANDS: tuple[click.Command, ...] = (
    analyst_group,
    key_group,
    budget_group,
    audit_log,
    admin_group,
)


def register_admin_commands(group: click.Group) -> None:
    """Add ``analyst``, ``key``, ``budget``, ``audit-log``, ``admin``, ``grant`` and
    ``group`` to the ``dpgate`` group."""
    from gateway.cli.access import ACCESS_COMMANDS

    for command in (*ADMIN_COMMANDS, *ACCESS_COMMANDS):
        group.add_command(command)


__all__: list[str] = ["ADMIN_COMMANDS", "open_ledger", "register_admin_commands"]
