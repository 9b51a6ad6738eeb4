"""``dpgate serve`` on ``spark+local://`` as an operator runs it: tables loaded into a
warehouse by another process are found through the persistent catalogue (``metastore=``
in the URL), and every line dpgate writes to stderr while serving is a JSON line — the
JVM's own output (log4j, progress bars, the JVM's warnings) goes to ``engine_log``.

Two JVMs start here (the loader, then the gateway's): the machine runs one at a time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests import engines
from tests.test_serve import (
    ADMIN_KEY,
    Server,
    free_port,
    make_analyst,
    serve_command,
    stop,
)

pytestmark = [engines.SLOW, engines.SPARK_GROUP]
READY_S = 300  # a JVM's start on a loaded machine

LOADER = textwrap.dedent(
    """
    import sys
    from gateway.sql.engines import spark_dbapi

    warehouse, metastore, log = sys.argv[1:]
    spark = spark_dbapi.session("local[1]", warehouse=warehouse, metastore=metastore,
                                engine_log=log)
    spark.sql("CREATE DATABASE IF NOT EXISTS clinic")
    rows = [(pid, "cardio" if pid % 3 else "neuro", pid % 9) for pid in range(1, 301)]
    frame = spark.createDataFrame(rows, "pid BIGINT, dept STRING, stay BIGINT")
    frame.write.saveAsTable("clinic.stays")
    spark.stop()
    """
)


def test_a_persistent_catalogue_serves_tables_loaded_elsewhere_with_json_logs(
    tmp_path: Path,
) -> None:
    pytest.importorskip("pyspark")
    warehouse, metastore = tmp_path / "warehouse", tmp_path / "metastore"
    engine_log = tmp_path / "spark-engine.log"
    loaded = subprocess.run(
        [sys.executable, "-c", LOADER, str(warehouse), str(metastore), str(engine_log)],
        capture_output=True,
        timeout=READY_S,
        cwd=tmp_path,
    )
    assert loaded.returncode == 0, loaded.stderr.decode(errors="replace")[-3000:]
    assert not (tmp_path / "derby.log").exists()  # Derby's log stays in the metastore

    url = (
        f"spark+local:///{warehouse}?master=local[1]&metastore={metastore}&engine_log={engine_log}"
    )
    config = tmp_path / "dpgate.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "database": {"url": url, "statement_timeout_ms": READY_S * 1000},
                "ledger": {"url": f"sqlite:///{tmp_path / 'ledger.db'}"},
                "execution": {"timing": "off"},
                "tables": {
                    "stays": {
                        "schema": "clinic",
                        "privacy_unit": "pid",
                        "columns": {
                            "pid": {"type": "integer"},
                            "dept": {
                                "type": "text",
                                "values": ["cardio", "neuro"],
                                "nullable": False,  # Spark writes every column nullable
                            },
                            "stay": {"type": "integer", "lower": 0, "upper": 10},
                        },
                    }
                },
            }
        )
    )
    key = make_analyst(tmp_path)
    port = free_port()
    out, err = (tmp_path / "stdout.log").open("wb"), (tmp_path / "stderr.log").open("wb")
    process = subprocess.Popen(
        serve_command(config, port, 1),
        stdout=out,
        stderr=err,
        cwd=tmp_path,
        env={**os.environ, "DPGATE_ADMIN_KEY": ADMIN_KEY},
    )
    server = Server(root=tmp_path, port=port, process=process, log_path=tmp_path / "stderr.log")
    try:
        _wait_ready(server)
        status, body = _query(server, "SELECT dept, COUNT(*) FROM stays GROUP BY dept", key)
        assert status == 200, body
        counts = {row[0]: row[1] for row in body["rows"]}
        assert set(counts) == {"cardio", "neuro"}
        assert abs(counts["cardio"] - 200) < 60 and abs(counts["neuro"] - 100) < 60
    finally:
        stop(server)
    lines = [line for line in (tmp_path / "stderr.log").read_text().splitlines() if line.strip()]
    assert lines, "dpgate wrote nothing"
    not_json = [line for line in lines if not _is_json_object(line)]
    assert not not_json, "\n".join(not_json[:20])
    assert any(json.loads(line).get("logger") == "dpgate.access" for line in lines)
    warnings = [json.loads(line) for line in lines if json.loads(line)["level"] == "warning"]
    assert not warnings, warnings  # nothing expected is a warning
    assert engine_log.exists() and engine_log.stat().st_size > 0  # the JVM's own stream
    assert "dpgate.access" not in (tmp_path / "stdout.log").read_text()  # written once


def _query(server: Server, sql: str, key: str) -> tuple[int, Any]:
    """POST /v1/query, waiting as long as a cold JVM may take (Server.call gives 15 s)."""
    request = urllib.request.Request(
        server.url + "/v1/query",
        data=json.dumps({"sql": sql, "epsilon": 1.0}).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=READY_S) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _wait_ready(server: Server) -> None:
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise AssertionError(f"dpgate serve exited:\n{server.log_path.read_text()[-3000:]}")
        try:
            if server.call("GET", "/readyz")[0] == 200:
                return
        except OSError:
            pass
        time.sleep(1)
    raise AssertionError(f"not ready:\n{server.log_path.read_text()[-3000:]}")


def _is_json_object(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False
