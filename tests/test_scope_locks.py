"""The per-scope audit lock (budget/locks.py): one holder per scope, across threads and
processes sharing a ledger; different scopes never wait for each other."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
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


def test_each_holder_takes_the_next_turn(ledger_url: str) -> None:
    """A holder's turn is the previous holder's plus one, whoever that was (another
    ledger object: another worker), per scope; so "my turn is my last one plus one"
    means nobody held the scope in between. Unknown (None) on PostgreSQL."""
    first = Ledger.from_url(ledger_url)
    first.migrate()
    second = Ledger.from_url(ledger_url)
    try:
        with first.scope_lock("alice") as a:
            pass
        if ledger_url.startswith("postgresql"):
            assert a is None
            return
        assert isinstance(a, int)
        with first.scope_lock("alice") as b:
            pass
        with second.scope_lock("alice") as c:
            pass
        with first.scope_lock("alice") as d:
            pass
        with second.scope_lock("bob"):
            pass
        with first.scope_lock("alice") as e:
            pass
        assert (b, c, d, e) == (a + 1, a + 2, a + 3, a + 4)  # bob's turns count apart
    finally:
        first.close()
        second.close()


def test_a_turn_taken_in_another_process_counts(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/ledger.db"
    ledger = Ledger.from_url(url)
    ledger.migrate()
    code = (
        "import sys\n"
        "from budget import Ledger\n"
        "with Ledger.from_url(sys.argv[1]).scope_lock('alice') as turn:\n"
        "    print(turn)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    try:
        with ledger.scope_lock("alice") as mine:
            pass
        out = subprocess.run(
            [sys.executable, "-c", code, url], env=env, capture_output=True, text=True, check=True
        )
        assert int(out.stdout) == mine + 1
        with ledger.scope_lock("alice") as again:
            assert again == mine + 2  # not mine + 1: someone held it in between
    finally:
        ledger.close()


def test_an_in_memory_ledger_counts_turns_itself() -> None:
    ledger = Ledger.from_url("sqlite://")
    ledger.migrate()
    with ledger.scope_lock("alice") as a:
        pass
    with ledger.scope_lock("alice") as b:
        pass
    assert a is not None and b == a + 1
    ledger.close()


def test_a_lock_file_made_again_counts_afresh(tmp_path: Path) -> None:
    """After the lock file is removed, another worker's first turn on the new file must
    not look like nobody came between: the new file's turns never follow the old's."""
    url = f"sqlite:///{tmp_path}/ledger.db"
    ledger, other = Ledger.from_url(url), Ledger.from_url(url)
    ledger.migrate()
    # renamed: keeps the inode, not reused
    a, b = _turns_around_a_new_lock_file(
        ledger, other, tmp_path, lambda lock: lock.rename(lock.with_suffix(".old"))
    )
    assert a is not None and b is not None and b != a + 1
    ledger.close()
    other.close()


def _turns_around_a_new_lock_file(
    ledger: Ledger, other: Ledger, tmp_path: Path, remove: Callable[[Path], object]
) -> tuple[int | None, int | None]:
    """``ledger``'s turn, then its next turn after the scope's lock file was taken away
    by ``remove`` and ``other`` took the new file's first turn."""
    with ledger.scope_lock("alice") as a:
        pass
    for lock in (tmp_path / "ledger.db.locks").iterdir():
        if lock.name != "write.lock":
            remove(lock)
    with other.scope_lock("alice"):  # the new file's first turn
        pass
    with ledger.scope_lock("alice") as b:
        pass
    return a, b


def test_a_lock_directory_removed_while_serving_is_made_again(tmp_path: Path) -> None:
    """Each scope's lock file path is kept once made; if the directory goes (an admin's
    clean-up), the next holder makes it again, and its turn counts afresh."""
    import shutil

    url = f"sqlite:///{tmp_path}/ledger.db"
    ledger = Ledger.from_url(url)
    ledger.migrate()
    with ledger.scope_lock("alice") as a:
        pass
    shutil.rmtree(tmp_path / "ledger.db.locks")
    with ledger.scope_lock("alice") as b:
        assert any((tmp_path / "ledger.db.locks").iterdir())
    assert a is not None and b is not None and b != a + 1
    ledger.close()


def test_a_lock_file_removed_and_made_again_never_continues_its_turns(tmp_path: Path) -> None:
    """A lock file removed (not renamed: its inode number is free again) and made again
    by another worker: the first worker's next turn must not look like its last + 1, or
    it would skip re-reading what the other recorded meanwhile. The file system hands the
    new file the old inode number (seen here), so the turn's high bits are a random
    epoch written in the file, not the inode."""
    url = f"sqlite:///{tmp_path}/ledger.db"
    ledger, other = Ledger.from_url(url), Ledger.from_url(url)
    ledger.migrate()
    for _ in range(3):
        a, b = _turns_around_a_new_lock_file(ledger, other, tmp_path, Path.unlink)
        assert a is not None and b is not None and b != a + 1
    ledger.close()
    other.close()
