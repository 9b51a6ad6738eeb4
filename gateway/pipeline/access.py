"""Stage: access — which of the declared tables a caller may read (table grants).

A table is granted to groups, in the config (``tables.<t>.grants``) and through the
admin API or CLI (stored in the ledger: ``budget.grants``); the grants of both count.
An analyst's groups are those the ledger holds for them and, for a caller signed in with
a token, those its groups claim names (``gateway.pipeline.sso``). A table with no grant at all is
read by every analyst under ``access.default: open`` (dpgate before grants) and by
nobody under ``granted``. Admins read every table's public schema.

What a caller may not read does not exist for them: their queries are planned against
the tables they may read only (``Access.planner``), so a query naming another table gets
exactly the refusal of a table that is not declared (``unknown_table``), decided before
anything else, free; ``/v1/schema``, the wire catalogue and the dry run show only these
tables. Every check reads the ledger afresh (inside the request's one read,
``budget.Ledger.lookup``), so a grant or membership change applies to the next request
of every gateway process, without a restart.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from budget.grants import StoredAccess
from gateway.core.config import TableConfig
from gateway.core.config_access import AccessConfig
from gateway.core.errors import Conflict, NotFound

#: Planners (and their plan caches) kept for distinct sets of readable tables.
MAX_VIEWS = 64


@dataclass(frozen=True)
class Grants:
    """Every grant in force: table → the groups that may read it (config ∪ ledger)."""

    by_table: Mapping[str, frozenset[str]]
    default: str

    def readable(self, table: str, groups: frozenset[str]) -> bool:
        """Whether members of ``groups`` may read ``table`` (a table the config declares
        ``grants: []`` for is read by nobody but through stored grants)."""
        granted = self.by_table.get(table)
        if granted is None:
            return self.default == "open"
        return not granted.isdisjoint(groups)

    @property
    def restricts(self) -> bool:
        """Whether some table is closed to some analyst."""
        return self.default != "open" or bool(self.by_table)


class Access:
    """The grants of one config (and its ledger), and the planners of what callers see."""

    def __init__(
        self,
        tables: Mapping[str, TableConfig],
        config: AccessConfig,
        make_view: Callable[[Mapping[str, TableConfig]], object],
    ) -> None:
        self.tables = tables
        self.config = config
        self.configured: dict[str, frozenset[str]] = {
            name: frozenset(t.grants) for name, t in tables.items() if t.grants is not None
        }
        self.all_tables = frozenset(tables)
        # whether the config alone may close a table (else only stored grants can)
        self.configured_restricts = config.default != "open" or bool(self.configured)
        self._make_view = make_view
        self._views: OrderedDict[frozenset[str], object] = OrderedDict()
        self._lock = threading.Lock()

    def grants(self, stored: StoredAccess) -> Grants:
        """The grants in force: the config's and the ledger's (of declared tables)."""
        merged = dict(self.configured)
        for table, groups in stored.grants.items():
            if table in self.tables:
                merged[table] = merged.get(table, frozenset()) | groups
        return Grants(merged, self.config.default)

    def readable(
        self, stored: StoredAccess, extra_groups: frozenset[str] = frozenset()
    ) -> frozenset[str]:
        """The declared tables a caller with ``stored`` access (and ``extra_groups``,
        from a token) may read."""
        grants = self.grants(stored)
        if not grants.restricts:
            return self.all_tables
        groups = stored.groups | extra_groups
        return frozenset(t for t in self.tables if grants.readable(t, groups))

    def open_tables(self, stored: StoredAccess | None) -> frozenset[str]:
        """The tables an analyst in no group may read (``None``: by the config alone)."""
        grants = {} if stored is None else stored.grants
        return self.readable(StoredAccess(grants, frozenset()))

    def tables_of(self, readable: frozenset[str]) -> dict[str, TableConfig]:
        """The table configs a caller sees (in declaration order)."""
        return {n: t for n, t in self.tables.items() if n in readable}

    # -- what admins see and change -------------------------------------------------------

    def table(self, name: str) -> str:
        """The declared table ``name`` (any case), or ``NotFound``."""
        key = name.lower()
        if key not in self.tables:
            raise NotFound(f"no table named {name!r} is declared in the config")
        return key

    def report(self, stored: StoredAccess) -> list[dict[str, object]]:
        """Every declared table: its groups (config and ledger) and who may read it."""
        grants = self.grants(stored)
        out: list[dict[str, object]] = []
        for name in self.tables:
            config_groups = sorted(self.configured.get(name, ()))
            ledger_groups = sorted(stored.grants.get(name, ()))
            groups = grants.by_table.get(name)
            if groups is not None:
                readers = "groups" if groups else "nobody"
            else:
                readers = "everyone" if self.config.default == "open" else "nobody"
            out.append(
                {
                    "table": name,
                    "groups": sorted(groups or ()),
                    "config_groups": config_groups,
                    "ledger_groups": ledger_groups,
                    "readable_by": readers,
                }
            )
        return out

    def check_revoke(self, stored: StoredAccess, table: str, group: str) -> None:
        """Refuse a revocation that cannot be made in the ledger (a grant of the config)
        or that would open the table to every analyst (its last grant, under
        ``access.default: open``): ``Conflict``, saying what to do instead."""
        configured = self.configured.get(table, frozenset())
        stored_groups = stored.grants.get(table, frozenset())
        if group not in configured and group not in stored_groups:
            raise NotFound(f"table {table!r} is not granted to {group!r}")
        if group in self.configured.get(table, ()) and group not in stored.grants.get(table, ()):
            raise Conflict(
                f"table {table!r} is granted to {group!r} in the config: change the config "
                "(tables.<t>.grants) to take it back"
            )
        remaining = (configured | stored_groups) - {group}
        if not remaining and table not in self.configured and self.config.default == "open":
            raise Conflict(
                f"{group!r} holds the last grant on {table!r}: without it every analyst "
                "could read the table (access.default: open); grant it to another group "
                "first, or set access.default: granted"
            )

    def view(self, readable: frozenset[str]) -> object:
        """What ``make_view`` built for this set of tables (a planner), built once."""
        with self._lock:
            found = self._views.get(readable)
            if found is not None:
                self._views.move_to_end(readable)
                return found
        made = self._make_view(self.tables_of(readable))
        with self._lock:
            self._views[readable] = made
            if len(self._views) > MAX_VIEWS:
                self._views.popitem(last=False)
        return made


__all__ = ["Access", "Grants"]
