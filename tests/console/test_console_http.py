"""The console over HTTP, without a browser: what is served, with which headers, to whom.

The browser tests (``test_console_browser.py``) drive the page itself; these pin the
server's side: the page and its files, the Content Security Policy, why no CSRF token
is needed, and that the chart endpoints release nothing the API would not.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from flask.testing import FlaskClient

from gateway.http.console import CONTENT_SECURITY_POLICY, STATIC
from tests.conftest import ADMIN_KEY

VENDOR = STATIC / "vendor"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


def test_the_page_and_its_files_are_served_with_a_strict_policy(client: FlaskClient) -> None:
    page = client.get("/ui/")
    assert page.status_code == 200 and page.mimetype == "text/html"
    assert page.headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
    policy = dict(
        part.strip().split(" ", 1) for part in CONTENT_SECURITY_POLICY.split(";") if part.strip()
    )
    assert policy["default-src"] == "'none'"
    assert policy["script-src"] == "'self'"  # no 'unsafe-inline', no 'unsafe-eval'
    assert policy["style-src"] == "'self'"
    assert policy["frame-ancestors"] == "'none'"
    assert page.headers["X-Frame-Options"] == "DENY"
    assert page.headers["X-Content-Type-Options"] == "nosniff"
    assert page.headers["Cache-Control"] == "no-store"
    html = page.get_data(as_text=True)
    # No inline script or style: every <script> has a src, no style= or on…= attributes.
    assert all("src=" in tag for tag in re.findall(r"<script[^>]*>", html))
    assert not re.search(r"<style|\sstyle=|\son[a-z]+=", html)
    for src in re.findall(r'(?:src|href)="(/ui/[^"]+)"', html):
        asset = client.get(src)
        assert asset.status_code == 200, src
        assert asset.headers["X-Content-Type-Options"] == "nosniff"
    assert client.get("/ui").status_code in (301, 308)  # to /ui/


def test_the_console_script_never_parses_text_as_html_or_code() -> None:
    """Everything the page shows (SQL from the audit log, error messages, names) is text.

    The CSP already forbids eval; this keeps the script from building markup out of
    strings, so nothing an analyst typed can become HTML in the admin's page.
    """
    script = (STATIC / "console.js").read_text()
    for sink in (
        "innerHTML",
        "outerHTML",
        "insertAdjacentHTML",
        "document.write",
        "eval(",
        "new Function",
        'setTimeout("',
        "javascript:",
    ):
        assert sink not in script, sink
    assert "localStorage.setItem" not in script  # the key lives in sessionStorage only
    assert "document.cookie" not in script


def test_no_file_outside_the_console_is_served(
    client: FlaskClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A folder called "static" where the server runs is not published (Flask's default).
    (tmp_path / "static").mkdir()
    (tmp_path / "static" / "secret.txt").write_text("do not serve")
    monkeypatch.chdir(tmp_path)
    for path in [
        "/static/secret.txt",
        "/ui/static/../../http/app.py",
        "/ui/static/%2e%2e/charts.py",
        "/ui/static/vendor/../../charts.py",
        "/ui/static/nothing.js",
    ]:
        response = client.get(path)
        assert response.status_code == 404, path
        assert response.get_json()["error"]["code"] == "not_found"


def test_the_vendored_bundles_are_the_recorded_versions() -> None:
    notice = (VENDOR / "NOTICE.md").read_text()
    recorded = dict(
        (name, digest) for digest, name in re.findall(r"^([0-9a-f]{64})  (\S+)$", notice, re.M)
    )
    assert set(recorded) == {"vega.min.js", "vega-lite.min.js", "vega-embed.min.js"}
    for name, digest in recorded.items():
        assert hashlib.sha256((VENDOR / name).read_bytes()).hexdigest() == digest, name
    # vega 6, vega-lite 6, vega-embed 7: each bundle carries its own version string.
    versions = {"vega.min.js": "6.4.0", "vega-lite.min.js": "6.5.0", "vega-embed.min.js": "7.3.0"}
    for name, version in versions.items():
        assert re.search(rf"\| `{re.escape(name)}` \| [a-z-]+ \| {re.escape(version)} \|", notice)
        assert f'"{version}"' in (VENDOR / name).read_text(), name
    for package in ("vega", "vega-lite", "vega-embed", "vega-interpreter", "d3"):
        assert (VENDOR / "licenses" / f"{package}.LICENSE").stat().st_size > 300


def test_a_forged_cross_site_request_has_no_key_and_costs_nothing(
    client: FlaskClient, analyst_key: str, gateway: Any
) -> None:
    """Why no CSRF token: the browser attaches nothing that authorises a request.

    A page on another site can make the browser send a form POST (text/plain, no
    preflight) or a GET, but it cannot set the Authorization header, and no cookie is
    ever read. The forged request is unauthenticated and spends nothing; no response
    grants another origin the right to read it.
    """
    forged = client.post(
        "/v1/query",
        data='{"sql": "SELECT COUNT(*) FROM patients", "x": "="}',
        content_type="text/plain",
        headers={"Origin": "https://evil.example", "Cookie": f"key={analyst_key}"},
    )
    assert forged.status_code == 401
    assert forged.get_json()["error"]["code"] == "unauthenticated"
    assert gateway.ledger.budget_status("alice").queries == 0
    preflight = client.options(
        "/v1/query",
        headers={
            "Origin": "https://evil.example",
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type",
        },
    )
    for response in (forged, preflight, client.get("/ui/")):
        assert not any(k.lower().startswith("access-control-allow") for k, _ in response.headers)
    assert all("Set-Cookie" not in r.headers for r in (forged, client.get("/ui/")))


def test_a_chart_is_of_the_analysts_own_released_answer(
    client: FlaskClient, auth: dict[str, str], ask: Callable[..., Any], gateway: Any
) -> None:
    status, body = ask("SELECT sex, COUNT(*) AS n FROM patients GROUP BY sex", epsilon=0.5)
    assert status == 200
    chart_response = client.get(f"/ui/api/charts/release/{body['query_id']}", headers=auth)
    assert chart_response.status_code == 200
    chart = chart_response.get_json()["chart"]
    assert chart["kind"] == "bars" and chart["keys"] == ["sex"] and chart["measure"] == "n"
    values = chart["spec"]["data"]["values"]
    half = body["accuracy"]["n"]["ci95_halfwidth"]
    assert [(v["key"], v["value"], v["low"], v["high"]) for v in values] == [
        (key, n, n - half, n + half) for key, n in body["rows"]
    ]
    # Another analyst cannot chart alice's answer, nor can a wrong or missing key.
    bob = {"Authorization": f"Bearer {gateway.ledger.create_analyst('bob', 1.0, 1e-6)}"}
    other = client.get(f"/ui/api/charts/release/{body['query_id']}", headers=bob)
    assert other.status_code == 404 and other.get_json()["error"]["code"] == "not_found"
    assert client.get(f"/ui/api/charts/release/{body['query_id']}").status_code == 401
    assert (
        client.get(f"/ui/api/charts/release/{body['query_id']}", headers=ADMIN).status_code == 403
    )
    # A scalar answer has nothing to plot.
    status, scalar = ask("SELECT COUNT(*) FROM patients", epsilon=0.5)
    assert status == 200
    none = client.get(f"/ui/api/charts/release/{scalar['query_id']}", headers=auth).get_json()
    assert none == {"ok": True, "chart": None}
    assert client.get("/ui/api/charts/release/dry-run", headers=auth).status_code == 404


def test_the_spend_chart_ends_at_what_the_budget_says(
    client: FlaskClient, auth: dict[str, str], ask: Callable[..., Any], gateway: Any
) -> None:
    for eps in (0.2, 0.3):
        assert (
            ask(f"SELECT COUNT(*) FROM patients WHERE age > {eps * 100:.0f}", epsilon=eps)[0] == 200
        )
    assert ask("SELECT COUNT(*) FROM nowhere")[0] == 400  # refused: no charge, no point
    response = client.get("/ui/api/charts/spend/alice", headers=ADMIN)
    assert response.status_code == 200
    body = response.get_json()
    status = client.get("/v1/admin/analysts/alice", headers=ADMIN).get_json()["analyst"]
    assert [p["query_epsilon"] for p in body["points"]] == [0.2, 0.3]
    assert body["points"][-1]["epsilon_spent"] == pytest.approx(status["epsilon_spent"])
    assert body["spec"]["data"]["values"] == body["points"]
    assert client.get("/ui/api/charts/spend/alice", headers=auth).status_code == 403
    missing = client.get("/ui/api/charts/spend/nobody", headers=ADMIN)
    assert missing.status_code == 404 and missing.get_json()["error"]["code"] == "not_found"
    # Like every analyst and admin request, chart requests are in the audit log.
    gateway.ledger.flush()  # request-log rows are written in batches
    logged = client.get("/v1/admin/audit-log?limit=100", headers=ADMIN).get_json()["entries"]
    endpoints = {(e["endpoint"], e["status"]) for e in logged}
    assert ("GET /ui/api/charts/spend/alice", 200) in endpoints
    assert ("GET /ui/api/charts/spend/alice", 403) in endpoints
    assert ("GET /ui/api/charts/spend/nobody", 404) in endpoints


def test_every_console_file_ships_in_the_package() -> None:
    import tomllib

    from tests.conftest import REPOSITORY

    pyproject = tomllib.loads((REPOSITORY / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["package-data"]["gateway"]
    package = STATIC.parents[1]  # gateway/: package-data globs are relative to it
    shipped = {path for pattern in patterns for path in package.glob(pattern)}
    files = {path for path in STATIC.rglob("*") if path.is_file()}
    assert len(files) >= 10
    assert files - shipped == set()
