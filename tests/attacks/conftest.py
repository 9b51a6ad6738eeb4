"""Fixtures of the attack tests: `dpgate serve` over the planted cohort (tests.attacks.kit),
on SQLite always and on PostgreSQL when DPGATE_TEST_POSTGRES_URL is set."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.attacks.kit import (
    PEOPLE,
    POSTGRES_URL,
    Deployment,
    PostgresSchema,
    shut_down,
    start_deployment,
    write_sqlite,
)


@pytest.fixture(scope="package")
def sqlite_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """`dpgate serve` at the default config over the planted cohort in SQLite."""
    root = tmp_path_factory.mktemp("attack-sqlite")
    write_sqlite(root / "people.db", PEOPLE)
    deployment = start_deployment(root, "sqlite:///people.db", "sqlite")
    yield deployment
    shut_down(deployment)


@pytest.fixture(scope="package")
def postgres_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """The same deployment with the protected table on PostgreSQL (its own schema)."""
    if not POSTGRES_URL:
        pytest.skip("set DPGATE_TEST_POSTGRES_URL to run the PostgreSQL attacks")
    schema = PostgresSchema(POSTGRES_URL)
    schema.create(PEOPLE)
    try:
        root = tmp_path_factory.mktemp("attack-postgres")
        deployment = start_deployment(root, POSTGRES_URL, "postgres", schema=schema.name)
        yield deployment
        shut_down(deployment)
    finally:
        schema.drop()
