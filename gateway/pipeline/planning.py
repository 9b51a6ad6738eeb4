"""Stage: plan — SQL text → a ``QueryPlan`` (with a cache of recent plans), its noise
calibration, and the key identical requests share.

Everything here is a function of the request and the public config: no ledger, no data.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gateway.core.config import PrivacyConfig, TableConfig
from gateway.core.errors import InvalidPrivacyParameters
from gateway.core.plan import ProbePlan, QueryPlan, QueryRequest
from gateway.pipeline.accuracy_target import request_for_target
from gateway.sql.analyze import analyze
from gateway.sql.analyze.aggregates import contribution_bounds
from mechanisms import QueryCalibration, calibrate_with_choices

PLAN_CACHE_SIZE = 256
"""Plans of recent SQL texts kept per planner (and as many compiled statements,
``gateway.pipeline.gateway``): a repeated question (a dashboard's refresh) is planned once. One
plan and its statement hold ~5 kB (measured on the demo's mixed load), so a planner
holds at most ~1.2 MB, and one per set of readable tables (``gateway.pipeline.access.MAX_VIEWS``)
at most ~77 MB. At 1,024 a soak's workers kept growing for minutes while the cache
filled with distinct questions (issue 36)."""


@dataclass(frozen=True)
class PlannedQuery:
    """A request that will reach the data: its plan, calibration and cache key
    (``request.epsilon`` is the ε chosen for an accuracy target, if it had one)."""

    request: QueryRequest
    plan: QueryPlan
    calibration: QueryCalibration
    key: str


class Planner:
    """Plans requests against one config, remembering the plans of recent SQL texts."""

    def __init__(
        self, tables: Mapping[str, TableConfig], privacy: PrivacyConfig, data_version: str
    ) -> None:
        self.tables = tables
        self.privacy = privacy
        self.data_version = data_version
        self._plans: OrderedDict[str, QueryPlan | ProbePlan] = OrderedDict()
        self._lock = threading.Lock()

    def analyze(self, sql: str) -> QueryPlan | ProbePlan:
        """``gateway.sql.analyze.analyze`` against this config (refusals raise, not kept)."""
        with self._lock:
            plan = self._plans.get(sql)
            if plan is not None:
                self._plans.move_to_end(sql)
                return plan
        plan = analyze(sql, self.tables)
        with self._lock:
            self._plans[sql] = plan
            if len(self._plans) > PLAN_CACHE_SIZE:
                self._plans.popitem(last=False)
        return plan

    def plan(self, request: QueryRequest) -> PlannedQuery | ProbePlan:
        """The plan, calibration and cache key of a checked request (or a probe)."""
        plan = self.analyze(request.sql)
        if isinstance(plan, ProbePlan):
            return plan
        if request.accuracy is not None:  # the smallest ε meeting the accuracy asked for
            request = request_for_target(plan, request, self.privacy, self._calibrator(plan))
        return PlannedQuery(request, plan, self.calibrate(plan, request), self.key(plan, request))

    def _calibrator(self, plan: QueryPlan) -> Callable[[QueryRequest], QueryCalibration]:
        return lambda request: self.calibrate(plan, request)

    def calibrate(self, plan: QueryPlan, request: QueryRequest) -> QueryCalibration:
        """Noise for every measure (and partition selection) at the request's (ε, δ)."""
        groups = None
        if plan.needs_partition_selection:
            groups = contribution_bounds(self.tables[plan.table], grouped=True)[1]
            if request.delta <= 0:
                raise InvalidPrivacyParameters(
                    "these GROUP BY keys are not declared public, so their groups are "
                    "released through DP partition selection, which needs delta > 0 (or "
                    "declare the key's values in the config)"
                )
        try:
            calibration = calibrate_with_choices(
                request.mechanism,
                request.epsilon,
                request.delta,
                [m.sensitivity for m in plan.measures if m.noised],
                sum(1 for o in plan.outputs if o.quantile is not None),
                max_groups_per_unit=groups,
                selector=plan.selecting_count if groups is not None else None,
            )
        except ValueError as e:
            raise InvalidPrivacyParameters(str(e)) from None
        except ArithmeticError:  # e.g. a denormal ε whose scale no float can hold
            raise InvalidPrivacyParameters(
                f"epsilon {request.epsilon!r} is too small to calibrate noise for"
            ) from None
        min_rho = self.privacy.min_rho
        if self.privacy.composition != "pure" and calibration.cost.rho < min_rho:
            raise InvalidPrivacyParameters(
                f"this query would cost ρ={calibration.cost.rho:.3g}, below this gateway's "
                f"minimum per query (ρ={min_rho:.3g}): ask for a larger epsilon or a smaller "
                "delta",
                min_rho_per_query=min_rho,
            )
        return calibration

    def key(self, plan: QueryPlan, request: QueryRequest) -> str:
        """What identical requests share: canonical SQL (without its LIMIT and OFFSET, a
        cut made in post-processing), parameters and data version."""
        material = json.dumps(
            [
                plan.uncut_sql or plan.canonical_sql,
                repr(float(request.epsilon)),
                repr(float(request.delta)),
                request.mechanism,
                self.data_version,
            ]
        )
        return hashlib.sha256(material.encode()).hexdigest()
