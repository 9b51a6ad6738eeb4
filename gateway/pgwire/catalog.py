"""The emulated PostgreSQL catalogue: what BI tools ask on connect, answered from the config.

Clients learn what a database holds from ``pg_catalog`` and ``information_schema``.
dpgate never asks the protected database: its catalogue carries row estimates
(``pg_class.reltuples``, ``relpages``, ``pg_stats``) computed from the protected rows.
Instead an in-memory DuckDB database holds tables named and shaped like PostgreSQL's
catalogue, filled from the declared tables and columns only — public by declaration
(docs/design.md, invariant 5: only what is declared public is published). Row estimates
are PostgreSQL's "never analysed" values (``reltuples = -1``, ``relpages = 0``).

Client SQL reaches it only through ``gateway.pgwire.rewrite``, which maps catalogue
names onto these tables and refuses anything else. The DuckDB connection cannot read
files or the network (``enable_external_access = false``, locked), runs one thread,
has a memory cap, and each statement is interrupted after ``STATEMENT_TIMEOUT_S``.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import duckdb

import gateway
from gateway.config import Config

PG_VERSION = "15.0"
SERVER_VERSION_NUM = "150000"
VERSION_TEXT = f"PostgreSQL {PG_VERSION} (dpgate {gateway.__version__}, differentially private)"
DATABASE = "dpgate"
OWNER = "dpgate"
STATEMENT_TIMEOUT_S = 2.0
MAX_ROWS = 100_000

CATALOG_SCHEMA = "pgc"  # pg_catalog's emulation
INFO_SCHEMA = "isc"  # information_schema's emulation

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

_C = tuple[str, str]  # column name, DuckDB type

#: The emulated tables: name → columns. Values not given for a row are NULL, or the
#: column's default below.
CATALOG_TABLES: dict[str, tuple[_C, ...]] = {
    "pg_namespace": (
        ("oid", "UINTEGER"),
        ("nspname", "VARCHAR"),
        ("nspowner", "UINTEGER"),
        ("nspacl", "VARCHAR"),
    ),
    "pg_class": (
        ("oid", "UINTEGER"),
        ("relname", "VARCHAR"),
        ("relnamespace", "UINTEGER"),
        ("reltype", "UINTEGER"),
        ("reloftype", "UINTEGER"),
        ("relowner", "UINTEGER"),
        ("relam", "UINTEGER"),
        ("relfilenode", "UINTEGER"),
        ("reltablespace", "UINTEGER"),
        ("relpages", "INTEGER"),
        ("reltuples", "FLOAT"),
        ("relallvisible", "INTEGER"),
        ("reltoastrelid", "UINTEGER"),
        ("relhasindex", "BOOLEAN"),
        ("relisshared", "BOOLEAN"),
        ("relpersistence", "VARCHAR"),
        ("relkind", "VARCHAR"),
        ("relnatts", "SMALLINT"),
        ("relchecks", "SMALLINT"),
        ("relhasrules", "BOOLEAN"),
        ("relhastriggers", "BOOLEAN"),
        ("relhassubclass", "BOOLEAN"),
        ("relrowsecurity", "BOOLEAN"),
        ("relforcerowsecurity", "BOOLEAN"),
        ("relispopulated", "BOOLEAN"),
        ("relreplident", "VARCHAR"),
        ("relispartition", "BOOLEAN"),
        ("relrewrite", "UINTEGER"),
        ("relfrozenxid", "UINTEGER"),
        ("relminmxid", "UINTEGER"),
        ("relacl", "VARCHAR[]"),
        ("reloptions", "VARCHAR[]"),
        ("relpartbound", "VARCHAR"),
        ("relhasoids", "BOOLEAN"),
    ),
    "pg_attribute": (
        ("attrelid", "UINTEGER"),
        ("attname", "VARCHAR"),
        ("atttypid", "UINTEGER"),
        ("attstattarget", "INTEGER"),
        ("attlen", "SMALLINT"),
        ("attnum", "SMALLINT"),
        ("attndims", "INTEGER"),
        ("attcacheoff", "INTEGER"),
        ("atttypmod", "INTEGER"),
        ("attbyval", "BOOLEAN"),
        ("attalign", "VARCHAR"),
        ("attstorage", "VARCHAR"),
        ("attcompression", "VARCHAR"),
        ("attnotnull", "BOOLEAN"),
        ("atthasdef", "BOOLEAN"),
        ("atthasmissing", "BOOLEAN"),
        ("attidentity", "VARCHAR"),
        ("attgenerated", "VARCHAR"),
        ("attisdropped", "BOOLEAN"),
        ("attislocal", "BOOLEAN"),
        ("attinhcount", "INTEGER"),
        ("attcollation", "UINTEGER"),
        ("attacl", "VARCHAR[]"),
        ("attoptions", "VARCHAR[]"),
        ("attfdwoptions", "VARCHAR[]"),
        ("attmissingval", "VARCHAR"),
    ),
    "pg_type": (
        ("oid", "UINTEGER"),
        ("typname", "VARCHAR"),
        ("typnamespace", "UINTEGER"),
        ("typowner", "UINTEGER"),
        ("typlen", "SMALLINT"),
        ("typbyval", "BOOLEAN"),
        ("typtype", "VARCHAR"),
        ("typcategory", "VARCHAR"),
        ("typispreferred", "BOOLEAN"),
        ("typisdefined", "BOOLEAN"),
        ("typdelim", "VARCHAR"),
        ("typrelid", "UINTEGER"),
        ("typsubscript", "VARCHAR"),
        ("typelem", "UINTEGER"),
        ("typarray", "UINTEGER"),
        ("typinput", "VARCHAR"),
        ("typoutput", "VARCHAR"),
        ("typreceive", "VARCHAR"),
        ("typsend", "VARCHAR"),
        ("typmodin", "VARCHAR"),
        ("typmodout", "VARCHAR"),
        ("typanalyze", "VARCHAR"),
        ("typalign", "VARCHAR"),
        ("typstorage", "VARCHAR"),
        ("typnotnull", "BOOLEAN"),
        ("typbasetype", "UINTEGER"),
        ("typtypmod", "INTEGER"),
        ("typndims", "INTEGER"),
        ("typcollation", "UINTEGER"),
        ("typdefaultbin", "VARCHAR"),
        ("typdefault", "VARCHAR"),
        ("typacl", "VARCHAR[]"),
    ),
    "pg_database": (
        ("oid", "UINTEGER"),
        ("datname", "VARCHAR"),
        ("datdba", "UINTEGER"),
        ("encoding", "INTEGER"),
        ("datlocprovider", "VARCHAR"),
        ("datistemplate", "BOOLEAN"),
        ("datallowconn", "BOOLEAN"),
        ("datconnlimit", "INTEGER"),
        ("datfrozenxid", "UINTEGER"),
        ("datminmxid", "UINTEGER"),
        ("dattablespace", "UINTEGER"),
        ("datcollate", "VARCHAR"),
        ("datctype", "VARCHAR"),
        ("daticulocale", "VARCHAR"),
        ("datcollversion", "VARCHAR"),
        ("datacl", "VARCHAR[]"),
    ),
    "pg_settings": (
        ("name", "VARCHAR"),
        ("setting", "VARCHAR"),
        ("unit", "VARCHAR"),
        ("category", "VARCHAR"),
        ("short_desc", "VARCHAR"),
        ("extra_desc", "VARCHAR"),
        ("context", "VARCHAR"),
        ("vartype", "VARCHAR"),
        ("source", "VARCHAR"),
        ("min_val", "VARCHAR"),
        ("max_val", "VARCHAR"),
        ("enumvals", "VARCHAR[]"),
        ("boot_val", "VARCHAR"),
        ("reset_val", "VARCHAR"),
        ("sourcefile", "VARCHAR"),
        ("sourceline", "INTEGER"),
        ("pending_restart", "BOOLEAN"),
    ),
    "pg_am": (
        ("oid", "UINTEGER"),
        ("amname", "VARCHAR"),
        ("amhandler", "VARCHAR"),
        ("amtype", "VARCHAR"),
    ),
    "pg_roles": (
        ("oid", "UINTEGER"),
        ("rolname", "VARCHAR"),
        ("rolsuper", "BOOLEAN"),
        ("rolinherit", "BOOLEAN"),
        ("rolcreaterole", "BOOLEAN"),
        ("rolcreatedb", "BOOLEAN"),
        ("rolcanlogin", "BOOLEAN"),
        ("rolreplication", "BOOLEAN"),
        ("rolconnlimit", "INTEGER"),
        ("rolpassword", "VARCHAR"),
        ("rolvaliduntil", "VARCHAR"),
        ("rolbypassrls", "BOOLEAN"),
        ("rolconfig", "VARCHAR[]"),
    ),
    "pg_tablespace": (
        ("oid", "UINTEGER"),
        ("spcname", "VARCHAR"),
        ("spcowner", "UINTEGER"),
        ("spcacl", "VARCHAR[]"),
        ("spcoptions", "VARCHAR[]"),
    ),
    "pg_collation": (
        ("oid", "UINTEGER"),
        ("collname", "VARCHAR"),
        ("collnamespace", "UINTEGER"),
        ("collowner", "UINTEGER"),
        ("collprovider", "VARCHAR"),
        ("collisdeterministic", "BOOLEAN"),
        ("collencoding", "INTEGER"),
        ("collcollate", "VARCHAR"),
        ("collctype", "VARCHAR"),
    ),
    "pg_index": (
        ("indexrelid", "UINTEGER"),
        ("indrelid", "UINTEGER"),
        ("indnatts", "SMALLINT"),
        ("indnkeyatts", "SMALLINT"),
        ("indisunique", "BOOLEAN"),
        ("indisprimary", "BOOLEAN"),
        ("indisexclusion", "BOOLEAN"),
        ("indimmediate", "BOOLEAN"),
        ("indisclustered", "BOOLEAN"),
        ("indisvalid", "BOOLEAN"),
        ("indcheckxmin", "BOOLEAN"),
        ("indisready", "BOOLEAN"),
        ("indislive", "BOOLEAN"),
        ("indisreplident", "BOOLEAN"),
        ("indkey", "SMALLINT[]"),
        ("indcollation", "UINTEGER[]"),
        ("indclass", "UINTEGER[]"),
        ("indoption", "SMALLINT[]"),
        ("indexprs", "VARCHAR"),
        ("indpred", "VARCHAR"),
        ("indnullsnotdistinct", "BOOLEAN"),
    ),
    "pg_attrdef": (
        ("oid", "UINTEGER"),
        ("adrelid", "UINTEGER"),
        ("adnum", "SMALLINT"),
        ("adbin", "VARCHAR"),
    ),
    "pg_description": (
        ("objoid", "UINTEGER"),
        ("classoid", "UINTEGER"),
        ("objsubid", "INTEGER"),
        ("description", "VARCHAR"),
    ),
    "pg_shdescription": (
        ("objoid", "UINTEGER"),
        ("classoid", "UINTEGER"),
        ("description", "VARCHAR"),
    ),
    "pg_constraint": (
        ("oid", "UINTEGER"),
        ("conname", "VARCHAR"),
        ("connamespace", "UINTEGER"),
        ("contype", "VARCHAR"),
        ("condeferrable", "BOOLEAN"),
        ("condeferred", "BOOLEAN"),
        ("convalidated", "BOOLEAN"),
        ("conrelid", "UINTEGER"),
        ("contypid", "UINTEGER"),
        ("conindid", "UINTEGER"),
        ("conparentid", "UINTEGER"),
        ("confrelid", "UINTEGER"),
        ("confupdtype", "VARCHAR"),
        ("confdeltype", "VARCHAR"),
        ("confmatchtype", "VARCHAR"),
        ("conislocal", "BOOLEAN"),
        ("coninhcount", "INTEGER"),
        ("connoinherit", "BOOLEAN"),
        ("conkey", "SMALLINT[]"),
        ("confkey", "SMALLINT[]"),
        ("conbin", "VARCHAR"),
    ),
    "pg_inherits": (
        ("inhrelid", "UINTEGER"),
        ("inhparent", "UINTEGER"),
        ("inhseqno", "INTEGER"),
        ("inhdetachpending", "BOOLEAN"),
    ),
    "pg_proc": (
        ("oid", "UINTEGER"),
        ("proname", "VARCHAR"),
        ("pronamespace", "UINTEGER"),
        ("proowner", "UINTEGER"),
        ("prokind", "VARCHAR"),
        ("prorettype", "UINTEGER"),
        ("proargtypes", "UINTEGER[]"),
        ("prosrc", "VARCHAR"),
    ),
    "pg_extension": (
        ("oid", "UINTEGER"),
        ("extname", "VARCHAR"),
        ("extowner", "UINTEGER"),
        ("extnamespace", "UINTEGER"),
        ("extrelocatable", "BOOLEAN"),
        ("extversion", "VARCHAR"),
    ),
    "pg_policy": (
        ("oid", "UINTEGER"),
        ("polname", "VARCHAR"),
        ("polrelid", "UINTEGER"),
        ("polcmd", "VARCHAR"),
        ("polpermissive", "BOOLEAN"),
        ("polroles", "UINTEGER[]"),
        ("polqual", "VARCHAR"),
        ("polwithcheck", "VARCHAR"),
    ),
    "pg_statistic_ext": (
        ("oid", "UINTEGER"),
        ("stxrelid", "UINTEGER"),
        ("stxname", "VARCHAR"),
        ("stxnamespace", "UINTEGER"),
        ("stxowner", "UINTEGER"),
        ("stxstattarget", "INTEGER"),
        ("stxkeys", "SMALLINT[]"),
        ("stxkind", "VARCHAR[]"),
        ("stxexprs", "VARCHAR"),
    ),
    "pg_publication": (
        ("oid", "UINTEGER"),
        ("pubname", "VARCHAR"),
        ("pubowner", "UINTEGER"),
        ("puballtables", "BOOLEAN"),
        ("pubinsert", "BOOLEAN"),
        ("pubupdate", "BOOLEAN"),
        ("pubdelete", "BOOLEAN"),
        ("pubtruncate", "BOOLEAN"),
        ("pubviaroot", "BOOLEAN"),
    ),
    "pg_publication_rel": (
        ("oid", "UINTEGER"),
        ("prpubid", "UINTEGER"),
        ("prrelid", "UINTEGER"),
        ("prqual", "VARCHAR"),
        ("prattrs", "SMALLINT[]"),
    ),
    "pg_publication_namespace": (
        ("oid", "UINTEGER"),
        ("pnpubid", "UINTEGER"),
        ("pnnspid", "UINTEGER"),
    ),
    "pg_trigger": (
        ("oid", "UINTEGER"),
        ("tgrelid", "UINTEGER"),
        ("tgparentid", "UINTEGER"),
        ("tgname", "VARCHAR"),
        ("tgfoid", "UINTEGER"),
        ("tgtype", "SMALLINT"),
        ("tgenabled", "VARCHAR"),
        ("tgisinternal", "BOOLEAN"),
    ),
    "pg_rewrite": (
        ("oid", "UINTEGER"),
        ("rulename", "VARCHAR"),
        ("ev_class", "UINTEGER"),
        ("ev_type", "VARCHAR"),
        ("ev_enabled", "VARCHAR"),
        ("is_instead", "BOOLEAN"),
    ),
    "pg_foreign_table": (
        ("ftrelid", "UINTEGER"),
        ("ftserver", "UINTEGER"),
        ("ftoptions", "VARCHAR[]"),
    ),
    "pg_partitioned_table": (
        ("partrelid", "UINTEGER"),
        ("partstrat", "VARCHAR"),
        ("partnatts", "SMALLINT"),
    ),
    "pg_enum": (
        ("oid", "UINTEGER"),
        ("enumtypid", "UINTEGER"),
        ("enumsortorder", "FLOAT"),
        ("enumlabel", "VARCHAR"),
    ),
    "pg_range": (("rngtypid", "UINTEGER"), ("rngsubtype", "UINTEGER")),
    "pg_sequence": (
        ("seqrelid", "UINTEGER"),
        ("seqtypid", "UINTEGER"),
        ("seqstart", "BIGINT"),
        ("seqincrement", "BIGINT"),
        ("seqmax", "BIGINT"),
        ("seqmin", "BIGINT"),
        ("seqcache", "BIGINT"),
        ("seqcycle", "BOOLEAN"),
    ),
    "pg_depend": (
        ("classid", "UINTEGER"),
        ("objid", "UINTEGER"),
        ("objsubid", "INTEGER"),
        ("refclassid", "UINTEGER"),
        ("refobjid", "UINTEGER"),
        ("refobjsubid", "INTEGER"),
        ("deptype", "VARCHAR"),
    ),
    "pg_tables": (
        ("schemaname", "VARCHAR"),
        ("tablename", "VARCHAR"),
        ("tableowner", "VARCHAR"),
        ("tablespace", "VARCHAR"),
        ("hasindexes", "BOOLEAN"),
        ("hasrules", "BOOLEAN"),
        ("hastriggers", "BOOLEAN"),
        ("rowsecurity", "BOOLEAN"),
    ),
    "pg_views": (
        ("schemaname", "VARCHAR"),
        ("viewname", "VARCHAR"),
        ("viewowner", "VARCHAR"),
        ("definition", "VARCHAR"),
    ),
    "pg_matviews": (
        ("schemaname", "VARCHAR"),
        ("matviewname", "VARCHAR"),
        ("matviewowner", "VARCHAR"),
        ("definition", "VARCHAR"),
    ),
    "pg_indexes": (
        ("schemaname", "VARCHAR"),
        ("tablename", "VARCHAR"),
        ("indexname", "VARCHAR"),
        ("tablespace", "VARCHAR"),
        ("indexdef", "VARCHAR"),
    ),
    "pg_user": (
        ("usename", "VARCHAR"),
        ("usesysid", "UINTEGER"),
        ("usecreatedb", "BOOLEAN"),
        ("usesuper", "BOOLEAN"),
    ),
    "pg_stat_activity": (
        ("datid", "UINTEGER"),
        ("datname", "VARCHAR"),
        ("pid", "INTEGER"),
        ("usename", "VARCHAR"),
        ("application_name", "VARCHAR"),
        ("state", "VARCHAR"),
        ("query", "VARCHAR"),
    ),
    "dpg_type_display": (("oid", "UINTEGER"), ("display", "VARCHAR")),
    # pg_get_keywords()'s result (DBeaver reads it on connect); left empty
    "dpg_keywords": (
        ("word", "VARCHAR"),
        ("catcode", "VARCHAR"),
        ("barelabel", "BOOLEAN"),
        ("catdesc", "VARCHAR"),
        ("baredesc", "VARCHAR"),
    ),
}

INFORMATION_SCHEMA_TABLES: dict[str, tuple[_C, ...]] = {
    "schemata": (
        ("catalog_name", "VARCHAR"),
        ("schema_name", "VARCHAR"),
        ("schema_owner", "VARCHAR"),
        ("default_character_set_catalog", "VARCHAR"),
        ("default_character_set_schema", "VARCHAR"),
        ("default_character_set_name", "VARCHAR"),
        ("sql_path", "VARCHAR"),
    ),
    "tables": (
        ("table_catalog", "VARCHAR"),
        ("table_schema", "VARCHAR"),
        ("table_name", "VARCHAR"),
        ("table_type", "VARCHAR"),
        ("self_referencing_column_name", "VARCHAR"),
        ("reference_generation", "VARCHAR"),
        ("user_defined_type_catalog", "VARCHAR"),
        ("user_defined_type_schema", "VARCHAR"),
        ("user_defined_type_name", "VARCHAR"),
        ("is_insertable_into", "VARCHAR"),
        ("is_typed", "VARCHAR"),
        ("commit_action", "VARCHAR"),
    ),
    "columns": (
        ("table_catalog", "VARCHAR"),
        ("table_schema", "VARCHAR"),
        ("table_name", "VARCHAR"),
        ("column_name", "VARCHAR"),
        ("ordinal_position", "INTEGER"),
        ("column_default", "VARCHAR"),
        ("is_nullable", "VARCHAR"),
        ("data_type", "VARCHAR"),
        ("character_maximum_length", "INTEGER"),
        ("character_octet_length", "INTEGER"),
        ("numeric_precision", "INTEGER"),
        ("numeric_precision_radix", "INTEGER"),
        ("numeric_scale", "INTEGER"),
        ("datetime_precision", "INTEGER"),
        ("interval_type", "VARCHAR"),
        ("interval_precision", "INTEGER"),
        ("character_set_catalog", "VARCHAR"),
        ("character_set_schema", "VARCHAR"),
        ("character_set_name", "VARCHAR"),
        ("collation_catalog", "VARCHAR"),
        ("collation_schema", "VARCHAR"),
        ("collation_name", "VARCHAR"),
        ("domain_catalog", "VARCHAR"),
        ("domain_schema", "VARCHAR"),
        ("domain_name", "VARCHAR"),
        ("udt_catalog", "VARCHAR"),
        ("udt_schema", "VARCHAR"),
        ("udt_name", "VARCHAR"),
        ("scope_catalog", "VARCHAR"),
        ("scope_schema", "VARCHAR"),
        ("scope_name", "VARCHAR"),
        ("maximum_cardinality", "INTEGER"),
        ("dtd_identifier", "VARCHAR"),
        ("is_self_referencing", "VARCHAR"),
        ("is_identity", "VARCHAR"),
        ("identity_generation", "VARCHAR"),
        ("identity_start", "VARCHAR"),
        ("identity_increment", "VARCHAR"),
        ("identity_maximum", "VARCHAR"),
        ("identity_minimum", "VARCHAR"),
        ("identity_cycle", "VARCHAR"),
        ("is_generated", "VARCHAR"),
        ("generation_expression", "VARCHAR"),
        ("is_updatable", "VARCHAR"),
    ),
    "views": (
        ("table_catalog", "VARCHAR"),
        ("table_schema", "VARCHAR"),
        ("table_name", "VARCHAR"),
        ("view_definition", "VARCHAR"),
    ),
    "table_constraints": (
        ("constraint_catalog", "VARCHAR"),
        ("constraint_schema", "VARCHAR"),
        ("constraint_name", "VARCHAR"),
        ("table_catalog", "VARCHAR"),
        ("table_schema", "VARCHAR"),
        ("table_name", "VARCHAR"),
        ("constraint_type", "VARCHAR"),
    ),
    "key_column_usage": (
        ("constraint_catalog", "VARCHAR"),
        ("constraint_schema", "VARCHAR"),
        ("constraint_name", "VARCHAR"),
        ("table_catalog", "VARCHAR"),
        ("table_schema", "VARCHAR"),
        ("table_name", "VARCHAR"),
        ("column_name", "VARCHAR"),
        ("ordinal_position", "INTEGER"),
    ),
    "referential_constraints": (
        ("constraint_catalog", "VARCHAR"),
        ("constraint_schema", "VARCHAR"),
        ("constraint_name", "VARCHAR"),
        ("unique_constraint_name", "VARCHAR"),
    ),
    "routines": (
        ("routine_catalog", "VARCHAR"),
        ("routine_schema", "VARCHAR"),
        ("routine_name", "VARCHAR"),
        ("routine_type", "VARCHAR"),
    ),
}

_DEFAULTS: dict[str, Any] = {
    "relowner": 10,
    "nspowner": 10,
    "typowner": 10,
    "datdba": 10,
    "relam": 2,
    "relpages": 0,
    "reltuples": -1.0,
    "relallvisible": 0,
    "reltoastrelid": 0,
    "reloftype": 0,
    "reltablespace": 0,
    "relhasindex": False,
    "relisshared": False,
    "relpersistence": "p",
    "relchecks": 0,
    "relhasrules": False,
    "relhastriggers": False,
    "relhassubclass": False,
    "relrowsecurity": False,
    "relforcerowsecurity": False,
    "relispopulated": True,
    "relreplident": "d",
    "relispartition": False,
    "relrewrite": 0,
    "relhasoids": False,
    "attstattarget": -1,
    "attndims": 0,
    "attcacheoff": -1,
    "atttypmod": -1,
    "attalign": "d",
    "attstorage": "p",
    "attcompression": "",
    "atthasdef": False,
    "atthasmissing": False,
    "attidentity": "",
    "attgenerated": "",
    "attisdropped": False,
    "attislocal": True,
    "attinhcount": 0,
    "attcollation": 0,
    "typtype": "b",
    "typispreferred": False,
    "typisdefined": True,
    "typdelim": ",",
    "typrelid": 0,
    "typalign": "i",
    "typstorage": "p",
    "typnotnull": False,
    "typbasetype": 0,
    "typtypmod": -1,
    "typndims": 0,
    "typcollation": 0,
}


@dataclass(frozen=True)
class CatalogResult:
    """A catalogue answer: column names with DuckDB type names, and the rows."""

    columns: tuple[tuple[str, str], ...]
    rows: list[tuple[Any, ...]]


class CatalogError(Exception):
    """The catalogue query failed (a missing emulated column, a timeout, …)."""


class Catalog:
    """The emulated catalogue of one config, shared by every connection of a server."""

    def __init__(self, config: Config) -> None:
        self._db = duckdb.connect(":memory:", config={"threads": 1, "memory_limit": "64MB"})
        self._lock = threading.Lock()
        self.table_oids: dict[str, int] = {}
        self._build(config)
        for setting in (
            "SET enable_external_access = false",
            "SET autoinstall_known_extensions = false",
            "SET autoload_known_extensions = false",
            "SET lock_configuration = true",
        ):
            self._db.execute(setting)

    def _build(self, config: Config) -> None:
        db = self._db
        for schema_name, tables in (
            (CATALOG_SCHEMA, CATALOG_TABLES),
            (INFO_SCHEMA, INFORMATION_SCHEMA_TABLES),
        ):
            db.execute(f"CREATE SCHEMA {schema_name}")
            for name, columns in tables.items():
                cols = ", ".join(f'"{c}" {t}' for c, t in columns)
                db.execute(f'CREATE TABLE {schema_name}."{name}" ({cols})')
        namespaces = {
            "pg_catalog": PG_CATALOG_OID,
            "public": PUBLIC_OID,
            "information_schema": INFORMATION_SCHEMA_OID,
        }
        next_oid = FIRST_USER_OID
        for t in config.tables.values():
            schema = t.schema or "public"
            if schema not in namespaces:
                namespaces[schema] = next_oid
                next_oid += 1
        for name, oid in namespaces.items():
            self._insert(CATALOG_SCHEMA, "pg_namespace", {"oid": oid, "nspname": name})
            self._insert(
                INFO_SCHEMA,
                "schemata",
                {"catalog_name": DATABASE, "schema_name": name, "schema_owner": OWNER},
            )
        for oid, name, size, category, array, elem, display in PG_TYPES:
            self._insert(
                CATALOG_SCHEMA,
                "pg_type",
                {
                    "oid": oid,
                    "typname": name,
                    "typnamespace": PG_CATALOG_OID,
                    "typlen": size,
                    "typbyval": 0 < size <= 8,
                    "typcategory": category,
                    "typarray": array,
                    "typelem": elem,
                    "typinput": "array_in" if category == "A" else f"{name}in",
                    "typoutput": f"{name}out",
                    "typreceive": f"{name}recv",
                    "typsend": f"{name}send",
                    "typcollation": 100 if category == "S" else 0,
                },
            )
            self._insert(CATALOG_SCHEMA, "dpg_type_display", {"oid": oid, "display": display})
        for t in config.tables.values():
            schema = t.schema or "public"
            table_oid, row_type = next_oid, next_oid + 1
            next_oid += 2
            self.table_oids[t.name] = table_oid
            self._insert(
                CATALOG_SCHEMA,
                "pg_class",
                {
                    "oid": table_oid,
                    "relname": t.name,
                    "relnamespace": namespaces[schema],
                    "reltype": row_type,
                    "relfilenode": table_oid,
                    "relkind": "r",
                    "relnatts": len(t.columns),
                },
            )
            self._insert(
                CATALOG_SCHEMA,
                "pg_type",
                {
                    "oid": row_type,
                    "typname": t.name,
                    "typnamespace": namespaces[schema],
                    "typlen": -1,
                    "typbyval": False,
                    "typtype": "c",
                    "typcategory": "C",
                    "typrelid": table_oid,
                    "typarray": 0,
                    "typelem": 0,
                },
            )
            self._insert(
                CATALOG_SCHEMA,
                "pg_tables",
                {
                    "schemaname": schema,
                    "tablename": t.name,
                    "tableowner": OWNER,
                    "hasindexes": False,
                    "hasrules": False,
                    "hastriggers": False,
                    "rowsecurity": False,
                },
            )
            self._insert(
                INFO_SCHEMA,
                "tables",
                {
                    "table_catalog": DATABASE,
                    "table_schema": schema,
                    "table_name": t.name,
                    "table_type": "BASE TABLE",
                    "is_insertable_into": "NO",
                    "is_typed": "NO",
                },
            )
            for position, column in enumerate(t.columns.values(), start=1):
                type_oid, size = TYPE_OF_VALUE[column.type]
                typname = next(p[1] for p in PG_TYPES if p[0] == type_oid)
                display = next(p[6] for p in PG_TYPES if p[0] == type_oid)
                self._insert(
                    CATALOG_SCHEMA,
                    "pg_attribute",
                    {
                        "attrelid": table_oid,
                        "attname": column.name,
                        "atttypid": type_oid,
                        "attlen": size,
                        "attnum": position,
                        "attbyval": 0 < size <= 8,
                        "attnotnull": not column.may_be_null,
                        "attcollation": 100 if column.type == "text" else 0,
                    },
                )
                numeric = column.type in ("integer", "real")
                self._insert(
                    INFO_SCHEMA,
                    "columns",
                    {
                        "table_catalog": DATABASE,
                        "table_schema": schema,
                        "table_name": t.name,
                        "column_name": column.name,
                        "ordinal_position": position,
                        "is_nullable": "YES" if column.may_be_null else "NO",
                        "data_type": display,
                        "udt_catalog": DATABASE,
                        "udt_schema": "pg_catalog",
                        "udt_name": typname,
                        "numeric_precision": (64 if column.type == "integer" else 53)
                        if numeric
                        else None,
                        "numeric_precision_radix": 2 if numeric else None,
                        "numeric_scale": 0 if column.type == "integer" else None,
                        "dtd_identifier": str(position),
                        "is_self_referencing": "NO",
                        "is_identity": "NO",
                        "is_generated": "NEVER",
                        "is_updatable": "NO",
                    },
                )
        self._insert(
            CATALOG_SCHEMA,
            "pg_database",
            {
                "oid": 16_383,
                "datname": DATABASE,
                "datdba": 10,
                "encoding": 6,
                "datlocprovider": "c",
                "datistemplate": False,
                "datallowconn": True,
                "datconnlimit": -1,
                "dattablespace": 1663,
                "datcollate": "C.UTF-8",
                "datctype": "C.UTF-8",
            },
        )
        self._insert(
            CATALOG_SCHEMA,
            "pg_am",
            {"oid": 2, "amname": "heap", "amhandler": "heap_tableam_handler", "amtype": "t"},
        )
        self._insert(
            CATALOG_SCHEMA,
            "pg_roles",
            {
                "oid": 10,
                "rolname": OWNER,
                "rolsuper": False,
                "rolinherit": True,
                "rolcreaterole": False,
                "rolcreatedb": False,
                "rolcanlogin": True,
                "rolreplication": False,
                "rolconnlimit": -1,
                "rolbypassrls": False,
            },
        )
        self._insert(
            CATALOG_SCHEMA, "pg_tablespace", {"oid": 1663, "spcname": "pg_default", "spcowner": 10}
        )
        self._insert(
            CATALOG_SCHEMA,
            "pg_collation",
            {
                "oid": 100,
                "collname": "default",
                "collnamespace": PG_CATALOG_OID,
                "collowner": 10,
                "collprovider": "d",
                "collisdeterministic": True,
                "collencoding": -1,
            },
        )
        for name, value in SETTINGS.items():
            self._insert(
                CATALOG_SCHEMA,
                "pg_settings",
                {
                    "name": name,
                    "setting": value,
                    "context": "user",
                    "vartype": "string",
                    "source": "default",
                    "boot_val": value,
                    "reset_val": value,
                    "pending_restart": False,
                },
            )
        c, i = CATALOG_SCHEMA, INFO_SCHEMA
        for macro in (
            f"CREATE MACRO dpg_format_type(t, m) AS "
            f"(SELECT display FROM {c}.dpg_type_display d WHERE d.oid = t)",
            f"CREATE MACRO dpg_table_is_visible(r) AS COALESCE((SELECT n.nspname IN "
            f"('public', 'pg_catalog') FROM {c}.pg_class k JOIN {c}.pg_namespace n "
            f"ON n.oid = k.relnamespace WHERE k.oid = r), false)",
            f"CREATE MACRO dpg_regclass(x) AS (SELECT k.oid FROM {c}.pg_class k JOIN "
            f"{c}.pg_namespace n ON n.oid = k.relnamespace WHERE k.relname = "
            f"trim(x, '\"') OR n.nspname || '.' || k.relname = replace(x, '\"', '') LIMIT 1)",
            f"CREATE MACRO dpg_regclass_name(o) AS COALESCE((SELECT k.relname FROM "
            f"{c}.pg_class k WHERE k.oid = o), CAST(o AS VARCHAR))",
            f"CREATE MACRO dpg_regtype_name(o) AS COALESCE((SELECT display FROM "
            f"{c}.dpg_type_display d WHERE d.oid = o), CAST(o AS VARCHAR))",
            f"CREATE MACRO dpg_regtype(x) AS (SELECT t.oid FROM {c}.pg_type t WHERE t.typname "
            f"= x OR t.oid IN (SELECT d.oid FROM {c}.dpg_type_display d WHERE d.display = x) "
            f"LIMIT 1)",
            f"CREATE MACRO dpg_regnamespace_name(o) AS (SELECT nspname FROM "
            f"{c}.pg_namespace WHERE oid = o)",
        ):
            self._db.execute(macro)
        del i

    def _insert(self, schema: str, table: str, values: dict[str, Any]) -> None:
        columns = (CATALOG_TABLES if schema == CATALOG_SCHEMA else INFORMATION_SCHEMA_TABLES)[table]
        row = [values.get(c, _DEFAULTS.get(c)) for c, _ in columns]
        marks = ", ".join("?" for _ in row)
        self._db.execute(f'INSERT INTO {schema}."{table}" VALUES ({marks})', row)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def run(self, sql: str, parameters: Sequence[Any] = ()) -> CatalogResult:
        """Run rewritten catalogue SQL (``gateway.pgwire.rewrite``) with a timeout."""
        cursor = self._db.cursor()
        timer = threading.Timer(STATEMENT_TIMEOUT_S, cursor.interrupt)
        timer.start()
        try:
            cursor.execute(sql, list(parameters))
            description = cursor.description or []
            rows = cursor.fetchmany(MAX_ROWS + 1)
        except duckdb.Error as e:
            raise CatalogError(_first_line(str(e))) from None
        finally:
            timer.cancel()
            cursor.close()
        if len(rows) > MAX_ROWS:
            raise CatalogError(f"a catalogue answer has at most {MAX_ROWS} rows")
        return CatalogResult(tuple((d[0], str(d[1])) for d in description), rows)


def _first_line(message: str) -> str:
    return message.strip().splitlines()[0] if message.strip() else "catalogue query failed"


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
