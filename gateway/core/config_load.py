"""Reading the config: one YAML file, validated into the frozen ``Config`` of
``gateway.core.config``.

``load_config`` reports every problem it finds at once, each with the path of the
offending field (``tables.patients.columns.age.lower: must be a number``) and its line
(``gateway.core.config_lines``), so that ``dpgate config check`` can say precisely what
is wrong. Secrets never live in the file: the admin key comes from ``DPGATE_ADMIN_KEY``.
The tables' sections are read by ``gateway.core.config_tables``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from gateway.core.config import (
    COMPOSITIONS,
    DEFAULT_MARGIN,
    DEFAULT_MIN_MS,
    MECHANISMS,
    PERIODS,
    POSTGRES_DEFAULT_PORT,
    AnalystBootstrap,
    AuditConfig,
    CacheConfig,
    Config,
    ConfigError,
    DatabaseConfig,
    ExecutionConfig,
    LedgerConfig,
    LimitsConfig,
    PostgresWireConfig,
    PrivacyConfig,
    WireTlsConfig,
)
from gateway.core.config_access import parse_access, parse_sso
from gateway.core.config_problems import _Validator
from gateway.core.config_tables import _tables


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
    if "char_ns" in ex:
        v.problem(
            "execution.char_ns: replaced by execution.op_ns, the cost of one operation of a "
            "statement per row (not one character); `dpgate config check --measure` "
            "suggests it"
        )
        ex = {k: val for k, val in ex.items() if k != "char_ns"}
    v.no_unknown(
        ex,
        "execution",
        {
            "timing",
            "deadline_ms",
            "deadline_margin",
            "min_deadline_ms",
            "post_ms",
            "interpreter_ms",
            "admission_ms",
            "load_aware",
            "row_ns",
            "op_ns",
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
        interpreter_ms=_non_negative(v, ex, "execution.interpreter_ms", 1.0),
        admission_ms=_non_negative(v, ex, "execution.admission_ms", 4.0),
        load_aware=load_aware,
        row_ns=v.number(ex, "execution.row_ns", None, positive=True),
        op_ns=v.number(ex, "execution.op_ns", None, positive=True),
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


def _non_negative(v: _Validator, raw: Mapping[str, Any], path: str, default: float) -> float:
    """A number ≥ 0 (0 turns the term it sizes off)."""
    value = v.number(raw, path, default)
    if value is None or value < 0:
        if value is not None:
            v.problem(f"{path}: must be ≥ 0")
        return default
    return value
