"""The Python client: ask the gateway for differentially private answers.

>>> from dpgate_client import Client
>>> client = Client("http://127.0.0.1:8000", key="…")
>>> answer = client.query("SELECT disease, COUNT(*) AS n FROM patients GROUP BY disease",
...                       epsilon=0.5)
>>> answer.rows, answer.accuracy["n"].ci95_halfwidth, answer.privacy.epsilon
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any, Literal

from dpgate_client.errors import InterfaceError
from dpgate_client.results import Budget, QueryResult, Schema
from dpgate_client.transport import DEFAULT_TIMEOUT, URL_ENVIRONMENT_VARIABLE, Transport

__all__ = ["Client", "Mechanism"]

# DEBUG records every SQL text sent: what a BI tool really asks is the first thing to
# look at when a dashboard and the gateway disagree.
log = logging.getLogger("dpgate_client")

Mechanism = Literal["laplace", "gaussian"]


class Client:
    """One analyst's handle on one gateway.

    ``url`` is the gateway's base URL (``http://host:port`` or ``https://host/prefix``;
    default: ``$DPGATE_URL``); ``key`` is the analyst's API key (default: ``$DPGATE_KEY``,
    as for ``dpgate query``). Safe to share between threads: it keeps no connection open.
    """

    def __init__(
        self,
        url: str | None = None,
        key: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        verify: bool = True,
        ca_file: str | None = None,
    ) -> None:
        url = url or os.environ.get(URL_ENVIRONMENT_VARIABLE)
        if not url:
            raise InterfaceError(
                "give the gateway URL: Client('http://host:port', key) or $DPGATE_URL",
                code="invalid_url",
            )
        self._transport = Transport(url, key, timeout=timeout, verify=verify, ca_file=ca_file)

    @property
    def url(self) -> str:
        return self._transport.base_url

    def __repr__(self) -> str:
        return f"Client({self.url!r})"

    def query(
        self,
        sql: str,
        *,
        epsilon: float | None = None,
        delta: float | None = None,
        mechanism: Mechanism | str | None = None,
        dry_run: bool = False,
        accuracy: float | None = None,
        raw: bool = False,
    ) -> QueryResult:
        """Run one counting query; the answer is charged to the analyst's budget.

        Parameters left as ``None`` take the gateway's configured defaults. ``accuracy``
        (instead of ``epsilon``) asks for a 95% half-width: the gateway uses the
        smallest ε whose interval of every COUNT and SUM is at most ± that, or refuses
        and says what it would cost. With ``dry_run=True`` nothing is read or spent: the
        result carries the plan, the cost (``charge``, in budget units), how many such
        queries the budget still admits and the expected accuracy, and no rows.
        ``raw=True`` returns the noisy values as drawn (unbiased, so they can be summed; a
        count may be negative) instead of values moved into the public bounds.
        """
        body: dict[str, Any] = {"sql": sql}
        if epsilon is not None:
            body["epsilon"] = epsilon
        if accuracy is not None:
            body["accuracy"] = {"ci95_halfwidth": accuracy}
        if delta is not None:
            body["delta"] = delta
        if mechanism is not None:
            body["mechanism"] = mechanism
        if dry_run:
            body["dry_run"] = True
        if raw:
            body["raw"] = True
        log.debug("POST %s/v1/query %s", self.url, json.dumps(body))
        payload = self._transport.request("POST", "/v1/query", body)
        return QueryResult.from_json(payload, dry_run=dry_run)

    def budget(self) -> Budget:
        """The analyst's budget: total, spent, remaining, the composition rule and when it
        renews (``period``, ``period_ends_at``)."""
        payload = self._transport.request("GET", "/v1/budget")
        budget = Budget.from_json(payload)
        assert budget is not None  # payload is a mapping: the transport checked
        return budget

    def schema(self) -> Schema:
        """The public metadata of the tables the analyst may query."""
        return Schema.from_json(self._transport.request("GET", "/v1/schema"))

    def queries(self, *, limit: int | None = None) -> list[dict[str, Any]]:
        """The analyst's own history, newest first, as the gateway reports it.

        Each entry has ``query_id``, ``sql``, ``mechanism``, ``cost``, ``outcome``,
        ``reason``, ``release`` (the released answer, for answered queries) and
        ``created_at``; ``limit`` caps how many (the gateway's default is 1,000).
        """
        path = "/v1/queries" if limit is None else f"/v1/queries?limit={int(limit)}"
        payload = self._transport.request("GET", path)
        entries = payload.get("queries")
        if not isinstance(entries, list):
            raise InterfaceError("the gateway's history has no 'queries' list")
        return [dict(entry) for entry in entries if isinstance(entry, dict)]
