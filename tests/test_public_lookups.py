"""The rows of public lookups the auditor reads (gateway/sql/public_lookups.py): only
where the translation of a lookup column into join keys is exact, and exactly the rows
the compiled join can attach (inside the lookup's declared domain, NULL keys left out)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import sqlalchemy as sa

from gateway.core.config_load import parse_config
from gateway.sql.join_keys import JoinKeys
from gateway.sql.public_lookups import MAX_ROWS, read_public_lookups
from tests.conftest import ADMIN_KEY


def _setup(tmp_path: Path, rows: list[tuple[object, object]], key_type: str = "TEXT") -> Path:
    db = tmp_path / "t.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE people (id INTEGER, code TEXT)")
        # untyped (key_type ""): each value keeps the storage class it was written in
        conn.execute(f"CREATE TABLE codes (code {key_type}, kind {key_type})")
        conn.executemany("INSERT INTO codes VALUES (?, ?)", rows)
    return db


def _read(db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **kind: object) -> object:
    monkeypatch.setenv("DPGATE_ADMIN_KEY", ADMIN_KEY)
    config = parse_config(
        {
            "database": {"url": f"sqlite:///{db}"},
            "ledger": {"url": f"sqlite:///{tmp_path / 'ledger.db'}"},
            "tables": {
                "people": {
                    "privacy_unit": "id",
                    "columns": {"id": {"type": "integer"}, "code": {"type": "text"}},
                    "references": {"code": "codes.code"},
                },
                "codes": {
                    "public": True,
                    "key": "code",
                    "columns": {"code": {"type": "text"}, "kind": {"type": "text", **kind}},
                },
            },
            "analysts": [{"name": "a", "epsilon": 1.0, "delta": 1e-6}],
        }
    )
    engine = sa.create_engine(f"sqlite:///{db}")
    return read_public_lookups(engine, config.tables, JoinKeys(), "sqlite").get(("people", "code"))


def test_the_rows_the_join_can_attach_are_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = _setup(tmp_path, [("a", "x"), ("b", None), (None, "x"), ("c", "outside")])
    lookup = _read(db, tmp_path, monkeypatch, values=["x", "y"])
    assert lookup is not None
    # NULL keys match nothing; a row outside the declared domain is cut from the join
    assert dict(lookup.rows) == {"a": {"code": "a", "kind": "x"}, "b": {"code": "b", "kind": None}}


@pytest.mark.parametrize(
    "rows",
    [
        [("a", "x"), ("a", "y")],  # a duplicate key: which row the cut keeps is not read
        [("a", "x"), ("A", "y")],  # a collation could merge them
        [("a", "x"), ("a ", "y")],  # so could trailing spaces (RTRIM, CHAR padding)
        [("a", "x"), (5, "y")],  # a key stored as a number: the join matches no text to it
        [("a", "x"), ("b", 5)],  # a column value not text: not compared as text
    ],
)
def test_rows_that_could_make_the_translation_inexact_are_not_read(
    rows: list[tuple[object, object]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = _setup(tmp_path, rows, key_type="")
    assert _read(db, tmp_path, monkeypatch) is None


def test_a_large_lookup_is_not_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = _setup(tmp_path, [(f"k{i}", "x") for i in range(MAX_ROWS + 1)])
    assert _read(db, tmp_path, monkeypatch) is None
