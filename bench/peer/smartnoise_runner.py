"""Runs the PUMS query list through SmartNoise SQL. Executed by the SmartNoise virtualenv's
interpreter (``bench.peer.smartnoise`` starts it), so it imports nothing from dpgate or
from the bench package: a JSON job on stdin, a JSON result on stdout.

Job: {"csv", "yaml", "epsilon", "delta", "reps", "warmup",
      "queries": [{"name", "sql"}]}
Result: {"version", "setup_s", "queries": [{"name", "accepted", "error",
         "latencies_s": [...], "answers": [[row, ...], ...]}]}
"""

from __future__ import annotations

import json
import sys
import time


def main() -> None:
    job = json.load(sys.stdin)
    import pandas as pd
    import snsql
    from snsql import Privacy

    t0 = time.perf_counter()
    df = pd.read_csv(job["csv"])
    privacy = Privacy(epsilon=float(job["epsilon"]), delta=float(job["delta"]))
    reader = snsql.from_df(df, privacy=privacy, metadata=job["yaml"])
    setup_s = time.perf_counter() - t0

    out = []
    for q in job["queries"]:
        entry: dict = {"name": q["name"], "accepted": True, "error": None}
        try:  # what SmartNoise's own odometer charges for this query at Privacy(ε, δ)
            eps, delta = reader.get_privacy_cost(q["sql"])
            entry["privacy_cost"] = [float(eps), float(delta)]
        except Exception:
            entry["privacy_cost"] = None
        lat: list[float] = []
        answers: list = []
        try:
            for i in range(int(job["warmup"]) + int(job["reps"])):
                t = time.perf_counter()
                res = reader.execute(q["sql"])
                dt = time.perf_counter() - t
                if i >= int(job["warmup"]):
                    lat.append(dt)
                    answers.append([[_plain(v) for v in row] for row in res[1:]])
        except Exception as e:  # any refusal is a finding, not a crash
            entry["accepted"] = False
            entry["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        entry["latencies_s"] = lat
        entry["answers"] = answers
        out.append(entry)

    version = getattr(snsql, "__version__", None)
    if version is None:
        from importlib.metadata import version as _v

        version = _v("smartnoise-sql")
    json.dump({"version": version, "setup_s": setup_s, "queries": out}, sys.stdout)


def _plain(v: object) -> object:
    if v is None or isinstance(v, (str, int, float, bool)):
        return v
    try:
        return float(v)  # numpy scalars
    except (TypeError, ValueError):
        return str(v)


if __name__ == "__main__":
    main()
