"""OpenDP (polars Context API) on PUMS: the accuracy workload, run inside OpenDP's own
virtualenv (bench/peer/opendp.py creates it). Reads a JSON job on stdin, prints a JSON
result: for each query shape, the released rows of every repetition and their latencies.

Standalone on purpose: it imports only OpenDP, polars and the standard library.
"""

from __future__ import annotations

import json
import sys
import time
import warnings
from typing import Any

import opendp.prelude as dp
import polars as pl

warnings.filterwarnings("ignore")
dp.enable_features("contrib")


def main() -> None:
    job = json.load(sys.stdin)
    n = int(job["rows"])
    frame = pl.read_csv(job["csv"], schema_overrides={"income": pl.Float64}).with_columns(
        pl.col(c).cast(pl.Int64) for c in ("age", "sex", "educ", "race", "income", "married")
    )
    lf = frame.lazy()
    eps, delta = float(job["epsilon"]), float(job["delta"])
    edges = [int(e) for e in job["median_candidates"]]

    def context(*margins: Any) -> Any:
        return dp.Context.compositor(
            data=lf,
            privacy_unit=dp.unit_of(contributions=1),
            privacy_loss=dp.loss_of(epsilon=eps, delta=delta),
            split_evenly_over=1,
            margins=list(margins),
        )

    length = dp.polars.Margin(max_length=n)
    lengths = dp.polars.Margin(max_length=n, invariant="lengths")
    sex_keys = dp.polars.Margin(by=["sex"], max_length=n, invariant="keys")
    shapes = {
        "count": lambda: context().query().select(dp.len()),
        "group_public": lambda: context(sex_keys).query().group_by("sex").agg(dp.len()),
        "sum": lambda: (
            context(lengths).query().select(pl.col("income").fill_null(0).dp.sum((0, 500_000)))
        ),
        "avg": lambda: context(length).query().select(pl.col("age").fill_null(0).dp.mean((0, 100))),
        "group_selection": lambda: context().query().group_by("educ").agg(dp.len()),
        "median": lambda: (
            context(length).query().select(pl.col("income").fill_null(0).dp.median(edges))
        ),
        "avg_group": lambda: (
            context(sex_keys)
            .query()
            .group_by("sex")
            .agg(pl.col("income").fill_null(0).dp.mean((0, 500_000)))
        ),
    }
    out: dict[str, Any] = {"version": getattr(dp, "__version__", "?"), "shapes": {}}
    for name in job["shapes"]:
        build = shapes[name]
        rows_per_rep: list[list[list[float]]] = []
        latencies: list[float] = []
        error = None
        try:
            for _ in range(int(job["reps"])):
                t = time.perf_counter()
                released = build().release().collect()
                latencies.append(time.perf_counter() - t)
                rows_per_rep.append([[float(v) for v in row] for row in released.rows()])
        except Exception as e:  # a shape OpenDP refuses is reported, not fatal
            error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        out["shapes"][name] = {"answers": rows_per_rep, "latencies_s": latencies, "error": error}
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
