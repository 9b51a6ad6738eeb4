"""Two more synthetic data sets for the honest workloads (``tests/workloads/``), besides
the demo hospital: a mobile operator's and a national statistics office's, each built
deterministically (seeded) and quickly, with the config its admin would write.

- **telecom**: ``subscribers`` (one row per subscriber: the privacy unit), ``plans`` (the
  public tariff list, which ``subscribers.plan_id`` references) and ``usage`` (one row per
  subscriber and active month of 2025: calls, texts, data, roaming — up to 12 rows per
  person, joined to ``subscribers`` on the privacy unit).
- **census**: ``persons`` (one row per person, in the style of a census microdata file:
  age, sex, marital status, education, employment, occupation, income, hours worked and
  the household's size and tenure) and ``areas`` (the public list of statistical areas
  with their region and settlement type, which ``persons.area`` references). Income is
  missing (NULL) under 15, employment status under 16, occupation and hours worked for
  whoever is not employed, as in census files (the PUMS person file codes them "N/A"),
  and the config says so (``null_when``).

The distributions are loosely modelled on public statistics (age pyramids, education
and income shares); no real record is used.
"""

from __future__ import annotations

import math
import random
import sqlite3
from pathlib import Path
from typing import Any


def _common_config(database: Path, ledger: Path, data_version: str) -> dict[str, Any]:
    """What both admins write alike: the SQLite files, ε 0.1 a query by default under
    combined composition, and the auditor refusing groups under five per analyst."""
    return {
        "database": {"url": f"sqlite:///{database}", "data_version": data_version},
        "ledger": {"url": f"sqlite:///{ledger}"},
        "privacy": {
            "mechanism": "laplace",
            "epsilon": 0.1,
            "max_epsilon_per_query": 1.0,
            "delta": 1.0e-7,
            "composition": "combined",
        },
        "audit": {"mode": "refuse", "min_group_size": 5, "scope": "analyst"},
        "execution": {"timing": "off"},
    }


# -- telecom -----------------------------------------------------------------------------

SUBSCRIBERS = 6_000
TELECOM_SEED = 20261127
TELECOM_REGIONS = ("Capital", "North", "South", "East", "West", "Coast")
TELECOM_REGION_WEIGHTS = (34, 14, 16, 13, 12, 11)
DEVICES = ("Android", "iOS", "Feature phone")
#: The public tariff list: (plan_id, tier, contract, monthly fee, data allowance in GB).
PLANS = (
    ("PRE-S", "Basic", "prepaid", 5.0, 2),
    ("PRE-M", "Standard", "prepaid", 10.0, 10),
    ("PRE-L", "Premium", "prepaid", 18.0, 30),
    ("POST-S", "Basic", "postpaid", 9.0, 5),
    ("POST-M", "Standard", "postpaid", 17.0, 25),
    ("POST-L", "Premium", "postpaid", 28.0, 60),
    ("POST-U", "Unlimited", "postpaid", 40.0, 999),
    ("FAM-M", "Standard", "family", 30.0, 40),
    ("FAM-U", "Unlimited", "family", 55.0, 999),
    ("BIZ-U", "Unlimited", "business", 45.0, 999),
)
PLAN_WEIGHTS = (16, 14, 5, 9, 18, 10, 8, 8, 5, 7)
TIERS = ("Basic", "Standard", "Premium", "Unlimited")
CONTRACTS = ("prepaid", "postpaid", "family", "business")


def build_telecom(path: Path, *, subscribers: int = SUBSCRIBERS, seed: int = TELECOM_SEED) -> None:
    """Write the telecom database to ``path`` (replacing it)."""
    rng = random.Random(seed)
    if path.exists():
        path.unlink()
    conn = sqlite3.connect(path)
    conn.executescript(
        """
        CREATE TABLE plans (
            plan_id TEXT PRIMARY KEY NOT NULL,
            tier TEXT NOT NULL,
            contract TEXT NOT NULL,
            monthly_fee REAL NOT NULL,
            data_gb INTEGER NOT NULL
        );
        CREATE TABLE subscribers (
            subscriber_id INTEGER PRIMARY KEY,
            msisdn TEXT NOT NULL UNIQUE,
            plan_id TEXT NOT NULL REFERENCES plans(plan_id),
            region TEXT NOT NULL,
            sex TEXT NOT NULL,
            age INTEGER NOT NULL,
            device TEXT,
            signup_year INTEGER NOT NULL,
            tenure_months INTEGER NOT NULL,
            monthly_bill REAL NOT NULL,
            churned INTEGER NOT NULL
        );
        CREATE TABLE usage (
            usage_id INTEGER PRIMARY KEY,
            subscriber_id INTEGER NOT NULL REFERENCES subscribers(subscriber_id),
            month INTEGER NOT NULL,
            call_minutes INTEGER NOT NULL,
            sms INTEGER NOT NULL,
            data_mb REAL NOT NULL,
            roaming INTEGER NOT NULL,
            dropped_calls INTEGER NOT NULL
        );
        """
    )
    conn.executemany("INSERT INTO plans VALUES (?,?,?,?,?)", PLANS)
    subscriber_rows = []
    usage_rows = []
    usage_id = 0
    for sid in range(1, subscribers + 1):
        plan = rng.choices(PLANS, PLAN_WEIGHTS)[0]
        region = rng.choices(TELECOM_REGIONS, TELECOM_REGION_WEIGHTS)[0]
        age = min(95, max(16, int(rng.gauss(42, 16))))
        young = age < 35
        device_weights = (55, 40 if young else 25, 2 if young else 14)
        device = rng.choices(DEVICES, device_weights)[0] if rng.random() > 0.04 else None
        # the billing system's records start in 2010 (older contracts were migrated then)
        signup_year = max(2010, min(2025, 2025 - int(rng.expovariate(0.22))))
        signup_month = rng.randint(1, 12)
        tenure = max(0, min(240, (2025 - signup_year) * 12 + 12 - signup_month))
        churned = int(rng.random() < (0.09 if plan[2] == "prepaid" else 0.04))
        months = range(signup_month if signup_year == 2025 else 1, 13)
        if churned:
            months = range(months.start, max(months.start + 1, rng.randint(months.start, 12)))
        data_gb = plan[4]
        extra = 0.0
        for month in months:
            usage_id += 1
            minutes = int(rng.lognormvariate(math.log(180 if age > 30 else 120), 0.8))
            sms = int(rng.lognormvariate(math.log(40 if young else 15), 1.0))
            heavy = 1.6 if young else 0.8
            data_mb = round(min(data_gb, 80) * 1024 * rng.betavariate(2, 3) * heavy, 1)
            roaming = int(rng.random() < (0.12 if month in (7, 8) else 0.03))
            dropped = min(50, int(rng.expovariate(0.7)))
            extra += 4.0 * roaming
            usage_rows.append((usage_id, sid, month, minutes, sms, data_mb, roaming, dropped))
        bill = round(plan[3] + extra / max(1, len(months)) + rng.uniform(0, 3), 2)
        msisdn = f"+36 30 {(sid * 7_919_113 + 1_234_567) % 10**7:07d}"  # distinct: 7919113 is prime
        subscriber_rows.append(
            (sid, msisdn, plan[0], region, rng.choice("FM"), age, device, signup_year, tenure,
             bill, churned)
        )  # fmt: skip
    conn.executemany("INSERT INTO subscribers VALUES (?,?,?,?,?,?,?,?,?,?,?)", subscriber_rows)
    conn.executemany("INSERT INTO usage VALUES (?,?,?,?,?,?,?,?)", usage_rows)
    conn.commit()
    conn.close()


def telecom_config(database: Path, ledger: Path) -> dict[str, Any]:
    """The operator's config: subscribers and their usage protected per subscriber, the
    tariff list public."""
    return {
        **_common_config(database, ledger, "telecom-2025"),
        "tables": {
            "subscribers": {
                "privacy_unit": "subscriber_id",
                "max_rows_per_unit": 1,
                "rows": 10_000,
                # every subscriber is on a listed tariff (a foreign key the billing system
                # keeps): no region of subscribers without one
                "references": {"plan_id": {"to": "plans.plan_id", "every_row_matches": True}},
                "columns": {
                    "subscriber_id": {"type": "integer"},
                    "plan_id": {"type": "text", "nullable": False},
                    "region": {"type": "text", "values": list(TELECOM_REGIONS), "nullable": False},
                    "sex": {"type": "text", "values": ["F", "M"], "nullable": False},
                    "age": {"type": "integer", "lower": 16, "upper": 100, "nullable": False},
                    # unknown handset: no TAC match in the device database
                    "device": {"type": "text", "values": list(DEVICES), "nullable": True},
                    "signup_year": {
                        "type": "integer",
                        "lower": 2010,
                        "upper": 2025,
                        "nullable": False,
                    },
                    "tenure_months": {
                        "type": "integer",
                        "lower": 0,
                        "upper": 240,
                        "nullable": False,
                    },
                    "monthly_bill": {
                        "type": "real",
                        "lower": 0.0,
                        "upper": 200.0,
                        "nullable": False,
                    },
                    "churned": {"type": "boolean", "nullable": False},
                },
            },
            "usage": {
                "max_rows_per_unit": 12,
                "max_groups_per_unit": 12,
                "rows": 12 * 10_000,
                "references": {
                    "subscriber_id": {
                        "to": "subscribers.subscriber_id",
                        "every_row_matches": True,
                    }
                },
                "columns": {
                    "subscriber_id": {"type": "integer"},
                    "month": {"type": "integer", "lower": 1, "upper": 12, "nullable": False},
                    "call_minutes": {
                        "type": "integer",
                        "lower": 0,
                        "upper": 3000,
                        "nullable": False,
                    },
                    "sms": {"type": "integer", "lower": 0, "upper": 1000, "nullable": False},
                    "data_mb": {"type": "real", "lower": 0.0, "upper": 150000.0, "nullable": False},
                    "roaming": {"type": "boolean", "nullable": False},
                    "dropped_calls": {
                        "type": "integer",
                        "lower": 0,
                        "upper": 50,
                        "nullable": False,
                    },
                },
            },
            "plans": {
                "public": True,
                "key": "plan_id",
                "rows": len(PLANS),
                "columns": {
                    "plan_id": {"type": "text"},
                    "tier": {"type": "text", "values": list(TIERS)},
                    "contract": {"type": "text", "values": list(CONTRACTS)},
                    "monthly_fee": {"type": "real", "lower": 0.0, "upper": 100.0},
                    "data_gb": {"type": "integer", "lower": 0, "upper": 999},
                },
            },
        },
        "analysts": [{"name": "churn-team", "epsilon": 10.0, "delta": 1.0e-6}],
    }


# -- census ------------------------------------------------------------------------------

PERSONS = 20_000
CENSUS_SEED = 20261128
CENSUS_REGIONS = ("Northeast", "Midwest", "South", "West")
CENSUS_REGION_WEIGHTS = (17, 21, 38, 24)
SETTLEMENTS = ("Urban", "Suburban", "Rural")
AREAS_PER_REGION = 30
EDUCATION = (
    "No schooling",
    "Primary",
    "Lower secondary",
    "Upper secondary",
    "Post-secondary",
    "Bachelor",
    "Master",
    "Doctorate",
)
EDUCATION_WEIGHTS = (2, 6, 10, 34, 14, 21, 10, 3)
MARITAL = ("Never married", "Married", "Divorced", "Widowed")
EMPLOYMENT = ("Employed", "Unemployed", "Not in labour force")
OCCUPATIONS = (
    "Managers",
    "Professionals",
    "Technicians",
    "Clerical",
    "Service and sales",
    "Agriculture",
    "Craft and trades",
    "Operators",
    "Elementary",
)
TENURE = ("Owned", "Mortgaged", "Rented")


def area_rows() -> list[tuple[str, str, str]]:
    """The public table: every statistical area with its region and settlement type
    (from no random numbers)."""
    return [
        (f"{r + 1}{a:03d}", region, SETTLEMENTS[0 if a < 12 else 1 if a < 22 else 2])
        for r, region in enumerate(CENSUS_REGIONS)
        for a in range(AREAS_PER_REGION)
    ]


def _education(rng: random.Random, age: int) -> str:
    if age < 6:
        return "No schooling"
    if age < 12:
        return "Primary"
    if age < 16:
        return "Lower secondary"
    if age < 19:
        return rng.choices(EDUCATION[2:5], (3, 6, 1))[0]
    if age < 23:
        return rng.choices(EDUCATION[2:6], (2, 10, 6, 2))[0]
    return rng.choices(EDUCATION, EDUCATION_WEIGHTS)[0]


_EDUCATION_PAY = dict(zip(EDUCATION, (0.55, 0.6, 0.7, 0.85, 0.95, 1.3, 1.55, 1.8), strict=True))


def build_census(path: Path, *, persons: int = PERSONS, seed: int = CENSUS_SEED) -> None:
    """Write the census database to ``path`` (replacing it)."""
    rng = random.Random(seed)
    if path.exists():
        path.unlink()
    conn = sqlite3.connect(path)
    conn.executescript(
        """
        CREATE TABLE areas (
            area TEXT PRIMARY KEY NOT NULL,
            region TEXT NOT NULL,
            settlement TEXT NOT NULL
        );
        CREATE TABLE persons (
            person_id INTEGER PRIMARY KEY,
            household_id INTEGER NOT NULL,
            area TEXT NOT NULL REFERENCES areas(area),
            age INTEGER NOT NULL,
            sex TEXT NOT NULL,
            marital_status TEXT NOT NULL,
            education TEXT NOT NULL,
            employment TEXT,
            occupation TEXT,
            hours_worked INTEGER,
            income INTEGER,
            household_size INTEGER NOT NULL,
            tenure TEXT NOT NULL
        );
        """
    )
    areas = area_rows()
    conn.executemany("INSERT INTO areas VALUES (?,?,?)", areas)
    by_region = {r: [a for a in areas if a[1] == r] for r in CENSUS_REGIONS}
    rows = []
    pid = 0
    household = 0
    while pid < persons:
        household += 1
        region = rng.choices(CENSUS_REGIONS, CENSUS_REGION_WEIGHTS)[0]
        area = rng.choices(
            by_region[region], [3 if a[2] == "Urban" else 2 for a in by_region[region]]
        )[0]
        size = min(8, 1 + int(rng.expovariate(0.65)))
        tenure = rng.choices(TENURE, (25, 38, 37))[0]
        head_age = min(95, max(18, int(rng.gauss(50, 17))))
        for member in range(size):
            pid += 1
            if member == 0:
                age = head_age
            elif member == 1 and size > 1:
                age = min(95, max(18, head_age + int(rng.gauss(-2, 5))))
            else:
                age = max(0, min(60, head_age - 20 - int(rng.expovariate(0.12))))
            sex = rng.choice("FM")
            if age < 18:
                marital = "Never married"
            else:
                old = age >= 70
                weights = (30 if age < 30 else 10, 50, 12, 20 if old else 2)
                marital = rng.choices(MARITAL, weights)[0]
            education = _education(rng, age)
            if age < 16:
                employment = None  # not asked under 16
            elif age >= 67:
                employment = rng.choices(EMPLOYMENT, (8, 1, 91))[0]
            else:
                employment = rng.choices(EMPLOYMENT, (72, 5, 23))[0]
            occupation = None
            hours = None
            if employment == "Employed":
                occupation = rng.choice(OCCUPATIONS)
                hours = min(99, max(1, int(rng.gauss(38, 9))))
            income = None
            if age >= 15:
                if employment == "Employed":
                    base = 42_000 * _EDUCATION_PAY[education]
                    income = int(min(500_000, rng.lognormvariate(math.log(base), 0.55)))
                else:
                    income = 0 if rng.random() < 0.35 else int(rng.lognormvariate(9.3, 0.8))
            rows.append(
                (pid, household, area[0], age, sex, marital, education, employment, occupation,
                 hours, income, size, tenure)
            )  # fmt: skip
            if pid == persons:
                break
    conn.executemany("INSERT INTO persons VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)", rows)
    conn.commit()
    conn.close()


def census_config(database: Path, ledger: Path) -> dict[str, Any]:
    """The statistics office's config: persons protected one by one, the areas public."""
    return {
        **_common_config(database, ledger, "census-2025"),
        "tables": {
            "persons": {
                "privacy_unit": "person_id",
                "max_rows_per_unit": 1,
                "rows": 25_000,
                # the list of areas is complete: every person lives in one of them
                "references": {"area": {"to": "areas.area", "every_row_matches": True}},
                "columns": {
                    "person_id": {"type": "integer"},
                    "area": {"type": "text", "nullable": False},
                    "age": {"type": "integer", "lower": 0, "upper": 100, "nullable": False},
                    "sex": {"type": "text", "values": ["F", "M"], "nullable": False},
                    "marital_status": {"type": "text", "values": list(MARITAL), "nullable": False},
                    "education": {"type": "text", "values": list(EDUCATION), "nullable": False},
                    # asked from 16 on (the labour-force universe)
                    "employment": {
                        "type": "text",
                        "values": list(EMPLOYMENT),
                        "null_when": "age < 16",
                    },
                    # asked of the employed, and only of them (under 16, employment is
                    # NULL: `employment <> 'Employed'` would not hold there)
                    "occupation": {
                        "type": "text",
                        "values": list(OCCUPATIONS),
                        "null_when": "employment IS NULL OR employment <> 'Employed'",
                    },
                    "hours_worked": {
                        "type": "integer",
                        "lower": 0,
                        "upper": 99,
                        "null_when": "employment IS NULL OR employment <> 'Employed'",
                    },
                    # asked from 15 on
                    "income": {
                        "type": "integer",
                        "lower": 0,
                        "upper": 500_000,
                        "null_when": "age < 15",
                    },
                    "household_size": {
                        "type": "integer",
                        "lower": 1,
                        "upper": 8,
                        "nullable": False,
                    },
                    "tenure": {"type": "text", "values": list(TENURE), "nullable": False},
                },
            },
            "areas": {
                "public": True,
                "key": "area",
                "rows": len(CENSUS_REGIONS) * AREAS_PER_REGION,
                "columns": {
                    "area": {"type": "text"},
                    "region": {"type": "text", "values": list(CENSUS_REGIONS)},
                    "settlement": {"type": "text", "values": list(SETTLEMENTS)},
                },
            },
        },
        "analysts": [{"name": "statistician", "epsilon": 10.0, "delta": 1.0e-6}],
    }
