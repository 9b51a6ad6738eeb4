"""Tumult Analytics: the accuracy workload of ``bench/accuracy.py``, run inside Tumult's
own virtualenv (``bench/.data/venv-tumult``; Spark ``local[1]``). Reads a JSON job on
stdin and writes JSON lines to the job's ``out`` file, like ``opendp_runner.py``.

One ``Session`` with an unbounded budget answers every release, each evaluated at
ε = 1 of its own (``PureDPBudget(1)``, add/remove one row: ``AddOneRow``); every
evaluation draws fresh noise, so the releases are independent, as with a fresh Session
per release, without paying Spark's Session setup each time. Partition selection
(``educ`` keys not public) is Tumult's documented pattern: ``get_groups`` at (ε/2, δ) in
an approximate-DP session, then the counts at ε/2 over the keys it returned.

Standalone on purpose: it imports only Tumult Analytics, PySpark and the standard library.
"""

from __future__ import annotations

import json
import os
import sys
import time
import warnings
from typing import Any

warnings.filterwarnings("ignore")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from pyspark.sql import SparkSession  # noqa: E402

try:  # Tumult Analytics ≥ 0.20 exports everything at the top level
    from tmlt.analytics import (
        AddOneRow,
        ApproxDPBudget,
        KeySet,
        PureDPBudget,
        QueryBuilder,
        Session,
    )
except ImportError:  # pragma: no cover - older layouts
    from tmlt.analytics.keyset import KeySet  # type: ignore[no-redef]
    from tmlt.analytics.privacy_budget import (  # type: ignore[no-redef]
        ApproxDPBudget,
        PureDPBudget,
    )
    from tmlt.analytics.protected_change import AddOneRow  # type: ignore[no-redef]
    from tmlt.analytics.query_builder import QueryBuilder  # type: ignore[no-redef]
    from tmlt.analytics.session import Session  # type: ignore[no-redef]


def main() -> None:
    job = json.load(sys.stdin)
    spark = (
        SparkSession.builder.master("local[1]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "1")
        .config("spark.driver.memory", "1g")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    columns = ["age", "sex", "educ", "race", "income", "married"]
    frame = spark.read.csv(job["csv"], header=True, inferSchema=True).select(*columns)
    for c in columns:
        frame = frame.withColumn(c, frame[c].cast("long"))
    frame = frame.cache()
    frame.count()
    eps, delta = float(job["epsilon"]), float(job["delta"])
    lo_inc, hi_inc = job["bounds"]["income"]
    lo_age, hi_age = job["bounds"]["age"]
    pure = Session.from_dataframe(
        privacy_budget=PureDPBudget(float("inf")),
        source_id="t",
        dataframe=frame,
        protected_change=AddOneRow(),
    )
    approx = Session.from_dataframe(
        privacy_budget=ApproxDPBudget(float("inf"), 0.5),
        source_id="t",
        dataframe=frame,
        protected_change=AddOneRow(),
    )
    sex = KeySet.from_dict({"sex": [0, 1]})
    q = lambda: QueryBuilder("t")  # noqa: E731

    def pure_release(query: Any) -> Any:
        return pure.evaluate(query, PureDPBudget(eps))

    def selection() -> Any:
        keys = approx.evaluate(q().get_groups(["educ"]), ApproxDPBudget(eps / 2, delta))
        return approx.evaluate(
            q().groupby(KeySet.from_dataframe(keys)).count(), ApproxDPBudget(eps / 2, 0)
        )

    shapes = {
        "count": lambda: pure_release(q().count()),
        "group_public": lambda: pure_release(q().groupby(sex).count()),
        "sum": lambda: pure_release(q().sum("income", low=lo_inc, high=hi_inc)),
        "avg": lambda: pure_release(q().average("age", low=lo_age, high=hi_age)),
        "group_selection": selection,
        "median": lambda: pure_release(q().median("income", low=lo_inc, high=hi_inc)),
        "avg_group": lambda: pure_release(q().groupby(sex).average("income", lo_inc, hi_inc)),
    }
    version = "?"
    try:
        from importlib.metadata import version as _v

        version = _v("tmlt.analytics")
    except Exception:  # pragma: no cover
        pass
    with open(job["out"], "a") as out:
        out.write(json.dumps({"version": f"Tumult Analytics {version}"}) + "\n")
        out.flush()
        for name in job["shapes"]:
            build = shapes[name]
            rows_per_rep: list[list[list[float]]] = []
            wall: list[float] = []
            cpu: list[float] = []
            error = None
            try:
                for _ in range(int(job["reps"])):
                    t, c = time.perf_counter(), time.process_time()
                    released = build().collect()
                    wall.append(time.perf_counter() - t)
                    cpu.append(time.process_time() - c)
                    rows_per_rep.append([[float(v) for v in row] for row in released])
            except Exception as e:  # a shape Tumult refuses is reported, not fatal
                error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            line = {"shape": name, "answers": rows_per_rep, "wall_s": wall, "cpu_s": cpu}
            out.write(json.dumps({**line, "error": error}) + "\n")
            out.flush()
    spark.stop()


if __name__ == "__main__":
    main()
