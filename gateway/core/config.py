"""The gateway's configuration: the frozen dataclasses one YAML file is validated into.

``Config`` and its parts (tables and their columns, the database, the ledger, privacy,
execution, audit, cache, limits, the PostgreSQL front end). Reading and validating the
file is ``gateway.core.config_load`` (``load_config``); the ``access:`` and ``sso:``
sections are ``gateway.core.config_access``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from gateway.core.config_access import AccessConfig, SsoConfig

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
    # ``null_when``: a condition on the table's other declared columns (SQL, as
    # ``gateway.core.config_nulls`` reads it) that holds exactly on the rows where this
    # column is NULL. Part of the declared domain: rows where it does not are left out of
    # every query (gateway/core/domain.py, ``row_filter``), and the auditor knows the
    # regions they would fill are empty.
    null_when: str | None = None
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
    the engine's per-row costs — ``row_ns``, ``op_ns``, ``sort_ns``, ``join_ns``, ``group_ns``,
    ``base_ms`` override them —, the query's shape, the gateway's concurrency), times
    ``deadline_margin``, plus ``post_ms`` for the work after the statement, never below
    ``min_deadline_ms``, plus ``interpreter_ms`` per other request present in the process
    (their own Python work shares the interpreter with the statement's), all counted
    from the query's arrival after ``admission_ms`` (times the load factor, and more per
    query of its audit scope ahead of it) for its own admission; a
    ``deadline_ms`` here (or on a table) fixes it instead, and a table without a declared
    ``rows`` gets ``FALLBACK_DEADLINE_MS`` (gateway/pipeline/timing.py).

    ``load_aware: true`` also scales deadlines by the machine's load average. Off by
    default: the load average counts dpgate's own statements, whose running time may
    depend on the rows, so it is not a public fact (docs/privacy.md, "Timing").
    """

    timing: Literal["deadline", "off"] = "deadline"
    deadline_ms: int | None = None
    deadline_margin: float = DEFAULT_MARGIN
    min_deadline_ms: int = DEFAULT_MIN_MS
    post_ms: int = 10
    interpreter_ms: float = 1.0  # per other request present (gateway/pipeline/timing.py)
    admission_ms: float = 4.0  # a query's own admission, from its arrival (same module)
    load_aware: bool = False
    row_ns: float | None = None  # the cost model's per-row costs (None: the engine's)
    op_ns: float | None = None
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
