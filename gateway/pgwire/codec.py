"""PostgreSQL protocol v3 framing: frontend messages decoded, backend messages encoded.

Decoding is strict and bounded: every length is checked against ``MAX_MESSAGE_BYTES``
before anything is read, every field against what is left of its message, and any
violation is a ``ProtocolViolation`` (the session answers it with an ErrorResponse,
SQLSTATE 08P01, and closes the connection). Nothing here allocates more than the
message it was given.

Reference: PostgreSQL documentation, "Frontend/Backend Protocol", chapters "Message
Flow" and "Message Formats".
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Protocol

#: The largest frontend message accepted (as the HTTP API's body limit).
MAX_MESSAGE_BYTES = 1_000_000
#: The largest startup packet (PostgreSQL's own limit is 10000).
MAX_STARTUP_BYTES = 10_000
#: Parameters of one Bind / parameter types of one Parse.
MAX_PARAMETERS = 1_000

PROTOCOL_V3 = 196608  # 3 << 16
SSL_REQUEST = 80877103
GSSENC_REQUEST = 80877104
CANCEL_REQUEST = 80877102


class ByteSource(Protocol):
    """Where frontend bytes come from (``gateway.pgwire.link.Link``, or a file in tests)."""

    def read(self, n: int, /) -> bytes: ...


class ProtocolViolation(Exception):
    """The peer sent bytes that are not a valid message here (SQLSTATE 08P01)."""


class ConnectionClosed(Exception):
    """The peer closed the connection (possibly in the middle of a message)."""


# -- frontend messages ------------------------------------------------------------------


@dataclass(frozen=True)
class Startup:
    parameters: dict[str, str]


@dataclass(frozen=True)
class SslRequest:
    pass


@dataclass(frozen=True)
class GssEncRequest:
    pass


@dataclass(frozen=True)
class CancelRequest:
    process_id: int
    secret: int


@dataclass(frozen=True)
class Query:
    sql: str


@dataclass(frozen=True)
class Parse:
    name: str
    sql: str
    parameter_types: tuple[int, ...]


@dataclass(frozen=True)
class Bind:
    portal: str
    statement: str
    parameter_formats: tuple[int, ...]
    parameters: tuple[bytes | None, ...]
    result_formats: tuple[int, ...]


@dataclass(frozen=True)
class Describe:
    kind: str  # "S" statement or "P" portal
    name: str


@dataclass(frozen=True)
class Execute:
    portal: str
    max_rows: int


@dataclass(frozen=True)
class Close:
    kind: str  # "S" or "P"
    name: str


@dataclass(frozen=True)
class Sync:
    pass


@dataclass(frozen=True)
class Flush:
    pass


@dataclass(frozen=True)
class Terminate:
    pass


@dataclass(frozen=True)
class PasswordData:
    """A 'p' message: its meaning (SASL initial or continuation) depends on the state."""

    body: bytes


@dataclass(frozen=True)
class Unsupported:
    """A well-framed message of a kind dpgate does not serve (COPY data, FunctionCall)."""

    type: str


Message = (
    Query
    | Parse
    | Bind
    | Describe
    | Execute
    | Close
    | Sync
    | Flush
    | Terminate
    | PasswordData
    | Unsupported
)


class Reader:
    """A cursor over one message body; every read is bounds-checked."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def _take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise ProtocolViolation("message is shorter than its fields")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def byte(self) -> str:
        return chr(self._take(1)[0])

    def int16(self) -> int:
        return int(struct.unpack("!h", self._take(2))[0])

    def int32(self) -> int:
        return int(struct.unpack("!i", self._take(4))[0])

    def uint32(self) -> int:
        return int(struct.unpack("!I", self._take(4))[0])

    def cstring(self) -> str:
        end = self.data.find(b"\0", self.pos)
        if end < 0:
            raise ProtocolViolation("unterminated string")
        raw = self.data[self.pos : end]
        self.pos = end + 1
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolViolation("string is not valid UTF-8") from None

    def raw(self, n: int) -> bytes:
        return self._take(n)

    def rest(self) -> bytes:
        return self._take(len(self.data) - self.pos)

    def count(self, what: str) -> int:
        n = self.int16()
        if n < 0 or n > MAX_PARAMETERS:
            raise ProtocolViolation(f"invalid number of {what}: {n}")
        return n

    def end(self) -> None:
        if self.pos != len(self.data):
            raise ProtocolViolation("message is longer than its fields")


def read_exact(stream: ByteSource, n: int) -> bytes:
    """Exactly ``n`` bytes from ``stream``; ``ConnectionClosed`` if it ends first."""
    chunks: list[bytes] = []
    left = n
    while left > 0:
        chunk = stream.read(left)
        if not chunk:
            raise ConnectionClosed()
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_startup(stream: ByteSource) -> Startup | SslRequest | GssEncRequest | CancelRequest:
    """The first packet of a connection (no type byte: length, then a request code)."""
    (length,) = struct.unpack("!i", read_exact(stream, 4))
    if length < 8 or length > MAX_STARTUP_BYTES:
        raise ProtocolViolation(f"invalid startup packet length {length}")
    r = Reader(read_exact(stream, length - 4))
    code = r.int32()
    if code == SSL_REQUEST:
        r.end()
        return SslRequest()
    if code == GSSENC_REQUEST:
        r.end()
        return GssEncRequest()
    if code == CANCEL_REQUEST:
        pid, secret = r.int32(), r.int32()
        r.end()
        return CancelRequest(pid, secret)
    if code != PROTOCOL_V3:
        raise ProtocolViolation(
            f"unsupported frontend protocol {code >> 16}.{code & 0xFFFF}: dpgate speaks 3.0"
        )
    params: dict[str, str] = {}
    while True:
        key = r.cstring()
        if not key:
            break
        params[key] = r.cstring()
    r.end()
    return Startup(params)


def read_message(stream: ByteSource) -> Message:
    """One typed frontend message, decoded."""
    header = read_exact(stream, 5)
    kind = chr(header[0])
    (length,) = struct.unpack("!i", header[1:])
    if length < 4 or length > MAX_MESSAGE_BYTES:
        raise ProtocolViolation(
            f"invalid message length {length} (at most {MAX_MESSAGE_BYTES} bytes)"
        )
    return decode(kind, read_exact(stream, length - 4))


def decode(kind: str, body: bytes) -> Message:
    """Decode the body of a frontend message of type ``kind``."""
    r = Reader(body)
    msg: Message
    if kind == "Q":
        msg = Query(r.cstring())
    elif kind == "P":
        name, sql = r.cstring(), r.cstring()
        msg = Parse(name, sql, tuple(r.uint32() for _ in range(r.count("parameter types"))))
    elif kind == "B":
        portal, statement = r.cstring(), r.cstring()
        formats = tuple(r.int16() for _ in range(r.count("parameter formats")))
        values: list[bytes | None] = []
        for _ in range(r.count("parameters")):
            n = r.int32()
            if n < -1:
                raise ProtocolViolation(f"invalid parameter length {n}")
            values.append(None if n == -1 else r.raw(n))
        results = tuple(r.int16() for _ in range(r.count("result formats")))
        if any(f not in (0, 1) for f in (*formats, *results)):
            raise ProtocolViolation("format codes are 0 (text) or 1 (binary)")
        msg = Bind(portal, statement, formats, tuple(values), results)
    elif kind in ("D", "C"):
        which = r.byte()
        if which not in ("S", "P"):
            raise ProtocolViolation(f"invalid {kind} target {which!r}")
        name = r.cstring()
        msg = Describe(which, name) if kind == "D" else Close(which, name)
    elif kind == "E":
        portal = r.cstring()
        msg = Execute(portal, r.int32())
    elif kind == "S":
        msg = Sync()
    elif kind == "H":
        msg = Flush()
    elif kind == "X":
        msg = Terminate()
    elif kind == "p":
        return PasswordData(r.rest())
    elif kind in ("F", "d", "c", "f"):
        return Unsupported(kind)
    else:
        raise ProtocolViolation(f"unknown message type {kind!r}")
    r.end()
    return msg


# -- backend messages -------------------------------------------------------------------


def _message(kind: bytes, body: bytes) -> bytes:
    return kind + struct.pack("!i", len(body) + 4) + body


def _cstr(text: str) -> bytes:
    return text.replace("\0", "").encode("utf-8") + b"\0"


def authentication(code: int, data: bytes = b"") -> bytes:
    """AuthenticationOk (0), SASL (10), SASLContinue (11), SASLFinal (12)."""
    return _message(b"R", struct.pack("!i", code) + data)


def sasl_mechanisms(*names: str) -> bytes:
    return authentication(10, b"".join(_cstr(n) for n in names) + b"\0")


def parameter_status(name: str, value: str) -> bytes:
    return _message(b"S", _cstr(name) + _cstr(value))


def backend_key_data(process_id: int, secret: int) -> bytes:
    return _message(b"K", struct.pack("!ii", process_id, secret))


def ready_for_query(status: str) -> bytes:
    return _message(b"Z", status.encode("ascii"))


@dataclass(frozen=True)
class Field:
    """One column of a RowDescription."""

    name: str
    type_oid: int
    type_size: int
    format: int = 0  # 0 text, 1 binary


def row_description(fields: list[Field]) -> bytes:
    body = struct.pack("!h", len(fields))
    for f in fields:
        body += _cstr(f.name) + struct.pack("!ihihih", 0, 0, f.type_oid, f.type_size, -1, f.format)
    return _message(b"T", body)


def data_row(values: list[bytes | None]) -> bytes:
    parts = [struct.pack("!h", len(values))]
    for v in values:
        if v is None:
            parts.append(struct.pack("!i", -1))
        else:
            parts.append(struct.pack("!i", len(v)))
            parts.append(v)
    return _message(b"D", b"".join(parts))


def command_complete(tag: str) -> bytes:
    return _message(b"C", _cstr(tag))


def empty_query_response() -> bytes:
    return _message(b"I", b"")


def parse_complete() -> bytes:
    return _message(b"1", b"")


def bind_complete() -> bytes:
    return _message(b"2", b"")


def close_complete() -> bytes:
    return _message(b"3", b"")


def no_data() -> bytes:
    return _message(b"n", b"")


def portal_suspended() -> bytes:
    return _message(b"s", b"")


def parameter_description(oids: list[int]) -> bytes:
    return _message(
        b"t", struct.pack("!h", len(oids)) + b"".join(struct.pack("!I", o) for o in oids)
    )


def _fields(
    severity: str, sqlstate: str, message: str, detail: str | None, hint: str | None
) -> bytes:
    body = b"S" + _cstr(severity) + b"V" + _cstr(severity) + b"C" + _cstr(sqlstate)
    body += b"M" + _cstr(message)
    if detail:
        body += b"D" + _cstr(detail)
    if hint:
        body += b"H" + _cstr(hint)
    return body + b"\0"


def error_response(
    sqlstate: str,
    message: str,
    *,
    detail: str | None = None,
    hint: str | None = None,
    severity: str = "ERROR",
) -> bytes:
    return _message(b"E", _fields(severity, sqlstate, message, detail, hint))


def notice_response(message: str, *, detail: str | None = None) -> bytes:
    return _message(b"N", _fields("NOTICE", "00000", message, detail, None))
