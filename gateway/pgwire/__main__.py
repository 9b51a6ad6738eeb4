"""``python -m gateway.pgwire --config FILE [--host H]``: the PostgreSQL front end alone.

``dpgate serve`` starts this beside the HTTP server when the config has
``postgres_wire``; it exits when its parent does.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

from gateway.core.config import ConfigError
from gateway.core.config_load import load_config
from gateway.ops.logs import configure_logging


def _exit_with_parent(parent: int) -> None:
    while True:
        time.sleep(1.0)
        if os.getppid() != parent:
            os._exit(0)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m gateway.pgwire")
    parser.add_argument("--config", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--parent", type=int, default=None)
    parser.add_argument(
        "--address-file",
        type=Path,
        default=None,
        help="write 'HOST PORT' here once listening (for /readyz)",
    )
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config)
    except ConfigError as e:
        print(str(e), file=sys.stderr)
        raise SystemExit(2) from None
    if config.postgres_wire is None:
        print("the config has no postgres_wire section", file=sys.stderr)
        raise SystemExit(2)
    configure_logging()
    if args.parent is not None:
        threading.Thread(target=_exit_with_parent, args=(args.parent,), daemon=True).start()
    from gateway.pgwire.server import serve

    serve(config, args.host, args.address_file)


if __name__ == "__main__":
    main()
