"""The gateway's configuration: one YAML file, validated into frozen dataclasses.

Secrets never live in the file: the admin key comes from ``DPGATE_ADMIN_KEY``.
``load_config`` reports every problem it finds at once, each with the path of the
offending field (``tables.patients.columns.age.lower: must be a number``), so that
``dpgate config check`` can say precisely what is wrong.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import yaml

from gateway.core.config_access import (
    AccessConfig,
    SsoConfig,
    parse_access,
    parse_grants,
    parse_sso,
)

ColumnType = Literal["integer", "real", "text", "boolean", "date"]
COLUMN_TYPES: tuple[str, ...] = ("integer", "real", "text", "boolean", "date")
MECHANISMS = ("laplace", "gaussian")
# budget.COMPOSITIONS and budget.PERIODS (not imported: the auditor imports this module and
# must load nothing that reaches a database; tests/test_budget_periods.py checks they
# agree).
COMPOSITIONS = ("combined", "zcdp", "pure")
PERIODS = ("none", "day", "week", "month")


class ConfigError(Exception):
    """A config that cannot be used; ``problems`` lists each one with its field path."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("invalid config:\n" + "\n".join(f"  - {p}" for p in problems))
        self.problems = problems


@dataclass(frozen=True)
class ColumnConfig:
    """One declared column: its type, and what the admin declared public about it."""

    name: str
    type: ColumnType
    lower: float | None = None
    upper: float | None = None
    values: tuple[Any, ...] | None = None
    nullable: bool | None = None  # None: not declared (the catalogue decides, else True)
    # The database itself keeps the column inside its declared domain (catalogue NOT NULL
    # where NULL is outside it, CHECK constraints admitting declared values only), so the
    # compiled SQL does not filter on it (gateway/sql/constraints.py). Read, never declared.
    enforced: bool = False
    # The database keeps the (integer) column whole and inside [lower, upper] (integral
    # storage, CHECK constraints admitting that interval only), so a SUM reads it as
    # stored, without the clamp (gateway/sql/constraints.py). Read, never declared.
    within_bounds: bool = False
    # Set only on a joined relation's columns (gateway/core/joins.py): the relation column this
    # one's value is a function of (a lookup through it), which the auditor must not treat
    # as independent of it.
    determined_by: str | None = None

    @property
    def may_be_null(self) -> bool:
        """Whether the column's domain has NULL (``nullable`` undecided counts as yes)."""
        return self.nullable is not False

    @property
    def bounded(self) -> bool:
        return self.lower is not None and self.upper is not None

    @property
    def numeric(self) -> bool:
        return self.type in ("integer", "real")


@dataclass(frozen=True)
class Reference:
    """``references: {column: table.column}``: this table's ``column`` holds values of
    ``table.target``, where each value names at most one row (docs/design.md, "Joins").

    To a protected table the target is its privacy unit (a privacy-unit path: both
    columns identify the same person); to a ``public`` table it is the table's ``key``."""

    column: str
    table: str
    target: str
    # ``every_row_matches: true``: rows whose ``column`` names no row of the lookup (as
    # the join matches keys) are outside the table, in every query on it — the compiled
    # SQL inner-joins the lookup (gateway/sql/analyze/joins.py, ``matched_lookups``) — so no
    # region of unmatched rows exists, in SQL or in the auditor.
    every_row_matches: bool = False


#: By default a query reads at most this many times ``max_rows_per_unit`` of one unit's
#: stored rows.
READ_ROWS_FACTOR = 10


@dataclass(frozen=True)
class TableConfig:
    """One protected table. ``privacy_unit`` None means row-level privacy.

    ``deadline_ms`` fixes the release deadline of queries on this table (instead of the
    cost model's, ``gateway/pipeline/cost_model.py``); ``rows`` declares the table's row count as
    public (an upper bound the cost model uses instead of the measured count).

    ``public`` tables hold public rows (a zip → region list) with a unique ``key``;
    ``references`` are the joins this table may take (``Reference``).
    """

    name: str
    columns: Mapping[str, ColumnConfig]
    privacy_unit: str | None = None
    max_rows_per_unit: int = 1
    max_groups_per_unit: int | None = None
    schema: str | None = None
    source: str | None = None  # the table's real name in the database, if it differs
    deadline_ms: int | None = None
    max_rows_read_per_unit: int | None = None
    rows: int | None = None
    public: bool = False
    key: str | None = None
    references: tuple[Reference, ...] = ()
    grants: tuple[str, ...] | None = None  # groups that may read it (gateway/pipeline/access.py)

    @property
    def rows_read_bound(self) -> int:
        """How many of one unit's stored rows a query reads at most, before the
        analyst's expressions are evaluated: bounds one person's share of a statement's
        time (docs/privacy.md, "Side channels"). Default: 10 × ``max_rows_per_unit``."""
        if self.max_rows_read_per_unit is not None:
            return max(self.max_rows_read_per_unit, self.max_rows_per_unit)
        return READ_ROWS_FACTOR * self.max_rows_per_unit

    @property
    def sql_name(self) -> str:
        return self.source or self.name


@dataclass(frozen=True)
class DatabaseConfig:
    url: str
    statement_timeout_ms: int = 10_000
    data_version: str = "1"


@dataclass(frozen=True)
class LedgerConfig:
    url: str


@dataclass(frozen=True)
class PrivacyConfig:
    mechanism: Literal["laplace", "gaussian"] = "laplace"
    epsilon: float = 0.1
    max_epsilon_per_query: float = 1.0
    delta: float = 1e-7
    composition: Literal["combined", "zcdp", "pure"] = "combined"
    global_budget: tuple[float, float] | None = None
    min_epsilon_per_query: float = 0.01
    min_rho_per_query: float | None = None
    global_period: Literal["none", "day", "week", "month"] = "none"
    # The share of each δ budget that partition selection may spend (budget/accountants).
    selection_delta_share: float = 0.5

    def ledger_options(self) -> dict[str, Any]:
        """The keyword arguments ``budget.Ledger`` takes from this section."""
        return {
            "composition": self.composition,
            "global_budget": self.global_budget,
            "global_period": self.global_period,
            "selection_share": self.selection_delta_share,
        }

    @property
    def min_rho(self) -> float:
        """The least zCDP cost (ρ) a query may have: by default that of a Laplace query at
        the minimum ε (ε²/2), so Gaussian and Laplace queries have the same floor."""
        if self.min_rho_per_query is not None:
            return self.min_rho_per_query
        return self.min_epsilon_per_query**2 / 2


#: Bounds beyond this magnitude are refused: arithmetic on bounded columns is checked to
#: stay exact in 64-bit integers and doubles (see gateway/sql/analyze/totality.py).
MAX_BOUND_MAGNITUDE = 1e15


#: The cost model's estimate is multiplied by this (the built-in per-row costs already
#: cover a loaded 2-core machine: the estimate of a demo query is 1.3-4.5 times its CPU
#: time; bench/README.md, "Release moments").
DEFAULT_MARGIN = 2.0
#: The least a statement gets, for a scheduler's time slice on a busy machine.
DEFAULT_MIN_MS = 10


@dataclass(frozen=True)
class ExecutionConfig:
    """When answers that read protected rows are released (docs/privacy.md, "Timing").

    ``timing: deadline``: every query that reaches the protected database is answered
    exactly ``deadline_ms`` (the table's own, or this default) after its execution
    starts — never earlier, whatever the rows made it cost — and a statement that has not
    finished by then is cancelled, charged, and reported at the same moment with the same
    error as any other failure. ``timing: off`` answers as soon as the database does
    (response time then depends on the data).

    The deadline is the cost model's (``gateway/pipeline/cost_model.py``: declared row counts,
    the engine's per-row costs — ``row_ns``, ``char_ns``, ``sort_ns``, ``join_ns``, ``group_ns``,
    ``base_ms`` override them —, the query's shape, the gateway's concurrency), times
    ``deadline_margin``, plus ``post_ms`` for the work after the statement, never below
    ``min_deadline_ms``; a ``deadline_ms`` here (or on a table) fixes it instead, and a
    table without a declared ``rows`` gets ``FALLBACK_DEADLINE_MS`` (gateway/pipeline/timing.py).

    ``load_aware: true`` also scales deadlines by the machine's load average. Off by
    default: the load average counts dpgate's own statements, whose running time may
    depend on the rows, so it is not a public fact (docs/privacy.md, "Timing").
    """

    timing: Literal["deadline", "off"] = "deadline"
    deadline_ms: int | None = None
    deadline_margin: float = DEFAULT_MARGIN
    min_deadline_ms: int = DEFAULT_MIN_MS
    post_ms: int = 10
    load_aware: bool = False
    row_ns: float | None = None  # the cost model's per-row costs (None: the engine's)
    char_ns: float | None = None
    sort_ns: float | None = None
    join_ns: float | None = None
    group_ns: float | None = None
    base_ms: float | None = None


@dataclass(frozen=True)
class AuditConfig:
    """The differencing auditor (docs/privacy.md, "What the auditor adds").

    A determined group is let through only if a lower confidence bound on its size, at
    level ``confidence``, reaches ``min_group_size``.
    """

    mode: Literal["refuse", "flag", "off"] = "refuse"
    min_group_size: int = 5
    scope: Literal["analyst", "global"] = "analyst"
    confidence: float = 0.999
    # the memory each process gives to audit knowledge; the least recently used
    # scopes beyond it wait on disk (gateway/audit/resident.py)
    memory_mb: int = 64


@dataclass(frozen=True)
class CacheConfig:
    scope: Literal["analyst", "global"] = "analyst"


@dataclass(frozen=True)
class LimitsConfig:
    """Requests per minute per analyst and per source address (None: unlimited)."""

    analyst_per_minute: int | None = None
    address_per_minute: int | None = None


#: PostgreSQL's own port: dpgate's wire front end never takes it (a real server may run
#: beside it, and a client that meant the real database must not reach dpgate by accident).
POSTGRES_DEFAULT_PORT = 5432


@dataclass(frozen=True)
class WireTlsConfig:
    """TLS for the PostgreSQL front end: a PEM certificate chain and its private key."""

    cert: Path
    key: Path
    require: bool = False  # refuse clients that do not ask for TLS


@dataclass(frozen=True)
class PostgresWireConfig:
    """``postgres_wire:``: dpgate also speaks the PostgreSQL protocol on ``port``."""

    port: int
    tls: WireTlsConfig | None = None
    max_connections: int = 64  # logged-in sessions at once (gateway/pgwire/admission.py)
    authentication_timeout_s: float = 10.0  # from accept to logged in, however slow
    max_authenticating: int = 32  # connections still logging in, in total
    max_authenticating_per_address: int = 8  # … from one source address
    idle_session_timeout_s: float = 600.0  # a session silent this long is closed; 0: never
    # scram: SCRAM-SHA-256 with the API key; password: the client sends its password in
    # the clear (an API key or an SSO token: gateway/pgwire/session.py) — use with TLS
    login: Literal["scram", "password"] = "scram"


@dataclass(frozen=True)
class AnalystBootstrap:
    name: str
    epsilon: float
    delta: float
    period: Literal["none", "day", "week", "month"] = "none"


@dataclass(frozen=True)
class Config:
    """A validated dpgate configuration."""

    database: DatabaseConfig
    ledger: LedgerConfig
    tables: Mapping[str, TableConfig]
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)
    audit: AuditConfig = field(default_factory=AuditConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    execution: ExecutionConfig = field(default_factory=ExecutionConfig)
    analysts: tuple[AnalystBootstrap, ...] = ()
    postgres_wire: PostgresWireConfig | None = None
    source: Path | None = None
    access: AccessConfig = field(default_factory=AccessConfig)
    sso: SsoConfig | None = None

    @property
    def admin_key(self) -> str | None:
        return os.environ.get("DPGATE_ADMIN_KEY") or None


def load_config(path: str | os.PathLike[str]) -> Config:
    """Read and validate a YAML config file; relative SQLite paths resolve from its folder."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ConfigError([f"{p}: cannot read: {e.strerror}"]) from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError([f"{p}: not valid YAML{where}"]) from None
    try:
        return parse_config(raw, base_dir=p.parent.resolve(), source=p)
    except ConfigError as e:
        from gateway.core.config_lines import locate

        raise ConfigError(locate(e.problems, text)) from None


def parse_config(raw: Any, *, base_dir: Path | None = None, source: Path | None = None) -> Config:
    """Validate an already parsed config mapping."""
    v = _Validator()
    if not isinstance(raw, Mapping):
        raise ConfigError(["the config must be a mapping at the top level"])
    v.no_unknown(
        raw,
        "",
        {
            "database",
            "ledger",
            "privacy",
            "audit",
            "cache",
            "limits",
            "execution",
            "tables",
            "analysts",
            "postgres_wire",
            "access",
            "sso",
        },
    )
    db = v.section(raw, "database", required=True)
    database = DatabaseConfig(
        url=_resolve_url(v.string(db, "database.url", required=True), base_dir),
        statement_timeout_ms=v.integer(db, "database.statement_timeout_ms", 10_000, low=1)
        or 10_000,
        data_version=str(db.get("data_version", "1")),
    )
    v.no_unknown(db, "database", {"url", "statement_timeout_ms", "data_version"})
    lg = v.section(raw, "ledger", required=True)
    v.no_unknown(lg, "ledger", {"url"})
    ledger = LedgerConfig(url=_resolve_url(v.string(lg, "ledger.url", required=True), base_dir))
    privacy = _privacy(v, v.section(raw, "privacy"))
    au = v.section(raw, "audit")
    v.no_unknown(au, "audit", {"mode", "min_group_size", "scope", "confidence", "memory_mb"})
    confidence = v.number(au, "audit.confidence", 0.999)
    if confidence is None or not 0.5 <= confidence < 1:
        v.problem("audit.confidence: must be in [0.5, 1)")
        confidence = 0.999
    audit = AuditConfig(
        mode=v.choice(au, "audit.mode", ("refuse", "flag", "off"), "refuse"),  # type: ignore[arg-type]
        min_group_size=v.integer(au, "audit.min_group_size", 5, low=1) or 5,
        scope=v.choice(au, "audit.scope", ("analyst", "global"), "analyst"),  # type: ignore[arg-type]
        confidence=confidence,
        memory_mb=v.integer(au, "audit.memory_mb", 64, low=1) or 64,
    )
    ca = v.section(raw, "cache")
    v.no_unknown(ca, "cache", {"scope"})
    cache = CacheConfig(scope=v.choice(ca, "cache.scope", ("analyst", "global"), "analyst"))  # type: ignore[arg-type]
    li = v.section(raw, "limits")
    v.no_unknown(li, "limits", {"analyst_per_minute", "address_per_minute"})
    limits = LimitsConfig(
        analyst_per_minute=v.integer(li, "limits.analyst_per_minute", None, low=1),
        address_per_minute=v.integer(li, "limits.address_per_minute", None, low=1),
    )
    ex = v.section(raw, "execution")
    v.no_unknown(
        ex,
        "execution",
        {
            "timing",
            "deadline_ms",
            "deadline_margin",
            "min_deadline_ms",
            "post_ms",
            "load_aware",
            "row_ns",
            "char_ns",
            "sort_ns",
            "join_ns",
            "group_ns",
            "base_ms",
        },
    )
    load_aware = ex.get("load_aware", False)
    if not isinstance(load_aware, bool):
        v.problem("execution.load_aware: must be true or false")
        load_aware = False
    margin = (
        v.number(ex, "execution.deadline_margin", DEFAULT_MARGIN, positive=True) or DEFAULT_MARGIN
    )
    if margin < 1:
        v.problem("execution.deadline_margin: must be ≥ 1")
    execution = ExecutionConfig(
        timing=v.choice(ex, "execution.timing", ("deadline", "off"), "deadline"),  # type: ignore[arg-type]
        deadline_ms=v.integer(ex, "execution.deadline_ms", None, low=1),
        deadline_margin=max(1.0, margin),
        min_deadline_ms=v.integer(ex, "execution.min_deadline_ms", DEFAULT_MIN_MS, low=1)
        or DEFAULT_MIN_MS,
        post_ms=v.integer(ex, "execution.post_ms", 10, low=1) or 10,
        load_aware=load_aware,
        row_ns=v.number(ex, "execution.row_ns", None, positive=True),
        char_ns=v.number(ex, "execution.char_ns", None, positive=True),
        sort_ns=v.number(ex, "execution.sort_ns", None, positive=True),
        join_ns=v.number(ex, "execution.join_ns", None, positive=True),
        group_ns=v.number(ex, "execution.group_ns", None, positive=True),
        base_ms=v.number(ex, "execution.base_ms", None, positive=True),
    )
    tables = _tables(v, raw.get("tables"))
    analysts = _analysts(v, raw.get("analysts"))
    wire = _postgres_wire(v, raw, base_dir)
    access = parse_access(v, raw)
    sso = parse_sso(v, raw, base_dir)
    v.raise_if_any()
    return Config(
        database=database,
        ledger=ledger,
        tables=tables,
        privacy=privacy,
        audit=audit,
        cache=cache,
        limits=limits,
        execution=execution,
        analysts=analysts,
        postgres_wire=wire,
        source=source,
        access=access,
        sso=sso,
    )


def _postgres_wire(
    v: _Validator, raw: Mapping[str, Any], base_dir: Path | None
) -> PostgresWireConfig | None:
    pw = v.section(raw, "postgres_wire")
    if "postgres_wire" not in raw or raw.get("postgres_wire") is None:
        return None
    v.no_unknown(
        pw,
        "postgres_wire",
        {
            "port",
            "tls",
            "max_connections",
            "authentication_timeout_s",
            "max_authenticating",
            "max_authenticating_per_address",
            "idle_session_timeout_s",
            "login",
        },
    )
    login = v.choice(pw, "postgres_wire.login", ("scram", "password"), "scram") or "scram"
    port = v.integer(pw, "postgres_wire.port", None, low=0)  # 0: any free port
    if port is None:
        v.problem("postgres_wire.port: missing (required)")
        port = 0
    elif port > 65535:
        v.problem("postgres_wire.port: must be ≤ 65535")
    elif port == POSTGRES_DEFAULT_PORT:
        v.problem(
            f"postgres_wire.port: {POSTGRES_DEFAULT_PORT} is PostgreSQL's own port; pick "
            "another (clients that meant a real database must not reach dpgate)"
        )
    max_connections = v.integer(pw, "postgres_wire.max_connections", 64, low=1) or 64
    auth_timeout = (
        v.number(pw, "postgres_wire.authentication_timeout_s", 10.0, positive=True) or 10.0
    )
    max_authenticating = v.integer(pw, "postgres_wire.max_authenticating", 32, low=1) or 32
    default_per_address = min(8, max_authenticating)
    per_address = (
        v.integer(pw, "postgres_wire.max_authenticating_per_address", default_per_address, low=1)
        or default_per_address
    )
    if per_address > max_authenticating:
        v.problem(
            "postgres_wire.max_authenticating_per_address: must be ≤ max_authenticating "
            f"({max_authenticating})"
        )
    idle_timeout = v.number(pw, "postgres_wire.idle_session_timeout_s", 600.0)
    if idle_timeout is not None and idle_timeout < 0:
        v.problem("postgres_wire.idle_session_timeout_s: must be ≥ 0 (0: never)")
        idle_timeout = 600.0
    tls = None
    tl = v.section(pw, "tls")
    if pw.get("tls") is not None:
        v.no_unknown(tl, "postgres_wire.tls", {"cert", "key", "require"})
        files: list[Path] = []
        for name in ("cert", "key"):
            text = v.string(tl, f"postgres_wire.tls.{name}", required=True)
            path = Path(text)
            if text and base_dir is not None and not path.is_absolute():
                path = base_dir / path
            # Checked when the config comes from a file (relative paths resolve from it).
            if text and base_dir is not None and not path.is_file():
                v.problem(f"postgres_wire.tls.{name}: no such file: {path}")
            files.append(path)
        require = tl.get("require", False)
        if not isinstance(require, bool):
            v.problem("postgres_wire.tls.require: must be true or false")
            require = False
        tls = WireTlsConfig(cert=files[0], key=files[1], require=require)
    return PostgresWireConfig(
        port=port,
        tls=tls,
        max_connections=max_connections,
        authentication_timeout_s=auth_timeout,
        max_authenticating=max_authenticating,
        max_authenticating_per_address=per_address,
        idle_session_timeout_s=600.0 if idle_timeout is None else idle_timeout,
        login=login,  # type: ignore[arg-type]
    )


def _resolve_url(url: str, base_dir: Path | None) -> str:
    """Make ``sqlite:///relative.db`` relative to the config file's folder."""
    prefix = "sqlite:///"
    if base_dir is None or not url.startswith(prefix):
        return url
    rest = url[len(prefix) :]
    if not rest or rest.startswith("/") or rest.startswith(":memory:") or rest.startswith("file:"):
        return url
    return prefix + str((base_dir / rest).resolve())


def _privacy(v: _Validator, pr: Mapping[str, Any]) -> PrivacyConfig:
    v.no_unknown(
        pr,
        "privacy",
        {
            "mechanism",
            "epsilon",
            "max_epsilon_per_query",
            "min_epsilon_per_query",
            "min_rho_per_query",
            "delta",
            "composition",
            "global_budget",
            "selection_delta_share",
        },
    )
    gb_raw = pr.get("global_budget")
    global_budget: tuple[float, float] | None = None
    global_period = "none"
    if gb_raw is not None:
        if not isinstance(gb_raw, Mapping):
            v.problem("privacy.global_budget: must be a mapping {epsilon, delta, period}")
        else:
            v.no_unknown(gb_raw, "privacy.global_budget", {"epsilon", "delta", "period"})
            global_budget = (
                v.number(gb_raw, "privacy.global_budget.epsilon", None, positive=True) or 0.0,
                v.number(gb_raw, "privacy.global_budget.delta", 0.0, unit=True) or 0.0,
            )
            global_period = (
                v.choice(gb_raw, "privacy.global_budget.period", PERIODS, "none") or "none"
            )
    mechanism = v.choice(pr, "privacy.mechanism", MECHANISMS, "laplace")
    composition = v.choice(pr, "privacy.composition", COMPOSITIONS, "combined")
    if composition == "pure" and mechanism == "gaussian":
        v.problem(
            "privacy.mechanism: gaussian needs composition combined or zcdp "
            "(pure admits Laplace only)"
        )
    share = v.number(pr, "privacy.selection_delta_share", 0.5, unit=True)
    epsilon = v.number(pr, "privacy.epsilon", 0.1, positive=True) or 0.1
    max_eps = v.number(pr, "privacy.max_epsilon_per_query", 1.0, positive=True) or 1.0
    if epsilon > max_eps:
        v.problem("privacy.epsilon: the default ε exceeds privacy.max_epsilon_per_query")
    min_eps = v.number(pr, "privacy.min_epsilon_per_query", 0.01, positive=True) or 0.01
    if min_eps > epsilon:
        v.problem(
            f"privacy.min_epsilon_per_query: {min_eps} is above the default ε ({epsilon}): "
            "the default query would be refused"
        )
    min_rho = v.number(pr, "privacy.min_rho_per_query", None, positive=True)
    return PrivacyConfig(
        mechanism=mechanism,  # type: ignore[arg-type]
        epsilon=epsilon,
        max_epsilon_per_query=max_eps,
        delta=v.number(pr, "privacy.delta", 1e-7, unit=True) or 1e-7,
        composition=composition,  # type: ignore[arg-type]
        global_budget=global_budget,
        min_epsilon_per_query=min_eps,
        min_rho_per_query=min_rho,
        global_period=global_period or "none",  # type: ignore[arg-type]
        selection_delta_share=0.5 if share is None else share,
    )


def _tables(v: _Validator, raw: Any) -> dict[str, TableConfig]:
    if not isinstance(raw, Mapping) or not raw:
        v.problem("tables: declare at least one table")
        return {}
    tables: dict[str, TableConfig] = {}
    for tname, traw in raw.items():
        path = f"tables.{tname}"
        if not isinstance(traw, Mapping):
            v.problem(f"{path}: must be a mapping")
            continue
        v.no_unknown(
            traw,
            path,
            {
                "privacy_unit",
                "max_rows_per_unit",
                "max_groups_per_unit",
                "columns",
                "schema",
                "source",
                "deadline_ms",
                "max_rows_read_per_unit",
                "rows",
                "public",
                "key",
                "references",
                "grants",
            },
        )
        columns: dict[str, ColumnConfig] = {}
        craw = traw.get("columns")
        if not isinstance(craw, Mapping) or not craw:
            v.problem(f"{path}.columns: declare at least one column")
            craw = {}
        for cname, cdef in craw.items():
            col = _column(v, f"{path}.columns.{cname}", str(cname), cdef)
            if col is not None:
                columns[str(cname).lower()] = col
        unit = traw.get("privacy_unit")
        if unit is not None and str(unit).lower() not in columns:
            v.problem(f"{path}.privacy_unit: '{unit}' is not a declared column")
        tables[str(tname).lower()] = TableConfig(
            name=str(tname),
            columns=columns,
            privacy_unit=str(unit).lower() if unit is not None else None,
            max_rows_per_unit=v.integer(traw, f"{path}.max_rows_per_unit", 1, low=1) or 1,
            max_groups_per_unit=v.integer(traw, f"{path}.max_groups_per_unit", None, low=1),
            schema=str(traw["schema"]) if traw.get("schema") else None,
            source=str(traw["source"]) if traw.get("source") else None,
            deadline_ms=v.integer(traw, f"{path}.deadline_ms", None, low=1),
            max_rows_read_per_unit=v.integer(traw, f"{path}.max_rows_read_per_unit", None, low=1),
            rows=v.integer(traw, f"{path}.rows", None, low=0),
            grants=parse_grants(v, f"{path}.grants", traw.get("grants")),
        )
    return _joins(v, raw, tables)


def _joins(
    v: _Validator, raw: Mapping[str, Any], tables: dict[str, TableConfig]
) -> dict[str, TableConfig]:
    """``public``, ``key`` and ``references``, checked across tables (docs/design.md,
    "Joins"); a table with no ``privacy_unit`` whose reference reaches a protected table's
    privacy unit takes the referencing column as its own (a privacy-unit path)."""
    for name, t in list(tables.items()):
        traw = next(r for k, r in raw.items() if str(k).lower() == name)
        path = f"tables.{t.name}"
        public = traw.get("public", False)
        if not isinstance(public, bool):
            v.problem(f"{path}.public: must be true or false")
            public = False
        key = traw.get("key")
        if key is not None and str(key).lower() not in t.columns:
            v.problem(f"{path}.key: '{key}' is not a declared column")
            key = None
        if public:
            if key is None and "key" not in traw:
                v.problem(
                    f"{path}.key: a public table needs a key — the column, unique in the "
                    "table, that other tables' references join on"
                )
            for setting in ("privacy_unit", "max_rows_per_unit", "max_groups_per_unit"):
                if setting in traw:
                    v.problem(
                        f"{path}.{setting}: a public table has no privacy unit (its rows "
                        "are public)"
                    )
            if "references" in traw:
                v.problem(f"{path}.references: a public table cannot reference other tables")
        elif key is not None:
            v.problem(f"{path}.key: only a public table (public: true) declares a key")
        tables[name] = replace(t, public=public, key=str(key).lower() if key else None)
    _derive_units(raw, tables)
    for name, t in list(tables.items()):
        traw = next(r for k, r in raw.items() if str(k).lower() == name)
        refs = traw.get("references")
        if refs is None or t.public:
            continue
        path = f"tables.{t.name}.references"
        if not isinstance(refs, Mapping) or not refs:
            v.problem(f"{path}: must be a mapping {{column: table.column}}")
            continue
        found: list[Reference] = []
        for column, target in refs.items():
            reference = _reference(v, f"{path}.{column}", t, str(column).lower(), target, tables)
            if reference is None:
                continue
            if any(r.table == reference.table for r in found):
                v.problem(f"{path}.{column}: a second reference to '{reference.table}'")
                continue
            found.append(reference)
        unit = t.privacy_unit
        for r in found:
            if tables[r.table].public:
                continue
            if unit is None:
                unit = r.column  # the privacy-unit path: this column names the person
            elif unit != r.column:
                v.problem(
                    f"{path}.{r.column}: references {r.table}'s privacy unit, so it must be "
                    f"this table's privacy unit (privacy_unit is '{unit}')"
                )
        tables[name] = replace(t, references=tuple(found), privacy_unit=unit)
    for name, t in tables.items():
        traw = next(r for k, r in raw.items() if str(k).lower() == name)
        if t.privacy_unit is None and traw.get("max_rows_per_unit", 1) != 1 and not t.public:
            v.problem(
                f"tables.{t.name}.max_rows_per_unit: needs a privacy_unit (without one, "
                "each row is its own unit)"
            )
    for name in tables:
        _reachable(v, name, tables)
    return tables


def _derive_units(raw: Mapping[str, Any], tables: dict[str, TableConfig]) -> None:
    """Give a table without ``privacy_unit`` the column that references another table's
    privacy unit (repeated, so that paths of several steps resolve)."""
    changed = True
    while changed:
        changed = False
        for name, t in tables.items():
            traw = next(r for k, r in raw.items() if str(k).lower() == name)
            refs = traw.get("references")
            if t.privacy_unit is not None or t.public or not isinstance(refs, Mapping):
                continue
            for column, target in refs.items():
                if isinstance(target, Mapping):
                    target = target.get("to")
                if not isinstance(target, str) or target.count(".") != 1:
                    continue
                tname, tcolumn = (part.lower() for part in target.split("."))
                other = tables.get(tname)
                if (
                    other is not None
                    and not other.public
                    and other.privacy_unit == tcolumn
                    and str(column).lower() in t.columns
                ):
                    tables[name] = replace(t, privacy_unit=str(column).lower())
                    changed = True
                    break


def _reference(
    v: _Validator,
    path: str,
    table: TableConfig,
    column: str,
    target: Any,
    tables: Mapping[str, TableConfig],
) -> Reference | None:
    """One ``column: table.column`` entry, or None (with the problem reported)."""
    if column not in table.columns:
        v.problem(f"{path}: '{column}' is not a declared column of {table.name}")
        return None
    every_row_matches = False
    if isinstance(target, Mapping):
        v.no_unknown(target, path, {"to", "every_row_matches"})
        every_row_matches = target.get("every_row_matches", False)
        if not isinstance(every_row_matches, bool):
            v.problem(f"{path}.every_row_matches: must be true or false")
            every_row_matches = False
        target = target.get("to")
    if not isinstance(target, str) or target.count(".") != 1:
        v.problem(
            f"{path}: must name the referenced column as table.column (or as "
            "{to: table.column, every_row_matches: true})"
        )
        return None
    tname, tcolumn = (part.lower() for part in target.split("."))
    other = tables.get(tname)
    if other is None:
        v.problem(f"{path}: '{tname}' is not a declared table")
        return None
    if tcolumn not in other.columns:
        v.problem(f"{path}: '{tcolumn}' is not a declared column of {other.name}")
        return None
    if other.name.lower() == table.name.lower():
        v.problem(f"{path}: a table cannot reference itself (a self-join multiplies rows)")
        return None
    if table.columns[column].type != other.columns[tcolumn].type:
        v.problem(
            f"{path}: {table.name}.{column} is {table.columns[column].type} but "
            f"{other.name}.{tcolumn} is {other.columns[tcolumn].type}"
        )
        return None
    if other.public:
        if tcolumn != other.key:
            v.problem(
                f"{path}: {other.name} is public and joins on its key '{other.key}' only (a "
                "non-unique column could match one row many times)"
            )
            return None
    elif other.privacy_unit is None or tcolumn != other.privacy_unit:
        v.problem(
            f"{path}: {other.name} is protected, so a reference to it must name its privacy "
            f"unit (a privacy-unit path), not '{tcolumn}'"
        )
        return None
    elif other.max_rows_per_unit != 1:
        v.problem(
            f"{path}: {other.name} may hold {other.max_rows_per_unit} rows per unit; a "
            "referenced table must hold one (max_rows_per_unit: 1), or joining it would "
            "multiply each of a person's rows"
        )
        return None
    return Reference(
        column=column, table=tname, target=tcolumn, every_row_matches=every_row_matches
    )


def _reachable(v: _Validator, name: str, tables: Mapping[str, TableConfig]) -> None:
    """References from ``name`` form a tree: no table is reached twice, nor ``name``."""
    seen: set[str] = set()
    stack = [name]
    while stack:
        current = stack.pop()
        for r in tables[current].references:
            if r.table == name or r.table in seen:
                v.problem(
                    f"tables.{tables[name].name}.references: '{r.table}' is reached twice "
                    "(a cycle, or two paths): each joined table must be reached one way"
                )
                return
            seen.add(r.table)
            stack.append(r.table)


def _column(v: _Validator, path: str, name: str, raw: Any) -> ColumnConfig | None:
    if not isinstance(raw, Mapping):
        v.problem(f"{path}: must be a mapping like {{type: integer, lower: 0, upper: 120}}")
        return None
    v.no_unknown(raw, path, {"type", "lower", "upper", "values", "nullable"})
    ctype = v.choice(raw, f"{path}.type", COLUMN_TYPES, None)
    if ctype is None:
        return None
    reported = len(v.problems)
    lower = v.number(raw, f"{path}.lower", None)
    upper = v.number(raw, f"{path}.upper", None)
    if len(v.problems) > reported:
        pass  # a bound that is not a number is reported once, without a follow-on
    elif (lower is None) != (upper is None):
        v.problem(f"{path}: declare both lower and upper, or neither")
    elif lower is not None and upper is not None and lower > upper:
        v.problem(f"{path}: lower ({lower}) is above upper ({upper})")
    if (lower is not None) and ctype not in ("integer", "real"):
        v.problem(f"{path}: bounds are only for integer and real columns")
    for which, bound in (("lower", lower), ("upper", upper)):
        if bound is None:
            continue
        if ctype == "integer" and not float(bound).is_integer():
            # The compiled SQL clamps to the bound and rounds half away from zero, so a
            # fractional bound would let one row move a SUM by more than it says.
            v.problem(f"{path}.{which}: an integer column needs a whole-number bound, got {bound}")
        if abs(bound) > MAX_BOUND_MAGNITUDE:
            v.problem(f"{path}.{which}: bounds beyond ±{MAX_BOUND_MAGNITUDE:.0e} are not supported")
    values_raw = raw.get("values")
    values: tuple[Any, ...] | None = None
    if values_raw is not None:
        if not isinstance(values_raw, list) or not values_raw:
            v.problem(f"{path}.values: must be a non-empty list")
        elif len(set(map(repr, values_raw))) != len(values_raw):
            v.problem(f"{path}.values: has duplicates")
        elif any(x is None for x in values_raw):
            v.problem(f"{path}.values: NULL is not a value (declare nullable: true)")
        elif ctype == "text":
            values = tuple(str(x) for x in values_raw)  # YAML reads 1051 as a number
        else:
            values = tuple(values_raw)
    if values is not None and lower is not None and upper is not None:
        outside = [
            x
            for x in values
            if not isinstance(x, int | float) or isinstance(x, bool) or not lower <= x <= upper
        ]
        if outside:
            v.problem(f"{path}.values: {outside[0]!r} is not a number within [lower, upper]")
    nullable = raw.get("nullable")
    if nullable is not None and not isinstance(nullable, bool):
        v.problem(f"{path}.nullable: must be true or false")
        nullable = None
    return ColumnConfig(
        name=name,
        type=ctype,  # type: ignore[arg-type]
        lower=lower,
        upper=upper,
        values=values,
        nullable=nullable,
    )


def with_nullability(
    tables: Mapping[str, TableConfig], catalogue: Mapping[str, Mapping[str, bool]]
) -> dict[str, TableConfig]:
    """``tables`` with every undeclared ``nullable`` decided: from ``catalogue`` (table →
    column → whether the database lets it hold NULL), and True where it says nothing."""
    out: dict[str, TableConfig] = {}
    for key, t in tables.items():
        known = {c.lower(): n for c, n in catalogue.get(key, {}).items()}
        columns = {
            name: c if c.nullable is not None else replace(c, nullable=known.get(name, True))
            for name, c in t.columns.items()
        }
        out[key] = replace(t, columns=columns)
    return out


def with_enforced_domains(
    tables: Mapping[str, TableConfig],
    enforced: Mapping[str, set[str]],
    within_bounds: Mapping[str, set[str]] | None = None,
) -> dict[str, TableConfig]:
    """``tables`` with the columns whose domain the database enforces (table → columns,
    from the catalogue) marked ``enforced``, and those it keeps inside their bounds
    marked ``within_bounds``."""
    out: dict[str, TableConfig] = {}
    for key, t in tables.items():
        marked = enforced.get(key, set())
        bounded = (within_bounds or {}).get(key, set())
        columns = {
            name: replace(
                c,
                enforced=c.enforced or name in marked,
                within_bounds=c.within_bounds or name in bounded,
            )
            for name, c in t.columns.items()
        }
        out[key] = replace(t, columns=columns)
    return out


def _analysts(v: _Validator, raw: Any) -> tuple[AnalystBootstrap, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        v.problem("analysts: must be a list of {name, epsilon, delta, period}")
        return ()
    out = []
    for i, a in enumerate(raw):
        path = f"analysts[{i}]"
        if not isinstance(a, Mapping):
            v.problem(f"{path}: must be a mapping")
            continue
        v.no_unknown(a, path, {"name", "epsilon", "delta", "period"})
        name = v.string(a, f"{path}.name", required=True)
        eps = v.number(a, f"{path}.epsilon", None, positive=True)
        delta = v.number(a, f"{path}.delta", 0.0, unit=True)
        period = v.choice(a, f"{path}.period", PERIODS, "none") or "none"
        if name and eps is not None:
            out.append(
                AnalystBootstrap(
                    name=name,
                    epsilon=eps,
                    delta=delta or 0.0,
                    period=period,  # type: ignore[arg-type]
                )
            )
    return tuple(out)


class _Validator:
    """Collects problems instead of stopping at the first one."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    def problem(self, message: str) -> None:
        self.problems.append(message)

    def raise_if_any(self) -> None:
        if self.problems:
            raise ConfigError(self.problems)

    def no_unknown(self, raw: Mapping[str, Any], path: str, allowed: set[str]) -> None:
        for key in raw:
            if key not in allowed:
                where = f"{path}.{key}" if path else str(key)
                self.problem(f"{where}: unknown setting (allowed: {', '.join(sorted(allowed))})")

    def section(
        self, raw: Mapping[str, Any], key: str, required: bool = False
    ) -> Mapping[str, Any]:
        value = raw.get(key)
        if value is None:
            if required:
                self.problem(f"{key}: missing (required)")
            return {}
        if not isinstance(value, Mapping):
            self.problem(f"{key}: must be a mapping")
            return {}
        return value

    def string(self, raw: Mapping[str, Any], path: str, required: bool = False) -> str:
        value = raw.get(path.rsplit(".", 1)[-1])
        if value is None:
            if required:
                self.problem(f"{path}: missing (required)")
            return ""
        if not isinstance(value, str) or not value:
            self.problem(f"{path}: must be a non-empty string")
            return ""
        return value

    def number(
        self,
        raw: Mapping[str, Any],
        path: str,
        default: float | None,
        positive: bool = False,
        unit: bool = False,
    ) -> float | None:
        value = raw.get(path.rsplit(".", 1)[-1], default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.problem(f"{path}: must be a number, got {type(value).__name__}")
            return default
        value = float(value)
        if not math.isfinite(value):
            self.problem(f"{path}: must be finite")
            return default
        if positive and value <= 0:
            self.problem(f"{path}: must be > 0")
            return default  # reported once: checks that use it see no follow-on error
        if unit and not 0 <= value < 1:
            self.problem(f"{path}: must be in [0, 1)")
            return default
        return value

    def integer(
        self, raw: Mapping[str, Any], path: str, default: int | None, low: int | None = None
    ) -> int | None:
        value = raw.get(path.rsplit(".", 1)[-1], default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            self.problem(f"{path}: must be a whole number")
            return default
        if low is not None and value < low:
            self.problem(f"{path}: must be ≥ {low}")
        return value

    def choice(
        self, raw: Mapping[str, Any], path: str, options: tuple[str, ...], default: str | None
    ) -> str | None:
        value = raw.get(path.rsplit(".", 1)[-1], default)
        if value is False and "off" in options:
            value = "off"  # YAML 1.1 reads a bare `off` as false
        if value is None:
            self.problem(f"{path}: missing (one of {', '.join(options)})")
            return None
        if value not in options:
            self.problem(f"{path}: '{value}' is not one of {', '.join(options)}")
            return default
        return str(value)
