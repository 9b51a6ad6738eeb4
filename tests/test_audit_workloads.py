"""Honest sessions are answered: the public corpus of workloads in ``tests/workloads/``.

Each file is one realistic session over one of three data sets (its ``dataset:``): the
demo hospital (12,000 patients and their visits, as ``dpgate demo`` builds it), a mobile
operator's subscribers, tariffs and monthly usage, and a census person file with its
public list of areas (``tests/workload_datasets.py``, each with the config its admin
would write): dashboards, drill-downs, BI chart sets, the README's examples, time
breakdowns, bands then totals, filtered GROUP BYs after unfiltered ones, every statistic
over the same cells, joins to lookups, quantiles, extremes and spreads. Every other
session (in name order) runs with the config's ``nullable:`` declarations removed (the
catalogue decides them). Three checks per session:

1. **Honest, by a data-level reference auditor.** It may look at the rows (it is a test
   oracle, not the product): every released cell — every group of every query, the
   declared values all released — holds no one or at least k = 5 people, and no region
   of fewer than k rows is *determined* (a union of "atoms", the rows no released cell
   tells apart, whose indicator is a linear combination of the released cells'). Regions
   are evaluated by SQLite on the rows as dpgate reads them (bounded numbers clamped, rows
   outside the declared domain left out, a join's lookups beside its anchor's rows); the
   span is decided over GF(p), p = 2³¹ − 1, with two random hashes of the null space (a
   false "determined" has probability ≤ 2⁻⁶⁰; a missed one needs p to divide a minor of
   a 0/1 matrix of this size).
2. **Answered with exact counts.** The auditor, fed the exact counts with the public noise
   scales of the real releases, refuses nothing; every region it sizes clears k by a
   margin the noise exceeds with probability at most α = 1e-6 / (regions sized).
3. **Answered through the pipeline**, with noise, a fresh analyst per session: 0
   refusals, and no row left out of any answer. False-alarm rate: the regions sized are
   the same (they depend on the query texts only); by 2., each is refused (or its rows
   left out) with probability ≤ α, so a refusal anywhere has probability ≤ 1e-6.

A session the product refuses or withholds today although the reference calls it honest
says why in its ``known_gap:``; its checks 2. and 3. are strict expected failures (they
fail the suite once the auditor answers it, so that the mark goes), and a refusal in it
must at least say what to ask instead, a query then answered whole (4.). A gap that only some
noise draws hit (``gap_by_noise: true``: a real group of more than k people, determined
and sized through noisy answers) is a strict expected failure of check 2. and a plain one
of check 3.
"""

from __future__ import annotations

import itertools
import random
import shutil
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from sqlglot import exp

from gateway.audit import AnsweredCell, AnsweredQuery
from gateway.audit.confidence import CountNoise, noise_quantile
from gateway.audit.findings import Sizing
from gateway.core.config import TableConfig
from gateway.core.config_load import parse_config
from gateway.core.errors import AuditRefused
from gateway.core.plan import QueryPlan, QueryRequest
from gateway.demo.hospital import PATIENTS, build
from gateway.pipeline.audit_advice import with_count
from gateway.pipeline.gateway import Gateway
from gateway.sql.compile import compile_plan
from gateway.sql.execute import run_aggregate
from tests.conftest import ADMIN_KEY, demo_config_dict
from tests.workload_datasets import build_census, build_telecom, census_config, telecom_config

K = 5
FALSE_ALARM = 1e-6
P = 2**31 - 1
WORKLOADS = sorted((Path(__file__).parent / "workloads").glob("*.yaml"))


@dataclass(frozen=True)
class Session:
    name: str
    queries: tuple[tuple[str, float], ...]
    dataset: str = "hospital"
    # why the product refuses or withholds this honest session today (None: it must not)
    known_gap: str | None = None
    # the gap is a real group sized through noise: the pipeline refuses it in some runs
    # only, so that check is a plain (not strict) expected failure
    gap_by_noise: bool = False


def _session(path: Path) -> Session:
    raw = yaml.safe_load(path.read_text())
    queries = tuple((q["sql"], float(q["epsilon"])) for q in raw["queries"])
    return Session(
        raw["name"],
        queries,
        raw.get("dataset", "hospital"),
        raw.get("known_gap"),
        bool(raw.get("gap_by_noise", False)),
    )


SESSIONS = {p.stem: _session(p) for p in WORKLOADS}


def _answered(name: str, *, noisy: bool = False) -> Any:
    """A session for the product's checks: one with a known gap is expected to fail them
    (strictly: once the auditor answers it, the mark must go), except the check through
    the noise (``noisy``) of a gap that only some noise draws hit (``gap_by_noise``)."""
    session = SESSIONS[name]
    if session.known_gap is None:
        return name
    strict = not (noisy and session.gap_by_noise)
    return pytest.param(name, marks=pytest.mark.xfail(reason=session.known_gap, strict=strict))


ANSWERED = [_answered(name) for name in sorted(SESSIONS)]
ANSWERED_WITH_NOISE = [_answered(name, noisy=True) for name in sorted(SESSIONS)]


@dataclass(frozen=True)
class Dataset:
    """How to build a data set (deterministically) and the config its admin wrote."""

    build: Callable[[Path], None]
    config: Callable[[Path, Path], dict[str, Any]]


DATASETS = {
    "hospital": Dataset(lambda path: build(path, patients=PATIENTS), demo_config_dict),
    "telecom": Dataset(build_telecom, telecom_config),
    "census": Dataset(build_census, census_config),
}


@pytest.fixture(scope="module")
def databases(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """Each data set at its real size, built once, when a session first needs it."""
    built: dict[str, Path] = {}

    def get(dataset: str) -> Path:
        if dataset not in built:
            path = tmp_path_factory.mktemp(dataset) / f"{dataset}.db"
            DATASETS[dataset].build(path)
            built[dataset] = path
        return built[dataset]

    return get


def _session_name(request: pytest.FixtureRequest) -> str | None:
    callspec = getattr(request.node, "callspec", None)
    return callspec.params.get("name") if callspec is not None else None


def catalogue_decides(name: str) -> bool:
    """Every other session runs with the demo's ``nullable:`` declarations removed, so
    that the catalogue decides them (as in a config that leaves them out)."""
    return sorted(SESSIONS).index(name) % 2 == 0


@pytest.fixture
def session_db(
    databases: Callable[[str], Path], tmp_path: Path, request: pytest.FixtureRequest
) -> Path:
    """A private copy of the session's data set (the hospital's for a test of no session)."""
    name = _session_name(request)
    dataset = SESSIONS[name].dataset if name is not None else "hospital"
    db = tmp_path / f"{dataset}.db"
    shutil.copy(databases(dataset), db)
    return db


@pytest.fixture
def gateway(
    session_db: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> Iterator[Gateway]:
    monkeypatch.setenv("DPGATE_ADMIN_KEY", ADMIN_KEY)
    name = _session_name(request)
    dataset = SESSIONS[name].dataset if name is not None else "hospital"
    raw = DATASETS[dataset].config(session_db, tmp_path / "ledger.db")
    raw["ledger"]["url"] += "?synchronous=normal"
    if name is not None and catalogue_decides(name):
        for table in raw["tables"].values():
            for column in table["columns"].values():
                column.pop("nullable", None)
    yield Gateway(parse_config(raw))


def test_the_corpus_is_large_enough() -> None:
    assert len(SESSIONS) >= 25
    assert all(len(s.queries) >= 3 for s in SESSIONS.values())
    datasets = [s.dataset for s in SESSIONS.values()]
    assert all(datasets.count(d) >= 5 for d in DATASETS), datasets
    assert sum(catalogue_decides(name) for name in SESSIONS) >= len(SESSIONS) / 2
    answered = [name for name, s in SESSIONS.items() if s.known_gap is None]
    assert len(answered) >= 25


# -- 1. the data-level reference auditor -----------------------------------------------


def _dpgate_view(conn: sqlite3.Connection, table: TableConfig) -> str:
    """A view of ``table`` as dpgate reads it (gateway/core/domain.py), built independently
    of the compiler: bounded numbers clamped, rows outside the declared domain dropped —
    a value not declared, NULL in a column declared ``nullable: false``, or a column NULL
    where its ``null_when`` does not hold (or not NULL where it does), the condition read
    on the clamped values."""
    columns = []
    keep = []
    for name, col in table.columns.items():
        if col.numeric and col.bounded:
            columns.append(f"MIN(MAX({name}, {col.lower}), {col.upper}) AS {name}")
        else:
            columns.append(name)
        if col.values is not None:
            listed = ", ".join(f"'{v}'" for v in col.values)
            keep.append(f"({name} IN ({listed}) OR {name} IS NULL)")
        if col.nullable is False:
            keep.append(f"{name} IS NOT NULL")
    declared = [
        f"(({col.null_when}) IS TRUE) = ({name} IS NULL)"
        for name, col in table.columns.items()
        if col.null_when is not None
    ]
    view = f"reference_{table.name}"
    conn.execute(f"DROP VIEW IF EXISTS {view}")
    conn.execute(
        f"CREATE TEMP VIEW {view} AS SELECT * FROM (SELECT rowid AS rid, {', '.join(columns)} "
        f"FROM {table.name} WHERE {' AND '.join(keep) or '1'}) "
        f"WHERE {' AND '.join(declared) or '1'}"
    )
    return view


def _relation_view(conn: sqlite3.Connection, tables: dict[str, TableConfig], anchor: str) -> str:
    """The rows of ``anchor`` (as dpgate reads them) with every table its references reach
    LEFT JOINed beside them, a lookup's columns named ``"table.column"`` as in a join's
    plan; a lookup declared ``every_row_matches`` is inner-joined (a row matching nothing
    is outside the table). Lookups hold one row per key in the reference data sets.
    Materialised (a temporary table), since every cell of every query scans it."""
    base = tables[anchor]
    columns = [f"{anchor}.rid AS rid"] + [f"{anchor}.{c} AS {c}" for c in base.columns]
    joins = []
    queue = [anchor]
    while queue:
        current = queue.pop(0)
        for ref in tables[current].references:
            lookup = tables[ref.table]
            kind = "JOIN" if ref.every_row_matches and current == anchor else "LEFT JOIN"
            joins.append(
                f"{kind} reference_{ref.table} AS {ref.table} "
                f"ON {ref.table}.{ref.target} = {current}.{ref.column}"
            )
            columns += [f'{ref.table}.{c} AS "{ref.table}.{c}"' for c in lookup.columns]
            queue.append(ref.table)
    view = f"relation_{anchor}"
    conn.execute(f"DROP TABLE IF EXISTS {view}")
    conn.execute(
        f"CREATE TEMP TABLE {view} AS SELECT {', '.join(columns)} "
        f"FROM reference_{anchor} AS {anchor} {' '.join(joins)}"
    )
    return view


def _cells(plan: QueryPlan) -> list[tuple[Any, ...]]:
    assert all(g.domain is not None for g in plan.group_keys), "declared keys only"
    return list(itertools.product(*(g.domain or () for g in plan.group_keys)))


def _sql(node: exp.Expr) -> str:
    return node.sql(dialect="sqlite")


def _region_sql(
    plan: QueryPlan, view: str, unit: str, cell: tuple[Any, ...]
) -> tuple[str, list[Any]]:
    conditions = [f"({_sql(plan.where)})"] if plan.where is not None else []
    if plan.join is not None and plan.join.matched is not None:
        conditions.append(f"({_sql(plan.join.matched)})")  # the inner joins' matches
    kinds = [m.kind for m in plan.measures]
    if "count_values" in kinds and not {"count_rows", "count_units"} & set(kinds):
        counted = plan.measures[kinds.index("count_values")].expression
        assert counted is not None  # COUNT(x), AVG(x): the count is of non-NULL x
        conditions.append(f"({_sql(counted)}) IS NOT NULL")
    params: list[Any] = []
    for key, value in zip(plan.group_keys, cell, strict=True):
        if value is None:
            conditions.append(f"({_sql(key.expression)}) IS NULL")
        else:
            conditions.append(f"({_sql(key.expression)}) = ?")
            params.append(int(value) if isinstance(value, bool) else value)
    where = " AND ".join(conditions) or "1"
    return f"SELECT rid, {unit} FROM {view} WHERE {where}", params


def _rref_mod_p(m: np.ndarray) -> tuple[np.ndarray, list[int]]:
    """Reduced row echelon form over GF(p) and the pivot columns."""
    a = m.astype(np.int64) % P
    pivots: list[int] = []
    row = 0
    for col in range(a.shape[1]):
        if row == a.shape[0]:
            break
        nz = np.nonzero(a[row:, col])[0]
        if len(nz) == 0:
            continue
        r = row + int(nz[0])
        a[[row, r]] = a[[r, row]]
        a[row] = a[row] * pow(int(a[row, col]), P - 2, P) % P
        others = np.nonzero(a[:, col])[0]
        others = others[others != row]
        if len(others):
            f = a[others, col][:, None]
            a[others] = (a[others] - f * a[row][None, :] % P) % P
        pivots.append(col)
        row += 1
    return a[:row], pivots


def _null_hashes(m: np.ndarray, rng: random.Random) -> np.ndarray:
    """Per atom, h(a) = N_a · ρ mod p for a random ρ over the null space of ``m``
    (regions × atoms): a set S of atoms is determined iff Σ_{a∈S} N_a = 0."""
    rref, pivots = _rref_mod_p(m)
    n = m.shape[1]
    free = [c for c in range(n) if c not in set(pivots)]
    rho = np.array([rng.randrange(P) for _ in free], dtype=np.int64)
    h = np.zeros(n, dtype=np.int64)
    if free:
        h[free] = rho
        for r, col in enumerate(pivots):
            terms = rref[r, free] * rho % P
            h[col] = (-int(terms.sum() % P)) % P
    return h


def _small_determined(sizes: np.ndarray, hashes: list[np.ndarray]) -> list[tuple[int, ...]]:
    """Sets of atoms with fewer than k rows in all (so at most k − 1 = 4 atoms of fewer
    than k rows each) whose indicator lies in the span of the released regions (every
    hash sums to 0), found by meeting in the middle over pairs."""
    assert K - 1 <= 4
    small = [int(a) for a in np.nonzero(sizes < K)[0]]
    key = {a: tuple(int(h[a]) for h in hashes) for a in small}

    def neg(v: tuple[int, ...]) -> tuple[int, ...]:
        return tuple((-x) % P for x in v)

    def add(u: tuple[int, ...], v: tuple[int, ...]) -> tuple[int, ...]:
        return tuple((x + y) % P for x, y in zip(u, v, strict=True))

    found: list[tuple[int, ...]] = [(a,) for a in small if not any(key[a])]
    singles: dict[tuple[int, ...], list[int]] = {}
    for a in small:
        singles.setdefault(key[a], []).append(a)
    pairs: dict[tuple[int, ...], list[tuple[int, int]]] = {}
    for a, b in itertools.combinations(small, 2):
        if sizes[a] + sizes[b] < K:
            pairs.setdefault(add(key[a], key[b]), []).append((a, b))
    for (a, b), _ in ((p, None) for group in pairs.values() for p in group):
        if not any(add(key[a], key[b])):
            found.append((a, b))
        for c in singles.get(neg(add(key[a], key[b])), []):
            if c not in (a, b) and sizes[a] + sizes[b] + sizes[c] < K:
                found.append((a, b, c))
        for c, d in pairs.get(neg(add(key[a], key[b])), []):
            atoms = {a, b, c, d}
            if len(atoms) == 4 and sum(int(sizes[x]) for x in atoms) < K:
                found.append((a, b, c, d))
    return found


def reference_audit(gateway: Gateway, db: Path, session: Session) -> None:
    """Fail unless every released cell holds ≥ k people and no smaller region is
    determined (per table: regions of different tables never combine)."""
    by_table: dict[str, list[np.ndarray]] = {}
    with sqlite3.connect(db) as conn:
        tables = dict(gateway.config.tables)
        for t in tables.values():
            _dpgate_view(conn, t)
        views: dict[str, str] = {}
        rids: dict[str, np.ndarray] = {}
        n_rows: dict[str, int] = {}
        for sql, _ in session.queries:
            plan = gateway.analyze(sql)
            assert isinstance(plan, QueryPlan)
            if plan.table not in views:
                views[plan.table] = v = _relation_view(conn, tables, plan.table)
                rids[plan.table] = np.array(
                    [r for (r,) in conn.execute(f"SELECT rid FROM {v} ORDER BY rid")]
                )
                n_rows[plan.table] = int(rids[plan.table].max()) + 1
            unit = tables[plan.table].privacy_unit
            assert unit is not None, f"{sql}: reads no protected table"
            for cell in _cells(plan):
                query, params = _region_sql(plan, views[plan.table], unit, cell)
                rows = conn.execute(query, params).fetchall()
                people = len({u for _, u in rows})
                # an empty cell singles out no one (as an empty region, below, is no atom)
                assert people == 0 or people >= K, (
                    f"{session.name}: {sql} releases {cell} of {people}"
                )
                member = np.zeros(n_rows[plan.table], dtype=bool)
                member[[rid for rid, _ in rows]] = True
                by_table.setdefault(plan.table, []).append(member)
    rng = random.Random(12)
    for table, regions in by_table.items():
        # atoms: the rows (of the table as dpgate reads it) no released region tells apart;
        # rows in no region form one atom, which no combination of regions reaches
        m = np.array(regions)[:, rids[table]]
        atoms, inverse = np.unique(m.T, axis=0, return_inverse=True)
        sizes = np.bincount(inverse.ravel(), minlength=len(atoms))
        hashes = [_null_hashes(atoms.T.astype(np.int64), rng) for _ in range(2)]
        assert (sizes < K).sum() <= 2000, f"{session.name}: too many small atoms to enumerate"
        small = _small_determined(sizes, hashes)
        assert not small, f"{session.name}: {table} regions of < {K} rows determined: {small}"


@pytest.mark.parametrize("dataset", sorted(DATASETS))
def test_every_row_of_the_data_sets_is_inside_its_declared_domain(
    dataset: str, databases: Callable[[str], Path], tmp_path: Path
) -> None:
    """The data sets are written to meet their configs (``values:``, ``nullable:``,
    ``null_when:``): no row is left out, so the sessions read every person."""
    config = parse_config(DATASETS[dataset].config(databases(dataset), tmp_path / "ledger.db"))
    with sqlite3.connect(databases(dataset)) as conn:
        for t in config.tables.values():
            view = _dpgate_view(conn, t)
            (stored,) = conn.execute(f"SELECT COUNT(*) FROM {t.name}").fetchone()
            (kept,) = conn.execute(f"SELECT COUNT(*) FROM {view}").fetchone()
            assert kept == stored, f"{dataset}.{t.name}: {stored - kept} rows outside"


@pytest.mark.parametrize("name", sorted(SESSIONS))
def test_sessions_are_honest_by_the_reference_auditor(
    name: str, gateway: Gateway, session_db: Path
) -> None:
    reference_audit(gateway, session_db, SESSIONS[name])


def test_the_reference_auditor_finds_a_differencing_pair(
    gateway: Gateway, session_db: Path
) -> None:
    pair = Session(
        "pair",
        (
            ("SELECT COUNT(*) FROM patients WHERE city = 'Sopron'", 1.0),
            ("SELECT COUNT(*) FROM patients WHERE city = 'Sopron' AND zip <> '8001'", 1.0),
        ),
    )
    with pytest.raises(AssertionError, match="determined"):
        reference_audit(gateway, session_db, pair)


def test_the_reference_auditor_finds_a_differencing_pair_through_a_join(
    gateway: Gateway, session_db: Path
) -> None:
    """A lookup's column read beside its anchor's rows: the pair differs by one zip code."""
    join = "SELECT COUNT(*) FROM patients p JOIN zip_regions z ON p.zip = z.zip"
    pair = Session(
        "pair through a join",
        (
            (f"{join} WHERE z.region = 'Western Transdanubia' AND p.city = 'Sopron'", 1.0),
            (f"{join} WHERE z.region = 'Western Transdanubia' AND p.zip <> '8001'", 1.0),
            ("SELECT COUNT(*) FROM patients WHERE city = 'Győr'", 1.0),
        ),
    )
    with pytest.raises(AssertionError, match="patients regions of < 5 rows determined"):
        reference_audit(gateway, session_db, pair)


# -- 2. and 3. the product -----------------------------------------------------------------


def _exact_answer(gateway: Gateway, query_id: str, sql: str, epsilon: float) -> AnsweredQuery:
    """The query's cells with their exact counts and the public noise of the release."""
    plan = gateway.analyze(sql)
    assert isinstance(plan, QueryPlan)
    calibration = gateway.planner.calibrate(plan, QueryRequest(sql, epsilon, 0.0, "laplace"))
    table = gateway.config.tables[plan.table]
    compiled = compile_plan(plan, table, gateway.dialect)
    rows = run_aggregate(gateway.engine, compiled.sql, timeout_ms=60_000)
    nk = compiled.n_keys
    by_key = {tuple(r[:nk]): r[nk:] for r in rows}
    kinds = [m.kind for m in plan.measures]
    j = next(
        (kinds.index(k) for k in ("count_rows", "count_units", "count_values") if k in kinds), None
    )
    cells = []
    for cell in _cells(plan):
        found = by_key.get(cell)
        count = None if j is None else float((found[j] if found else 0) or 0)
        noise = calibration.noises[j] if j is not None else None
        scale = None if noise is None else CountNoise(noise.mechanism, float(noise.scale))
        cells.append(AnsweredCell(cell, count, {}, scale))
    return AnsweredQuery(query_id, plan, tuple(cells))


@pytest.mark.parametrize("name", ANSWERED)
def test_sessions_are_answered_with_exact_counts_by_a_margin(name: str, gateway: Gateway) -> None:
    auditor = gateway.auditor
    sized: list[Sizing] = []
    auditor.observe = sized.append
    for i, (sql, epsilon) in enumerate(SESSIONS[name].queries):
        answer = _exact_answer(gateway, f"q{i}", sql, epsilon)
        pre = auditor.pre_audit("exact", answer.plan)
        post = auditor.post_audit("exact", answer)
        assert pre.allowed and post.allowed, f"{sql}: {pre.reason} / {post.reason}"
        auditor.remember("exact", answer)
    alpha = FALSE_ALARM / max(1, len(sized))
    for s in sized:
        assert s.terms is not None and not s.small
        slack = s.estimate - s.margin - K
        assert slack >= noise_quantile(list(s.terms), alpha), (name, s)


@pytest.mark.parametrize("name", ANSWERED_WITH_NOISE)
def test_sessions_are_answered_through_the_pipeline(name: str, gateway: Gateway) -> None:
    gateway.ledger.create_analyst("honest", 100.0, 1e-6)
    for sql, epsilon in SESSIONS[name].queries:
        release = gateway.query("honest", QueryRequest(sql, epsilon, 0.0, "laplace"))
        assert release.rows is not None, sql
        # every row: an honest session loses none to the audit either
        assert "audit_left_out" not in release.extra, (sql, release.extra.get("audit_left_out"))


REFUSED_SESSIONS = sorted(
    name for name, s in SESSIONS.items() if s.known_gap is not None and not s.gap_by_noise
)


@pytest.mark.parametrize("name", REFUSED_SESSIONS)
def test_a_known_gap_is_answered_once_the_refusals_advice_is_followed(
    name: str, gateway: Gateway
) -> None:
    """4. Each refusal of a session with a known gap comes with queries to ask instead
    (``detail.ask_instead``), and following them at once — the refused query with
    COUNT(*) when suggested, else the suggested counts and then the query again — gets
    the answer whole, so the session's question is answered at the price of one free
    refusal. (Through the noise: the groups these counts size are hundreds of people,
    whose lower bounds miss k with probability far below 1e-6.)"""
    gateway.ledger.create_analyst("honest", 100.0, 1e-6)
    refusals = 0
    for sql, epsilon in SESSIONS[name].queries:
        try:
            gateway.query("honest", QueryRequest(sql, epsilon, 0.0, "laplace"))
            continue
        except AuditRefused as refused:
            assert refused.detail["charged"] is False, sql
            advice = list(refused.detail["ask_instead"])
        refusals += 1
        asked = advice[:1] if advice[0] == with_count(sql) else [*advice, sql]
        for q in asked:
            release = gateway.query("honest", QueryRequest(q, epsilon, 0.0, "laplace"))
        assert release.rows is not None and "audit_left_out" not in release.extra, sql
    assert refusals > 0, f"{name} is answered: its known_gap can go"
