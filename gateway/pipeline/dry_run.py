"""A dry run: what a query would cost (in the analyst's budget units, and how many such
queries remain) and how accurate it would be, before anything is spent. Public
information only — the plan, the calibration, the analyst's own budget and the
configured release deadline, and the auditor's verdict from the analyst's earlier noisy
answers; the protected database is never touched."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.audit import AuditPrediction
from gateway.core.config import ExecutionConfig, TableConfig
from gateway.core.plan import QueryPlan
from gateway.pipeline.charges import Charges
from gateway.pipeline.noising import expected_accuracy, selection_note
from gateway.pipeline.planning import PlannedQuery
from gateway.pipeline.release import ColumnInfo, Release, privacy_spent
from gateway.pipeline.timing import deadline_ms


def dry_run(
    planned: PlannedQuery,
    charges: Charges,
    analyst: str,
    execution: ExecutionConfig,
    tables: Mapping[str, TableConfig],
    audit: AuditPrediction | None = None,
) -> Release:
    """The dry run's release; ``audit`` is the auditor's prediction
    (``AuditPolicy.predict``): refused now, answered with rows left out, may be
    withheld after execution, or answered."""
    plan, calibration = planned.plan, planned.calibration
    quote = charges.quote(analyst, calibration.cost, planned.request.mechanism)
    return Release(
        query_id="dry-run",
        cached=False,
        columns=tuple(ColumnInfo(o.name, o.type) for o in plan.visible_outputs),
        rows=(),
        accuracy=expected_accuracy(plan, calibration),
        privacy=privacy_spent(planned),
        budget=quote.budget,
        extra={
            "dry_run": True,
            "would_fit": quote.would_fit,
            **({"audit": audit_json(audit, plan)} if audit is not None else {}),
            # what it would cost, in the analyst's budget units, and how many such fit
            "charge": quote.charge.to_json(),
            "queries_remaining": quote.queries_remaining,
            "plan": describe(planned),
            # When the answer would leave after its execution starts (public: config).
            "release_deadline_ms": deadline_ms(execution, tables[plan.table]),
            **(
                {"partition_selection": selection_note(plan, calibration, None)}
                if plan.needs_partition_selection
                else {}
            ),
        },
    )


def audit_json(prediction: AuditPrediction, plan: QueryPlan) -> dict[str, Any]:
    """The auditor's prediction as the dry run shows it (the rows it would leave out by
    their group keys, as an answer's ``audit_left_out`` names them)."""
    out: dict[str, Any] = {"verdict": prediction.verdict, "reason": prediction.reason}
    if prediction.left_out:
        out["left_out"] = [plan.named_cell(key) for key in prediction.left_out]
    if prediction.groups:
        out["groups"] = list(prediction.groups)
    if prediction.combined_with:
        out["combined_with"] = list(prediction.combined_with)
    if prediction.ask_instead:
        out["ask_instead"] = list(prediction.ask_instead)
    return out


def describe(planned: PlannedQuery) -> dict[str, Any]:
    """A JSON view of the plan: public information only."""
    plan, calibration = planned.plan, planned.calibration
    return {
        "table": plan.table,
        "canonical_sql": plan.canonical_sql,
        "measures": [
            {
                "kind": m.kind,
                "expression": m.expression.sql() if m.expression is not None else None,
                "sensitivity": float(m.sensitivity.l1),
                "noise": {"mechanism": n.mechanism, "scale": float(n.scale * m.resolution)},
            }
            for m, n in zip([m for m in plan.measures if m.noised], calibration.noises, strict=True)
        ],
        # quantiles: a bucket of a public grid chosen by the exponential mechanism at this ε
        "choices": [
            {
                "output": o.name,
                "quantile": float(o.quantile.p),
                "epsilon": float(epsilon),
                "buckets": o.quantile.buckets,
            }
            for o, epsilon in zip(
                [o for o in plan.outputs if o.quantile is not None],
                calibration.choices,
                strict=True,
            )
            if o.quantile is not None
        ],
        "group_keys": [
            {
                "name": g.name,
                "release": "declared values" if g.domain is not None else "partition selection",
            }
            for g in plan.group_keys
        ],
        "partition_selection": (
            {"threshold": calibration.selection.threshold}
            if calibration.selection is not None
            else None
        ),
    }
