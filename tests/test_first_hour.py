"""Acceptance: a new user's first hour, run exactly as the documentation prints it.

A fresh clone of this checkout (the files git tracks, and new ones it does not ignore)
runs the README's ``make demo`` line through the shell; then the README's other shell
commands, every command the demo printed, and the Python examples of docs/connect.md
run as printed against that demo, and the README's example answer is checked against
the demo data. Only the port changes, if 8080 is taken on this machine.

The clone's ``.venv`` is seeded from the environment running the tests, so this takes
seconds. With ``DPGATE_TEST_FRESH_CLONE=1`` (``.ci/run`` sets it) a second fresh clone
builds its own ``.venv`` with ``make`` from the package index and runs ``make test`` on a
few test files (CI's own run is the full suite in a fresh clone), and neither may print a
warning caused by the project's own configuration.
"""

from __future__ import annotations

import ast
import io
import json
import os
import queue
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import sysconfig
import threading
import time
import tokenize
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import repository_files

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
CONNECT = (ROOT / "docs" / "connect.md").read_text()
PRINTED_PORT = 8080
STARTUP_SECONDS = 180
FRESH_CLONE = os.environ.get("DPGATE_TEST_FRESH_CLONE") == "1"

#: What this machine's own pip configuration prints (an extra index that is not there):
#: environment, not project, noise.
ENVIRONMENT_NOISE = (re.compile(r"^WARNING: Location '.*' is ignored: it is neither a file"),)


def fresh_clone(target: Path) -> Path:
    """Copy what a clone of this checkout would hold (plus new, not ignored files)."""
    for source in repository_files():
        name = source.relative_to(ROOT)
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target / name)
    return target


def seed_venv(clone: Path) -> None:
    """A ``.venv`` that runs the clone's code on this environment's dependencies.

    What ``make`` would build, without the download: a bare virtual environment whose
    path holds the clone and this environment's site-packages, a ``dpgate`` script, and
    the stamp that tells ``make`` it is installed.
    """
    venv = clone / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = Path(sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)}))
    ours = {sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}
    (site / "dpgate_first_hour.pth").write_text("\n".join([str(clone), *sorted(ours)]) + "\n")
    script = venv / "bin" / "dpgate"
    script.write_text(
        f"#!{venv / 'bin' / 'python'}\nimport sys\nfrom gateway.cli import main\nsys.exit(main())\n"
    )
    script.chmod(0o755)
    (venv / ".installed").touch()


def user_environment(**extra: str) -> dict[str, str]:
    """The environment of a new user's shell: none of dpgate's or make's variables."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DPGATE_", "MAKE", "PYTEST_", "PROMETHEUS_"))
        and k not in ("MFLAGS", "PYTHONPATH", "VIRTUAL_ENV")
    }
    return {**env, **extra}


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def shell_commands(markdown: str) -> list[str]:
    """The commands of every ```sh block, continuation lines joined, comments kept."""
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", markdown, re.S):
        for line in block.replace("\\\n", "").splitlines():
            if line.strip() and not line.strip().startswith("#"):
                commands.append(line.strip())
    return commands


def run(command: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


@dataclass
class Demo:
    clone: Path
    port: int
    output: str
    key: str


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    """``make demo``, exactly as the README prints it, in a fresh clone."""
    clone = fresh_clone(tmp_path_factory.mktemp("first-hour") / "dpgate")
    seed_venv(clone)
    command = next(c for c in shell_commands(README) if c.startswith("make demo"))
    port = PRINTED_PORT if port_is_free(PRINTED_PORT) else free_port()
    if port != PRINTED_PORT:
        command = f"make demo PORT={port}"
    process = subprocess.Popen(
        ["bash", "-c", command],
        cwd=clone,
        env=user_environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines: queue.Queue[str] = queue.Queue()

    def drain() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.put(line)

    threading.Thread(target=drain, daemon=True).start()
    output = ""
    deadline = time.monotonic() + STARTUP_SECONDS
    try:
        while "serving on" not in output:
            try:
                output += lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                pytest.fail(f"make demo did not start serving:\n{output}")
            if process.poll() is not None and lines.empty():
                pytest.fail(f"make demo exited with {process.returncode}:\n{output}")
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2):
                    break
            except OSError:
                time.sleep(0.2)
        key = re.search(r"demo analyst key: (\S+)", output)
        assert key is not None, output
        yield Demo(clone, port, output, key.group(1))
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=40)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def exact_counts(demo: Demo, sql: str) -> dict[str, int]:
    with sqlite3.connect(demo.clone / "demo-data" / "hospital.db") as conn:
        return {str(k): int(n) for k, n in conn.execute(sql)}


@pytest.mark.timing  # the demo's answers are held to model-sized deadlines
def test_the_first_hour_runs_as_printed(demo: Demo) -> None:
    env = user_environment(KEY=demo.key)
    # 1. The README: every shell command, as printed (`make test` is what runs this).
    readme_answer: dict[str, Any] | None = None
    for command in shell_commands(README):
        if command.startswith(("make demo", "make test")):
            continue
        command = command.replace(f":{PRINTED_PORT}", f":{demo.port}")
        result = run(command, demo.clone, env)
        assert result.returncode == 0, f"{command}\n{result.stdout}\n{result.stderr}"
        if command.startswith("curl"):
            answer = json.loads(result.stdout)
            assert answer["ok"] is True, answer
            readme_answer = readme_answer or answer
    assert readme_answer is not None
    check_readme_example(demo, readme_answer)

    # 2. Every command the demo printed, as printed.
    try_it = demo.output.split("Try it", 1)[1].split("serving on", 1)[0]
    printed = [line.strip() for line in try_it.replace("\\\n", "").splitlines()[1:] if line.strip()]
    assert len(printed) >= 5, demo.output
    for command in printed:
        result = run(command, demo.clone, env)
        assert result.returncode == 0, f"{command}\n{result.stdout}\n{result.stderr}"
        if command.startswith("curl"):
            assert json.loads(result.stdout)["ok"] is True

    # 3. docs/connect.md's Python examples, with the demo's key.
    check_connect_examples(demo)


def check_readme_example(demo: Demo, actual: dict[str, Any]) -> None:
    """The README's example answer is one the demo gives: its counts are within the
    printed 95% accuracy (three times over) of the demo's exact counts."""
    example = README.split("```json", 1)[1].split("```", 1)[0]
    halfwidth = float(re.search(r'"ci95_halfwidth": ([\d.]+)', example).group(1))  # type: ignore[union-attr]
    assert actual["accuracy"]["n"]["ci95_halfwidth"] == halfwidth
    stddev = float(re.search(r'"stddev": ([\d.]+)', example).group(1))  # type: ignore[union-attr]
    assert round(actual["accuracy"]["n"]["stddev"], 1) == stddev
    exact = exact_counts(
        demo, "SELECT disease, COUNT(*) FROM patients WHERE age >= 40 GROUP BY disease"
    )
    shown = re.findall(r'\["(\w+)", (\d+)\]', example)
    assert shown, example
    for disease, n in shown:
        assert abs(int(n) - exact[disease]) <= 3 * halfwidth, (disease, n, exact[disease])
    assert f'"rho": {actual["privacy"]["rho"]}' in example
    if actual["budget"]["queries"] == 1:  # the demo's first answer, as in the README
        spent = re.search(r'"epsilon_spent": ([\d.]+)', example).group(1)  # type: ignore[union-attr]
        assert f"{actual['budget']['epsilon_spent']:.2f}" == spent


def python_blocks(markdown: str) -> list[str]:
    return [
        block
        for block in re.findall(r"```python\n(.*?)```", markdown, re.S)
        if "dpgate_client" in block or "client." in block or "dpgate://" in block
    ]


def comments(source: str) -> dict[int, str]:
    found = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            found[token.start[0]] = token.string.lstrip("#").strip()
    return found


def expected_repr(comment: str) -> str | None:
    """The part of a ``# comment`` that shows a value: a repr, or a leading number."""
    if re.match(r"[-\d]", comment):
        return comment.split(":", 1)[0]
    if re.match(r"[(\[{']|[A-Z]\w*\(", comment):
        return comment
    return None  # prose


def matches(expected: str, actual: str) -> bool:
    """``…`` in the documentation stands for anything."""
    pattern = ".*?".join(re.escape(part) for part in expected.split("…"))
    return re.fullmatch(pattern, actual, re.S) is not None


def check_connect_examples(demo: Demo) -> None:
    """Run each example block; every value its comment shows must be what it gives."""
    exact = exact_counts(
        demo, "SELECT disease, COUNT(*) FROM patients WHERE age >= 40 GROUP BY disease"
    )
    namespace: dict[str, Any] = {}
    checked = 0
    wrong = []
    for block in python_blocks(CONNECT):
        source = block.replace("dpg_…", demo.key).replace(
            f"127.0.0.1:{PRINTED_PORT}", f"127.0.0.1:{demo.port}"
        )
        notes = comments(source)
        for statement in ast.parse(source).body:
            code = ast.get_source_segment(source, statement)
            if not isinstance(statement, ast.Expr):
                exec(compile(ast.Module([statement], []), "<connect.md>", "exec"), namespace)
                continue
            value = eval(
                compile(ast.Expression(statement.value), "<connect.md>", "eval"), namespace
            )
            note = notes.get(statement.end_lineno or 0)
            expected = expected_repr(note) if note else None
            if expected is None:
                continue
            checked += 1
            if code == "answer.rows":  # noisy counts: near the exact ones, as in the README
                for disease, n in re.findall(r"\('(\w+)', (\d+)\)", expected):
                    assert abs(int(n) - exact[disease]) <= 18, (disease, n, exact[disease])
                assert matches(re.sub(r"\d+", "…", expected), re.sub(r"\d+", "…", repr(value)))
                continue
            if not matches(expected, repr(value)):
                wrong.append(f"{code}\n  doc:    {expected}\n  actual: {value!r}")
    assert not wrong, "docs/connect.md shows values the demo does not give:\n" + "\n".join(wrong)
    assert checked >= 6


@pytest.mark.slow
@pytest.mark.skipif(not FRESH_CLONE, reason="set DPGATE_TEST_FRESH_CLONE=1 (as .ci/run does)")
def test_a_fresh_clone_installs_and_tests_without_warnings(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """``make`` builds the environment from the index with the pinned versions, and
    ``make test`` passes; neither prints a warning caused by the project's config."""
    clone = fresh_clone(tmp_path_factory.mktemp("fresh") / "dpgate")
    env = user_environment()
    install = subprocess.run(
        ["make", ".venv/.installed"], cwd=clone, env=env, capture_output=True, text=True
    )
    assert install.returncode == 0, install.stdout + install.stderr
    assert_no_warnings(install.stdout + install.stderr)
    pinned = dict(
        line.split("==", 1)
        for line in (clone / "constraints.txt").read_text().splitlines()
        if "==" in line
    )
    frozen = subprocess.run(
        [str(clone / ".venv" / "bin" / "pip"), "freeze", "--all", "--exclude-editable"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for line in frozen.splitlines():
        name, _, version = line.partition("==")
        if name in pinned:
            assert version == pinned[name], line
    # The whole suite already runs in CI's own fresh clone: here `make test` runs end to
    # end (lint, types, pytest) on a few test files, to see the clone's own install work
    # and print no warning, without doubling CI's time.
    quick = {**env, "PYTEST_ADDOPTS": "tests/test_analyze.py tests/test_expressions.py"}
    tested = subprocess.run(["make", "test"], cwd=clone, env=quick, capture_output=True, text=True)
    assert tested.returncode == 0, tested.stdout[-5000:] + tested.stderr[-5000:]
    postgres = shutil.which("pg_isready") and (
        subprocess.run(["pg_isready", "-q", "-h", "127.0.0.1", "-p", "5432"]).returncode == 0
    )
    if postgres:  # as in .ci/run: a server that answers is used, without being asked
        assert "PostgreSQL tests: on" in tested.stdout
    assert_no_warnings(tested.stdout + tested.stderr)
    assert "nanobind" not in tested.stdout + tested.stderr


def assert_no_warnings(output: str) -> None:
    noisy = [
        line
        for line in output.splitlines()
        if re.search(r"warn|deprecat", line, re.I)
        and not any(p.search(line) for p in ENVIRONMENT_NOISE)
    ]
    assert not noisy, "\n".join(noisy)
