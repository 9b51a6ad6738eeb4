"""Admin endpoints for table grants and group membership (``gateway.pipeline.access``), on
``admin_bp`` (``/v1/admin``); each change is one audit-logged admin action, in the
change's own transaction, and applies to the next request without a restart.

    GET    /v1/admin/grants                            every table: its groups, who reads it
    POST   /v1/admin/grants                            {table, group} → grant (201)
    DELETE /v1/admin/grants/<table>/<group>            take a grant back
    GET    /v1/admin/groups                            every group and its members
    POST   /v1/admin/groups/<name>/members             {analyst} → add a member (201)
    DELETE /v1/admin/groups/<name>/members/<analyst>   remove a member
"""

from __future__ import annotations

from flask import Response, jsonify

from gateway.core.errors import Conflict, InvalidRequest, LedgerUnavailable, NotFound
from gateway.http.admin import (
    _caller,
    _json_body,
    _ledger,
    _ledger_errors,
    _reading,
    _written,
    admin_bp,
)
from gateway.http.auth import gateway
from gateway.http.openapi import array_of, document, ok_answer

_NAME = {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$"}
_TABLE_GRANTS = {
    "type": "object",
    "required": ["table", "groups", "readable_by"],
    "properties": {
        "table": {"type": "string"},
        "groups": {"type": "array", "items": {"type": "string"}},
        "config_groups": {"type": "array", "items": {"type": "string"}},
        "ledger_groups": {"type": "array", "items": {"type": "string"}},
        "readable_by": {
            "enum": ["everyone", "groups", "nobody"],
            "description": "everyone: the table has no grant and access.default is open",
        },
    },
}
_GRANT = ok_answer({"table": {"type": "string"}, "group": {"type": "string"}})
_MEMBER = ok_answer({"group": {"type": "string"}, "analyst": {"type": "string"}})


def _string(value: object, field: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidRequest(f"{field} must be a non-empty string", field=field)
    return value


@admin_bp.get("/grants")
@document(
    summary="Every declared table, the groups that may read it, and who reads it",
    auth="admin",
    responses={
        200: ok_answer(
            {"default": {"enum": ["open", "granted"]}, "tables": array_of(_TABLE_GRANTS)}
        )
    },
    errors=[LedgerUnavailable],
    tags=["admin"],
)
def list_grants() -> Response:
    _reading()
    access = gateway().access
    with _ledger_errors():
        stored = _ledger().access()
    return jsonify({"ok": True, "default": access.config.default, "tables": access.report(stored)})


@admin_bp.post("/grants")
@document(
    summary="Grant a table to a group: its members may read it from their next request",
    auth="admin",
    request={
        "type": "object",
        "required": ["table", "group"],
        "additionalProperties": False,
        "properties": {"table": {"type": "string"}, "group": _NAME},
    },
    responses={201: _GRANT},
    errors=[NotFound, Conflict, LedgerUnavailable],
    tags=["admin"],
)
def add_grant() -> tuple[Response, int]:
    body = _json_body({"table", "group"}, {"table", "group"})
    raw_table, group = _string(body["table"], "table"), _string(body["group"], "group")
    caller = _caller({"table": raw_table, "group": group}, 201)
    table = gateway().access.table(raw_table)
    with _ledger_errors():
        _ledger().grant(table, group, caller=caller)
        _written()
    return jsonify({"ok": True, "table": table, "group": group}), 201


@admin_bp.delete("/grants/<table>/<group>")
@document(
    summary="Take back a group's grant on a table",
    description="A grant declared in the config is changed in the config. The last grant "
    "of a table is refused (409) under `access.default: open`, where it would open the "
    "table to every analyst.",
    auth="admin",
    responses={200: _GRANT},
    errors=[NotFound, Conflict, LedgerUnavailable],
    tags=["admin"],
)
def remove_grant(table: str, group: str) -> Response:
    caller = _caller({"table": table, "group": group})
    access = gateway().access
    name = access.table(table)
    with _ledger_errors():
        access.check_revoke(_ledger().access(), name, group)
        _ledger().revoke(name, group, caller=caller)
        _written()
    return jsonify({"ok": True, "table": name, "group": group})


@admin_bp.get("/groups")
@document(
    summary="Every group with members (stored in the ledger), and its members",
    auth="admin",
    responses={
        200: ok_answer(
            {
                "groups": array_of(
                    {
                        "type": "object",
                        "properties": {
                            "name": {"type": "string"},
                            "members": array_of({"type": "string"}),
                        },
                    }
                )
            }
        )
    },
    errors=[LedgerUnavailable],
    tags=["admin"],
)
def list_groups() -> Response:
    _reading()
    with _ledger_errors():
        groups = _ledger().group_members()
    return jsonify(
        {"ok": True, "groups": [{"name": g, "members": m} for g, m in sorted(groups.items())]}
    )


@admin_bp.post("/groups/<name>/members")
@document(
    summary="Add an analyst to a group",
    auth="admin",
    request={
        "type": "object",
        "required": ["analyst"],
        "additionalProperties": False,
        "properties": {"analyst": {"type": "string"}},
    },
    responses={201: _MEMBER},
    errors=[NotFound, Conflict, LedgerUnavailable],
    tags=["admin"],
)
def add_member(name: str) -> tuple[Response, int]:
    body = _json_body({"analyst"}, {"analyst"})
    analyst = _string(body["analyst"], "analyst")
    caller = _caller({"group": name, "analyst": analyst}, 201)
    with _ledger_errors():
        _ledger().add_member(name, analyst, caller=caller)
        _written()
    return jsonify({"ok": True, "group": name, "analyst": analyst}), 201


@admin_bp.delete("/groups/<name>/members/<analyst>")
@document(
    summary="Remove an analyst from a group",
    auth="admin",
    responses={200: _MEMBER},
    errors=[NotFound, LedgerUnavailable],
    tags=["admin"],
)
def remove_member(name: str, analyst: str) -> Response:
    caller = _caller({"group": name, "analyst": analyst})
    with _ledger_errors():
        _ledger().remove_member(name, analyst, caller=caller)
        _written()
    return jsonify({"ok": True, "group": name, "analyst": analyst})


__all__: list[str] = []
