"""The distributed engines under test, on their real engines in this process: ClickHouse
embedded (chDB) and Spark SQL in ``local[2]`` mode. Test modules load their fixture rows
with ``load`` and open the engine as the gateway does, from ``url``.

Both engines are process-wide singletons (chDB holds one data directory per process, a
JVM one SparkSession), so each test process starts each at most once (``chdb_root``,
``spark_warehouse`` are session-scoped) and every test module loads its tables into a
database of its own. Spark's tests share one pytest-xdist worker (``SPARK_GROUP``), so a
``make test`` run starts one JVM.
"""

from __future__ import annotations

import datetime
import json
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

import pytest

Engine = Literal["clickhouse", "spark"]
#: Column kinds as the tests declare them, and their storage type on each engine.
STORAGE: dict[str, dict[str, str]] = {
    "clickhouse": {
        "integer": "Int64",
        "real": "Float64",
        "text": "String",
        "boolean": "Bool",
        "date": "Date32",
        "smallint": "Int16",
        "int": "Int32",
        "bigint": "Int64",
        "float": "Float32",
        "double": "Float64",
    },
    "spark": {
        "integer": "BIGINT",
        "real": "DOUBLE",
        "text": "STRING",
        "boolean": "BOOLEAN",
        "date": "DATE",
        "smallint": "SMALLINT",
        "int": "INT",
        "bigint": "BIGINT",
        "float": "FLOAT",
        "double": "DOUBLE",
    },
}
SLOW = pytest.mark.slow
SPARK_GROUP = pytest.mark.xdist_group("spark")
ENGINES = [
    pytest.param("clickhouse", marks=SLOW),
    pytest.param("spark", marks=[SLOW, SPARK_GROUP]),
]


def chdb_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This process's chDB data directory (created once)."""
    pytest.importorskip("chdb")
    return tmp_path_factory.getbasetemp() / "chdb"


def spark_warehouse(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """This process's SparkSession (created once), as the gateway's driver opens it."""
    pytest.importorskip("pyspark")
    from gateway.engines import spark_dbapi

    warehouse = tmp_path_factory.getbasetemp() / "spark-warehouse"
    spark = spark_dbapi.session(master="local[2]", warehouse=str(warehouse))
    spark.sparkContext.setLogLevel("OFF")
    spark.conf.set("spark.sql.shuffle.partitions", "2")
    return spark


def new_database(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


def url(engine: Engine, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The URL the gateway opens the engine with."""
    if engine == "clickhouse":
        return f"chdb:///{chdb_root(tmp_path_factory)}"
    warehouse = tmp_path_factory.getbasetemp() / "spark-warehouse"
    spark_warehouse(tmp_path_factory)
    return f"spark+local:///{warehouse}?master=local[2]"


def load(
    engine: Engine,
    tmp_path_factory: pytest.TempPathFactory,
    database: str,
    table: str,
    columns: Mapping[str, str],
    rows: Iterable[Mapping[str, Any]],
    *,
    not_null: Iterable[str] = (),
) -> None:
    """Create ``database.table`` with ``columns`` (name → kind of ``STORAGE``; nullable
    unless in ``not_null``) and insert ``rows``."""
    rows = list(rows)
    required = set(not_null)
    if engine == "clickhouse":
        _load_clickhouse(chdb_root(tmp_path_factory), database, table, columns, rows, required)
    else:
        _load_spark(spark_warehouse(tmp_path_factory), database, table, columns, rows, required)


def _load_clickhouse(
    root: Path,
    database: str,
    table: str,
    columns: Mapping[str, str],
    rows: list[Mapping[str, Any]],
    required: set[str],
) -> None:
    import chdb

    conn = chdb.connect(f"file:{root}")
    cursor = conn.cursor()
    types = STORAGE["clickhouse"]
    defs = ", ".join(
        f'"{n}" {types[k] if n in required else f"Nullable({types[k]})"}'
        for n, k in columns.items()
    )
    cursor.execute(f'CREATE DATABASE IF NOT EXISTS "{database}"')
    cursor.execute(
        f'CREATE TABLE "{database}"."{table}" ({defs}) ENGINE = MergeTree ORDER BY tuple()'
    )
    if rows:
        lines = "\n".join(json.dumps({n: _jsonable(r.get(n)) for n in columns}) for r in rows)
        # NaN and ±inf travel as JSON's non-standard literals, which ClickHouse reads.
        cursor.execute(
            f'INSERT INTO "{database}"."{table}" SETTINGS input_format_json_read_numbers_as_strings'
            f" = 1 FORMAT JSONEachRow {lines}"
        )
    conn.close()


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime.date):
        return value.isoformat()
    return value


def _same(value: Any) -> Any:
    return value


def _date(value: Any) -> Any:
    return datetime.date.fromisoformat(value) if isinstance(value, str) else value


def _float(value: Any) -> Any:
    return float(value) if isinstance(value, int) else value


def _load_spark(
    spark: Any,
    database: str,
    table: str,
    columns: Mapping[str, str],
    rows: list[Mapping[str, Any]],
    required: set[str],
) -> None:
    from pyspark.sql.types import StructField, StructType, _parse_datatype_string

    types = STORAGE["spark"]
    schema = StructType(
        [
            StructField(n, _parse_datatype_string(types[k]), n not in required)
            for n, k in columns.items()
        ]
    )
    spark.sql(f"CREATE DATABASE IF NOT EXISTS `{database}`")
    convert = {"date": _date, "real": _float, "float": _float, "double": _float}
    frame = spark.createDataFrame(
        [tuple(convert.get(k, _same)(r.get(n)) for n, k in columns.items()) for r in rows],
        schema,
    )
    frame.write.saveAsTable(f"`{database}`.`{table}`")


def raw_error(engine: Engine, engine_url: str, sql: str) -> str:
    """The engine's own error for ``sql``, for a failing test's message (the drivers
    hide it from everything else, rightly)."""
    try:
        if engine == "clickhouse":
            import chdb

            conn = chdb.connect("file:" + engine_url.removeprefix("chdb:///"))
            conn.cursor().execute(sql)
            conn.close()
        else:
            from pyspark.sql import SparkSession

            active = SparkSession.getActiveSession()
            if active is not None:
                active.sql(sql).collect()
    except Exception as e:
        return f"{type(e).__name__}: {str(e)[:1500]}"
    return "(the statement succeeded when re-run directly)"


def drop_table(
    engine: Engine, tmp_path_factory: pytest.TempPathFactory, database: str, table: str
) -> None:
    """Drop ``database.table`` with a writing connection (not the gateway's)."""
    if engine == "clickhouse":
        import chdb

        conn = chdb.connect(f"file:{chdb_root(tmp_path_factory)}")
        conn.cursor().execute(f'DROP TABLE "{database}"."{table}"')
        conn.close()
    else:
        spark_warehouse(tmp_path_factory).sql(f"DROP TABLE `{database}`.`{table}`")
