"""Running dpgate as a production WSGI server (``dpgate serve``).

On Unix the app runs under gunicorn with N worker processes of ``THREADS_PER_WORKER``
threads each (requests spend most of their time waiting for their release moment, see
``gateway.pipeline.timing``, so a worker must serve many at once); with at least one worker per
CPU, each worker is pinned to a CPU of its own (``serve_workers.pin_worker``;
``DPGATE_CPU_AFFINITY=off`` leaves the scheduler free); SIGTERM stops it
gracefully (workers finish the requests they have, up to ``GRACEFUL_TIMEOUT`` seconds).
Where gunicorn is unavailable (Windows), waitress serves it from one process with
threads. Flask's development server is never used.

The config is loaded and validated before any port is bound: a broken config prints
each of its problems and exits with status 2, so a deployment fails at once and
precisely instead of with workers crashing in a loop.

Several workers share what must be shared through the ledger database (budgets, rate
limits) and, for metrics, a directory of memory-mapped sample files named by
``PROMETHEUS_MULTIPROC_DIR`` (see ``gateway.ops.metrics``): a fresh temporary one unless the
operator sets it.
"""

from __future__ import annotations

import atexit
import importlib
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NoReturn

from gateway.core.config import Config, ConfigError
from gateway.core.config_load import load_config

if TYPE_CHECKING:
    from flask import Flask

GRACEFUL_TIMEOUT = 30
THREADS_PER_WORKER = 16
WORKER_TIMEOUT = 120
APP_FACTORY = "gateway.http.app:create_app"
SERVER_ENV = "DPGATE_SERVER"  # auto | gunicorn | waitress
AFFINITY_ENV = "DPGATE_CPU_AFFINITY"  # auto | off (gateway.server.serve_workers.pin_worker)
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"  # as gateway.ops.metrics, without importing it early

Server = Literal["auto", "gunicorn", "waitress"]


def run(
    config_path: str,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    workers: int = 1,
    server: Server | None = None,
    app_factory: str = APP_FACTORY,
) -> None:
    """Serve the gateway described by ``config_path`` until SIGTERM or SIGINT.

    Exits with status 2 (after printing every problem) if the config is invalid.
    """
    config = _load_or_exit(config_path)
    if workers < 1:
        _fail([f"--workers: must be ≥ 1, got {workers}"])
    chosen = server or os.environ.get(SERVER_ENV, "auto")
    if chosen not in ("auto", "gunicorn", "waitress"):
        _fail([f"{SERVER_ENV}: '{chosen}' is not one of auto, gunicorn, waitress"])
    if chosen == "auto":
        chosen = "gunicorn" if _gunicorn_available() else "waitress"
    affinity = os.environ.get(AFFINITY_ENV, "auto")
    if affinity not in ("auto", "off"):
        _fail([f"{AFFINITY_ENV}: '{affinity}' is not one of auto, off"])
    _prepare_metrics_dir()
    from gateway.ops.logs import configure_logging

    configure_logging()
    factory = _factory(app_factory, config)
    if config.postgres_wire is not None:
        _start_postgres_wire(config_path, host)
    if chosen == "gunicorn":
        _run_gunicorn(factory, host=host, port=port, workers=workers, affinity=affinity)
    else:
        _run_waitress(factory, host=host, port=port, workers=workers)


def _start_postgres_wire(config_path: str, host: str) -> None:
    """Serve the PostgreSQL protocol (``postgres_wire:``) from a process of its own, with
    its own Gateway on the same config and ledger, stopped when this one exits (and
    exiting by itself if this one is killed). It writes the address it bound to a file
    that the HTTP workers' ``/readyz`` reads (``gateway.pgwire.probe``)."""
    import subprocess

    from gateway.pgwire.probe import ADDRESS_FILE_ENV

    folder = Path(tempfile.mkdtemp(prefix="dpgate-pgwire-"))
    address_file = folder / "address"
    os.environ[ADDRESS_FILE_ENV] = str(address_file)  # inherited by the workers
    child = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gateway.pgwire",
            "--config",
            config_path,
            "--host",
            host,
            "--parent",
            str(os.getpid()),
            "--address-file",
            str(address_file),
        ]
    )
    master = os.getpid()

    def stop() -> None:
        if os.getpid() == master and child.poll() is None:
            child.terminate()
            try:
                child.wait(timeout=GRACEFUL_TIMEOUT)
            except subprocess.TimeoutExpired:
                child.kill()
        if os.getpid() == master:
            shutil.rmtree(folder, ignore_errors=True)

    atexit.register(stop)


def _fail(problems: list[str], header: str = "dpgate: cannot start:") -> NoReturn:
    print(header, file=sys.stderr)
    for p in problems:
        print(f"  - {p}", file=sys.stderr)
    raise SystemExit(2)


def _load_or_exit(config_path: str) -> Config:
    try:
        return load_config(config_path)
    except ConfigError as e:
        _fail(e.problems, f"dpgate: cannot start: the config {config_path} is invalid:")


def _gunicorn_available() -> bool:
    if os.name != "posix":
        return False
    try:
        import gunicorn.app.base  # noqa: F401
    except ImportError:
        return False
    return True


def _factory(spec: str, config: Config) -> Callable[[], Flask]:
    """A function that builds the app in the process that serves it (after fork).

    The module is imported here, before any port is bound, so a broken installation is
    reported at once; the app itself (database connections) is built in each worker.
    """
    module_name, _, attr = spec.partition(":")
    try:
        create_app = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as e:
        _fail([f"cannot load the application {spec}: {type(e).__name__}: {e}"])

    def build() -> Flask:
        from gateway.ops.heap import freeze_startup_heap

        app: Flask = create_app(config)
        freeze_startup_heap()  # a full collection no longer walks the startup heap
        return app

    return build


def _prepare_metrics_dir() -> None:
    """Point prometheus_client at one sample directory shared by all workers.

    Must run before any worker records a metric; stale files from an earlier run would
    be summed in, so an operator-provided directory is emptied.
    """
    existing = os.environ.get(MULTIPROC_ENV)
    if existing:
        path = Path(existing)
        path.mkdir(parents=True, exist_ok=True)
        for f in path.glob("*.db"):
            f.unlink()
    else:
        path = Path(tempfile.mkdtemp(prefix="dpgate-metrics-"))
        os.environ[MULTIPROC_ENV] = str(path)
        master = os.getpid()
        atexit.register(
            lambda: shutil.rmtree(path, ignore_errors=True) if os.getpid() == master else None
        )
    # If prometheus_client was imported before the variable was set (the CLI may import
    # the app module early), its value class is the single-process one: switch it now,
    # before any labelled sample exists.
    values = sys.modules.get("prometheus_client.values")
    if values is not None:
        values.ValueClass = values.get_value_class()  # type: ignore[attr-defined]


def _bind_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _run_gunicorn(
    factory: Callable[[], Flask], *, host: str, port: int, workers: int, affinity: str
) -> None:
    from gunicorn.app.base import BaseApplication
    from gunicorn.arbiter import Arbiter

    from gateway.ops.heap import limit_malloc_arenas
    from gateway.server.serve_workers import balanced_worker_class, pin_worker

    # Keep-alive connections go to the worker holding fewest (gateway/server/serve_workers.py);
    # twice the slots, for a reload's new workers starting beside the old ones.
    worker_class, connections = balanced_worker_class(2 * workers)

    def child_exit(_server: Any, worker: Any) -> None:
        from gateway.ops.metrics import mark_process_dead

        connections.release(worker)
        mark_process_dead(worker.pid)

    def pre_fork(_server: Any, worker: Any) -> None:
        connections.assign(worker)

    def post_fork(server: Any, worker: Any) -> None:
        limit_malloc_arenas()  # before the worker starts its threads
        cpu = pin_worker(getattr(worker, "dpgate_slot", None), workers, affinity)
        if cpu is not None:
            server.log.info("worker %s runs on CPU %s", worker.pid, cpu)

    options: dict[str, Any] = {
        "bind": [_bind_address(host, port)],
        "workers": workers,
        # Threads, not sync workers: under the timing policy an answer waits for its
        # release moment, and a waiting request must not hold a whole worker process.
        "worker_class": worker_class,
        "threads": THREADS_PER_WORKER,
        "graceful_timeout": GRACEFUL_TIMEOUT,
        "timeout": WORKER_TIMEOUT,
        "keepalive": 5,
        "proc_name": "dpgate",
        "accesslog": None,  # dpgate writes its own JSON line per request
        "errorlog": "-",
        "loglevel": "info",
        # gunicorn's own lines (start, workers, signals) as JSON lines like dpgate's
        "logger_class": _json_gunicorn_logger(),
        "child_exit": child_exit,
        "pre_fork": pre_fork,
        "post_fork": post_fork,
        "preload_app": False,  # each worker opens its own database connections
        # gunicorn ≥ 25's control socket lives at one path per user: two gateways on a
        # host would fight over it, and dpgate is managed by signals, not gunicornc.
        "control_socket_disable": True,
    }

    class GatewayArbiter(Arbiter):
        def stop(self, graceful: bool = True) -> None:
            connections.server_stops()  # before the workers hear of it (serve_workers)
            super().stop(graceful)

    class GatewayServer(BaseApplication):
        def run(self) -> None:
            try:
                GatewayArbiter(self).run()
            except RuntimeError as e:  # as gunicorn's own run(): a bind error, say
                print(f"\nError: {e}\n", file=sys.stderr)
                sys.exit(1)

        def load_config(self) -> None:
            for key, value in options.items():
                if key in self.cfg.settings:  # older gunicorns lack some settings
                    self.cfg.set(key, value)

        def load(self) -> Flask:
            return factory()

    GatewayServer().run()


def _json_gunicorn_logger() -> type:
    """gunicorn's logger, its error log (start, workers, signals) written as JSON lines
    like dpgate's own. (A ``logconfig_dict`` would do it too, but turns gunicorn's access
    log on: a second line per request, on stdout.)"""
    from gunicorn.glogging import Logger

    from gateway.ops.logs import JsonFormatter

    class JsonLogger(Logger):
        def setup(self, cfg: Any) -> None:
            super().setup(cfg)
            for handler in self.error_log.handlers:
                handler.setFormatter(JsonFormatter())

    return JsonLogger


def _run_waitress(factory: Callable[[], Flask], *, host: str, port: int, workers: int) -> None:
    import waitress

    if workers > 1:
        print(
            f"dpgate: waitress serves from one process; --workers {workers} becomes "
            f"{THREADS_PER_WORKER * workers} threads",
            file=sys.stderr,
        )
    app = factory()

    def stop(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt  # waitress closes its sockets and returns

    signal.signal(signal.SIGTERM, stop)
    waitress.serve(app, host=host, port=port, threads=THREADS_PER_WORKER * workers, ident="dpgate")
