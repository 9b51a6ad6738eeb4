"""OpenDP (polars Context API): the accuracy workload of ``bench/accuracy.py``, run inside
OpenDP's own virtualenv (``bench/.data/venv-opendp``). Reads a JSON job on stdin and
writes JSON lines to the job's ``out`` file: first ``{"version": …}``, then one line per
query shape as soon as it is done (the released rows of every repetition, and the wall and
CPU seconds of the first ``fresh`` ones), so a run stopped part-way keeps the shapes it
finished.

A whole release (a new ``Context``, the plan, its calibration, the noise) costs OpenDP
about a second of CPU, nearly all of it calibration; the first ``fresh`` releases of a
shape are whole ones, timed, and the rest invoke the same resolved measurement again
(``Query.resolve()``): the same mechanism at the same ε, a fresh draw of its noise each
time, so the accuracy is the same as with whole releases and the run takes minutes, not
hours.

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
    columns = ("age", "sex", "educ", "race", "income", "married")
    frame = pl.read_csv(
        job["csv"], columns=list(columns), schema_overrides={"income": pl.Float64}
    ).with_columns(pl.col(c).cast(pl.Int64) for c in columns)
    lf = frame.lazy()
    eps, delta = float(job["epsilon"]), float(job["delta"])
    edges = [int(e) for e in job["median_candidates"]]
    lo_inc, hi_inc = job["bounds"]["income"]
    lo_age, hi_age = job["bounds"]["age"]

    def context(*margins: Any) -> Any:
        return dp.Context.compositor(
            data=lf,
            privacy_unit=dp.unit_of(contributions=1),
            privacy_loss=dp.loss_of(epsilon=eps, delta=delta),
            split_evenly_over=1,
            margins=list(margins),
        )

    # Public: the table's size is not (margins state only an upper bound on it), the
    # keys of `sex` are (as dpgate's declared values are).
    length = dp.polars.Margin(max_length=n)
    sex_keys = dp.polars.Margin(by=["sex"], max_length=n, invariant="keys")
    shapes = {
        "count": lambda: context().query().select(dp.len()),
        "group_public": lambda: context(sex_keys).query().group_by("sex").agg(dp.len()),
        "sum": lambda: (
            context(length).query().select(pl.col("income").fill_null(0).dp.sum((lo_inc, hi_inc)))
        ),
        "avg": lambda: (
            context(length).query().select(pl.col("age").fill_null(0).dp.mean((lo_age, hi_age)))
        ),
        "group_selection": lambda: context().query().group_by("educ").agg(dp.len()),
        "median": lambda: (
            context(length).query().select(pl.col("income").fill_null(0).dp.median(edges))
        ),
        "avg_group": lambda: (
            context(sex_keys)
            .query()
            .group_by("sex")
            .agg(pl.col("income").fill_null(0).dp.mean((lo_inc, hi_inc)))
        ),
    }
    with open(job["out"], "a") as out:
        out.write(json.dumps({"version": f"OpenDP {dp.__version__}"}) + "\n")
        out.flush()
        for name in job["shapes"]:
            build = shapes[name]
            rows_per_rep: list[list[list[float]]] = []
            wall: list[float] = []
            cpu: list[float] = []
            error = None
            try:
                reps, fresh = int(job["reps"]), int(job.get("fresh", 5))
                measurement = None
                for i in range(reps):
                    t, c = time.perf_counter(), time.process_time()
                    if i < fresh:  # a whole release: Context, plan, calibration, noise
                        released = build().release().collect()
                        wall.append(time.perf_counter() - t)
                        cpu.append(time.process_time() - c)
                    else:  # the same measurement again: fresh noise, no re-calibration
                        if measurement is None:
                            measurement = build().resolve()
                        released = measurement(lf).collect()
                    rows_per_rep.append([[float(v) for v in row] for row in released.rows()])
            except Exception as e:  # a shape OpenDP refuses is reported, not fatal
                error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            line = {"shape": name, "answers": rows_per_rep, "wall_s": wall, "cpu_s": cpu}
            out.write(json.dumps({**line, "error": error}) + "\n")
            out.flush()


if __name__ == "__main__":
    main()
