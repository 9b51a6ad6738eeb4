"""The Flask application factory.

``create_app(config)`` wires the Gateway, the analyst, admin and operations endpoints,
and the single error envelope: every error, on every endpoint — including 404, 405 and
anything unexpected — is ``{"ok": false, "status", "error": {"code", "message",
"detail"}}``. An unexpected exception becomes ``internal`` with only the request id: no
stack trace, no message text (it could quote protected values).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from flask import Flask, Response, g, jsonify
from flask.json.provider import DefaultJSONProvider
from werkzeug.exceptions import HTTPException

from gateway.core.config import Config
from gateway.core.config_load import load_config
from gateway.core.errors import GatewayError, InvalidRequest, MethodNotAllowed, NotFound
from gateway.pipeline.gateway import Gateway
from gateway.pipeline.request import load_json

log = logging.getLogger("dpgate.http")


def create_app(config: Config, *, gateway: Gateway | None = None) -> Flask:
    """A WSGI app serving ``config`` (or an already built ``gateway``)."""
    # No static folder of its own: the console installs its files (and only those).
    app = Flask("dpgate", static_folder=None)
    app.json = _BoundedJSON(app)
    app.json.sort_keys = False
    app.config["MAX_CONTENT_LENGTH"] = 1_000_000
    app.extensions["dpgate"] = gateway or Gateway(config)

    from gateway.http import admin_access
    from gateway.http.admin import admin_bp
    from gateway.http.analyst import bp as analyst_bp
    from gateway.http.console import install_console
    from gateway.http.ops import install_operations

    app.register_blueprint(analyst_bp)
    assert admin_access.__all__ == []  # imported for its routes, which are on admin_bp
    app.register_blueprint(admin_bp, url_prefix="/v1/admin")
    install_operations(app)
    install_console(app)

    app.register_error_handler(GatewayError, _gateway_error)
    app.register_error_handler(HTTPException, _http_error)
    app.register_error_handler(Exception, _unexpected)
    return app


class _BoundedJSON(DefaultJSONProvider):
    """Flask's JSON, reading request bodies within ``gateway.pipeline.request``'s limits (depth,
    digits): a body past them is an ``invalid_request``, not a parser's RecursionError."""

    def loads(self, s: str | bytes, **kwargs: Any) -> Any:
        return load_json(s)


def create_app_from_env() -> Flask:
    """For WSGI servers: the config path comes from ``DPGATE_CONFIG``."""
    path = os.environ.get("DPGATE_CONFIG")
    if not path:
        raise RuntimeError("set DPGATE_CONFIG to the path of the dpgate config file")
    return create_app(load_config(path))


def render_error(error: GatewayError) -> Response:
    body = error.to_dict()
    rec = g.get("record")
    if rec is not None:
        body["error"]["detail"] = {**body["error"]["detail"], "request_id": rec.request_id}
        rec.outcome = rec.outcome or error.code
    response = jsonify(body)
    response.status_code = error.status
    if error.status == 429 and "retry_after" in error.detail:
        response.headers["Retry-After"] = str(int(error.detail["retry_after"]))
    return response


def _gateway_error(error: GatewayError) -> Response:
    return render_error(error)


def _http_error(error: HTTPException) -> Response:
    status = error.code or 500
    if status == 404:
        return render_error(NotFound("no such endpoint"))
    if status == 405:
        return render_error(MethodNotAllowed("this endpoint does not accept that method"))
    if status == 413:
        return render_error(InvalidRequest("the request body is too large"))
    if 400 <= status < 500:
        return render_error(InvalidRequest(error.description or "bad request"))
    return _unexpected(error)


def _unexpected(error: Exception) -> Response:
    log.error(
        "internal error (request %s): %s",
        getattr(g.get("record"), "request_id", None),
        type(error).__name__,
        exc_info=(type(error), error, None),
    )
    return render_error(GatewayError("internal error; quote the request id to the admin"))
