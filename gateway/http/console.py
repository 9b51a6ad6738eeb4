"""The web console at ``/ui/``: the page, its static files, its chart endpoints, its headers.

``install_console(app)`` makes the app serve

    GET /ui/                                   the console page (no key needed: it holds none)
    GET /ui/static/<file>                      its script, stylesheet and vendored Vega bundles
    GET /ui/api/charts/release/<query_id>      analyst: the chart of one of their answers
    GET /ui/api/charts/spend/<name>            admin: ε spent over time by one analyst

The page signs in with an API key kept in ``sessionStorage`` and calls the public API
with it as a bearer token, so it can show only what the API releases; the chart
endpoints build their specs (``gateway.console.charts``) from the analyst's own released
answers and, for the admin, from the ledger.

Why there is no CSRF token: no endpoint reads a cookie or any other credential the
browser attaches by itself. Every request that reads or spends is authorised by the
``Authorization: Bearer`` header, which only script running on this origin can set
(another origin's script would need a CORS preflight, and dpgate answers none), and the
key lives in this origin's ``sessionStorage``. A forged cross-site form or link arrives
without a key and is ``unauthenticated``, costing nothing
(``tests/console/test_console_http.py``).

Every ``/ui/`` response carries a strict Content Security Policy (scripts, styles and
connections from this origin only; no inline script or style, no ``eval``: charts are
rendered with Vega's expression interpreter), and may not be framed.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from flask import Blueprint, Flask, Response, jsonify, request, send_file

import budget
from gateway import console as console_package
from gateway.console.charts import release_chart, spend_chart
from gateway.console.spend import spend_series
from gateway.core.errors import LedgerUnavailable, NotFound
from gateway.http.auth import gateway, record, require_admin, require_analyst
from gateway.http.openapi import document, register_schema

STATIC = Path(console_package.__file__).parent / "static"
PREFIX = "/ui"

CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "font-src 'self'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    ]
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
}

console_bp = Blueprint("console", __name__, url_prefix=PREFIX)

_CHART = register_schema(
    "ReleaseChart",
    {
        "type": "object",
        "required": ["ok", "chart"],
        "properties": {
            "ok": {"const": True},
            "chart": {
                "description": "null when there is nothing to plot (no group key, no rows, "
                "or no noisy column)",
                "oneOf": [
                    {"type": "null"},
                    {
                        "type": "object",
                        "required": ["kind", "measure", "keys", "spec"],
                        "properties": {
                            "kind": {"enum": ["bars", "line"]},
                            "measure": {"type": "string"},
                            "keys": {"type": "array", "items": {"type": "string"}},
                            "truncated_from": {"type": ["integer", "null"]},
                            "spec": {"type": "object", "description": "a Vega-Lite 6 spec"},
                        },
                    },
                ],
            },
        },
    },
)
_SPEND = register_schema(
    "SpendChart",
    {
        "type": "object",
        "required": ["ok", "analyst", "points", "spec"],
        "properties": {
            "ok": {"const": True},
            "analyst": {"type": "string"},
            "points": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["at", "epsilon_spent", "query_epsilon", "outcome"],
                    "properties": {
                        "at": {"type": "string", "format": "date-time"},
                        "epsilon_spent": {"type": "number"},
                        "query_epsilon": {"type": "number"},
                        "outcome": {"type": "string"},
                    },
                },
            },
            "spec": {"type": "object", "description": "a Vega-Lite 6 spec"},
        },
    },
)


def install_console(app: Flask) -> None:
    """Serve the console on ``app``: its blueprint, its static files, its headers.

    The static files are the app's own static folder (endpoint ``static``): files, not
    API operations. Nothing else on disk is served, whatever the working directory.
    """
    app.static_folder = str(STATIC)
    app.static_url_path = f"{PREFIX}/static"
    app.add_url_rule(
        f"{PREFIX}/static/<path:filename>", endpoint="static", view_func=app.send_static_file
    )
    app.register_blueprint(console_bp)
    app.after_request(_console_headers)


def _console_headers(response: Response) -> Response:
    if request.path == PREFIX or request.path.startswith(PREFIX + "/"):
        response.headers.update(SECURITY_HEADERS)
        if request.endpoint == "console.page":
            response.headers["Cache-Control"] = "no-store"
    return response


@console_bp.get("/")
@document(
    summary="The web console (an HTML page; sign in there with an API key)",
    responses={200: {"type": "string"}},
    content_type="text/html",
    tags=["console"],
)
def page() -> Response:
    return send_file(STATIC / "index.html", mimetype="text/html", max_age=0)


@console_bp.get("/api/charts/release/<query_id>")
@document(
    summary="The chart of one of the analyst's answered queries, as a Vega-Lite spec",
    description="Built from the answer as released (the same rows and intervals "
    "`GET /v1/queries` returns): bars with 95% error bars for a GROUP BY, a line with a "
    "95% band when the key is ordered.",
    auth="analyst",
    responses={200: _CHART},
    errors=[NotFound, LedgerUnavailable],
    tags=["console"],
)
def release_chart_of(query_id: str) -> Response:
    record().audited = "analyst"  # like GET /v1/queries, which it reads
    analyst = require_analyst()
    for entry in gateway().history(analyst, limit=10_000):
        if entry.get("query_id") == query_id and isinstance(entry.get("release"), dict):
            chart = release_chart(entry["release"])
            body: dict[str, Any] = {"ok": True, "chart": None}
            if chart is not None:
                body["chart"] = {
                    "kind": chart.kind,
                    "measure": chart.measure,
                    "keys": list(chart.keys),
                    "truncated_from": chart.truncated_from,
                    "spec": chart.spec,
                }
            return jsonify(body)
    raise NotFound("no answered query with this id in your history")


@console_bp.get("/api/charts/spend/<name>")
@document(
    summary="ε spent over time by one analyst, with its Vega-Lite spec",
    description="One point after each charge that stands (answered, withheld or pending), "
    "as the ledger's accountant reports the running total.",
    auth="admin",
    responses={200: _SPEND},
    errors=[NotFound, LedgerUnavailable],
    tags=["console"],
)
def spend_chart_of(name: str) -> Response:
    rec = record()
    rec.audited, rec.action, rec.params = "admin", "budget.spend_chart", {"name": name}
    require_admin()
    ledger = gateway().ledger
    try:
        status = ledger.budget_status(name)
        entries = ledger.history(name)
    except budget.UnknownAnalyst:
        raise NotFound(f"no analyst named '{name}'") from None
    except budget.LedgerUnavailable as e:
        raise LedgerUnavailable(str(e)) from None
    points = spend_series(
        entries, composition=status.composition, epsilon=status.epsilon, delta=status.delta
    )
    return jsonify(
        {
            "ok": True,
            "analyst": name,
            "points": [asdict(p) for p in points],
            "spec": spend_chart(name, points, epsilon_budget=status.epsilon),
        }
    )


__all__ = ["CONTENT_SECURITY_POLICY", "console_bp", "install_console"]
