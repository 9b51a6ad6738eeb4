"""CPU per release of issue 34's shapes, for whichever dpgate tree is on ``PYTHONPATH``.

Runs that tree's own ``bench.accuracy.run_dpgate`` (PUMS, in process, every release a
cache miss with a durable ledger charge) with its ``InProcess.query`` wrapped to time
``time.process_time()`` per release, and prints one JSON line: each shape's median CPU
ms per release (the warm-up release left out). Run as a file, so that an older tree,
which has no such module, can be measured by it too; alternate the trees, one CPU each:

    PYTHONPATH=/path/to/old DPGATE_BENCH_DATA=/tmp/bd-old taskset -c 1 \\
        .venv/bin/python bench/release_cpu.py 200 [count,sum,...]
    PYTHONPATH=. DPGATE_BENCH_DATA=/tmp/bd-new taskset -c 1 \\
        .venv/bin/python bench/release_cpu.py 200
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def main() -> None:
    import bench.accuracy as accuracy
    import bench.adapter as adapter

    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    if len(sys.argv) > 2:
        accuracy.SHAPES = {k: accuracy.SHAPES[k] for k in sys.argv[2].split(",")}
    cpu: dict[str, list[float]] = {}
    query = adapter.InProcess.query

    def shape_of(sql: str) -> str:
        for name, (text, _) in accuracy.SHAPES.items():
            grouped = " GROUP BY" in text
            if sql.startswith(text.split(" GROUP BY")[0]) and grouped == (" GROUP BY" in sql):
                return name
        return "?"

    def timed(self: Any, analyst: str, sql: str, epsilon: float = 1.0) -> Any:
        started = time.process_time()
        answer = query(self, analyst, sql, epsilon)
        cpu.setdefault(shape_of(sql), []).append(time.process_time() - started)
        return answer

    adapter.InProcess.query = timed  # type: ignore[method-assign]
    accuracy.InProcess = adapter.InProcess
    if hasattr(accuracy, "dataset"):  # the bench as it is now
        out = Path(tempfile.mkdtemp()) / "answers.jsonl"
        accuracy.run_dpgate(accuracy.dataset("pums", 1000), reps, list(accuracy.SHAPES), out)
    else:  # the bench as issue 34 first committed it (7f0ff5d)
        accuracy.run_dpgate(reps)
    medians = {k: round(1000 * statistics.median(v[1:]), 3) for k, v in cpu.items()}
    print(json.dumps({"tree": os.environ.get("PYTHONPATH", "."), **medians}))


if __name__ == "__main__":
    main()
