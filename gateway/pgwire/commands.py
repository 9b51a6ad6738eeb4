"""Session commands: SET, SHOW, RESET, transactions, DISCARD, DEALLOCATE.

Answered by the connection itself, from public settings: nothing here reads data or
charges. ``SET dpgate.epsilon`` / ``dpgate.delta`` / ``dpgate.mechanism`` choose the
privacy parameters of the session's next queries (checked again by the pipeline).
Transactions are accepted and have no effect (dpgate is read-only); after an error
inside one, PostgreSQL's rule holds: only ROLLBACK or COMMIT until it ends.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gateway.core.errors import InvalidPrivacyParameters, InvalidRequest, UnsupportedQuery
from gateway.pgwire.catalog_settings import SETTINGS

if TYPE_CHECKING:
    from gateway.pgwire.server import WireServer

DPGATE_SETTINGS = ("dpgate.epsilon", "dpgate.delta", "dpgate.mechanism")


@dataclass
class Outcome:
    """A statement's answer, before encoding: columns (name, PG type), rows, tag."""

    columns: list[tuple[str, int]]
    rows: list[tuple[Any, ...]] | None
    tag: str
    notices: list[str] = field(default_factory=list)


class SessionCommands:
    """The session-command half of ``gateway.pgwire.session.Session``."""

    server: WireServer
    user: str
    settings: dict[str, str]
    status: str

    def _drop_statement(self, name: str) -> None:
        raise NotImplementedError

    def _deallocate_all(self) -> None:
        raise NotImplementedError

    def _session_command(self, sql: str, describe_only: bool) -> Outcome:
        text = _strip(sql)
        word = text.split(None, 1)[0].upper() if text else ""
        if word == "SHOW":
            return self._show(text[4:].strip(), describe_only)
        if describe_only:
            return Outcome([], None, "")
        if word == "SET":
            self._set(text[3:].strip())
            return Outcome([], None, "SET")
        if word == "RESET":
            name = text[5:].strip().lower()
            if name == "all":
                self.settings.clear()
            else:
                self.settings.pop(name, None)
            return Outcome([], None, "RESET")
        if word in ("BEGIN", "START"):
            if self.status == "I":
                self.status = "T"
            return Outcome([], None, "BEGIN" if word == "BEGIN" else "START TRANSACTION")
        if word in ("COMMIT", "END"):
            tag = "ROLLBACK" if self.status == "E" else "COMMIT"
            self.status = "I"
            return Outcome([], None, tag)
        if word in ("ROLLBACK", "ABORT"):
            self.status = "I"
            return Outcome([], None, "ROLLBACK")
        if word == "DISCARD":
            return Outcome(
                [], None, "DISCARD " + text.split(None, 1)[1].upper() if " " in text else "DISCARD"
            )
        if word == "DEALLOCATE":
            name = text.split()[-1].strip('"')
            if name.upper() == "ALL":
                self._deallocate_all()
            else:
                self._drop_statement(name)
            return Outcome([], None, "DEALLOCATE")
        if word in ("SAVEPOINT", "RELEASE"):
            return Outcome([], None, word)
        raise UnsupportedQuery(f"{word} is not supported by dpgate", construct=word.lower())

    def _set(self, rest: str) -> None:
        rest = re.sub(r"^(SESSION|LOCAL)\s+", "", rest, flags=re.IGNORECASE)
        if re.match(
            r"^(TIME\s+ZONE|NAMES|SESSION\s+CHARACTERISTICS|TRANSACTION)\b", rest, re.IGNORECASE
        ):
            return  # accepted, without effect on a read-only, UTC gateway
        match = re.match(r'^"?([\w.]+)"?\s*(?:=|\bTO\b)\s*(.*)$', rest, re.IGNORECASE | re.DOTALL)
        if match is None:
            raise InvalidRequest("SET needs a name and a value: SET name = value")
        name = match.group(1).lower()
        value = match.group(2).strip().rstrip(";").strip()
        if len(value) >= 2 and value[0] == value[-1] == "'":
            value = value[1:-1].replace("''", "'")
        if name in ("dpgate.epsilon", "dpgate.delta"):
            setting_number({name: value}, name, 0.0)
        if name == "dpgate.mechanism" and value not in ("laplace", "gaussian"):
            raise InvalidPrivacyParameters("dpgate.mechanism must be 'laplace' or 'gaussian'")
        self.settings[name] = value

    def _show(self, name: str, describe_only: bool) -> Outcome:
        name = name.strip().strip('"').rstrip(";").strip()
        name = _SHOW_ALIASES.get(re.sub(r"\s+", " ", name.lower()), name)
        if name.lower() == "all":
            rows = [(k, v, "") for k, v in sorted(self._all_settings().items())]
            return Outcome(
                [("name", 25), ("setting", 25), ("description", 25)],
                [] if describe_only else rows,
                "SHOW",
            )
        value = self._setting(name)
        if value is None:
            raise UnknownSetting(f'unrecognized configuration parameter "{name[:64]}"')
        return Outcome([(name.lower(), 25)], [] if describe_only else [(value,)], "SHOW")

    def _setting(self, name: str) -> str | None:
        settings = self._all_settings()
        for key, value in settings.items():
            if key.lower() == name.lower():
                return value
        return None

    def _all_settings(self) -> dict[str, str]:
        privacy = self.server.gateway.config.privacy
        merged = dict(SETTINGS)
        merged.update(
            {
                "dpgate.epsilon": repr(privacy.epsilon),
                "dpgate.delta": repr(privacy.delta),
                "dpgate.mechanism": privacy.mechanism,
                "session_authorization": self.user,
            }
        )
        lowered = {k.lower(): k for k in merged}
        for key, value in self.settings.items():
            merged[lowered.get(key.lower(), key)] = value
        return merged


class UnknownSetting(InvalidRequest):
    """SQLSTATE 42704."""


_SHOW_ALIASES = {
    "transaction isolation level": "transaction_isolation",
    "time zone": "TimeZone",
    "session authorization": "session_authorization",
}


def setting_number(settings: dict[str, str], name: str, default: float) -> float:
    raw = settings.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise InvalidPrivacyParameters(f"{name} must be a number, got {raw[:40]!r}") from None
    return value


def _strip(sql: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", sql, flags=re.DOTALL)
    return re.sub(r"--[^\n]*", " ", text).strip()
