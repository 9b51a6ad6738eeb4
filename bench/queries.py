"""The fixed PUMS query list and its exact answers.

Every query is written once with a ``{t}`` placeholder for the table name: SmartNoise SQL
needs ``PUMS.PUMS`` (schema.table from its metadata), dpgate and the raw SQLite copy use
``pums``. Group-key columns come first in the SELECT list, aggregates after, every output
column is aliased (SmartNoise names unaliased columns ``???``).

Exact answers are computed by running the same text on an SQLite copy of PUMS.csv, with no
noise and no clamping (all PUMS values already lie inside the declared bounds, so clamping
would change nothing).
"""

from __future__ import annotations

import csv
import sqlite3
from dataclasses import dataclass
from pathlib import Path

PUMS_DIR = Path("/work/shared/data/pums")
PUMS_CSV = PUMS_DIR / "PUMS.csv"
PUMS_YAML = PUMS_DIR / "PUMS.yaml"

# Columns of PUMS.csv, in order, and the public bounds / domains declared for them
# (identical to PUMS.yaml; categorical domains are the values present in the file, which
# the Census codebook fixes in advance: sex 0/1, educ 1–16, race 1–6, married 0/1).
COLUMNS = ("age", "sex", "educ", "race", "income", "married")
BOUNDS = {"age": (0, 100), "income": (0, 500_000)}
DOMAINS = {
    "sex": list(range(2)),
    "educ": list(range(1, 17)),
    "race": list(range(1, 7)),
    "married": list(range(2)),
}


@dataclass(frozen=True)
class Query:
    name: str
    kind: str  # count | count_grouped | sum | avg | mixed
    sql: str  # with {t} for the table
    keys: int = 0  # how many leading output columns are group keys

    def text(self, table: str) -> str:
        return self.sql.format(t=table)


QUERIES: tuple[Query, ...] = (
    # --- COUNT, no filter / simple and nested filters (sensitivity 1 each) ---
    Query("count_all", "count", "SELECT COUNT(*) AS n FROM {t}"),
    Query("count_age_ge_40", "count", "SELECT COUNT(*) AS n FROM {t} WHERE age >= 40"),
    Query("count_sex_1", "count", "SELECT COUNT(*) AS n FROM {t} WHERE sex = 1"),
    Query(
        "count_age_between",
        "count",
        "SELECT COUNT(*) AS n FROM {t} WHERE age BETWEEN 20 AND 40",
    ),
    Query("count_race_in", "count", "SELECT COUNT(*) AS n FROM {t} WHERE race IN (1, 2)"),
    Query(
        "count_income_gt_100k",
        "count",
        "SELECT COUNT(*) AS n FROM {t} WHERE income > 100000",
    ),
    Query(
        "count_nested_and_or",
        "count",
        "SELECT COUNT(*) AS n FROM {t} WHERE age > 30 AND (sex = 1 OR educ > 10)",
    ),
    Query(
        "count_nested_not",
        "count",
        "SELECT COUNT(*) AS n FROM {t} "
        "WHERE (married = 1 AND income > 50000) OR (age < 25 AND NOT educ >= 12)",
    ),
    # --- GROUP BY on declared categorical keys ---
    Query("group_sex", "count_grouped", "SELECT sex, COUNT(*) AS n FROM {t} GROUP BY sex", 1),
    Query("group_educ", "count_grouped", "SELECT educ, COUNT(*) AS n FROM {t} GROUP BY educ", 1),
    Query("group_race", "count_grouped", "SELECT race, COUNT(*) AS n FROM {t} GROUP BY race", 1),
    Query(
        "group_sex_married",
        "count_grouped",
        "SELECT sex, married, COUNT(*) AS n FROM {t} GROUP BY sex, married",
        2,
    ),
    Query(
        "group_race_adults",
        "count_grouped",
        "SELECT race, COUNT(*) AS n FROM {t} WHERE age >= 18 GROUP BY race",
        1,
    ),
    # --- SUM / AVG over bounded columns ---
    Query("sum_income", "sum", "SELECT SUM(income) AS s FROM {t}"),
    Query("sum_age", "sum", "SELECT SUM(age) AS s FROM {t}"),
    Query("avg_income", "avg", "SELECT AVG(income) AS a FROM {t}"),
    Query("avg_age", "avg", "SELECT AVG(age) AS a FROM {t}"),
    Query(
        "sum_income_nested",
        "sum",
        "SELECT SUM(income) AS s FROM {t} WHERE married = 1 AND (educ >= 13 OR age > 50)",
    ),
    Query(
        "avg_income_by_sex",
        "avg",
        "SELECT sex, AVG(income) AS a FROM {t} GROUP BY sex",
        1,
    ),
    Query(
        "avg_age_by_race",
        "avg",
        "SELECT race, AVG(age) AS a FROM {t} GROUP BY race",
        1,
    ),
    Query(
        "sum_income_by_educ",
        "sum",
        "SELECT educ, SUM(income) AS s FROM {t} GROUP BY educ",
        1,
    ),
    Query(
        "count_and_avg_age",
        "mixed",
        "SELECT COUNT(*) AS n, AVG(age) AS a FROM {t} WHERE income > 0",
    ),
)

# The ungrouped single-COUNT queries: at ε = 1 each released value is exact + discrete
# Laplace noise of scale 1, whose mean absolute value is 2q/(1−q²) with q = e^−1.
COUNT_QUERIES = tuple(q.name for q in QUERIES if q.kind == "count")


def load_pums_rows() -> list[tuple[int, ...]]:
    """PUMS.csv as integer tuples, in file order (income is integral in the file)."""
    with PUMS_CSV.open(newline="") as f:
        reader = csv.DictReader(f)
        return [tuple(int(float(r[c])) for c in COLUMNS) for r in reader]


def write_pums_sqlite(path: Path, table: str = "pums") -> Path:
    """An SQLite copy of PUMS with a ``pid`` (row number) as the privacy unit."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        path.unlink()
    con = sqlite3.connect(path)
    try:
        cols = ", ".join(f"{c} INTEGER NOT NULL" for c in COLUMNS)
        con.execute(f"CREATE TABLE {table} (pid INTEGER PRIMARY KEY, {cols})")
        con.executemany(
            f"INSERT INTO {table} VALUES (?, {', '.join('?' * len(COLUMNS))})",
            [(i + 1, *row) for i, row in enumerate(load_pums_rows())],
        )
        con.commit()
    finally:
        con.close()
    return path


def exact_answers(table: str = "pums") -> dict[str, list[list[float]]]:
    """Exact result rows of every query, from an in-memory SQLite copy of PUMS."""
    con = sqlite3.connect(":memory:")
    try:
        cols = ", ".join(f"{c} INTEGER" for c in COLUMNS)
        con.execute(f"CREATE TABLE {table} ({cols})")
        con.executemany(
            f"INSERT INTO {table} VALUES ({', '.join('?' * len(COLUMNS))})", load_pums_rows()
        )
        out: dict[str, list[list[float]]] = {}
        for q in QUERIES:
            rows = con.execute(q.text(table)).fetchall()
            out[q.name] = [list(r) for r in rows]
        return out
    finally:
        con.close()


def key_of(row: list, keys: int) -> tuple[str, ...]:
    """Group key of a result row, normalised to strings (SmartNoise returns '0', not 0)."""
    return tuple(str(int(float(v))) if _numeric(v) else str(v) for v in row[:keys])


def _numeric(v: object) -> bool:
    try:
        float(v)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    return True


def errors_against_exact(
    query: Query, exact: list[list[float]], answers: list[list[list]]
) -> dict[str, object]:
    """Absolute errors of released cells, matched to the exact rows by group key.

    Returns the list of absolute errors (one per released aggregate cell per repetition)
    and how many exact groups were missing from releases (suppressed or refused).
    """
    truth = {key_of(r, query.keys): r[query.keys :] for r in exact}
    errs: list[float] = []
    missing = 0
    for rows in answers:
        got = {key_of(r, query.keys): r[query.keys :] for r in rows}
        for k, vals in truth.items():
            if k not in got:
                missing += 1
                continue
            for e, g in zip(vals, got[k], strict=False):
                if e is None or g is None:
                    continue
                errs.append(abs(float(g) - float(e)))
    return {"abs_errors": errs, "missing_groups": missing}
