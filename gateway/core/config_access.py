"""The config's access sections: ``access`` (who may read a table without grants) and
``sso`` (OIDC/JWT issuers whose tokens stand for an API key); ``tables.<t>.grants`` is
read with its table (``gateway.core.config``).

    access:
      default: open            # open (a table without grants: every analyst) | granted
    sso:
      clock_skew_s: 60         # leeway on exp / nbf / iat
      jwks_ttl_s: 300          # how long fetched signing keys are reused
      unknown_subject: refuse  # refuse | provision (a new analyst with `provision`'s budget)
      provision: {epsilon: 1.0, delta: 1.0e-6, period: month}
      admin_groups: {admin: [dpgate-admins], auditor: [dpgate-auditors]}
      issuers:
        - issuer: https://sso.example.org/realms/hospital
          audience: dpgate
          jwks_url: https://sso.example.org/realms/hospital/protocol/openid-connect/certs
          # or jwks_file: keys.json
          algorithms: [RS256]
          analyst_claim: preferred_username
          groups_claim: groups
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from gateway.core.config_problems import _Validator

#: Asymmetric signatures only: a symmetric (HS*) key would be a secret shared with every
#: verifier, and ``none`` is no signature at all.
ALLOWED_ALGORITHMS = (
    "RS256",
    "RS384",
    "RS512",
    "PS256",
    "PS384",
    "PS512",
    "ES256",
    "ES384",
    "ES512",
    "EdDSA",
)
GROUP_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")


@dataclass(frozen=True)
class AccessConfig:
    """``default``: who may read a table that has no grant (in the config or the
    ledger): ``open`` — every analyst (dpgate's behaviour before grants); ``granted`` —
    nobody until a group is granted it."""

    default: Literal["open", "granted"] = "open"


@dataclass(frozen=True)
class Issuer:
    """One identity provider whose tokens dpgate accepts."""

    issuer: str
    audience: str
    jwks_url: str | None = None
    jwks_file: Path | None = None
    algorithms: tuple[str, ...] = ("RS256",)
    analyst_claim: str = "sub"
    groups_claim: str | None = "groups"


@dataclass(frozen=True)
class SsoConfig:
    """Bearer tokens (JWT, as OIDC providers issue them) accepted instead of API keys."""

    issuers: tuple[Issuer, ...]
    clock_skew_s: float = 60.0
    jwks_ttl_s: float = 300.0
    unknown_subject: Literal["refuse", "provision"] = "refuse"
    provision_epsilon: float | None = None
    provision_delta: float = 0.0
    provision_period: str = "none"
    admin_groups: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


def parse_access(v: _Validator, raw: Mapping[str, Any]) -> AccessConfig:
    ac = v.section(raw, "access")
    v.no_unknown(ac, "access", {"default"})
    default = v.choice(ac, "access.default", ("open", "granted"), "open") or "open"
    return AccessConfig(default=default)  # type: ignore[arg-type]


def parse_grants(v: _Validator, path: str, raw: Any) -> tuple[str, ...] | None:
    """``tables.<t>.grants``: the groups that may read the table (``[]``: none)."""
    if raw is None:
        return None
    if not isinstance(raw, list) or not all(isinstance(g, str) for g in raw):
        v.problem(f"{path}: must be a list of group names")
        return None
    for g in raw:
        if not GROUP_NAME.match(g):
            v.problem(f"{path}: '{g}' is not a group name (letters, digits, '_.@-')")
    return tuple(dict.fromkeys(raw))


def parse_sso(v: _Validator, raw: Mapping[str, Any], base_dir: Path | None) -> SsoConfig | None:
    if raw.get("sso") is None:
        return None
    so = v.section(raw, "sso")
    v.no_unknown(
        so,
        "sso",
        {"issuers", "clock_skew_s", "jwks_ttl_s", "unknown_subject", "provision", "admin_groups"},
    )
    issuers = []
    raw_issuers = so.get("issuers")
    if not isinstance(raw_issuers, list) or not raw_issuers:
        v.problem("sso.issuers: declare at least one issuer")
        raw_issuers = []
    for i, ir in enumerate(raw_issuers):
        issuer = _issuer(v, f"sso.issuers[{i}]", ir, base_dir)
        if issuer is not None:
            issuers.append(issuer)
    unknown = v.choice(so, "sso.unknown_subject", ("refuse", "provision"), "refuse") or "refuse"
    pr = v.section(so, "provision")
    v.no_unknown(pr, "sso.provision", {"epsilon", "delta", "period"})
    eps = v.number(pr, "sso.provision.epsilon", None, positive=True)
    if unknown == "provision" and eps is None:
        v.problem("sso.provision.epsilon: needed with unknown_subject: provision")
    admin_groups: dict[str, tuple[str, ...]] = {}
    ag = v.section(so, "admin_groups")
    v.no_unknown(ag, "sso.admin_groups", {"admin", "auditor"})
    for role, groups in ag.items():
        if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
            v.problem(f"sso.admin_groups.{role}: must be a list of group names")
            continue
        admin_groups[str(role)] = tuple(groups)
    return SsoConfig(
        issuers=tuple(issuers),
        clock_skew_s=v.number(so, "sso.clock_skew_s", 60.0) or 0.0,
        jwks_ttl_s=v.number(so, "sso.jwks_ttl_s", 300.0, positive=True) or 300.0,
        unknown_subject=unknown,  # type: ignore[arg-type]
        provision_epsilon=eps,
        provision_delta=v.number(pr, "sso.provision.delta", 0.0, unit=True) or 0.0,
        provision_period=v.choice(
            pr, "sso.provision.period", ("none", "day", "week", "month"), "none"
        )
        or "none",
        admin_groups=admin_groups,
    )


def _issuer(v: _Validator, path: str, raw: Any, base_dir: Path | None) -> Issuer | None:
    if not isinstance(raw, Mapping):
        v.problem(f"{path}: must be a mapping")
        return None
    v.no_unknown(
        raw,
        path,
        {
            "issuer",
            "audience",
            "jwks_url",
            "jwks_file",
            "algorithms",
            "analyst_claim",
            "groups_claim",
        },
    )
    issuer = v.string(raw, f"{path}.issuer", required=True)
    audience = v.string(raw, f"{path}.audience", required=True)
    url = raw.get("jwks_url")
    file = raw.get("jwks_file")
    if (url is None) == (file is None):
        v.problem(f"{path}: give exactly one of jwks_url and jwks_file")
    if url is not None and (not isinstance(url, str) or not re.match(r"^https?://", url)):
        v.problem(f"{path}.jwks_url: must be an http(s) URL")
        url = None
    jwks_file = None
    if file is not None:
        jwks_file = Path(str(file))
        if base_dir is not None and not jwks_file.is_absolute():
            jwks_file = base_dir / jwks_file
        if base_dir is not None and not jwks_file.is_file():
            v.problem(f"{path}.jwks_file: no such file: {jwks_file}")
    algorithms = raw.get("algorithms", ["RS256"])
    if not isinstance(algorithms, list) or not algorithms:
        v.problem(f"{path}.algorithms: must be a non-empty list")
        algorithms = ["RS256"]
    for alg in algorithms:
        if alg not in ALLOWED_ALGORITHMS:
            v.problem(
                f"{path}.algorithms: '{alg}' is not allowed (asymmetric signatures only: "
                f"{', '.join(ALLOWED_ALGORITHMS)})"
            )
    groups_claim = raw.get("groups_claim", "groups")
    return Issuer(
        issuer=issuer,
        audience=audience,
        jwks_url=url,
        jwks_file=jwks_file,
        algorithms=tuple(a for a in algorithms if a in ALLOWED_ALGORITHMS) or ("RS256",),
        analyst_claim=str(raw.get("analyst_claim", "sub")),
        groups_claim=None if groups_claim is None else str(groups_claim),
    )
