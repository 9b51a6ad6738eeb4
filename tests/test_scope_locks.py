"""The per-scope audit lock (budget/locks.py): one holder per scope, across threads and
processes sharing a ledger; different scopes never wait for each other."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from budget import Ledger

REPO = Path(__file__).resolve().parent.parent
WAIT = 0.3  # long enough for a waiting thread to have got the lock if it could


def _acquire_in_thread(ledger: Ledger, scope: str) -> tuple[threading.Event, threading.Event]:
    """Start a thread that takes ``scope``'s lock; returns (got it, let it go)."""
    got, release = threading.Event(), threading.Event()

    def run() -> None:
        with ledger.scope_lock(scope):
            got.set()
            release.wait(30)

    threading.Thread(target=run, daemon=True).start()
    return got, release


def test_one_holder_per_scope_across_threads(ledger_url: str) -> None:
    ledger = Ledger.from_url(ledger_url)
    ledger.migrate()
    first_got, first_release = _acquire_in_thread(ledger, "alice")
    assert first_got.wait(10)
    second_got, second_release = _acquire_in_thread(ledger, "alice")
    other_got, other_release = _acquire_in_thread(ledger, "bob")
    assert other_got.wait(10)  # another scope is not blocked
    assert not second_got.wait(WAIT)  # the same scope is
    first_release.set()
    assert second_got.wait(10)
    second_release.set()
    other_release.set()
    ledger.close()


def test_one_holder_per_scope_across_processes(ledger_url: str, tmp_path: Path) -> None:
    ledger = Ledger.from_url(ledger_url)
    ledger.migrate()
    flag = tmp_path / "held"
    code = (
        "import sys, time, pathlib\n"
        "from budget import Ledger\n"
        "ledger = Ledger.from_url(sys.argv[1])\n"
        "with ledger.scope_lock('alice'):\n"
        "    pathlib.Path(sys.argv[2]).write_text('held')\n"
        "    time.sleep(1.5)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    child = subprocess.Popen([sys.executable, "-c", code, ledger_url, str(flag)], env=env)
    try:
        deadline = time.time() + 30
        while not flag.exists():
            assert child.poll() is None and time.time() < deadline
            time.sleep(0.02)
        got, release = _acquire_in_thread(ledger, "alice")
        assert not got.wait(WAIT)  # the other process holds it
        assert got.wait(30)  # and lets go when it is done
        assert child.wait(30) == 0
        release.set()
    finally:
        if child.poll() is None:
            child.kill()
        ledger.close()
