"""HTTP to the gateway: JSON over urllib, the Bearer key, and errors turned into exceptions.

Standard library only, so the driver installs anywhere a BI tool runs. One
``Transport`` is stateless apart from its settings (each request opens its own HTTP
connection), so it may be shared between threads.
"""

from __future__ import annotations

import http.client
import json
import os
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dpgate_client.errors import (
    ConnectionFailedError,
    Error,
    InterfaceError,
    error_from_response,
)

__version__ = "0.1.0"

DEFAULT_TIMEOUT = 60.0
KEY_ENVIRONMENT_VARIABLES = ("DPGATE_KEY", "DPGATE_API_KEY")  # as `dpgate query`
URL_ENVIRONMENT_VARIABLE = "DPGATE_URL"


def _redact(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    netloc = parts.hostname or ""
    if parts.port:
        netloc += f":{parts.port}"
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))


@dataclass(frozen=True)
class Transport:
    """Where the gateway is and how to reach it: base URL, API key, timeout, TLS."""

    base_url: str
    key: str | None = field(default=None, repr=False)
    timeout: float = DEFAULT_TIMEOUT
    verify: bool = True
    ca_file: str | None = None

    def __post_init__(self) -> None:
        parts = urllib.parse.urlsplit(self.base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise InterfaceError(
                f"the gateway URL must look like http://host:port or https://host, "
                f"got {self.base_url!r}",
                code="invalid_url",
            )
        if parts.username or parts.password:
            raise InterfaceError(
                "put the API key in key=…, not in an http(s) URL", code="invalid_url"
            )
        object.__setattr__(self, "base_url", self.base_url.rstrip("/"))
        if self.key is None:
            from_env = (os.environ.get(name) for name in KEY_ENVIRONMENT_VARIABLES)
            object.__setattr__(self, "key", next((k for k in from_env if k), None))

    def _context(self) -> ssl.SSLContext | None:
        if not self.base_url.startswith("https:"):
            return None
        context = ssl.create_default_context(cafile=self.ca_file)
        if not self.verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return context

    def request(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> Any:
        """Send one request; return the parsed JSON of an ``ok`` answer or raise."""
        url = self.base_url + path
        headers = {
            "Accept": "application/json",
            "User-Agent": f"dpgate-client/{__version__}",
        }
        data = None
        if body is not None:
            data = json.dumps(body, allow_nan=False).encode("utf-8")
            headers["Content-Type"] = "application/json"
        if self.key:
            headers["Authorization"] = f"Bearer {self.key}"
        request = urllib.request.Request(url, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(
                request, timeout=self.timeout, context=self._context()
            ) as response:
                status, raw = response.status, response.read()
        except urllib.error.HTTPError as exc:
            status, raw = exc.code, exc.read()
            exc.close()
        except (OSError, http.client.HTTPException) as exc:
            # URLError, timeouts, refused/reset connections, TLS failures, truncated
            # answers: no usable HTTP answer arrived.
            reason = getattr(exc, "reason", exc)
            raise ConnectionFailedError(
                f"could not reach the dpgate gateway at {_redact(self.base_url)}: {reason}",
                detail={"url": _redact(self.base_url)},
            ) from exc
        return _decode(status, raw)


def _decode(status: int, raw: bytes) -> Any:
    text = raw.decode("utf-8", errors="replace")
    try:
        payload: Any = json.loads(text) if text.strip() else None
    except ValueError:
        payload = None
    if 200 <= status < 300 and isinstance(payload, Mapping) and payload.get("ok") is not False:
        return payload
    if isinstance(payload, Mapping) and "error" in payload:
        raise error_from_response(status, payload)
    if 200 <= status < 300:
        raise InterfaceError(
            f"the gateway answered HTTP {status} with a body that is not dpgate's JSON",
            code="invalid_response",
            status=status,
        )
    error: Error = error_from_response(status, text)
    raise error
