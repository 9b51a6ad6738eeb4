"""``dpgate config check``: the columns that are nullable only because the catalogue
says so, and what declaring ``nullable: false`` would change.

A column that may hold NULL has a NULL cell in the auditor's domain model
(docs/privacy.md, "The domain model"): a total minus bands over it determines "the rows
where it is NULL", so an analyst asking bands one by one and then the total may be
refused when that cell cannot be shown to hold k people — even when it is in fact empty.
An admin who knows the column never holds NULL declares ``nullable: false``: the compiled
SQL then leaves rows with NULL out of every query (as it does undeclared values) and the
NULL cell no longer exists. Catalogue metadata only; never a row.
"""

from __future__ import annotations

from collections.abc import Mapping

from gateway.core.config import Config

__all__ = ["nullability_notes"]


def nullability_notes(cfg: Config, catalogue: Mapping[str, Mapping[str, bool]]) -> list[str]:
    """One note per declared column whose ``nullable`` is undeclared and that the
    catalogue (table → column → may hold NULL) lets hold NULL, or does not describe."""
    notes = []
    for key, t in cfg.tables.items():
        if t.public:
            continue  # a public table's rows are released as they are: no NULL cell to audit
        known = {c.lower(): n for c, n in catalogue.get(key, {}).items()}
        for name, col in t.columns.items():
            if col.nullable is not None or name == t.privacy_unit:
                continue
            if known.get(name.lower(), True):
                source = "the catalogue" if name.lower() in known else "default (not catalogued)"
                notes.append(
                    f"tables.{t.name}.columns.{name}: nullable by {source}, not declared. "
                    f"The auditor keeps a cell '{name} IS NULL': a total minus bands over "
                    f"{name} determines it, and may be refused when the noisy answers cannot "
                    f"show it holds the minimum group size. If {name} never holds NULL, "
                    "declare `nullable: false`: rows with NULL are then left out of every "
                    "query and that cell no longer exists; if it may, declare "
                    "`nullable: true` to say so."
                )
    return notes
