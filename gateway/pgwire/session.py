"""One client connection speaking PostgreSQL protocol v3, from startup to Terminate.

    startup (TLS?) → SCRAM-SHA-256 → ReadyForQuery ─► simple Query
                                                   └► Parse / Bind / Describe / Execute / Sync

Every statement is routed by ``gateway.pgwire.rewrite.classify``: session commands are
answered here (``gateway.pgwire.commands``), catalogue queries by
``gateway.pgwire.catalog`` (config only), and
everything else by ``Gateway.query`` — the same call ``POST /v1/query`` makes, so the
same analysis, cache, charges, audit, timing and ledger records apply; the connection
adds what the HTTP layer adds around it (``gateway.pgwire.observe``: rate limits, the
log line, metrics, the audit log).

Describe never runs a query that reads protected rows: a statement's columns come from
its plan (analysis of the text against the public schema), so describing is free.

Limits: messages (``codec.MAX_MESSAGE_BYTES``), and ``MEMORY_LIMIT_BYTES`` for what a
connection holds at once — prepared statements, portals and their encoded results.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlglot import exp

from budget import LedgerUnavailable
from gateway.core.errors import (
    Forbidden,
    GatewayError,
    InvalidPrivacyParameters,
    InvalidRequest,
    Unauthenticated,
    UnknownColumn,
    UnsupportedQuery,
)
from gateway.core.errors import LedgerUnavailable as GatewayLedgerUnavailable
from gateway.core.plan import ProbePlan, QueryRequest
from gateway.pgwire import codec
from gateway.pgwire.catalog import CatalogError, CatalogResult
from gateway.pgwire.catalog_settings import REPORTED
from gateway.pgwire.commands import Outcome, SessionCommands, setting_number
from gateway.pgwire.errors import sqlstate_of
from gateway.pgwire.rewrite import classify, rewrite_catalog, split_statements
from gateway.pgwire.translate import SessionContext
from gateway.pgwire.values import (
    bind,
    duckdb_type_oid,
    encode,
    infer_parameter_types,
    parameter_literal,
    placeholders,
    type_size,
    value_type_oid,
)
from gateway.pipeline.identity import Principal
from gateway.pipeline.release import Release

if TYPE_CHECKING:
    from gateway.pgwire.server import WireServer

log = logging.getLogger("dpgate.pgwire")

#: What one connection may hold at once: prepared statements, portals, encoded results.
MEMORY_LIMIT_BYTES = 16 * 1024 * 1024
MAX_STATEMENTS = 256
STATEMENT_OVERHEAD = 256
FLUSH_BYTES = 64 * 1024


class MemoryLimit(GatewayError):
    """The connection would hold more than its memory limit (SQLSTATE 54000)."""

    code = "invalid_request"
    status = 400


class CancelledQuery(GatewayError):
    code = "invalid_request"
    status = 400


@dataclass
class Statement:
    name: str
    sql: str
    parameter_types: tuple[int, ...]
    size: int


@dataclass
class Portal:
    name: str
    statement: Statement
    sql: str
    result_formats: tuple[int, ...]
    size: int
    fields: list[codec.Field] | None = None
    rows: list[bytes] | None = None
    tag: str = ""
    sent: int = 0
    result_size: int = 0


class Session(SessionCommands):
    """The state of one connection. ``run`` serves it until Terminate or disconnect."""

    def __init__(
        self,
        server: WireServer,
        stream: codec.ByteSource,
        write: Callable[[bytes], None],
        peer: str,
    ) -> None:
        self.server = server
        self.stream = stream
        self._write = write
        self.peer = peer
        self.user = ""
        self.groups: frozenset[str] = frozenset()  # an SSO token's groups claim
        self.process_id = 0
        self.secret = 0
        self.settings: dict[str, str] = {}
        self.status = "I"  # I idle, T in a transaction, E failed transaction
        self.statements: dict[str, Statement] = {}
        self.portals: dict[str, Portal] = {}
        self.held = 0
        self.out = bytearray()
        self.cancelled = threading.Event()
        self.busy = False
        self._skipping = False  # after an error in the extended protocol, until Sync

    # -- output -----------------------------------------------------------------------------

    def send(self, data: bytes) -> None:
        self.out += data
        if len(self.out) >= FLUSH_BYTES:
            self.flush()

    def flush(self) -> None:
        if self.out:
            self._write(bytes(self.out))
            self.out.clear()

    def send_error(self, error: GatewayError, request_id: str | None = None) -> None:
        detail = dict(error.detail)
        if request_id:
            detail["request_id"] = request_id
        instead = detail.get("ask_instead")
        self.send(
            codec.error_response(
                sqlstate_of(error),
                error.message,
                detail=json.dumps({"code": error.code, "detail": detail}, default=str),
                # psql prints it as HINT: the auditor's suggestions, one per line
                hint="Ask instead:\n" + "\n".join(f"  {q};" for q in instead)
                if isinstance(instead, list) and instead
                else None,
            )
        )

    # -- the connection -----------------------------------------------------------------

    def serve(self, startup: codec.Startup, login: Callable[[], bool] = lambda: True) -> None:
        """Authenticate the startup's user, then answer messages until Terminate.

        ``login`` is asked for a session slot once the user has proved their key, before
        the client is told it is in; False refuses the login (53300)."""
        if not self._authenticate(startup, login):
            return
        self.flush()
        while True:
            try:
                message = codec.read_message(self.stream)
            except codec.ProtocolViolation as e:
                self.send(codec.error_response("08P01", str(e), severity="FATAL"))
                self.flush()
                return
            if isinstance(message, codec.Terminate):
                return
            self._dispatch(message)

    def _authenticate(self, startup: codec.Startup, login_slot: Callable[[], bool]) -> bool:
        user = startup.parameters.get("user", "")
        self.user = user
        for key, value in startup.parameters.items():
            if key == "options":
                self._startup_options(value)
            elif key not in ("user", "database"):
                self.settings[key] = value
        try:
            self.server.observe.check_address(self.peer)
        except GatewayError as e:
            self.send_error(e)
            return False
        if self.server.wire.login == "password":
            logged_in = self._password_login(user)
        else:
            logged_in = self._scram_login(user)
        if logged_in is None:
            return False
        disabled, server_final = logged_in
        if disabled:
            error = Forbidden(f"analyst '{user}' is disabled")
            self.server.observe.connection(self.peer, user, error.code)
            self.send(codec.error_response("28000", error.message, severity="FATAL"))
            self.flush()
            return False
        if not login_slot():
            self.server.observe.connection(self.peer, user, "too_many_clients")
            self.send(
                codec.error_response("53300", "sorry, too many clients already", severity="FATAL")
            )
            self.flush()
            return False
        if server_final is not None:
            self.send(codec.authentication(12, server_final.encode("ascii")))
        self.send(codec.authentication(0))
        self.server.observe.connection(self.peer, user, "ok")
        for name in REPORTED:
            self.send(codec.parameter_status(name, self._setting(name) or ""))
        self.process_id, self.secret = self.server.register(self)
        self.send(codec.backend_key_data(self.process_id, self.secret))
        self.send(codec.ready_for_query(self.status))
        return True

    def _login_failed(self, user: str, message: str) -> None:
        self.server.observe.connection(self.peer, user, "unauthenticated")
        self.send(codec.error_response("28P01", message, severity="FATAL"))
        self.flush()

    def _ledger_down(self) -> None:
        self.send(
            codec.error_response("58000", "the ledger database is unavailable", severity="FATAL")
        )
        self.flush()

    def _scram_login(self, user: str) -> tuple[bool, str | None] | None:
        """SCRAM-SHA-256 with the analyst's API key: (disabled, SASLFinal's data), or
        ``None`` once the refusal was sent."""
        from gateway.pgwire.scram import (
            MECHANISM,
            ScramExchange,
            ScramFailed,
            mock_verifier,
            parse_client_first,
        )

        try:
            login = self.server.gateway.ledger.scram_login(user) if user else None
        except LedgerUnavailable:
            self._ledger_down()
            return None
        verifier = login[1] if login is not None else mock_verifier(user)
        self.send(codec.sasl_mechanisms(MECHANISM))
        self.flush()
        try:
            first = codec.read_message(self.stream)
            if not isinstance(first, codec.PasswordData):
                raise ScramFailed("expected a SASL response")
            r = codec.Reader(first.body)
            if r.cstring() != MECHANISM:
                raise ScramFailed("unsupported SASL mechanism")
            length = r.int32()
            data = r.raw(length) if length >= 0 else b""
            exchange = ScramExchange(verifier, parse_client_first(data.decode("utf-8")))
            self.send(codec.authentication(11, exchange.server_first.encode("ascii")))
            self.flush()
            final = codec.read_message(self.stream)
            if not isinstance(final, codec.PasswordData):
                raise ScramFailed("expected a SASL response")
            server_final = exchange.finish(final.body.decode("utf-8"))
            if login is None:
                raise ScramFailed("no such analyst")
        except (ScramFailed, codec.ProtocolViolation, UnicodeDecodeError):
            self._login_failed(user, _failure(user))
            return None
        return login[0].disabled, server_final

    def _password_login(self, user: str) -> tuple[bool, str | None] | None:
        """A password sent in the clear (``postgres_wire.login: password``): the analyst's
        API key, or an SSO token naming the analyst ``user`` (``gateway.pgwire.password``).
        (disabled, None), or ``None`` once the refusal was sent."""
        from gateway.pgwire.password import check_password

        self.send(codec.authentication(3))
        self.flush()
        try:
            message = codec.read_message(self.stream)
            if not isinstance(message, codec.PasswordData):
                raise codec.ProtocolViolation("expected a password message")
            password = message.body.rstrip(b"\0").decode("utf-8")
        except (codec.ProtocolViolation, UnicodeDecodeError):
            self._login_failed(user, _failure(user))
            return None
        try:
            principal = check_password(self.server.gateway, user, password)
        except (LedgerUnavailable, GatewayLedgerUnavailable):
            self._ledger_down()
            return None
        except Forbidden:
            return True, None
        except Unauthenticated as e:
            reason = e.detail.get("reason")
            self._login_failed(user, _failure(user) if reason is None else e.message)
            return None
        self.groups = principal.groups
        return False, None

    def _startup_options(self, options: str) -> None:
        for match in re.finditer(r"(?:-c\s*|--)([\w.]+)=(\S+)", options):
            self.settings[match.group(1).lower()] = match.group(2)

    # -- dispatch ----------------------------------------------------------------------

    def _dispatch(self, message: codec.Message) -> None:
        if isinstance(message, codec.Query):
            self._simple_query(message.sql)
            return
        if isinstance(message, codec.Sync):
            self._skipping = False
            self._close_unnamed_portal()
            self.send(codec.ready_for_query(self.status))
            self.flush()
            return
        if isinstance(message, codec.Flush):
            self.flush()
            return
        if self._skipping:
            return  # after an error, the extended protocol discards messages until Sync
        try:
            if isinstance(message, codec.Parse):
                self._parse(message)
            elif isinstance(message, codec.Bind):
                self._bind(message)
            elif isinstance(message, codec.Describe):
                self._describe(message)
            elif isinstance(message, codec.Execute):
                self._execute(message)
            elif isinstance(message, codec.Close):
                self._close(message)
            else:
                raise UnsupportedQuery(
                    "dpgate does not support this protocol message (COPY, function call, "
                    "or a password message outside authentication)",
                    construct="protocol",
                )
        except GatewayError as e:
            self.send_error(e)
            self._fail_transaction()
            self._skipping = True
        except Exception as e:
            request_id = uuid.uuid4().hex
            log.error("internal error (request %s): %s", request_id, type(e).__name__)
            self.send_error(
                GatewayError("internal error; quote the request id to the admin"), request_id
            )
            self._fail_transaction()
            self._skipping = True

    def _fail_transaction(self) -> None:
        if self.status == "T":
            self.status = "E"

    # -- simple query ----------------------------------------------------------------------

    def _simple_query(self, sql: str) -> None:
        statements = split_statements(sql)
        if not statements:
            self.send(codec.empty_query_response())
        for text in statements:
            try:
                outcome = self._run(text, describe_only=False)
            except GatewayError as e:
                self.send_error(e, getattr(e, "request_id", None))
                self._fail_transaction()
                break
            except Exception as e:
                request_id = uuid.uuid4().hex
                log.error("internal error (request %s): %s", request_id, type(e).__name__)
                self.send_error(
                    GatewayError("internal error; quote the request id to the admin"),
                    request_id,
                )
                self._fail_transaction()
                break
            for notice in outcome.notices:
                self.send(codec.notice_response(notice))
            if outcome.rows is not None:
                fields = [codec.Field(n, t, type_size(t)) for n, t in outcome.columns]
                self.send(codec.row_description(fields))
                for row in outcome.rows:
                    self.send(self._data_row(row, fields))
            self.send(codec.command_complete(outcome.tag))
        self.send(codec.ready_for_query(self.status))
        self.flush()

    def _data_row(self, row: tuple[Any, ...], fields: list[codec.Field]) -> bytes:
        return codec.data_row(
            [encode(v, f.type_oid, f.format == 1) for v, f in zip(row, fields, strict=True)]
        )

    # -- extended protocol -------------------------------------------------------------

    def _hold(self, size: int) -> None:
        if self.held + size > MEMORY_LIMIT_BYTES:
            raise MemoryLimit(
                f"this connection would hold more than {MEMORY_LIMIT_BYTES // (1024 * 1024)} MiB "
                "(prepared statements, portals and results): close some first"
            )
        self.held += size

    def _parse(self, message: codec.Parse) -> None:
        if message.name and message.name in self.statements:
            raise InvalidRequest(f'prepared statement "{message.name}" already exists')
        if len(self.statements) >= MAX_STATEMENTS and message.name not in self.statements:
            raise MemoryLimit(f"a connection holds at most {MAX_STATEMENTS} prepared statements")
        self._drop_statement(message.name)
        size = len(message.sql) + STATEMENT_OVERHEAD + 4 * len(message.parameter_types)
        self._hold(size)
        count = max(placeholders(message.sql), len(message.parameter_types))
        types = tuple(message.parameter_types) + (0,) * (count - len(message.parameter_types))
        if 0 in types:  # the client left some to the server (asyncpg, node-postgres)
            column_types = self.server.catalog_for(self._readable()).column_types
            inferred = infer_parameter_types(message.sql, column_types)
            types = tuple(t or inferred.get(i + 1, 0) for i, t in enumerate(types))
        self.statements[message.name] = Statement(message.name, message.sql, types, size)
        self.send(codec.parse_complete())

    def _bind(self, message: codec.Bind) -> None:
        statement = self.statements.get(message.statement)
        if statement is None:
            raise InvalidRequest(f'prepared statement "{message.statement}" does not exist')
        if message.portal and message.portal in self.portals:
            raise InvalidRequest(f'portal "{message.portal}" already exists')
        if len(message.parameters) != len(statement.parameter_types):
            raise InvalidRequest(
                f"the statement has {len(statement.parameter_types)} parameters, "
                f"{len(message.parameters)} were bound"
            )
        formats = _formats(message.parameter_formats, len(message.parameters), "parameter")
        literals = [
            parameter_literal(value, statement.parameter_types[i], formats[i] == 1)
            for i, value in enumerate(message.parameters)
        ]
        sql = bind(statement.sql, literals)
        self._drop_portal(message.portal)
        if len(self.portals) >= MAX_STATEMENTS:
            raise MemoryLimit(f"a connection holds at most {MAX_STATEMENTS} portals")
        size = len(sql) + STATEMENT_OVERHEAD
        self._hold(size)
        self.portals[message.portal] = Portal(
            message.portal, statement, sql, message.result_formats, size
        )
        self.send(codec.bind_complete())

    def _describe(self, message: codec.Describe) -> None:
        if message.kind == "S":
            statement = self.statements.get(message.name)
            if statement is None:
                raise InvalidRequest(f'prepared statement "{message.name}" does not exist')
            types = [t or 25 for t in statement.parameter_types]
            self.send(codec.parameter_description(types))
            sql = bind(statement.sql, [exp.Null() for _ in statement.parameter_types])
            outcome = self._run(sql, describe_only=True)
            self._send_description(outcome, ())
            return
        portal = self.portals.get(message.name)
        if portal is None:
            raise InvalidRequest(f'portal "{message.name}" does not exist')
        outcome = self._run(portal.sql, describe_only=True)
        portal.fields = self._send_description(outcome, portal.result_formats)

    def _send_description(
        self, outcome: Outcome, result_formats: tuple[int, ...]
    ) -> list[codec.Field] | None:
        if outcome.rows is None:
            self.send(codec.no_data())
            return None
        formats = _formats(result_formats, len(outcome.columns), "result")
        fields = [
            codec.Field(n, t, type_size(t), formats[i]) for i, (n, t) in enumerate(outcome.columns)
        ]
        self.send(codec.row_description(fields))
        return fields

    def _execute(self, message: codec.Execute) -> None:
        portal = self.portals.get(message.portal)
        if portal is None:
            raise InvalidRequest(f'portal "{message.portal}" does not exist')
        if portal.rows is None:
            outcome = self._run(portal.sql, describe_only=False)
            if outcome.rows is None and not outcome.tag:
                self.send(codec.empty_query_response())
                return
            for notice in outcome.notices:
                self.send(codec.notice_response(notice))
            formats = _formats(portal.result_formats, len(outcome.columns), "result")
            fields = [
                codec.Field(n, t, type_size(t), formats[i])
                for i, (n, t) in enumerate(outcome.columns)
            ]
            rows = [self._data_row(r, fields) for r in outcome.rows or []]
            size = sum(len(r) for r in rows)
            self._hold(size)
            portal.rows, portal.result_size, portal.tag = rows, size, outcome.tag
        limit = message.max_rows if message.max_rows > 0 else len(portal.rows)
        batch = portal.rows[portal.sent : portal.sent + limit]
        for row in batch:
            self.send(row)
        portal.sent += len(batch)
        if portal.sent < len(portal.rows):
            self.send(codec.portal_suspended())
        else:
            self.send(codec.command_complete(portal.tag))

    def _close(self, message: codec.Close) -> None:
        if message.kind == "S":
            self._drop_statement(message.name)
        else:
            self._drop_portal(message.name)
        self.send(codec.close_complete())

    def _drop_statement(self, name: str) -> None:
        statement = self.statements.pop(name, None)
        if statement is not None:
            self.held -= statement.size

    def _drop_portal(self, name: str) -> None:
        portal = self.portals.pop(name, None)
        if portal is not None:
            self.held -= portal.size + portal.result_size

    def _deallocate_all(self) -> None:
        for key in list(self.statements):
            self._drop_statement(key)

    def _close_unnamed_portal(self) -> None:
        self._drop_portal("")

    # -- statements ------------------------------------------------------------------------

    def _run(self, sql: str, *, describe_only: bool) -> Outcome:
        """Answer one statement (or, with ``describe_only``, only say its columns)."""
        route, tree = classify(sql)
        if self.status == "E" and not re.match(
            r"^\s*(ROLLBACK|ABORT|COMMIT|END)\b", sql, re.IGNORECASE
        ):
            raise InFailedTransaction(
                "current transaction is aborted, commands ignored until end of transaction block"
            )
        if route == "empty":
            return Outcome([], None, "")
        if route == "session":
            return self._session_command(sql, describe_only)
        if route == "catalog":
            assert tree is not None
            return self._catalog(tree)
        if describe_only:
            return self._describe_query(sql)
        return self.server.observe.query(self, sql, self._request(sql))

    def _catalog(self, tree: exp.Expr) -> Outcome:
        context = SessionContext(self.user, self.process_id, self._all_settings())
        try:
            rewritten = rewrite_catalog(tree, context)
        except GatewayError:
            raise
        except Exception:  # a construct the rewriter does not know
            raise UnsupportedQuery(_CATALOG_UNSUPPORTED, construct="catalog") from None
        try:
            result: CatalogResult = self.server.catalog_for(self._readable()).run(rewritten)
        except CatalogError as e:
            raise _catalog_error(str(e)) from None
        columns = [(name, duckdb_type_oid(kind)) for name, kind in result.columns]
        return Outcome(columns, result.rows, f"SELECT {len(result.rows)}")

    def _describe_query(self, sql: str) -> Outcome:
        """A pipeline query's columns, from its plan: no data read, nothing charged."""
        plan = self.server.gateway.analyze(sql, self._readable())
        if isinstance(plan, ProbePlan):
            columns = [(n, value_type_oid(t)[0]) for n, t in plan.columns]
        else:
            columns = [(n, value_type_oid(t)[0]) for n, t in plan.result_columns]
        return Outcome(columns, [], "SELECT 0")

    def _readable(self) -> frozenset[str]:
        """The tables this session's analyst may read now (grants change without a
        reconnect: read from the ledger each time)."""
        return self.server.gateway.readable(
            Principal(self.user, is_admin=False, groups=self.groups)
        )

    def _request(self, sql: str) -> QueryRequest:
        defaults = self.server.gateway.config.privacy
        mechanism = self.settings.get("dpgate.mechanism", defaults.mechanism)
        if mechanism not in ("laplace", "gaussian"):
            raise InvalidPrivacyParameters("dpgate.mechanism must be 'laplace' or 'gaussian'")
        epsilon = setting_number(self.settings, "dpgate.epsilon", defaults.epsilon)
        delta = setting_number(self.settings, "dpgate.delta", defaults.delta)
        return QueryRequest(
            sql=sql,
            epsilon=epsilon,
            delta=delta,
            mechanism="gaussian" if mechanism == "gaussian" else "laplace",
        )

    def answer(self, release: Release) -> Outcome:
        """A released answer as wire rows, with its cost and accuracy as a notice."""
        columns = [(c.name, value_type_oid(c.type)[0]) for c in release.columns]
        notices = [_notice(release)]
        left_out = release.extra.get("audit_left_out")
        if isinstance(left_out, dict):  # rows the audit left out: a client must be told
            rows = "; ".join(
                ", ".join(f"{k} = {v}" for k, v in group.items()) for group in left_out["groups"]
            )
            said = f"dpgate: rows left out by the audit: {rows} ({left_out['reason']})"
            instead = left_out.get("ask_instead")
            if instead:  # the counts that would give every row, to send as they are
                said += " Ask instead: " + " ".join(f"{q};" for q in instead)
            notices.append(said)
        return Outcome(columns, list(release.rows), f"SELECT {len(release.rows)}", notices)

    # -- cancellation ----------------------------------------------------------------------

    def cancel(self) -> None:
        """A CancelRequest for this connection arrived (only a running query notices)."""
        if self.busy:
            self.cancelled.set()

    def secret_matches(self, secret: int) -> bool:
        return secrets.compare_digest(
            secret.to_bytes(4, "big", signed=True), self.secret.to_bytes(4, "big", signed=True)
        )


_CATALOG_UNSUPPORTED = (
    "this catalogue query is not supported by dpgate: it reads only the tables and "
    "columns of pg_catalog and information_schema that dpgate emulates from its config"
)


def _catalog_error(engine_message: str) -> GatewayError:
    """The client's error for a failed catalogue query, in PostgreSQL's words.

    The engine's own message is never shown (its wording would tell what answers the
    catalogue); only a column or table name the client itself wrote is echoed back."""
    column = re.search(r'column "([^"]{1,64})" not found', engine_message)
    if column is not None:
        return UnknownColumn(f'column "{column.group(1)}" does not exist', column=column.group(1))
    if "interrupt" in engine_message.lower():
        return UnsupportedQuery(
            "this catalogue query took too long and was stopped", construct="catalog"
        )
    return UnsupportedQuery(_CATALOG_UNSUPPORTED, construct="catalog")


def _failure(user: str) -> str:
    return (
        f'password authentication failed for user "{user[:64]}": the password is the '
        "analyst's API key (a key made before dpgate served PostgreSQL clients must be "
        "rotated first: dpgate key rotate NAME)"
    )


class InFailedTransaction(InvalidRequest):
    """SQLSTATE 25P02."""


def _formats(codes: tuple[int, ...], n: int, what: str) -> list[int]:
    if not codes:
        return [0] * n
    if len(codes) == 1:
        return [codes[0]] * n
    if len(codes) != n:
        raise InvalidRequest(f"{len(codes)} {what} format codes for {n} values")
    return list(codes)


def _notice(release: Release) -> str:
    privacy = release.privacy
    budget = release.budget
    if release.cached:
        head = "dpgate: the same answer as before, free"
    elif privacy.mechanism == "none":
        return "dpgate: answered from public information, free"
    else:
        head = f"dpgate: charged ε={privacy.epsilon} ({privacy.mechanism})"
    remaining = budget.epsilon_remaining
    parts = [head]
    if remaining is not None:
        parts.append(f"ε remaining {remaining:.4g} of {budget.epsilon}")
    spread = [
        f"{name} ±{acc['ci95_halfwidth']:.3g}"
        for name, acc in release.accuracy.items()
        if isinstance(acc, dict) and "ci95_halfwidth" in acc
    ]
    if spread:
        parts.append("95% accuracy: " + ", ".join(spread))
    return "; ".join(parts)
