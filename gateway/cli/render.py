"""How the CLI shows numbers, answers and budgets: one format everywhere.

Budgets and costs print with ``number`` (six significant digits, ``∞`` for no limit),
whether they come from ``dpgate query`` (the HTTP answer) or from the admin commands
(the ledger), so the same budget reads the same in both.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import click


def number(value: Any) -> str:
    """A budget, cost or accuracy figure: six significant digits, ``∞``, or ``?``."""
    if value is None or isinstance(value, bool) or not isinstance(value, int | float):
        return "?"
    if math.isinf(value):
        return "∞"
    return f"{value:.6g}"


def budget_line(budget: Mapping[str, Any]) -> str:
    """``budget: ε 0.5 spent of 10, 9.5 remaining`` (and when it renews) from a budget
    JSON object."""
    line = (
        f"budget: ε {number(budget.get('epsilon_spent'))} spent of "
        f"{number(budget.get('epsilon'))}, {number(budget.get('epsilon_remaining'))} remaining"
    )
    if budget.get("period_ends_at"):
        line += f"; renews {budget['period_ends_at']} ({budget.get('period')})"
    return line


def delta_line(budget: Mapping[str, Any]) -> str:
    """``δ: 1e-06 in all; 5e-07 for partition selection (0 spent, 5e-07 remaining), the
    rest converts the zCDP total to (ε, δ)`` from a budget JSON object."""
    delta, selection = budget.get("delta"), budget.get("selection_delta_budget")
    line = f"δ: {number(delta)} in all"
    if isinstance(delta, int | float) and isinstance(selection, int | float):
        line += (
            f"; {number(selection)} for partition selection ({number(budget.get('delta_spent'))}"
            f" spent, {number(budget.get('delta_remaining'))} remaining)"
        )
        if selection < delta:
            line += ", the rest converts the zCDP total to (ε, δ)"
    return line


def period_line(budget: Mapping[str, Any]) -> str:
    """``period: month, renews 2026-02-01T00:00:00+00:00`` or ``period: none (…)``."""
    period = budget.get("period") or "none"
    if period == "none" or not budget.get("period_ends_at"):
        return "period: none (the budget does not renew)"
    return f"period: {period}, renews {budget['period_ends_at']}"


def charge_line(answer: Mapping[str, Any]) -> str | None:
    """``charged: ε 0.5 of your budget`` from an answer's ``charge`` (None if absent)."""
    charge = answer.get("charge")
    if not isinstance(charge, Mapping):
        return None
    line = f"ε {number(charge.get('epsilon'))}"
    if charge.get("delta"):
        line += f", δ {number(charge.get('delta'))}"
    return line


def cost_line(privacy: Mapping[str, Any]) -> str:
    """``cost: ε 0.5 (laplace), ρ 0.125`` from a response's ``privacy`` object."""
    parts = [f"ε {number(privacy.get('epsilon'))}"]
    if privacy.get("delta"):
        parts.append(f"δ {number(privacy.get('delta'))}")
    if privacy.get("selection_delta"):
        parts.append(f"partition-selection δ {number(privacy.get('selection_delta'))}")
    if privacy.get("rho") is not None:
        parts.append(f"ρ {number(privacy.get('rho'))}")
    return f"cost: {', '.join(parts)} ({privacy.get('mechanism', '?')})"


def table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    """Left-aligned columns, two spaces apart; NULL prints as nothing, reals as ``number``."""
    cells = [[_cell(v) for v in r] for r in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip()]
    for r in cells:
        lines.append("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip())
    return lines


def _cell(value: Any) -> str:
    if value is None:
        return ""
    return number(value) if isinstance(value, float) else str(value)


def print_answer(answer: Mapping[str, Any]) -> None:
    """A released answer: its rows, how accurate each column is, what it cost."""
    accuracy: Mapping[str, Any] = answer.get("accuracy") or {}
    columns = [str(c["name"]) for c in answer["columns"]]
    rows = [list(r) for r in answer["rows"]]
    # An AVG has a 95% interval per row (noisy SUM / noisy COUNT): shown beside it.
    shown = list(columns)
    for name in reversed(columns):
        intervals = (accuracy.get(name) or {}).get("ci95_intervals")
        if intervals is None:
            continue
        at = columns.index(name) + 1
        shown.insert(shown.index(name) + 1, f"{name} 95% interval")
        for row, interval in zip(rows, intervals, strict=False):
            row.insert(at, f"[{number(interval[0])}, {number(interval[1])}]" if interval else "")
    for line in table(shown, rows):
        click.echo(line)
    for name, acc in accuracy.items():
        if acc.get("ci95_halfwidth") is not None:
            click.echo(
                f"  {name}: ± {number(acc['ci95_halfwidth'])} (95%), "
                f"stddev {number(acc.get('stddev'))}"
            )
    selection = answer.get("partition_selection")
    if selection:
        click.echo(f"note: {selection.get('note')}")
    clamped = answer.get("clamped")
    if isinstance(clamped, Mapping):
        names = ", ".join(str(c) for c in clamped.get("columns") or [])
        click.echo(f"clamped ({names}): {clamped.get('note')}")
    if answer.get("cached"):
        click.echo("cached: the identical earlier answer, at no charge")
    else:
        click.echo(cost_line(answer.get("privacy") or {}))
        charged = charge_line(answer)
        if charged is not None:
            click.echo(f"charged to your budget: {charged}")
    target = answer.get("accuracy_target")
    if isinstance(target, Mapping):
        click.echo(
            f"ε {number(target.get('epsilon'))} chosen for ± {number(target.get('ci95_halfwidth'))}"
            " (95%)"
        )
    click.echo(budget_line(answer.get("budget") or {}))


def print_dry_run(answer: Mapping[str, Any]) -> None:
    """A dry run: what the query would cost and how accurate it would be, no data."""
    click.echo("dry run: nothing was read from the data and nothing was charged")
    click.echo("columns: " + ", ".join(str(c["name"]) for c in answer.get("columns") or []))
    click.echo("would " + cost_line(answer.get("privacy") or {}))
    charged = charge_line(answer)
    if charged is not None:
        click.echo(f"would charge your budget: {charged}")
    fits = answer.get("would_fit")
    click.echo(
        "would fit your budget: "
        + ("yes" if fits else "no (the query would be refused)" if fits is False else "?")
    )
    remaining = answer.get("queries_remaining")
    if isinstance(remaining, int):
        click.echo(f"such queries your budget still admits: {remaining}")
    target = answer.get("accuracy_target")
    if isinstance(target, Mapping):
        click.echo(
            f"ε {number(target.get('epsilon'))} chosen for ± {number(target.get('ci95_halfwidth'))}"
            " (95%)"
        )
    for name, acc in (answer.get("accuracy") or {}).items():
        if acc.get("ci95_halfwidth") is not None:
            click.echo(f"  {name}: ± {number(acc['ci95_halfwidth'])} (95%) expected")
        elif acc.get("sum") and acc.get("count"):
            click.echo(
                f"  {name}: an AVG: its SUM ± {number(acc['sum'].get('ci95_halfwidth'))}, "
                f"its COUNT ± {number(acc['count'].get('ci95_halfwidth'))} (95%) expected"
            )
    selection = answer.get("partition_selection")
    if selection:
        click.echo(f"note: {selection.get('note')}")
    click.echo(budget_line(answer.get("budget") or {}))
