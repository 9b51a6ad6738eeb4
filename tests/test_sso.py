"""Issue 39: single sign-on. An OIDC/JWT bearer token stands for an API key, on HTTP and
as the wire's password. Tokens are minted here with local keys and verified by the real
gateway against a JWKS document served over real HTTP on 127.0.0.1 (a tiny http.server
thread): a token with a wrong signature, issuer or audience, an expired one, or one with
an algorithm that is not allowed is refused with 401 ``unauthenticated`` and a distinct
``detail.reason``; a JWKS endpoint that fails is a 401 too, never a 500."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jwt
import psycopg
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from flask.testing import FlaskClient

from gateway.http.app import create_app
from gateway.pipeline.gateway import Gateway
from tests.conftest import ADMIN_KEY, demo_config_dict

AUDIENCE = "dpgate"
COUNT = "SELECT COUNT(*) AS n FROM patients"  # granted to the group oncology only
VISITS = "SELECT COUNT(*) AS n FROM visits"  # open to every analyst


class Issuer:
    """A local identity provider: signing keys, and its JWKS over HTTP."""

    def __init__(self) -> None:
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.fetches = 0
        self.failing = False
        self.jwks: dict[str, Any] = {"keys": [self.public_jwk(self.key, "k1")]}
        issuer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                issuer.fetches += 1
                if issuer.failing:
                    self.send_response(500)
                    self.end_headers()
                    return
                body = json.dumps(issuer.jwks).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.port}/realms/hospital"

    @staticmethod
    def public_jwk(key: Any, kid: str) -> dict[str, Any]:
        jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
        return {**jwk, "kid": kid, "use": "sig", "alg": "RS256"}

    def token(
        self,
        *,
        sign_with: Any = None,
        algorithm: str = "RS256",
        kid: str | None = "k1",
        **claims: Any,
    ) -> str:
        now = int(time.time())
        body = {
            "iss": self.url,
            "aud": AUDIENCE,
            "iat": now,
            "exp": now + 300,
            "sub": "0b5c-uuid",
            "preferred_username": "alice",
            "groups": [],
            **claims,
        }
        body = {k: v for k, v in body.items() if v is not None}
        headers = {"kid": kid} if kid is not None else {}
        return jwt.encode(body, sign_with or self.key, algorithm=algorithm, headers=headers)

    def close(self) -> None:
        self.server.shutdown()


@pytest.fixture
def idp() -> Iterator[Issuer]:
    issuer = Issuer()
    yield issuer
    issuer.close()


def sso_section(idp: Issuer, **extra: Any) -> dict[str, Any]:
    return {
        "clock_skew_s": 30,
        "jwks_ttl_s": 300,
        "admin_groups": {"admin": ["dpgate-admins"], "auditor": ["dpgate-auditors"]},
        "issuers": [
            {
                "issuer": idp.url,
                "audience": AUDIENCE,
                "jwks_url": f"http://127.0.0.1:{idp.port}/realms/hospital/certs",
                "algorithms": ["RS256", "ES256"],
                "analyst_claim": "preferred_username",
                "groups_claim": "groups",
            }
        ],
        **extra,
    }


@pytest.fixture
def make_sso(
    make_gateway: Callable[..., Gateway], idp: Issuer, tmp_path: Path
) -> Callable[..., tuple[Gateway, FlaskClient]]:
    def build(**extra: Any) -> tuple[Gateway, FlaskClient]:
        raw = demo_config_dict(tmp_path / "unused.db", tmp_path / "unused-ledger.db")
        tables = raw["tables"]
        tables["patients"] = {**tables["patients"], "grants": ["oncology"]}
        # plain references: visits, open to everyone, is not read through patients
        # (every_row_matches: tests/test_grants.py)
        tables["visits"]["references"] = {"patient_id": "patients.patient_id"}
        tables["patients"]["references"] = {"zip": "zip_regions.zip"}
        overrides = {"tables": tables, "analysts": [], "sso": sso_section(idp, **extra)}
        gw = make_gateway(**overrides)
        gw.ledger.create_analyst("alice", 10.0, 1e-6)
        return gw, create_app(gw.config, gateway=gw).test_client()

    return build


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _query(client: FlaskClient, token: str, sql: str = VISITS) -> tuple[int, dict[str, Any]]:
    r = client.post("/v1/query", json={"sql": sql, "epsilon": 0.5}, headers=bearer(token))
    return r.status_code, r.get_json()


def _reason(client: FlaskClient, token: str) -> str:
    status, body = _query(client, token)
    assert status == 401, body
    assert body["error"]["code"] == "unauthenticated"
    return str(body["error"]["detail"]["reason"])


def test_a_valid_token_stands_for_the_analyst_and_brings_its_groups(
    make_sso: Callable[..., tuple[Gateway, FlaskClient]], idp: Issuer
) -> None:
    _, client = make_sso()
    plain = idp.token()
    assert client.get("/v1/budget", headers=bearer(plain)).status_code == 200
    schema = client.get("/v1/schema", headers=bearer(plain)).get_json()
    assert "patients" not in [t["name"] for t in schema["tables"]]
    assert _query(client, plain, COUNT)[1]["error"]["code"] == "unknown_table"
    # Keycloak's full group path counts by its last part
    oncologist = idp.token(groups=["/hospital/oncology"])
    status, body = _query(client, oncologist, COUNT)
    assert status == 200, body
    assert body["budget"]["epsilon_spent"] > 0


def test_bad_tokens_get_401_with_a_reason_each(
    make_sso: Callable[..., tuple[Gateway, FlaskClient]], idp: Issuer
) -> None:
    _, client = make_sso()
    stranger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    assert _reason(client, idp.token(sign_with=stranger)) == "bad_signature"
    assert _reason(client, idp.token(iss="https://evil.example/realms/x")) == "wrong_issuer"
    assert _reason(client, idp.token(aud="another-app")) == "wrong_audience"
    now = int(time.time())
    assert _reason(client, idp.token(iat=now - 7200, exp=now - 3600)) == "expired"
    assert _reason(client, idp.token(nbf=now + 3600)) == "not_yet_valid"
    assert _reason(client, idp.token(exp=None)) == "missing_claim"
    assert _reason(client, idp.token(preferred_username=None)) == "missing_claim"
    assert _reason(client, idp.token(kid="rotated-away")) == "unknown_key"
    # an allowed algorithm, but not the one of the key its kid names
    ec_key = ec.generate_private_key(ec.SECP256R1())
    assert _reason(client, idp.token(sign_with=ec_key, algorithm="ES256")) == "bad_signature"
    # the HS256-with-the-public-key confusion, and no signature at all
    pem = idp.key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    forged = jwt.encode(
        {"iss": idp.url, "aud": AUDIENCE, "exp": now + 300, "preferred_username": "alice"},
        pem.decode()[:32],  # any secret: the algorithm itself is refused
        algorithm="HS256",
        headers={"kid": "k1"},
    )
    assert _reason(client, forged) == "algorithm_not_allowed"
    unsigned = jwt.encode(
        {"iss": idp.url, "aud": AUDIENCE, "exp": now + 300, "preferred_username": "alice"},
        None,
        algorithm="none",
    )
    assert _reason(client, unsigned) == "algorithm_not_allowed"
    assert _reason(client, "eyJhbGciOi.not-a.token") == "malformed"
    # a clock skew within the allowed leeway is accepted
    assert _query(client, idp.token(iat=now - 400, exp=now - 10))[0] == 200
    # an analyst the ledger does not know: refused by default
    assert _reason(client, idp.token(preferred_username="zed")) == "unknown_subject"
    # the admin endpoints say the same reasons
    r = client.get("/v1/admin/analysts", headers=bearer(idp.token(aud="x")))
    assert r.status_code == 401 and r.get_json()["error"]["detail"]["reason"] == "wrong_audience"


def test_an_ec_key_and_a_rotated_key_are_fetched(
    make_sso: Callable[..., tuple[Gateway, FlaskClient]], idp: Issuer
) -> None:
    _, client = make_sso()
    assert _query(client, idp.token())[0] == 200
    fetched = idp.fetches
    assert _query(client, idp.token())[0] == 200
    assert idp.fetches == fetched  # cached for jwks_ttl_s
    # the issuer rotates to a new EC key: a token with its kid makes dpgate refetch once
    ec_key = ec.generate_private_key(ec.SECP256R1())
    jwk = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(ec_key.public_key()))
    idp.jwks["keys"].append({**jwk, "kid": "k2", "use": "sig", "alg": "ES256"})
    from gateway.pipeline import sso

    for cache in client.application.extensions["dpgate"].tokens._keys.values():
        cache._tried_at -= sso.REFETCH_MIN_S  # as if the last fetch was a while ago
    status, body = _query(client, idp.token(sign_with=ec_key, algorithm="ES256", kid="k2"))
    assert status == 200, body
    assert idp.fetches == fetched + 1
    # made-up key ids do not make dpgate hammer the issuer
    for _ in range(5):
        assert _reason(client, idp.token(kid="made-up")) == "unknown_key"
    assert idp.fetches == fetched + 1


def test_an_unreachable_jwks_is_a_401_not_a_500(
    make_sso: Callable[..., tuple[Gateway, FlaskClient]], idp: Issuer
) -> None:
    idp.failing = True
    _, client = make_sso()
    assert _reason(client, idp.token()) == "jwks_unavailable"
    idp.close()  # and the endpoint gone altogether
    assert _reason(client, idp.token()) == "jwks_unavailable"


def test_unknown_subjects_may_be_provisioned(
    make_sso: Callable[..., tuple[Gateway, FlaskClient]], idp: Issuer
) -> None:
    gw, client = make_sso(
        unknown_subject="provision", provision={"epsilon": 2.0, "delta": 1e-6, "period": "month"}
    )
    token = idp.token(preferred_username="zed")
    r = client.get("/v1/budget", headers=bearer(token))
    assert r.status_code == 200, r.get_json()
    assert r.get_json()["budget"]["epsilon"] == 2.0
    assert r.get_json()["budget"]["period"] == "month"
    entries = gw.ledger.audit_log(actor="sso")
    assert [(e.action, e.params) for e in entries] == [
        ("analyst.create", {"name": "zed", "epsilon": 2.0, "delta": 1e-6, "period": "month"})
    ]
    client.get("/v1/budget", headers=bearer(token))
    assert len(gw.ledger.audit_log(actor="sso")) == 1  # once


def test_admin_groups_make_admins_and_auditors(
    make_sso: Callable[..., tuple[Gateway, FlaskClient]], idp: Issuer
) -> None:
    gw, client = make_sso()
    admin = idp.token(preferred_username="root-ann", groups=["dpgate-admins"])
    auditor = idp.token(preferred_username="ivy", groups=["dpgate-auditors"])
    r = client.post(
        "/v1/admin/grants", json={"table": "visits", "group": "cardio"}, headers=bearer(admin)
    )
    assert r.status_code == 201, r.get_json()
    assert client.get("/v1/admin/grants", headers=bearer(auditor)).status_code == 200
    r = client.post(
        "/v1/admin/groups/cardio/members", json={"analyst": "alice"}, headers=bearer(auditor)
    )
    assert r.status_code == 403
    gw.ledger.flush()
    rows = {(e.actor, e.action, e.status) for e in gw.ledger.audit_log()}
    assert ("root-ann", "grant.add", 201) in rows and ("ivy", "group.add_member", 403) in rows
    # an admin's token runs no queries
    assert _query(client, admin)[0] == 403
    # an analyst's token is no admin's
    assert client.get("/v1/admin/grants", headers=bearer(idp.token())).status_code == 403
    assert ADMIN_KEY  # the bootstrap key still works beside tokens
    assert client.get("/v1/admin/grants", headers=bearer(ADMIN_KEY)).status_code == 200


def test_the_wire_takes_a_token_or_a_key_as_the_password(
    make_gateway: Callable[..., Gateway], idp: Issuer, tmp_path: Path
) -> None:
    from gateway.pgwire.server import WireServer

    gw = make_gateway(
        analysts=[],
        sso=sso_section(idp),
        postgres_wire={"port": 0, "login": "password"},
    )
    key = gw.ledger.create_analyst("alice", 10.0, 1e-6)
    gw.ledger.create_analyst("bob", 10.0, 1e-6)
    server = WireServer(gw.config, gw)
    _, port = server.bind("127.0.0.1")
    threading.Thread(target=server.serve_forever, daemon=True).start()

    def connect(user: str, password: str) -> psycopg.Connection[Any]:
        return psycopg.connect(
            host="127.0.0.1", port=port, user=user, password=password, dbname="dpgate",
            sslmode="disable", connect_timeout=10, autocommit=True,
        )  # fmt: skip

    try:
        with connect("alice", idp.token()) as conn:
            assert conn.execute(COUNT).fetchone() is not None
        with connect("alice", key) as conn:
            assert conn.execute(COUNT).fetchone() is not None
        now = int(time.time())
        for user, password, says in (
            ("alice", idp.token(iat=now - 7200, exp=now - 3600), "expired"),
            ("alice", idp.token(aud="x"), "not meant for dpgate"),
            ("bob", idp.token(), "password authentication failed"),  # alice's token
            ("bob", key, "password authentication failed"),  # alice's key
            ("alice", "wrong", "password authentication failed"),
            ("alice", ADMIN_KEY, "password authentication failed"),
        ):
            with pytest.raises(psycopg.OperationalError) as e:
                connect(user, password)
            assert says in str(e.value), (user, str(e.value))
    finally:
        server.shutdown()


def test_keys_from_a_file_and_the_config_checks(
    make_gateway: Callable[..., Gateway], idp: Issuer, tmp_path: Path
) -> None:
    from gateway.core.config import ConfigError
    from gateway.core.config_load import parse_config

    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps(idp.jwks))
    section = sso_section(idp)
    issuer = {k: v for k, v in section["issuers"][0].items() if k != "jwks_url"}
    section["issuers"] = [{**issuer, "jwks_file": str(keys)}]
    gw = make_gateway(analysts=[], sso=section)
    gw.ledger.create_analyst("alice", 10.0, 1e-6)
    client = create_app(gw.config, gateway=gw).test_client()
    assert _query(client, idp.token())[0] == 200
    assert idp.fetches == 0
    raw = demo_config_dict(tmp_path / "d.db", tmp_path / "l.db")
    raw["sso"] = {
        "issuers": [{**issuer, "algorithms": ["HS256", "none"], "jwks_url": "file:///etc/passwd"}],
        "unknown_subject": "provision",
    }
    with pytest.raises(ConfigError) as e:
        parse_config(raw, base_dir=tmp_path)
    text = str(e.value)
    assert "'HS256' is not allowed" in text and "'none' is not allowed" in text
    assert "jwks_url: must be an http(s) URL" in text
    assert "sso.provision.epsilon: needed" in text
