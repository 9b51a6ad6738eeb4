"""``dpgate demo``'s files: the demo database, its config, its ledger and the demo key.

A second ``dpgate demo`` in the same folder resumes the first: the ledger keeps what was
spent and who was added, which the command must say (a fresh key on a spent budget is
confusing otherwise); ``--fresh`` starts a new ledger. The data is deterministic, so it
is built once and kept. The admin key is kept too (``admin.key``, readable by its owner
only), so a second demo does not silently invalidate the key an admin already uses;
``DPGATE_ADMIN_KEY`` overrides it, ``--fresh`` replaces it.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

import budget
from gateway.core.config_load import load_config
from gateway.demo.hospital import build, config_yaml, upgrade

DEMO_ANALYST = "demo"
DEMO_EPSILON = 10.0
DEMO_DELTA = 1e-6


@dataclass(frozen=True)
class DemoFiles:
    """What ``prepare`` made: paths, the demo analyst's new key, and what was resumed.

    ``resumed`` is None for a new ledger, else a short account of the earlier state
    (``demo: ε 2.5 spent of 10; analysts: demo, alice``).
    """

    database: Path
    config: Path
    ledger: Path
    key: str
    resumed: str | None
    admin_key: str = ""
    # where the admin key came from: "environment", "kept" (an earlier demo's) or "new"
    admin_key_source: str = "new"


def prepare(directory: Path, *, fresh: bool = False, postgres_port: int | None = None) -> DemoFiles:
    """Write the demo into ``directory`` and give the demo analyst a new key."""
    from gateway.cli.render import number

    root = directory.resolve()
    root.mkdir(parents=True, exist_ok=True)
    db, ledger_path, config_path = root / "hospital.db", root / "ledger.db", root / "dpgate.yaml"
    if fresh:
        for suffix in ("", "-wal", "-shm", "-journal"):
            Path(f"{ledger_path}{suffix}").unlink(missing_ok=True)
        (root / ADMIN_KEY_FILE).unlink(missing_ok=True)
    admin_key, admin_source = _admin_key(root / ADMIN_KEY_FILE)
    existed = ledger_path.exists()
    if not db.exists():
        build(db)
    else:
        upgrade(db)  # a demo database from an earlier version: add what it lacks
    config_path.write_text(config_yaml(str(db), str(ledger_path), postgres_port))
    config = load_config(config_path)
    ledger = budget.Ledger.from_url(config.ledger.url, **config.privacy.ledger_options())
    try:
        ledger.migrate()
        resumed = None
        if existed:
            analysts = ledger.list_analysts()
            spent = next((a for a in analysts if a.name == DEMO_ANALYST), None)
            resumed = "analysts: " + (", ".join(a.name for a in analysts) or "none")
            if spent is not None:
                resumed = (
                    f"{DEMO_ANALYST}: ε {number(spent.epsilon_spent)} spent of "
                    f"{number(spent.epsilon)} in {spent.queries} queries; {resumed}"
                )
        try:
            key = ledger.create_analyst(DEMO_ANALYST, DEMO_EPSILON, DEMO_DELTA)
        except budget.AnalystExists:
            key = ledger.rotate_key(DEMO_ANALYST)
    finally:
        ledger.close()
    return DemoFiles(
        database=db,
        config=config_path,
        ledger=ledger_path,
        key=key,
        resumed=resumed,
        admin_key=admin_key,
        admin_key_source=admin_source,
    )


ADMIN_KEY_FILE = "admin.key"


def _admin_key(path: Path) -> tuple[str, str]:
    """The demo's admin key: ``DPGATE_ADMIN_KEY`` if set, else the one an earlier demo
    kept in ``path``, else a new one written there (mode 0600)."""
    if os.environ.get("DPGATE_ADMIN_KEY"):
        return os.environ["DPGATE_ADMIN_KEY"], "environment"
    if path.exists():
        kept = path.read_text().strip()
        if kept:
            return kept, "kept"
    key = secrets.token_urlsafe(24)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key + "\n")
    return key, "new"
