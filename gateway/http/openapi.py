"""The OpenAPI 3.1 description of dpgate's HTTP API, generated from the code.

Each endpoint declares its contract next to its code with ``@document``; ``build_spec``
walks the Flask app's URL map and turns each (route, method) into an operation. So the
spec cannot drift from the routes: a route without a declaration is reported by
``undocumented_routes`` (a test fails on it), and paths, methods and path parameters
come from the URL map itself.

    from gateway.http.openapi import document, ref

    @bp.post("/v1/query")
    @document(
        summary="Answer a counting query with differential privacy",
        auth="analyst",
        request=ref("QueryRequest"),
        responses={200: ref("Release")},
        errors=[SqlSyntaxError, UnsupportedQuery, BudgetExhausted, DatabaseUnavailable],
    )
    def query() -> Response: ...

``@document`` must sit below the route decorator (it marks the function the route
registers). Every operation also documents, without being told, the error envelope for:
``internal`` (500); ``unauthenticated`` and ``forbidden`` when it needs a key;
``invalid_request`` when it takes a body or query parameters; ``not_found`` when its
path has parameters; ``rate_limited`` unless it is an operations endpoint.
Shared schemas are registered once with ``register_schema``
and referenced with ``ref``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from gateway.core.errors import (
    ALL_ERRORS,
    Forbidden,
    GatewayError,
    InvalidRequest,
    NotFound,
    RateLimited,
    ShuttingDown,
    Unauthenticated,
)

if TYPE_CHECKING:  # Flask is imported only by gateway.http; here it is just a type.
    from flask import Flask

Schema = dict[str, Any]
Auth = Literal["analyst", "admin", "any"]
F = TypeVar("F", bound=Callable[..., Any])

DOC_ATTRIBUTE = "__dpgate_openapi__"

SCHEMAS: dict[str, Schema] = {}
"""Named schemas, published under ``components.schemas``."""


@dataclass(frozen=True)
class EndpointDoc:
    """What one operation accepts and returns, as declared next to its code."""

    summary: str
    description: str | None = None
    auth: Auth | None = None
    request: Schema | None = None
    query: Mapping[str, Schema] = field(default_factory=dict)
    required_query: tuple[str, ...] = ()
    responses: Mapping[int, Schema] = field(default_factory=dict)
    content_type: str = "application/json"
    errors: tuple[type[GatewayError], ...] = ()
    tags: tuple[str, ...] = ()
    rate_limited: bool = True


def document(
    *,
    summary: str,
    description: str | None = None,
    auth: Auth | None = None,
    request: Schema | None = None,
    query: Mapping[str, Schema] | None = None,
    required_query: Iterable[str] = (),
    responses: Mapping[int, Schema] | None = None,
    content_type: str = "application/json",
    errors: Iterable[type[GatewayError]] = (),
    tags: Iterable[str] = (),
    method: str | None = None,
    rate_limited: bool = True,
) -> Callable[[F], F]:
    """Declare a view's contract; ``method`` narrows it to one of the route's methods.

    ``request`` is the JSON body's schema, ``query`` the query parameters' schemas,
    ``responses`` the success bodies by status (default ``{200: {"type": "object"}}``),
    ``errors`` the ``GatewayError`` classes the endpoint can answer with.
    """
    doc = EndpointDoc(
        summary=summary,
        description=description,
        auth=auth,
        request=request,
        query=dict(query or {}),
        required_query=tuple(required_query),
        responses=dict(responses or {200: {"type": "object"}}),
        content_type=content_type,
        errors=tuple(errors),
        tags=tuple(tags),
        rate_limited=rate_limited,
    )

    def mark(view: F) -> F:
        docs: dict[str | None, EndpointDoc] = dict(getattr(view, DOC_ATTRIBUTE, {}))
        docs[method.upper() if method else None] = doc
        setattr(view, DOC_ATTRIBUTE, docs)
        return view

    return mark


def register_schema(name: str, schema: Schema) -> Schema:
    """Publish a named schema under ``components.schemas``; returns a ``$ref`` to it."""
    SCHEMAS[name] = schema
    return ref(name)


def ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def ok_answer(
    required: Mapping[str, Schema], optional: Mapping[str, Schema] | None = None
) -> Schema:
    """The schema of a successful JSON answer: ``{"ok": true, …}`` with the ``required``
    fields (in that order) and the ``optional`` ones."""
    return {
        "type": "object",
        "required": ["ok", *required],
        "properties": {"ok": {"const": True}, **required, **(optional or {})},
    }


def array_of(items: Schema) -> Schema:
    return {"type": "array", "items": items}


def _error_codes() -> list[str]:
    return [e.code for e in ALL_ERRORS]


def _first_line(cls: type) -> str:
    return (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else ""


def error_envelope_schema() -> Schema:
    """The one shape of every error, on every endpoint."""
    return {
        "type": "object",
        "required": ["ok", "status", "error"],
        "properties": {
            "ok": {"const": False},
            "status": {"type": "integer"},
            "error": {
                "type": "object",
                "required": ["code", "message", "detail"],
                "properties": {
                    "code": {"$ref": "#/components/schemas/ErrorCode"},
                    "message": {"type": "string"},
                    "detail": {
                        "type": "object",
                        "properties": {"request_id": {"type": "string"}},
                    },
                },
            },
        },
    }


def _error_code_schema() -> Schema:
    lines = [f"- `{e.code}` ({e.status}): {_first_line(e)}" for e in ALL_ERRORS]
    return {
        "type": "string",
        "enum": _error_codes(),
        "description": "Every error code dpgate reports:\n\n" + "\n".join(lines),
    }


_RULE_ARGUMENT = re.compile(
    r"<(?:(?P<converter>[a-zA-Z_][a-zA-Z0-9_]*)(?:\([^)]*\))?:)?(?P<name>\w+)>"
)
_CONVERTER_SCHEMAS: dict[str, Schema] = {
    "int": {"type": "integer", "minimum": 0},
    "float": {"type": "number", "minimum": 0},
    "uuid": {"type": "string", "format": "uuid"},
}


def _path_and_parameters(rule: str) -> tuple[str, list[Schema]]:
    params: list[Schema] = []

    def replace(m: re.Match[str]) -> str:
        converter = m.group("converter") or "default"
        schema = _CONVERTER_SCHEMAS.get(
            converter, {"type": "string", "minLength": 1, "pattern": "^[^/]+$"}
        )
        params.append({"name": m.group("name"), "in": "path", "required": True, "schema": schema})
        return "{" + m.group("name") + "}"

    return _RULE_ARGUMENT.sub(replace, rule), params


_REQUEST_ID_HEADER: Schema = {"$ref": "#/components/headers/X-Request-Id"}


def _error_responses(errors: Iterable[type[GatewayError]]) -> dict[str, Schema]:
    by_status: dict[int, list[str]] = {}
    for err in errors:
        codes = by_status.setdefault(err.status, [])
        if err.code not in codes:
            codes.append(err.code)
    out: dict[str, Schema] = {}
    for status, codes in sorted(by_status.items()):
        schema: Schema = {
            "allOf": [
                {"$ref": "#/components/schemas/Error"},
                {
                    "type": "object",
                    "properties": {
                        "status": {"const": status},
                        "error": {"type": "object", "properties": {"code": {"enum": codes}}},
                    },
                },
            ]
        }
        headers: dict[str, Schema] = {"X-Request-Id": _REQUEST_ID_HEADER}
        if "rate_limited" in codes:
            headers["Retry-After"] = {
                "description": "Seconds until the limit resets.",
                "schema": {"type": "integer", "minimum": 1},
            }
        elif "shutting_down" in codes:
            headers["Retry-After"] = {
                "description": "With `shutting_down`: seconds until the request may be sent "
                "again (1; the front door of a stopping `dpgate serve` sends it, and no "
                "`X-Request-Id`: the request was not run).",
                "schema": {"type": "integer", "minimum": 1},
            }
        out[str(status)] = {
            "description": ", ".join(codes),
            "headers": headers,
            "content": {"application/json": {"schema": schema}},
        }
    return out


def _operation(endpoint: str, method: str, doc: EndpointDoc, path_params: list[Schema]) -> Schema:
    errors: list[type[GatewayError]] = list(doc.errors)
    if doc.auth is not None:
        errors += [Unauthenticated, Forbidden]
    if doc.request is not None or doc.query:
        errors.append(InvalidRequest)
    if path_params:
        errors.append(NotFound)  # a path that names nothing
    if doc.rate_limited:
        errors.append(RateLimited)
    errors.append(GatewayError)  # internal
    errors.append(ShuttingDown)  # any request reaching a stopping `dpgate serve`
    parameters = list(path_params)
    for name, schema in doc.query.items():
        parameters.append(
            {"name": name, "in": "query", "required": name in doc.required_query, "schema": schema}
        )
    op: Schema = {
        "operationId": f"{endpoint.replace('.', '_')}_{method.lower()}",
        "summary": doc.summary,
        "responses": {
            str(status): {
                "description": "OK" if status < 300 else str(status),
                "headers": {"X-Request-Id": _REQUEST_ID_HEADER},
                "content": {doc.content_type: {"schema": schema}},
            }
            for status, schema in sorted(doc.responses.items())
        },
    }
    op["responses"].update(_error_responses(errors))
    if doc.description:
        op["description"] = doc.description
    if doc.tags:
        op["tags"] = list(doc.tags)
    if parameters:
        op["parameters"] = parameters
    if doc.request is not None:
        op["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": doc.request}},
        }
    if doc.auth is not None:
        op["security"] = [{"bearerAuth": []}]
        needs = {
            "analyst": "an analyst key",
            "admin": "the admin key",
            "any": "an analyst key or the admin key",
        }[doc.auth]
        op["description"] = f"{doc.description or ''}\n\nNeeds {needs}.".strip()
    return op


def _documented_methods(app: Flask) -> Iterable[tuple[str, str, str, EndpointDoc | None]]:
    """(rule, endpoint, method, its declaration or None) for every served operation."""
    for rule in sorted(app.url_map.iter_rules(), key=lambda r: (r.rule, r.endpoint)):
        if rule.endpoint == "static":
            continue
        view = app.view_functions.get(rule.endpoint)
        docs: Mapping[str | None, EndpointDoc] = getattr(view, DOC_ATTRIBUTE, {})
        for method in sorted((rule.methods or set()) - {"HEAD", "OPTIONS"}):
            yield rule.rule, rule.endpoint, method, docs.get(method) or docs.get(None)


def undocumented_routes(app: Flask) -> list[str]:
    """``METHOD /rule`` for every served operation that has no ``@document``."""
    return [f"{m} {r}" for r, _, m, doc in _documented_methods(app) if doc is None]


def _version() -> str:
    try:
        return metadata.version("dpgate")
    except metadata.PackageNotFoundError:
        return "0.0.0"


def build_spec(app: Flask) -> Schema:
    """The OpenAPI 3.1 document of every documented route the app serves."""
    paths: dict[str, Schema] = {}
    for rule, endpoint, method, doc in _documented_methods(app):
        if doc is None:
            continue
        path, params = _path_and_parameters(rule)
        paths.setdefault(path, {})[method.lower()] = _operation(endpoint, method, doc, params)
    schemas: dict[str, Schema] = {
        "Error": error_envelope_schema(),
        "ErrorCode": _error_code_schema(),
    }
    schemas.update(SCHEMAS)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "dpgate",
            "version": _version(),
            "description": (
                "A differentially private SQL query gateway. Every error, on every "
                "endpoint, is the `Error` envelope; its `detail.request_id` matches the "
                "`X-Request-Id` response header and the request's log line."
            ),
        },
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {
                "bearerAuth": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "An analyst key, or the admin key (DPGATE_ADMIN_KEY).",
                }
            },
            "headers": {
                "X-Request-Id": {
                    "description": "The request's id, as in its log line.",
                    "schema": {"type": "string", "pattern": "^[0-9a-f]{32}$"},
                }
            },
        },
    }
