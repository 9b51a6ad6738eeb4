"""Fixtures of the console tests: a real gateway served over HTTP, and Debian's Chromium.

The gateway is the real app (``create_app``) on a copy of the demo data, served by
werkzeug on a loopback port in a thread; the browser is ``/usr/bin/chromium`` driven by
Playwright for Python (no browser download). Where either is missing the browser tests
skip and say how to install them. Screenshots go to ``test-artifacts/console/`` (git
ignores it); the path is printed at the end of the run.
"""

from __future__ import annotations

import json
import shutil
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from werkzeug.serving import WSGIRequestHandler

from gateway.core.config_load import parse_config
from tests.conftest import ADMIN_KEY, REPOSITORY, demo_config_dict

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = REPOSITORY / "test-artifacts" / "console"
INSTALL_HINT = (
    "the console's browser tests need Debian's Chromium at /usr/bin/chromium "
    "(apt-get install -y chromium) and Playwright for Python (pip install playwright, "
    "in the dev extra); no browser download is needed"
)


@dataclass
class Served:
    """A gateway serving the console on a loopback port, and a way to call its API."""

    url: str
    analyst_key: str
    admin_key: str = ADMIN_KEY
    gateway: Any = None

    def call(
        self, method: str, path: str, body: Any = None, key: str | None = None
    ) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if key:
            req.add_header("Authorization", f"Bearer {key}")
        try:
            with urllib.request.urlopen(req, timeout=15) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())


class _Quiet(WSGIRequestHandler):  # type: ignore[misc]
    """werkzeug's handler without its access log (dpgate writes its own)."""

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        pass


@pytest.fixture(scope="module")
def served(demo_db: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    from werkzeug.serving import make_server

    from gateway.http.app import create_app
    from gateway.pipeline.gateway import Gateway

    root = tmp_path_factory.mktemp("console")
    shutil.copy(demo_db, root / "hospital.db")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DPGATE_ADMIN_KEY", ADMIN_KEY)
        gw = Gateway(parse_config(demo_config_dict(root / "hospital.db", root / "ledger.db")))
        key = gw.ledger.create_analyst("alice", 10.0, 1e-6)
        app = create_app(gw.config, gateway=gw)
        server = make_server("127.0.0.1", 0, app, threaded=True, request_handler=_Quiet)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield Served(url=f"http://127.0.0.1:{server.server_port}", analyst_key=key, gateway=gw)
        finally:
            server.shutdown()
            thread.join(timeout=10)


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    """Debian's Chromium under Playwright, or a skip that says how to install it."""
    if not CHROMIUM.exists():
        pytest.skip(INSTALL_HINT)
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip(INSTALL_HINT)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM))
        try:
            yield browser
        finally:
            browser.close()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    shots = sorted(ARTIFACTS.glob("*.png")) if ARTIFACTS.is_dir() else []
    if shots:
        terminalreporter.write_line(f"console screenshots ({len(shots)}): {ARTIFACTS}")
