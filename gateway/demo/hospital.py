"""A synthetic but realistic hospital data set, generated deterministically.

``patients`` has one row per person (with a name that is *not* declared public: it must
never appear in any response); ``visits`` has one to eight rows per person, so the
per-person contribution bound (``max_rows_per_unit``) matters there. ``zip_regions`` is a
public table (the region of every zip code the demo uses), which ``patients`` joins on
``zip``; ``visits`` joins ``patients`` on the privacy unit (docs/design.md, "Joins").
"""

from __future__ import annotations

import math
import random
import sqlite3
from dataclasses import replace
from pathlib import Path

from gateway.core.config import Config, with_nullability

CITIES = ("Budapest", "Debrecen", "Szeged", "Pécs", "Győr", "Miskolc", "Eger", "Sopron")
CITY_WEIGHTS = (40, 9, 8, 7, 6, 6, 3, 2)
#: The region of each city (the public ``zip_regions`` table maps each zip code to it).
REGIONS = {
    "Budapest": "Central Hungary",
    "Debrecen": "Northern Great Plain",
    "Szeged": "Southern Great Plain",
    "Pécs": "Southern Transdanubia",
    "Győr": "Western Transdanubia",
    "Miskolc": "Northern Hungary",
    "Eger": "Northern Hungary",
    "Sopron": "Western Transdanubia",
}
ZIPS_PER_CITY = 240
DISEASES = ("Crohn", "Influenza", "Meningitis", "Diabetes", "Asthma", "Hypertension", "None")
DISEASE_WEIGHTS = (1, 12, 0.5, 9, 7, 15, 55.5)
DEPARTMENTS = (
    "Cardiology",
    "Emergency",
    "Gastroenterology",
    "Neurology",
    "Oncology",
    "Pediatrics",
    "Pulmonology",
    "Surgery",
)
FIRST = (
    "Anna",
    "Bence",
    "Csilla",
    "Dániel",
    "Eszter",
    "Ferenc",
    "Gabriella",
    "Hajnalka",
    "István",
    "Judit",
    "Kata",
    "László",
    "Márton",
    "Nóra",
    "Orsolya",
    "Péter",
    "Réka",
    "Sándor",
    "Tamás",
    "Zsófia",
)
LAST = (
    "Nagy",
    "Kovács",
    "Tóth",
    "Szabó",
    "Horváth",
    "Varga",
    "Kiss",
    "Molnár",
    "Németh",
    "Farkas",
    "Balogh",
    "Papp",
    "Takács",
    "Juhász",
    "Lakatos",
    "Mészáros",
    "Oláh",
    "Simon",
)

#: Which declared columns of the demo tables may hold NULL, as their catalogue says (only
#: glucose): what ``nullable`` defaults to against the demo database, for code that reads
#: the config without opening it.
NULLABLE = {
    "patients": {
        "patient_id": False,
        "sex": False,
        "age": False,
        "city": False,
        "zip": False,
        "smoker": False,
        "glucose": True,
        "income": False,
        "disease": False,
    },
    "visits": {
        "patient_id": False,
        "year": False,
        "department": False,
        "length_of_stay": False,
        "cost": False,
    },
    "zip_regions": {"zip": False, "region": False},
}


def catalogued(config: Config) -> Config:
    """``config`` with ``nullable`` decided as the demo database's catalogue decides it
    (what a Gateway on the demo data does at start-up), for tests that open no database."""
    return replace(config, tables=with_nullability(config.tables, NULLABLE))


#: The share of patients with a glucose reading, by disease: every diabetic is tested
#: (3% of readings are lost whoever was tested), three patients in four otherwise.
TESTED = {"Diabetes": 1.0}
TESTED_OTHERWISE = 0.75

PATIENTS = 12_000
SEED = 20261123
MAX_VISITS = 8


def build(path: Path, *, patients: int = PATIENTS, seed: int = SEED) -> None:
    """Write the demo database to ``path`` (replacing it)."""
    rng = random.Random(seed)
    # who had a glucose test: drawn from its own stream, so that the rest of the data set
    # is what it always was
    tested_rng = random.Random(seed + 1)
    if path.exists():
        path.unlink()
    conn = sqlite3.connect(path)
    conn.executescript(
        """
        CREATE TABLE patients (
            patient_id INTEGER PRIMARY KEY,
            name TEXT NOT NULL,
            sex TEXT NOT NULL,
            age INTEGER NOT NULL,
            city TEXT NOT NULL,
            zip TEXT NOT NULL,
            smoker INTEGER NOT NULL,
            glucose REAL,
            income INTEGER NOT NULL,
            disease TEXT NOT NULL
        );
        CREATE TABLE visits (
            visit_id INTEGER PRIMARY KEY,
            patient_id INTEGER NOT NULL REFERENCES patients(patient_id),
            year INTEGER NOT NULL,
            department TEXT NOT NULL,
            length_of_stay INTEGER NOT NULL,
            cost REAL NOT NULL
        );
        """
    )
    _zip_regions(conn)
    patient_rows = []
    visit_rows = []
    visit_id = 0
    for pid in range(1, patients + 1):
        sex = rng.choice("FM")
        age = min(100, max(0, int(rng.gauss(46, 21))))
        city = rng.choices(CITIES, CITY_WEIGHTS)[0]
        zip_code = f"{1000 + CITIES.index(city) * 1000 + rng.randrange(0, ZIPS_PER_CITY):04d}"
        disease = rng.choices(DISEASES, DISEASE_WEIGHTS)[0]
        smoker = int(rng.random() < 0.22)
        base_glucose = 5.2 + (3.5 if disease == "Diabetes" else 0.0) + age * 0.01
        glucose = round(max(2.5, rng.gauss(base_glucose, 1.1)), 1) if rng.random() > 0.03 else None
        if tested_rng.random() >= TESTED.get(disease, TESTED_OTHERWISE):
            glucose = None  # never tested: no reading
        income = int(max(0, rng.lognormvariate(math.log(24000), 0.6)))
        name = f"{rng.choice(FIRST)} {rng.choice(LAST)}-{pid}"
        patient_rows.append((pid, name, sex, age, city, zip_code, smoker, glucose, income, disease))
        n_visits = min(MAX_VISITS, 1 + int(rng.expovariate(0.55)))
        for _ in range(n_visits):
            visit_id += 1
            dept = rng.choice(DEPARTMENTS)
            stay = min(30, int(rng.expovariate(0.35)))
            cost = round(80 + stay * rng.uniform(250, 600) + rng.uniform(0, 200), 2)
            visit_rows.append((visit_id, pid, rng.randint(2019, 2025), dept, stay, cost))
    conn.executemany("INSERT INTO patients VALUES (?,?,?,?,?,?,?,?,?,?)", patient_rows)
    conn.executemany("INSERT INTO visits VALUES (?,?,?,?,?,?)", visit_rows)
    conn.commit()
    conn.close()


def upgrade(path: Path) -> None:
    """Add to a demo database built by an earlier dpgate what it lacks: the public
    ``zip_regions`` table (derived from constants, so the result is what ``build`` makes)."""
    conn = sqlite3.connect(path)
    try:
        known = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'zip_regions'"
        ).fetchone()
        if known is None:
            _zip_regions(conn)
            conn.commit()
    finally:
        conn.close()


def _zip_regions(conn: sqlite3.Connection) -> None:
    conn.execute("CREATE TABLE zip_regions (zip TEXT PRIMARY KEY NOT NULL, region TEXT NOT NULL)")
    conn.executemany("INSERT INTO zip_regions VALUES (?,?)", zip_region_rows())


def zip_region_rows() -> list[tuple[str, str]]:
    """The public table: every zip code of every city, with the city's region (drawn
    from no random numbers, so the rest of the data set is what it always was)."""
    return [
        (f"{1000 + i * 1000 + r:04d}", REGIONS[city])
        for i, city in enumerate(CITIES)
        for r in range(ZIPS_PER_CITY)
    ]


def config_yaml(database: str, ledger: str, postgres_port: int | None = None) -> str:
    """The demo config declaring what is public about the demo tables (and, with
    ``postgres_port``, serving the PostgreSQL protocol there)."""
    cities = ", ".join(CITIES)
    diseases = ", ".join(DISEASES)
    departments = ", ".join(DEPARTMENTS)
    regions = ", ".join(dict.fromkeys(REGIONS.values()))
    return f"""\
# dpgate demo configuration (generated by `dpgate demo`).
# Every column says whether it may hold NULL (`nullable:`), as a careful admin would: a
# column left undeclared is nullable unless the catalogue says NOT NULL, and the auditor
# then keeps a NULL cell for it (`dpgate config check` lists such columns).
database:
  url: "sqlite:///{database}"
  statement_timeout_ms: 10000
  data_version: "demo-1"
ledger:
  url: "sqlite:///{ledger}"
privacy:
  mechanism: laplace
  epsilon: 0.1
  max_epsilon_per_query: 1.0
  delta: 1.0e-7
  composition: combined   # the smaller of basic composition and zCDP (docs/accounting.md)
  min_epsilon_per_query: 0.01
audit:
  mode: refuse
  min_group_size: 5
  scope: analyst
execution:
  timing: deadline     # answers that read rows leave at a release moment fixed from public facts
  deadline_margin: 2   # a query's deadline: its cost estimate × 2 (+ post_ms), or set deadline_ms
tables:
  patients:
    privacy_unit: patient_id
    max_rows_per_unit: 1
    rows: {PATIENTS}              # declared public (an upper bound): sizes the release deadlines
    columns:
      patient_id: {{type: integer}}
      sex:        {{type: text, values: [F, M], nullable: false}}
      age:        {{type: integer, lower: 0, upper: 100, nullable: false}}
      city:       {{type: text, values: [{cities}], nullable: false}}
      zip:        {{type: text, nullable: false}}
      smoker:     {{type: boolean, nullable: false}}
      glucose:    {{type: real, lower: 2.0, upper: 20.0, nullable: true}}  # untested: no reading
      income:     {{type: integer, lower: 0, upper: 200000, nullable: false}}
      disease:    {{type: text, values: [{diseases}], nullable: false}}
    references:               # joins: patients.zip → the public zip_regions' key
      zip: {{to: zip_regions.zip, every_row_matches: true}}  # every zip is listed there
  visits:
    privacy_unit: patient_id
    max_rows_per_unit: 5
    max_groups_per_unit: 3
    rows: {MAX_VISITS * PATIENTS}              # at most {MAX_VISITS} visits per patient
    references:               # a privacy-unit path: a visit's patient is the person
      patient_id: {{to: patients.patient_id, every_row_matches: true}}  # no orphan visits
    columns:
      patient_id:     {{type: integer}}
      year:           {{type: integer, lower: 2019, upper: 2025, nullable: false}}
      department:     {{type: text, values: [{departments}], nullable: false}}
      length_of_stay: {{type: integer, lower: 0, upper: 30, nullable: false}}
      cost:           {{type: real, lower: 0.0, upper: 20000.0, nullable: false}}
  zip_regions:                # public rows: no privacy unit, joined on its unique key
    public: true
    key: zip
    rows: {len(CITIES) * ZIPS_PER_CITY}
    columns:
      zip:    {{type: text}}
      region: {{type: text, values: [{regions}]}}
analysts:
  - {{name: demo, epsilon: 10.0, delta: 1.0e-6}}
""" + (f"postgres_wire:\n  port: {postgres_port}\n" if postgres_port is not None else "")
