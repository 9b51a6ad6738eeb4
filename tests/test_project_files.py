"""The repository's own files keep their promises: the design document names tests that
exist and a config reference the parser accepts, links point at files that are there,
and constraints.txt pins everything pyproject.toml asks for."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

from gateway.core.config_load import parse_config
from gateway.core.errors import ALL_ERRORS
from tests.conftest import repository_files

ROOT = Path(__file__).resolve().parents[1]
OUTSIDE_DESIGN = "DESIGN" + ".md"  # the shared file that is not in the repository
DESIGN = (ROOT / "docs" / "design.md").read_text()


def tracked_files() -> list[Path]:
    return repository_files()


def test_the_design_document_names_tests_that_exist() -> None:
    """``file.py::test_name`` (or ``::test_name`` after one) names a real test."""
    named = 0
    current: Path | None = None
    for file, test in re.findall(
        r"`(?:((?:statistical/)?test_\w+\.py))?(?:::(test_\w+))?`", DESIGN
    ):
        if file:
            current = ROOT / "tests" / file
            assert current.exists(), file
        if test:
            assert current is not None, test
            assert re.search(rf"^def {test}\(", current.read_text(), re.M), f"{current}::{test}"
            named += 1
    assert named >= 30


def test_the_design_document_has_the_ten_invariants() -> None:
    numbers = [int(n) for n in re.findall(r"^### (\d+)\. ", DESIGN, re.M)]
    assert numbers == list(range(1, 11))


def test_the_config_reference_is_a_valid_config() -> None:
    reference = DESIGN.split("## Config reference", 1)[1].split("```yaml\n", 1)[1]
    config = parse_config(yaml.safe_load(reference.split("```", 1)[0]))
    assert set(config.tables) == {"patients", "visits", "zip_regions"}
    assert config.tables["visits"].privacy_unit == "patient_id"  # through its reference
    assert config.privacy.global_budget == (20.0, 1e-5)


def test_the_error_table_lists_every_code() -> None:
    table = DESIGN.split("### Errors", 1)[1].split("###", 1)[0]
    for error in ALL_ERRORS:
        assert f"`{error.code}`" in table, error.code


def test_nothing_points_at_a_design_file_outside_the_repository() -> None:
    for path in tracked_files():
        if path.suffix in (".py", ".md", ".yaml", ".toml", ".sh", ".txt") or path.name in (
            "Makefile",
            "run",
        ):
            assert OUTSIDE_DESIGN not in path.read_text(errors="replace"), path


def test_relative_links_in_the_documentation_resolve() -> None:
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" in target:
                continue
            assert (page.parent / target).exists(), f"{page.name}: {target}"


def _name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def test_the_lock_pins_every_dependency() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = {_name(r) for r in project["dependencies"]}
    for extra in project["optional-dependencies"].values():
        wanted |= {_name(r) for r in extra}
    wanted.discard(project["name"])  # an extra made of other extras (``engines``)
    pinned = _pinned()
    assert all("==" in line for line in pinned.values()), pinned
    assert wanted <= set(pinned), sorted(wanted - set(pinned))
    assert "make lock" in (ROOT / "constraints.txt").read_text().splitlines()[1]


def _pinned() -> dict[str, str]:
    lines = (ROOT / "constraints.txt").read_text().splitlines()
    return {_name(line): line for line in lines if line and not line.startswith("#")}


def test_the_spark_connect_extra_brings_and_pins_what_the_client_needs() -> None:
    """``pip install 'dpgate[spark-connect]'`` alone once left the worker unable to boot
    (``grpcio >= 1.48.1 must be installed``): the extra is pyspark's own ``connect``
    extra, and the lock pins each package that extra asks for."""
    from importlib import metadata

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert "pyspark[connect]>=4.0" in extras["spark-connect"]
    assert "dpgate[clickhouse,chdb,spark,spark-connect]" in extras["engines"]
    needs = {
        _name(r)
        for r in metadata.requires("pyspark") or []
        if re.search(r"""extra\s*==\s*["']connect["']""", r)
    }
    assert {"grpcio", "grpcio-status", "googleapis-common-protos"} <= needs
    assert needs <= set(_pinned()), sorted(needs - set(_pinned()))
