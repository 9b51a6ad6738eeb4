"""The emulated PostgreSQL server itself: its version, database and owner, the OIDs of its
schemas, its types, and the settings clients read (SHOW, current_setting) or are told at
startup (ParameterStatus).

PostgreSQL's own names and values (PostgreSQL documentation, "System Catalogs"); the
tables of the catalogue are in ``gateway.pgwire.catalog_tables``. Nothing here is
computed from data.
"""

from __future__ import annotations

from gateway import POSTGRES_VERSION

PG_VERSION = POSTGRES_VERSION
SERVER_VERSION_NUM = "150000"
DATABASE = "dpgate"
OWNER = "dpgate"

PG_CATALOG_OID = 11
PUBLIC_OID = 2200
INFORMATION_SCHEMA_OID = 13_000
FIRST_USER_OID = 16_384

#: (oid, typname, typlen, category, array oid, element oid, display name)
PG_TYPES: tuple[tuple[int, str, int, str, int, int, str], ...] = (
    (16, "bool", 1, "B", 1000, 0, "boolean"),
    (17, "bytea", -1, "U", 1001, 0, "bytea"),
    (18, "char", 1, "Z", 1002, 0, '"char"'),
    (19, "name", 64, "S", 1003, 0, "name"),
    (20, "int8", 8, "N", 1016, 0, "bigint"),
    (21, "int2", 2, "N", 1005, 0, "smallint"),
    (22, "int2vector", -1, "A", 1006, 21, "int2vector"),
    (23, "int4", 4, "N", 1007, 0, "integer"),
    (24, "regproc", 4, "N", 1008, 0, "regproc"),
    (25, "text", -1, "S", 1009, 0, "text"),
    (26, "oid", 4, "N", 1028, 0, "oid"),
    (30, "oidvector", -1, "A", 1013, 26, "oidvector"),
    (114, "json", -1, "U", 199, 0, "json"),
    (700, "float4", 4, "N", 1021, 0, "real"),
    (701, "float8", 8, "N", 1022, 0, "double precision"),
    (1042, "bpchar", -1, "S", 1014, 0, "character"),
    (1043, "varchar", -1, "S", 1015, 0, "character varying"),
    (1082, "date", 4, "D", 1182, 0, "date"),
    (1083, "time", 8, "D", 1183, 0, "time without time zone"),
    (1114, "timestamp", 8, "D", 1115, 0, "timestamp without time zone"),
    (1184, "timestamptz", 8, "D", 1185, 0, "timestamp with time zone"),
    (1186, "interval", 16, "T", 1187, 0, "interval"),
    (1700, "numeric", -1, "N", 1231, 0, "numeric"),
    (2205, "regclass", 4, "N", 2210, 0, "regclass"),
    (2206, "regtype", 4, "N", 2211, 0, "regtype"),
    (2950, "uuid", 16, "U", 2951, 0, "uuid"),
    (3802, "jsonb", -1, "U", 3807, 0, "jsonb"),
    (1000, "_bool", -1, "A", 0, 16, "boolean[]"),
    (1005, "_int2", -1, "A", 0, 21, "smallint[]"),
    (1007, "_int4", -1, "A", 0, 23, "integer[]"),
    (1009, "_text", -1, "A", 0, 25, "text[]"),
    (1015, "_varchar", -1, "A", 0, 1043, "character varying[]"),
    (1016, "_int8", -1, "A", 0, 20, "bigint[]"),
    (1021, "_float4", -1, "A", 0, 700, "real[]"),
    (1022, "_float8", -1, "A", 0, 701, "double precision[]"),
    (1028, "_oid", -1, "A", 0, 26, "oid[]"),
    (1182, "_date", -1, "A", 0, 1082, "date[]"),
)

#: dpgate's column types as PostgreSQL types: (oid, size). Integers are int8 (a noisy
#: count or a declared integer column may exceed int4), reals float8.
TYPE_OF_VALUE: dict[str, tuple[int, int]] = {
    "integer": (20, 8),
    "real": (701, 8),
    "text": (25, -1),
    "boolean": (16, 1),
    "date": (1082, 4),
}


#: Settings clients read with SHOW or current_setting (and may SET for their session).
SETTINGS: dict[str, str] = {
    "server_version": PG_VERSION,
    "server_version_num": SERVER_VERSION_NUM,
    "server_encoding": "UTF8",
    "client_encoding": "UTF8",
    "DateStyle": "ISO, MDY",
    "IntervalStyle": "postgres",
    "TimeZone": "UTC",
    "integer_datetimes": "on",
    "standard_conforming_strings": "on",
    "is_superuser": "off",
    "search_path": '"$user", public',
    "transaction_isolation": "read committed",
    "default_transaction_isolation": "read committed",
    "default_transaction_read_only": "on",
    "transaction_read_only": "on",
    "max_identifier_length": "63",
    "max_index_keys": "32",
    "lc_collate": "C.UTF-8",
    "lc_ctype": "C.UTF-8",
    "extra_float_digits": "1",
    "application_name": "",
    "statement_timeout": "0",
    "default_tablespace": "",
    "bytea_output": "hex",
    "in_hot_standby": "off",
}

#: Settings reported to the client at startup (ParameterStatus).
REPORTED = (
    "server_version",
    "server_encoding",
    "client_encoding",
    "DateStyle",
    "IntervalStyle",
    "TimeZone",
    "integer_datetimes",
    "standard_conforming_strings",
    "is_superuser",
    "application_name",
    "default_transaction_read_only",
    "in_hot_standby",
)
