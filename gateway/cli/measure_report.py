"""The part of ``dpgate config check --measure`` that times statements on the protected
database (``gateway/pipeline/calibration.py``) and prints what the cost model needs: the row
counts to declare, each measured shape next to the model's estimate and deadline, and
the ``execution:`` coefficients to put in the config.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from gateway.core.config import Config
from gateway.pipeline.calibration import Calibration, measure
from gateway.pipeline.cost_model import EngineCosts
from gateway.sql.compile import CompiledQuery


def measure_config(cfg: Config, repeat: int) -> Calibration:
    """Measure ``cfg``'s tables with a gateway of its own (the real compiler and the
    catalogue's facts) over a throwaway ledger: the real ledger is not touched."""
    from budget import Ledger
    from gateway.pipeline.gateway import Gateway
    from gateway.sql.execute import run_aggregate

    with tempfile.TemporaryDirectory(prefix="dpgate-measure-") as tmp:
        ledger = Ledger.from_url(f"sqlite:///{Path(tmp) / 'ledger.db'}")
        gateway = Gateway(cfg, ledger=ledger)
        try:
            timeout = cfg.database.statement_timeout_ms

            def compile_sql(sql: str) -> CompiledQuery:
                plan = gateway.analyze(sql)
                return gateway.compile(plan)

            def run(sql: str) -> object:
                return run_aggregate(gateway.engine, sql, timeout_ms=timeout)

            return measure(gateway.config.tables, compile_sql, run, gateway.dialect, repeat=repeat)
        finally:
            gateway.engine.dispose()
            ledger.engine.dispose()


def measure_lines(cfg: Config, cal: Calibration) -> list[str]:
    """The report of ``cal`` for the admin (see the module doc)."""
    ex = cfg.execution
    configured = EngineCosts(
        row_ns=ex.row_ns or 0,
        op_ns=ex.op_ns or 0,
        sort_ns=ex.sort_ns or 0,
        join_ns=ex.join_ns or 0,
        base_ms=ex.base_ms or 0,
        group_ns=ex.group_ns or 0,
    )
    s = cal.suggested
    lines = [
        f"Measured on the protected database ({cal.engine}; load average {cal.load:.1f} on "
        f"{cal.cpus} CPU(s) while measuring; median of each statement's runs). These figures "
        "were read from the protected rows: they are for you, and become public only if you "
        "put them in the config (docs/privacy.md, 'Timing').",
    ]
    if cal.load > cal.cpus:
        lines.append(
            "  the machine was busy while measuring: the coefficients are higher than a quiet "
            "machine's (measure again when it is quiet for tighter deadlines)"
        )
    lines.append(f"  a statement's fixed cost (SELECT 1): {cal.base_ms:.2f} ms")
    for key, t in cfg.tables.items():
        count = cal.counts[key]
        declared = "not declared (the 250 ms fallback deadline)"
        if t.rows is not None:
            declared = f"declared {t.rows:,}" + (
                "" if t.rows >= count else ": BELOW the table's rows, deadlines are too short"
            )
        lines.append(f"  tables.{t.name}: {count:,} rows ({declared})")
        for shape in (sh for sh in cal.shapes if sh.table == key):
            model = cal.estimate_ms(shape, s)
            deadline = max(ex.min_deadline_ms, model * ex.deadline_margin) + ex.post_ms
            lines.append(
                f"    {shape.name:<22} {shape.ms:9.2f} ms measured, {model:9.2f} ms by the "
                f"suggested model, deadline {deadline:8.0f} ms ({shape.windows} window(s))"
            )
    lines.append(
        "Suggested (fitted to every shape above, raised to cover each, rounded up to powers "
        "of two; the margin, execution.deadline_margin, is left for load):"
    )
    lines.append("execution:")
    margin = cal.suggested_margin()
    note = f"   # configured {ex.deadline_margin:g}" + (
        " (lower)" if ex.deadline_margin < margin else ""
    )
    lines.append(
        f"  deadline_margin: {margin:g}{note}   # slowest of {cal.cpus} concurrent runs: "
        f"{cal.spread:.2f} x the suggested model, at load {cal.load:.1f}"
    )
    for name in ("row_ns", "op_ns", "sort_ns", "join_ns", "group_ns", "base_ms"):
        value = getattr(s, name)
        now = getattr(configured, name)
        note = "" if not now else f"   # configured {now:g}" + (" (lower)" if now < value else "")
        lines.append(f"  {name}: {value:.12g}{note}")
    lines.append("tables:")
    for key, t in cfg.tables.items():
        lines.append(f"  {t.name}: {{rows: {cal.suggested_rows(key)}}}")
    return lines
