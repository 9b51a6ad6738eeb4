"""Two gateways on neighbouring SQLite databases, for the statistical tests that run the
whole query path (tests/statistical/test_pipeline_dp.py, test_selection_pipeline_dp.py).

Each side is a real ``Gateway`` with its own database and ledger, and an analyst
``tester`` whose budget lasts for every release the harness asks for. DP is under test,
not durability nor timing: the ledger skips its fsyncs, and release timing is off (the
release deadline, invariant 4, is tested elsewhere; here it would hold each of the
hundreds of releases for 250 ms).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.core.config_load import parse_config
from gateway.pipeline.gateway import Gateway


@dataclass
class Side:
    """One neighbour: its gateway, and a counter that makes every query's text new (a
    repeated text would be answered from the cache, invariant 7)."""

    gateway: Gateway
    counter: Iterator[int] = field(default_factory=itertools.count)


def side(root: Path, name: str, build: Callable[[Path], None], table: dict[str, Any]) -> Side:
    """A gateway on ``root/name.db``, filled by ``build``, declaring it as ``people``."""
    os.environ.setdefault("DPGATE_ADMIN_KEY", "statistical-test-admin")
    db = root / f"{name}.db"
    build(db)
    raw: dict[str, Any] = {
        "database": {"url": f"sqlite:///{db}"},
        "ledger": {"url": f"sqlite:///{root / (name + '-ledger.db')}?synchronous=normal"},
        "privacy": {"max_epsilon_per_query": 10.0},
        "audit": {"mode": "off"},
        "execution": {"timing": "off"},
        "tables": {"people": table},
    }
    gateway = Gateway(parse_config(raw))
    gateway.ledger.create_analyst("tester", 1e9, 0.5)
    return Side(gateway)
