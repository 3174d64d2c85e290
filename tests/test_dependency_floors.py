"""The installed dependencies are at or above the floors pyproject.toml declares (the floors
clear published advisories: an environment below one runs a version with a known hole)."""

from __future__ import annotations

import tomllib
from importlib.metadata import PackageNotFoundError, version

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from tests.conftest import REPO

DECLARED = [
    Requirement(spec)
    for spec in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
]


def floor(requirement: Requirement) -> Version | None:
    found = [Version(s.version) for s in requirement.specifier if s.operator in (">=", "==", "~=")]
    return max(found, default=None)


def test_the_transitive_servers_have_floors_of_their_own() -> None:
    # fastapi, uvicorn and httpx admit starlette and h11 versions with advisories: those two
    # carry floors here (the numbers live in pyproject.toml only).
    floors = {r.name: floor(r) for r in DECLARED}
    assert floors.get("starlette") is not None and floors.get("h11") is not None


@pytest.mark.parametrize("requirement", DECLARED, ids=lambda r: r.name)
def test_the_installed_version_is_not_below_its_floor(requirement: Requirement) -> None:
    try:
        installed = version(requirement.name)
    except PackageNotFoundError:
        pytest.fail(f"{requirement.name} is declared but not installed")
    assert requirement.specifier.contains(installed, prereleases=True), (
        f"{requirement.name} {installed} is outside {requirement} (pyproject.toml): upgrade it"
    )
