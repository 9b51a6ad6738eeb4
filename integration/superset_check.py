"""Drive Apache Superset's own REST API against a running dpgate (run in Superset's venv).

Usage: python superset_check.py DPGATE_SQLALCHEMY_URI REPORT_JSON

What it does, as a user would in the UI:
  1. tests the connection (Databases → + Database → Test connection),
  2. registers the database,
  3. lists schemas and tables, reads the table metadata (dataset creation screen),
  4. creates a dataset on ``main.patients``,
  5. runs a bar-chart query (COUNT(*) by disease, ordered, row limit) through
     ``POST /api/v1/chart/data`` — Superset's own query path (QueryContext →
     SqlaTable.get_sqla_query → dpgate dialect → DB-API cursor),
  6. creates a virtual dataset (defined by an aggregate SQL query) and charts SUM(n)
     and AVG(n) over it — the nested aggregation Superset generates for virtual
     datasets, answered as post-processing of the dataset query's release,
  7. runs an aggregate through SQL Lab (``POST /api/v1/sqllab/execute/``), and a
     row-level ``SELECT *`` that dpgate must refuse, showing what the user sees,
and writes every response (plus the SQL Superset generated) to REPORT_JSON.
Exit status 0 only if steps 1–6 succeed.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

DPGATE_URI, REPORT = sys.argv[1], sys.argv[2]

logging.basicConfig(level=logging.WARNING)
logging.getLogger("dpgate_client").setLevel(logging.DEBUG)

from superset.app import create_app  # noqa: E402

app = create_app()
report: dict[str, Any] = {"steps": []}
failed = False


def step(name: str, response: Any, *, required: bool = True, refusal: bool = False) -> Any:
    """Record one Superset API call; ``refusal`` steps are expected to fail."""
    global failed
    try:
        body = response.get_json()
    except Exception:  # pragma: no cover - diagnostic only
        body = response.data.decode(errors="replace")[:2000]
    ok = (response.status_code >= 400) if refusal else (200 <= response.status_code < 300)
    report["steps"].append({"step": name, "status": response.status_code, "ok": ok, "body": body})
    print(f"[{'ok' if ok else 'FAIL'}] {name}: HTTP {response.status_code}")
    if not ok:
        print(json.dumps(body, indent=2)[:3000])
        if required:
            failed = True
    return body


with app.test_client() as client:
    login = client.post(
        "/api/v1/security/login",
        json={"username": "admin", "password": "admin", "provider": "db", "refresh": True},
    )
    token = login.get_json()["access_token"]
    headers = {"Authorization": f"Bearer {token}"}

    def chart_data(dataset_id: int, query: dict[str, Any], result_type: str) -> Any:
        """One chart's data through Superset's own query path (QueryContext →
        SqlaTable.get_sqla_query → dpgate dialect → DB-API cursor)."""
        return client.post(
            "/api/v1/chart/data",
            json={
                "datasource": {"id": dataset_id, "type": "table"},
                "force": True,
                "queries": [query],
                "result_format": "json",
                "result_type": result_type,
            },
            headers=headers,
        )

    step(
        "test connection",
        client.post(
            "/api/v1/database/test_connection/",
            json={"database_name": "dpgate", "sqlalchemy_uri": DPGATE_URI},
            headers=headers,
        ),
    )
    created = step(
        "register database",
        client.post(
            "/api/v1/database/",
            json={
                "database_name": "dpgate demo",
                "sqlalchemy_uri": DPGATE_URI,
                "expose_in_sqllab": True,
            },
            headers=headers,
        ),
    )
    db_id = created.get("id") if isinstance(created, dict) else None
    if db_id is None:
        with open(REPORT, "w") as f:
            json.dump(report, f, indent=2, default=str)
        sys.exit(1)
    step("list schemas", client.get(f"/api/v1/database/{db_id}/schemas/", headers=headers))
    step(
        "list tables",
        client.get(f"/api/v1/database/{db_id}/tables/?q=(schema_name:main)", headers=headers),
    )
    step(
        "table metadata",
        client.get(
            f"/api/v1/database/{db_id}/table_metadata/?name=patients&schema=main",
            headers=headers,
        ),
    )
    step(
        "select star (preview SQL text)",
        client.get(f"/api/v1/database/{db_id}/select_star/patients/main/", headers=headers),
        required=False,
    )
    dataset = step(
        "create dataset main.patients",
        client.post(
            "/api/v1/dataset/",
            json={"database": db_id, "schema": "main", "table_name": "patients"},
            headers=headers,
        ),
    )
    ds_id = dataset.get("id") if isinstance(dataset, dict) else None
    if ds_id is not None:
        query = {
            "columns": ["disease"],
            "metrics": [{"expressionType": "SQL", "sqlExpression": "COUNT(*)", "label": "count"}],
            "orderby": [
                [{"expressionType": "SQL", "sqlExpression": "COUNT(*)", "label": "count"}, False]
            ],
            "row_limit": 10000,
            "filters": [{"col": "age", "op": ">=", "val": 18}],
        }
        for result_type in ("query", "full"):
            step(
                f"bar chart COUNT(*) BY disease (chart/data, result_type={result_type})",
                chart_data(ds_id, query, result_type),
            )
    if ds_id is not None:
        step(
            "filter values for disease (native filter dropdown)",
            client.get(f"/api/v1/datasource/table/{ds_id}/column/disease/values/", headers=headers),
            required=False,
        )
        # The Samples pane is a classic view: it needs a browser session, not the JWT.
        client.post("/login/", data={"username": "admin", "password": "admin"})
        samples = step(
            "dataset samples pane (row-level; dpgate should refuse)",
            client.post(
                f"/datasource/samples?datasource_id={ds_id}&datasource_type=table",
                json={},
            ),
            required=False,
            refusal=True,
        )
        print("  samples pane shows:", json.dumps(samples, ensure_ascii=False)[:400])
    # A virtual dataset (defined by SQL) and a chart over it: Superset wraps the
    # dataset's SQL as a subquery and aggregates over it (nested aggregation). dpgate
    # answers (and charges) the dataset's query once; the charts are post-processing.
    virtual = step(
        "create virtual dataset (SQL: disease, sex, COUNT(*) AS n FROM patients)",
        client.post(
            "/api/v1/dataset/",
            json={
                "database": db_id,
                "schema": "main",
                "table_name": "patients_by_disease_sex",
                "sql": "SELECT disease, sex, COUNT(*) AS n FROM patients GROUP BY disease, sex",
            },
            headers=headers,
        ),
    )
    vds_id = virtual.get("id") if isinstance(virtual, dict) else None
    if vds_id is not None:
        sum_n = {
            "expressionType": "SIMPLE",
            "column": {"column_name": "n", "type": "INTEGER"},
            "aggregate": "SUM",
            "label": "SUM(n)",
        }
        charts = {
            "bar chart SUM(n) BY disease over the virtual dataset": {
                "columns": ["disease"],
                "metrics": [sum_n],
                "orderby": [[sum_n, False]],
                "row_limit": 10000,
            },
            "bar chart SUM(n), AVG(n) BY sex over the virtual dataset, filtered": {
                "columns": ["sex"],
                "metrics": [
                    sum_n,
                    {
                        "expressionType": "SIMPLE",
                        "column": {"column_name": "n", "type": "INTEGER"},
                        "aggregate": "AVG",
                        "label": "AVG(n)",
                    },
                ],
                "orderby": [["sex", True]],
                "row_limit": 10000,
                "filters": [{"col": "disease", "op": "IN", "val": ["Crohn", "Influenza"]}],
            },
        }
        for name, query in charts.items():
            for result_type in ("query", "full"):
                body = step(
                    f"{name} (chart/data, result_type={result_type})",
                    chart_data(vds_id, query, result_type),
                )
                result = (body.get("result") or [{}])[0] if isinstance(body, dict) else {}
                if result_type == "query":
                    print("  SQL Superset generated:", result.get("query"))
                else:
                    data = result.get("data") or []
                    print(f"  {len(data)} rows:", json.dumps(data[:4]))
                    if not data or "SUM(n)" not in data[0]:
                        print("  [FAIL] the chart over the virtual dataset returned no SUM(n)")
                        failed = True
    step(
        "SQL Lab aggregate",
        client.post(
            "/api/v1/sqllab/execute/",
            json={
                "database_id": db_id,
                "sql": "SELECT sex, COUNT(*) AS n FROM patients GROUP BY sex",
                "schema": "main",
                "runAsync": False,
                "client_id": "dpgateIT1",
            },
            headers=headers,
        ),
        required=False,
    )

    refused = step(
        "SQL Lab row-level preview (dpgate must refuse it)",
        client.post(
            "/api/v1/sqllab/execute/",
            json={
                "database_id": db_id,
                "sql": "SELECT * FROM main.patients LIMIT 100",
                "schema": "main",
                "runAsync": False,
                "client_id": "dpgateIT2",
            },
            headers=headers,
        ),
        refusal=True,
    )
    shown = json.dumps(refused, ensure_ascii=False)
    print("  what the SQL Lab user sees:", shown[:600])
    # The gateway's own words (a dry run of a refused query is refused the same way).
    from dpgate_client import dbapi as dpgate_dbapi
    from dpgate_client import errors as dpgate_errors

    try:
        dpgate_dbapi.connect(DPGATE_URI).cursor().execute(
            "SELECT * FROM main.patients LIMIT 100001", dry_run=True
        )
        expected = "(dpgate answered the row-level query!)"
    except dpgate_errors.UnsupportedQueryError as exc:
        expected = exc.message
    report["refusal_expected_message"] = expected
    if expected not in json.loads(shown)["errors"][0]["message"]:
        print(f"  [FAIL] the user did not see dpgate's explanation: {expected!r}")
        failed = True

report["ok"] = not failed
with open(REPORT, "w") as f:
    json.dump(report, f, indent=2, default=str)
sys.exit(1 if failed else 0)
