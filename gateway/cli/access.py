"""Grant and group commands, straight on the ledger (``gateway.pipeline.access``):

    dpgate grant list [--json]                  every table, its groups, who reads it
    dpgate grant add TABLE GROUP                members of GROUP may read TABLE
    dpgate grant remove TABLE GROUP
    dpgate group list [--json]                  every group and its members
    dpgate group add-member GROUP ANALYST
    dpgate group remove-member GROUP ANALYST

Each change writes one audit-log row in its own transaction (``--actor``, default the
OS user) and applies to the next request of a running gateway.
"""

from __future__ import annotations

import json

import click

from gateway.cli.admin import (
    ACTOR_OPTION,
    CONFIG_OPTION,
    JSON_OPTION,
    _caller,
    _ledger_errors,
    open_ledger,
)
from gateway.core.config import ConfigError
from gateway.core.config_load import load_config
from gateway.core.errors import GatewayError
from gateway.pipeline.access import Access


def _access(config_path: str) -> Access:
    try:
        config = load_config(config_path)
    except ConfigError as e:
        raise click.ClickException(str(e)) from None
    return Access(config.tables, config.access, lambda tables: None)


@click.group("grant")
def grant_group() -> None:
    """Which groups may read which tables (tables.<t>.grants in the config, and these)."""


@grant_group.command("list")
@CONFIG_OPTION
@JSON_OPTION
def grant_list(config_path: str, as_json: bool) -> None:
    """Every declared table, the groups that may read it, and who reads it."""
    access = _access(config_path)
    with _ledger_errors():
        report = access.report(open_ledger(config_path).access())
    if as_json:
        click.echo(json.dumps({"default": access.config.default, "tables": report}, indent=2))
        return
    for row in report:
        groups = ", ".join(row["groups"]) or "-"  # type: ignore[arg-type]
        click.echo(f"{row['table']}  read by {row['readable_by']}  groups: {groups}")


@grant_group.command("add")
@click.argument("table")
@click.argument("group")
@CONFIG_OPTION
@ACTOR_OPTION
def grant_add(table: str, group: str, config_path: str, actor: str | None) -> None:
    """Let members of GROUP read TABLE."""
    caller = _caller(actor, "grant add")
    try:
        name = _access(config_path).table(table)
    except GatewayError as e:
        raise click.ClickException(e.message) from None
    with _ledger_errors():
        open_ledger(config_path).grant(name, group, caller=caller)
    click.echo(f"granted {name} to {group}")


@grant_group.command("remove")
@click.argument("table")
@click.argument("group")
@CONFIG_OPTION
@ACTOR_OPTION
def grant_remove(table: str, group: str, config_path: str, actor: str | None) -> None:
    """Take back GROUP's grant on TABLE."""
    caller = _caller(actor, "grant remove")
    access = _access(config_path)
    ledger = open_ledger(config_path)
    try:
        name = access.table(table)
        with _ledger_errors():
            access.check_revoke(ledger.access(), name, group)
    except GatewayError as e:
        raise click.ClickException(e.message) from None
    with _ledger_errors():
        ledger.revoke(name, group, caller=caller)
    click.echo(f"revoked {name} from {group}")


@click.group("group")
def group_group() -> None:
    """Groups of analysts, to which tables are granted."""


@group_group.command("list")
@CONFIG_OPTION
@JSON_OPTION
def group_list(config_path: str, as_json: bool) -> None:
    """Every group with members, and its members."""
    with _ledger_errors():
        groups = open_ledger(config_path).group_members()
    if as_json:
        click.echo(json.dumps(groups, indent=2))
        return
    for name, members in sorted(groups.items()):
        click.echo(f"{name}: {', '.join(members)}")


@group_group.command("add-member")
@click.argument("group")
@click.argument("analyst")
@CONFIG_OPTION
@ACTOR_OPTION
def group_add_member(group: str, analyst: str, config_path: str, actor: str | None) -> None:
    """Put ANALYST in GROUP."""
    caller = _caller(actor, "group add-member")
    with _ledger_errors():
        open_ledger(config_path).add_member(group, analyst, caller=caller)
    click.echo(f"{analyst} is in {group}")


@group_group.command("remove-member")
@click.argument("group")
@click.argument("analyst")
@CONFIG_OPTION
@ACTOR_OPTION
def group_remove_member(group: str, analyst: str, config_path: str, actor: str | None) -> None:
    """Take ANALYST out of GROUP."""
    caller = _caller(actor, "group remove-member")
    with _ledger_errors():
        open_ledger(config_path).remove_member(group, analyst, caller=caller)
    click.echo(f"{analyst} is no longer in {group}")


ACCESS_COMMANDS: tuple[click.Command, ...] = (grant_group, group_group)

__all__ = ["ACCESS_COMMANDS"]
