"""The demo walkthrough one new analyst makes: how many of its questions the auditor
refuses (free), withholds (after charging), or answers with rows left out (charged; the
rows whose groups it cannot show to hold k, ``audit_left_out``).

    python -m bench.walkthrough                 # the walkthrough in its written order
    python -m bench.walkthrough --seeds 5       # and shuffled, five seeds
    python -m bench.walkthrough --verbose       # every refusal with its reason

The questions are the README's, docs/connect.md's and the console's example queries,
then ordinary questions a new analyst asks of the demo (counts and averages by disease,
sex, year and department, joins to ``zip_regions``, quantiles, MIN/MAX, STDDEV, bands
then the total, a filtered GROUP BY after the unfiltered one). Each run is one analyst
of a fresh gateway on the demo data at its real size (``dpgate demo``), audit mode
``refuse``. After a refusal the analyst follows its advice (``ask_instead``): the same
query with COUNT(*) when that is suggested, else the counts suggested (a breakdown, the
named groups' own) and then the refused query again; the report counts the refusals
answered that way. The answers are noisy, so the counts vary from run to run. What is
still refused or withheld, and why, is in docs/privacy.md ("What the auditor refuses"):
in the written order, one SUM over part of an answered group (each department's cost
outside 2024, which no answered count sizes; its first suggestion, the same query with
COUNT(*), is answered); in shuffled orders also the average cost by department after
that SUM (the same groups), and rows of the rare diseases (a few dozen Meningitis
patients under 40, say) that ε = 0.1 cannot show to hold 5, left out. The groups of no
one that plain references left possible (visits without a patient row, patients whose
zip is not listed) are gone: the demo declares its references ``every_row_matches``.
``tests/test_audit_walkthrough.py`` pins the written order's decisions (with exact
counts); ``tests/test_audit_docs_examples.py`` the docs' examples in shuffled orders.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from gateway.core.config_load import parse_config
from gateway.core.errors import AuditRefused, GatewayError
from gateway.core.plan import QueryRequest
from gateway.demo.hospital import PATIENTS, build, config_yaml
from gateway.pipeline.audit_advice import with_count
from gateway.pipeline.gateway import Gateway

#: The docs' own examples: README.md, docs/connect.md, the console's default query.
DOCS_EXAMPLES: tuple[str, ...] = (
    "SELECT disease, COUNT(*) AS n FROM patients WHERE age >= 40 GROUP BY disease",
    "SELECT COUNT(*) FROM patients",
    "SELECT z.region, COUNT(*) AS n FROM patients p LEFT JOIN zip_regions z "
    "ON p.zip = z.zip GROUP BY z.region",
    "SELECT p.sex, COUNT(*) FROM patients p JOIN visits v ON p.patient_id = v.patient_id "
    "GROUP BY p.sex",
    "SELECT z.region, COUNT(*) FROM patients p JOIN zip_regions z ON p.zip = z.zip "
    "GROUP BY z.region",
    "SELECT sex, AVG(glucose) AS mean_glucose FROM patients GROUP BY sex",
    "SELECT disease, COUNT(*) AS n FROM patients WHERE sex = 'F' GROUP BY disease",
    "SELECT sex, COUNT(*) AS n FROM patients WHERE age >= 40 GROUP BY sex",
    "SELECT disease, sex, COUNT(*) AS n FROM patients GROUP BY disease, sex",
    "SELECT disease, COUNT(*) AS n FROM patients GROUP BY disease",
)

#: Ordinary questions of a new analyst.
ORDINARY: tuple[str, ...] = (
    "SELECT sex, COUNT(*) AS n FROM patients GROUP BY sex",
    "SELECT sex, AVG(glucose) AS g FROM patients GROUP BY sex",
    "SELECT disease, AVG(age) AS mean_age FROM patients GROUP BY disease",
    "SELECT disease, AVG(glucose) AS g FROM patients GROUP BY disease",
    "SELECT city, COUNT(*) AS n FROM patients GROUP BY city",
    "SELECT city, COUNT(*) AS n FROM patients WHERE age >= 65 GROUP BY city",
    "SELECT city, AVG(income) AS mean_income FROM patients GROUP BY city",
    "SELECT smoker, COUNT(*) AS n FROM patients GROUP BY smoker",
    "SELECT smoker, AVG(glucose) AS g FROM patients GROUP BY smoker",
    "SELECT MIN(income), MAX(income), MEDIAN(age) FROM patients",
    "SELECT STDDEV(income) FROM patients",
    "SELECT AVG(income) FROM patients",
    "SELECT SUM(income) FROM patients",
    "SELECT COUNT(*) FROM patients WHERE income < 20000",
    "SELECT COUNT(*) FROM patients WHERE income >= 20000 AND income < 60000",
    "SELECT COUNT(*) FROM patients WHERE income >= 60000",
    "SELECT COUNT(*) FROM patients WHERE smoker",
    "SELECT year, COUNT(*) AS n FROM visits GROUP BY year",
    "SELECT department, COUNT(*) AS n FROM visits GROUP BY department",
    "SELECT department, AVG(cost) AS mean_cost FROM visits GROUP BY department",
    "SELECT year, AVG(length_of_stay) AS stay FROM visits GROUP BY year",
    "SELECT department, SUM(cost) AS total FROM visits WHERE year = 2024 GROUP BY department",
    "SELECT COUNT(*) FROM visits",
    "SELECT AVG(cost) FROM visits",
    "SELECT p.disease, AVG(v.cost) AS mean_cost FROM patients p "
    "JOIN visits v ON p.patient_id = v.patient_id GROUP BY p.disease",
    "SELECT z.region, AVG(p.income) AS mean_income FROM patients p "
    "JOIN zip_regions z ON p.zip = z.zip GROUP BY z.region",
    "SELECT z.region, p.sex, COUNT(*) AS n FROM patients p "
    "JOIN zip_regions z ON p.zip = z.zip GROUP BY z.region, p.sex",
    "SELECT PERCENTILE_CONT(0.9) WITHIN GROUP (ORDER BY income) FROM patients",
    "SELECT sex, MEDIAN(income) AS median_income FROM patients GROUP BY sex",
    "SELECT MIN(age), MAX(age) FROM patients",
    "SELECT disease, STDDEV(glucose) AS sd FROM patients GROUP BY disease",
    "SELECT CASE WHEN age < 18 THEN 'child' WHEN age < 65 THEN 'adult' ELSE 'senior' END "
    "AS band, COUNT(*) AS n FROM patients GROUP BY 1",
    "SELECT sex, COUNT(*) AS n FROM patients WHERE disease = 'Diabetes' GROUP BY sex",
    "SELECT year, department, COUNT(*) AS n FROM visits GROUP BY year, department",
)

WALKTHROUGH: tuple[str, ...] = DOCS_EXAMPLES + ORDINARY
EPSILON = 0.1  # the demo config's default ε


@dataclass(frozen=True)
class Outcome:
    """One question's fate: ``answered``, ``partial`` (answered with rows left out),
    ``refused`` (free) or ``withheld`` (charged), or ``error`` (not an audit decision:
    an unsupported query, say)."""

    sql: str
    outcome: str
    reason: str = ""
    # the refusal's advice (``ask_instead``), followed at once, got the answer whole
    answered_instead: bool = False


def make_gateway(db: Path, workdir: Path, n: int) -> Gateway:
    """A fresh gateway (its own ledger) on a copy of the demo database."""
    copy = workdir / f"hospital{n}.db"
    shutil.copy(db, copy)
    raw = yaml.safe_load(config_yaml(str(copy), str(workdir / f"ledger{n}.db")))
    raw["execution"] = {"timing": "off"}
    raw["analysts"] = [{"name": "demo", "epsilon": 100.0, "delta": 1e-6}]
    return Gateway(parse_config(raw))


def replay(gateway: Gateway, questions: Sequence[str]) -> list[Outcome]:
    """Ask ``questions`` in order as the demo analyst; each question's outcome. After a
    refusal the analyst sends its first suggestion (``detail.ask_instead``) at once."""
    out = []
    for sql in questions:
        try:
            release = gateway.query("demo", QueryRequest(sql, EPSILON, 0.0, "laplace"))
        except AuditRefused as e:
            kind = "withheld" if e.detail.get("charged") else "refused"
            out.append(Outcome(sql, kind, e.message, _follows(gateway, sql, e)))
        except GatewayError as e:
            out.append(Outcome(sql, "error", f"{e.code}: {e.message}"))
        else:
            left_out = release.extra.get("audit_left_out")
            if left_out is None:
                out.append(Outcome(sql, "answered"))
            else:
                out.append(Outcome(sql, "partial", f"{left_out['groups']}: {left_out['reason']}"))
    return out


def _follows(gateway: Gateway, sql: str, refusal: AuditRefused) -> bool:
    """Whether following the refusal's advice gets the answer whole: its first
    suggestion when that is the query with COUNT(*); else the counts it suggests (a
    breakdown, the groups' own), then the refused query again."""
    suggestions = list(refusal.detail.get("ask_instead") or [])
    if not suggestions:
        return False
    asked = suggestions[:1] if suggestions[0] == with_count(sql) else [*suggestions, sql]
    try:
        for q in asked:
            release = gateway.query("demo", QueryRequest(q, EPSILON, 0.0, "laplace"))
    except GatewayError:
        return False
    return "audit_left_out" not in release.extra


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=0, help="also replay shuffled orders")
    parser.add_argument("--patients", type=int, default=PATIENTS)
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument("--docs-only", action="store_true", help="only the docs' examples")
    args = parser.parse_args(argv)
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        db = workdir / "demo.db"
        build(db, patients=args.patients)
        questions = DOCS_EXAMPLES if args.docs_only else WALKTHROUGH
        orders: list[tuple[str, list[str]]] = [("written order", list(questions))]
        for seed in range(args.seeds):
            shuffled = list(questions)
            random.Random(seed).shuffle(shuffled)
            orders.append((f"seed {seed}", shuffled))
        for n, (name, questions) in enumerate(orders):
            outcomes = replay(make_gateway(db, workdir, n), questions)
            kinds = ("refused", "withheld", "partial")
            counts = {k: sum(o.outcome == k for o in outcomes) for k in kinds}
            errors = sum(o.outcome == "error" for o in outcomes)
            instead = sum(o.answered_instead for o in outcomes)
            print(
                f"{name}: {len(outcomes)} questions, {counts['refused']} refused "
                f"({instead} of them answered once its advice was followed), "
                f"{counts['withheld']} withheld, {counts['partial']} answered with rows left "
                f"out, {errors} errors"
            )
            for o in outcomes:
                if o.outcome != "answered" and (args.verbose or o.outcome == "error"):
                    print(f"  {o.outcome}: {o.sql}\n    {o.reason}")
            failed += counts["refused"] + counts["withheld"] + errors
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
