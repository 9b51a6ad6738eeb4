"""Stage: request validation — the one place where a query request's SQL size, ε, δ and
mechanism are checked, for every front end (HTTP body, in-process callers).

``load_json`` reads a JSON body within limits (nesting depth, digits of a number): a
body nested 1,000 deep would otherwise exhaust the parser's recursion, and a 310-digit
ε overflow a float. ``parse_request`` turns a JSON
body into a ``QueryRequest`` with the config's defaults; ``check_request`` checks its
privacy parameters against the gateway's limits. All raise errors that cost nothing.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from gateway.core.config import PrivacyConfig
from gateway.core.errors import InvalidPrivacyParameters, InvalidRequest
from gateway.core.plan import QueryRequest

QUERY_FIELDS = frozenset({"sql", "epsilon", "delta", "mechanism", "dry_run", "accuracy", "raw"})
MAX_SQL_CHARS = 100_000
#: Deepest nesting of arrays and objects in a JSON body (a query body nests 2 deep; an
#: admin's, 1).
MAX_JSON_DEPTH = 32
#: Most characters in one JSON number: a double has 17 significant digits, so a longer
#: number says nothing more, and a 310-digit integer is not a float at all.
MAX_JSON_NUMBER_CHARS = 40
_LONG_DIGITS = re.compile(rf"\d{{{MAX_JSON_NUMBER_CHARS - 1}}}")  # a number past it, maybe


def load_json(text: str | bytes) -> Any:
    """A JSON document, or ``InvalidRequest`` if it nests deeper than ``MAX_JSON_DEPTH``
    or holds a number longer than ``MAX_JSON_NUMBER_CHARS`` (the parser's own hooks, and
    its recursion guard for a body nested past Python's limit: linear time, in C);
    ``ValueError`` if it is not JSON."""
    if isinstance(text, bytes | bytearray):
        text = text.decode("utf-8")  # UnicodeDecodeError is a ValueError
    try:
        if _LONG_DIGITS.search(text) is None:  # the usual body: no hook per number
            value = json.loads(text)
        else:
            value = json.loads(text, parse_int=_json_int, parse_float=_json_float)
    except RecursionError:
        raise _too_deep() from None
    if text.count("[") + text.count("{") > MAX_JSON_DEPTH:  # else it cannot be too deep
        _check_json_depth(value)
    return value


def _check_json_depth(value: Any) -> None:
    """Walk the parsed containers (iteratively) for one deeper than ``MAX_JSON_DEPTH``."""
    level = [value] if isinstance(value, list | dict) else []
    depth = 0
    while level:
        depth += 1
        if depth > MAX_JSON_DEPTH:
            raise _too_deep()
        level = [
            child
            for container in level
            for child in (container.values() if isinstance(container, dict) else container)
            if isinstance(child, list | dict)
        ]


def _too_deep() -> InvalidRequest:
    return InvalidRequest(
        f"the JSON body nests deeper than {MAX_JSON_DEPTH} levels", limit="max_json_depth"
    )


def _json_number_text(text: str) -> str:
    if len(text) > MAX_JSON_NUMBER_CHARS:
        raise InvalidRequest(
            f"a number in the JSON body is longer than {MAX_JSON_NUMBER_CHARS} characters",
            limit="max_json_number_chars",
        )
    return text


def _json_int(text: str) -> int:
    return int(_json_number_text(text))


def _json_float(text: str) -> float:
    return float(_json_number_text(text))


def parse_request(body: Any, raw: bytes, defaults: PrivacyConfig) -> QueryRequest:
    """A ``POST /v1/query`` body as a checked ``QueryRequest`` (defaults from the config)."""
    if body is None:
        if not raw.strip():
            raise InvalidRequest('send a JSON body like {"sql": "SELECT COUNT(*) FROM t"}')
        raise InvalidRequest("the body is not valid JSON")
    if not isinstance(body, dict):
        raise InvalidRequest("the body must be a JSON object")
    unknown = sorted(set(body) - QUERY_FIELDS)
    if unknown:
        raise InvalidRequest(
            f"unknown field(s): {', '.join(unknown)} (allowed: {', '.join(sorted(QUERY_FIELDS))})",
            fields=unknown,
        )
    sql = body.get("sql")
    if not isinstance(sql, str):
        raise InvalidRequest("'sql' is required and must be a string")
    accuracy = _accuracy(body)
    if accuracy is not None and body.get("epsilon") is not None:
        raise InvalidPrivacyParameters("give either 'epsilon' or 'accuracy', not both")
    epsilon = _number(body, "epsilon", defaults.epsilon)
    mechanism = body.get("mechanism")
    if mechanism is None:  # absent or JSON null: the config's default
        mechanism = defaults.mechanism
    if mechanism not in ("laplace", "gaussian"):
        raise InvalidPrivacyParameters("'mechanism' must be 'laplace' or 'gaussian'")
    delta = _number(body, "delta", defaults.delta if mechanism == "gaussian" else None)
    if delta is None:
        delta = defaults.delta  # used only by partition selection, when keys are not public
    dry_run = body.get("dry_run", False)
    if not isinstance(dry_run, bool):
        raise InvalidRequest("'dry_run' must be true or false")
    raw = body.get("raw", False)
    if not isinstance(raw, bool):
        raise InvalidRequest("'raw' must be true or false")
    request = QueryRequest(
        sql=sql,
        epsilon=epsilon,
        delta=delta,
        mechanism=mechanism,
        dry_run=dry_run,
        accuracy=accuracy,
        raw=raw,
    )
    check_request(request, defaults)
    return request


def check_request(request: QueryRequest, limits: PrivacyConfig) -> None:
    """Raise ``InvalidRequest`` / ``InvalidPrivacyParameters`` unless the request's SQL
    size, ε, δ and mechanism are within this gateway's limits."""
    if len(request.sql) > MAX_SQL_CHARS:
        raise InvalidRequest("'sql' is longer than 100,000 characters")
    epsilon, delta = _as_float(request.epsilon), _as_float(request.delta)
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise InvalidPrivacyParameters("epsilon must be a finite number > 0")
    if epsilon > limits.max_epsilon_per_query:
        raise InvalidPrivacyParameters(
            f"epsilon {epsilon} is above this gateway's limit per query "
            f"({limits.max_epsilon_per_query})",
            max_epsilon_per_query=limits.max_epsilon_per_query,
        )
    if epsilon < limits.min_epsilon_per_query:
        # Near-free queries would let an analyst repeat any residual channel millions of
        # times; the floor makes the budget bound the number of queries.
        raise InvalidPrivacyParameters(
            f"epsilon {epsilon} is below this gateway's minimum per query "
            f"({limits.min_epsilon_per_query})",
            min_epsilon_per_query=limits.min_epsilon_per_query,
        )
    if not (math.isfinite(delta) and 0 <= delta < 1):
        raise InvalidPrivacyParameters("delta must be in [0, 1)")
    if limits.composition == "pure" and request.mechanism != "laplace":
        raise InvalidPrivacyParameters(
            "this gateway accounts pure ε-DP: only the laplace mechanism is available"
        )
    if request.mechanism == "gaussian" and delta <= 0:
        raise InvalidPrivacyParameters("the gaussian mechanism needs delta > 0")


def _as_float(value: float) -> float:
    """An in-process caller's number as a float (an int past 1.8e308 is infinite)."""
    try:
        return float(value)
    except OverflowError:
        return math.inf


def _accuracy(body: dict[str, Any]) -> float | None:
    """The target 95% half-width of ``"accuracy": {"ci95_halfwidth": X}``, if given (the
    planner then picks ε: ``gateway.pipeline.accuracy_target``)."""
    raw = body.get("accuracy")
    if raw is None:
        return None
    if not isinstance(raw, dict) or set(raw) != {"ci95_halfwidth"}:
        raise InvalidPrivacyParameters(
            "'accuracy' must be an object {\"ci95_halfwidth\": X}, X > 0 in the units of the "
            "released values"
        )
    value = _number(raw, "ci95_halfwidth", None)
    if value is None or value <= 0:
        raise InvalidPrivacyParameters("'accuracy.ci95_halfwidth' must be a number > 0")
    return float(value)


def _number(body: dict[str, Any], key: str, default: float | None) -> Any:
    value = body.get(key)
    if value is None:  # absent or JSON null: the config's default
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidPrivacyParameters(f"'{key}' must be a number")
    try:
        value = float(value)
    except OverflowError:  # an in-process caller's huge int
        raise InvalidPrivacyParameters(f"'{key}' must be finite") from None
    if not math.isfinite(value):
        raise InvalidPrivacyParameters(f"'{key}' must be finite")
    return value
