"""CPU to refuse hostile input (issue 36: at most 100 ms per request): the largest
bodies and SQL texts each input limit sees, sent through the app's test client (the
whole request path: JSON, request checks, tokens, parser), best and worst of 5.

    python -m bench.refusal_cpu
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from gateway.config import parse_config
from gateway.demo.hospital import build, config_yaml
from gateway.http.app import create_app
from gateway.pipeline import Gateway

WHERE = "SELECT COUNT(*) FROM patients WHERE "
CASES = {
    "99k parentheses": {"sql": WHERE + "(" * 99_000},
    "24k NOT": {"sql": WHERE + "NOT " * 24_000 + "age > 1"},
    "96 kB AND chain": {"sql": WHERE + " AND ".join(["age > 1"] * 8000)},
    # Under the token cap: refused by the count of ANDs and ORs, before the parser.
    "1,990-term AND chain": {"sql": WHERE + " AND ".join(["age > 1"] * 1990)},
    # At the count of ANDs: parsed, refused by the expression's size (max_nodes).
    "512-term AND chain": {"sql": WHERE + " AND ".join(["age > 1"] * 512)},
    "1,990-term + chain": {"sql": WHERE + " + ".join(["age"] * 1990) + " > 1"},
    "49k-value IN list": {"sql": WHERE + "age IN (" + ",".join(["1"] * 49_000) + ")"},
    "99k-char string": {"sql": WHERE + "city = '" + "x" * 99_000 + "'"},
    "7,000 junk tokens": {"sql": WHERE + " ".join(["#>"] * 7_000)},
    "CASE 60 deep": {"sql": WHERE + "CASE WHEN " * 60 + "age > 1" + " THEN TRUE END" * 60},
    "ABS 40 deep": {"sql": WHERE + "ABS(" * 40 + "age" + ")" * 40 + " > 1"},
    "99k-digit number in SQL": {"sql": WHERE + "age > " + "9" * 99_000},
    "4,000-digit ε": {"sql": "SELECT COUNT(*) FROM patients", "epsilon": 10**4000},
}
RAW = {
    "1 MB of [": "[" * 999_000,
    "1 MB nested 500 deep": "[" * 500 + "0," * 498_000 + "0" + "]" * 500,
    "1 MB number": '{"sql": "SELECT 1", "epsilon": ' + "1" * 999_000 + "}",
}


def run(repeats: int = 5) -> dict[str, Any]:
    logging.disable(logging.CRITICAL)
    root = Path(tempfile.mkdtemp(prefix="dpgate-refusal-"))
    build(root / "h.db", patients=1000)
    raw = yaml.safe_load(config_yaml(str(root / "h.db"), str(root / "ledger.db")))
    os.environ.setdefault("DPGATE_ADMIN_KEY", "admin-" + "k" * 40)
    gateway = Gateway(parse_config(raw))
    key = gateway.ledger.create_analyst("alice", 10.0, 1e-6)
    client = create_app(gateway.config, gateway=gateway).test_client()
    bodies = {**{n: json.dumps(b) for n, b in CASES.items()}, **RAW}
    out: dict[str, Any] = {}
    for name, body in bodies.items():
        cpu = []
        for _ in range(repeats):
            began = time.process_time()
            resp = client.post(
                "/v1/query",
                data=body,
                headers={"Authorization": f"Bearer {key}"},
                content_type="application/json",
            )
            cpu.append(time.process_time() - began)
        code = (resp.get_json() or {}).get("error", {}).get("code")
        out[name] = {
            "status": resp.status_code,
            "code": code,
            "cpu_ms_min": round(1000 * min(cpu), 1),
            "cpu_ms_max": round(1000 * max(cpu), 1),
        }
    assert gateway.charges.status("alice").epsilon_spent == 0.0
    return out


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
