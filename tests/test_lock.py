"""constraints.txt, the lock scripts/bootstrap.sh installs from, and pyproject.toml agree:
every range pyproject declares for what bootstrap installs is in the lock and satisfied by its
pin, and the lock was written from today's dependency tables (the digest in its header), so an
edited range fails here until `bash scripts/lock.sh` refreshes the lock."""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import NormalizedName, canonicalize_name

from scripts.lock_digest import PREFIX, dependency_digest

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "constraints.txt"
PYPROJECT = ROOT / "pyproject.toml"
BOOTSTRAP = ROOT / "scripts" / "bootstrap.sh"
LOCK_SH = ROOT / "scripts" / "lock.sh"


def bootstrap_extras() -> list[str]:
    """The extras bootstrap.sh installs the project with (its uv line and its pip line)."""
    installs = re.findall(r'-e "\$ROOT\[([a-z,]+)\]"', BOOTSTRAP.read_text(encoding="utf-8"))
    assert len(installs) == 2, installs  # uv's line and pip's
    assert installs[0] == installs[1]
    extras: str = installs[0]
    return extras.split(",")


def pins(lock: str) -> dict[NormalizedName, list[Requirement]]:
    """Every pin of a lock, by package name: one per platform fork (a universal lock pins
    another version where an environment marker says so)."""
    found: dict[NormalizedName, list[Requirement]] = {}
    for line in lock.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        pin = Requirement(line)
        found.setdefault(canonicalize_name(pin.name), []).append(pin)
    return found


def pinned_version(pin: Requirement) -> str:
    (specifier,) = pin.specifier
    assert specifier.operator == "==", f"not a pin: {pin}"
    return specifier.version


def disagreements(pyproject: str, lock: str, extras: list[str]) -> list[str]:
    """What a lock gets wrong about a pyproject.toml: requirements of its dependencies and of
    the given extras that the lock lacks or pins outside their range, and a digest of other
    dependency tables than these."""
    project = tomllib.loads(pyproject)["project"]
    wanted = [("dependencies", r) for r in project["dependencies"]]
    for extra in extras:
        where = f"optional-dependencies.{extra}"
        wanted += [(where, r) for r in project["optional-dependencies"][extra]]
    locked = pins(lock)
    problems = []
    for where, text in wanted:
        requirement = Requirement(text)
        forks = locked.get(canonicalize_name(requirement.name))
        if not forks:
            problems.append(f"{text} ({where}): not in the lock")
            continue
        for pin in forks:
            if not requirement.specifier.contains(pinned_version(pin), prereleases=True):
                problems.append(f"{text} ({where}): the lock pins {pin}")
    recorded = [line.removeprefix(PREFIX) for line in lock.splitlines() if line.startswith(PREFIX)]
    if recorded != [dependency_digest(pyproject)]:
        problems.append("the lock was written from other dependency tables than these")
    return problems


def pinned_requirements(pyproject: str) -> list[str]:
    """The requirements of a pyproject.toml, its extras' included, that pin one version
    (``==`` or ``===``, a wildcard aside): kronos-audit installs into its users'
    environments, so its own requirements stay ranges, and only the lock pins."""
    project = tomllib.loads(pyproject)["project"]
    declared = [*project["dependencies"]]
    for extra in project["optional-dependencies"].values():
        declared += extra
    return [
        text
        for text in declared
        if any(
            s.operator == "===" or (s.operator == "==" and not s.version.endswith("*"))
            for s in Requirement(text).specifier
        )
    ]


def test_kronos_audits_own_requirements_stay_ranges() -> None:
    pyproject = PYPROJECT.read_text(encoding="utf-8")
    assert pinned_requirements(pyproject) == [], "pin in constraints.txt, not in pyproject.toml"
    # and a pin is caught, in the dependencies and in an extra alike
    assert '"cryptography>=42"' in pyproject
    assert '"pytest>=8.0"' in pyproject
    edited = pyproject.replace('"cryptography>=42"', '"cryptography==51.0.1"', 1)
    edited = edited.replace('"pytest>=8.0"', '"pytest>=8.0,===8.3.4"', 1)
    assert pinned_requirements(edited) == ["cryptography==51.0.1", "pytest>=8.0,===8.3.4"]
    wildcard = pyproject.replace('"cryptography>=42"', '"cryptography==51.*"', 1)
    assert pinned_requirements(wildcard) == []  # a wildcard is a range


def test_the_lock_satisfies_every_range_pyproject_declares() -> None:
    problems = disagreements(
        PYPROJECT.read_text(encoding="utf-8"), LOCK.read_text(encoding="utf-8"), bootstrap_extras()
    )
    assert problems == [], "refresh the lock: bash scripts/lock.sh\n" + "\n".join(problems)


@pytest.mark.parametrize(
    ("before", "after", "expected"),
    [
        # a range the pin no longer satisfies
        ('"cryptography>=42"', '"cryptography>=42,<43"', ["cryptography>=42,<43 (dependencies)"]),
        # a new requirement the lock has never resolved
        ('"jinja2>=3.1",', '"jinja2>=3.1", "tomli-w>=1",', ["tomli-w>=1 (dependencies)"]),
        # an extra's range
        ('"pytest>=8.0"', '"pytest>=999"', ["pytest>=999 (optional-dependencies.test)"]),
        # a range the old pin still satisfies: only the digest tells
        ('"cryptography>=42"', '"cryptography>=43"', []),
    ],
)
def test_an_edited_range_without_a_refreshed_lock_fails(
    before: str, after: str, expected: list[str]
) -> None:
    pyproject = PYPROJECT.read_text(encoding="utf-8")
    assert before in pyproject
    problems = disagreements(
        pyproject.replace(before, after, 1), LOCK.read_text(encoding="utf-8"), bootstrap_extras()
    )
    assert len(problems) == len(expected) + 1, problems
    for problem, start in zip(problems, expected, strict=False):
        assert problem.startswith(start), problem
    assert problems[-1] == "the lock was written from other dependency tables than these"


def test_a_comment_or_layout_change_is_not_a_dependency_change() -> None:
    pyproject = PYPROJECT.read_text(encoding="utf-8")
    edited = pyproject.replace('"cryptography>=42",', '"cryptography>=42",  # Ed25519\n', 1)
    assert edited != pyproject
    assert dependency_digest(edited) == dependency_digest(pyproject)


def test_the_lock_pins_every_package_once_per_platform_without_local_labels() -> None:
    locked = pins(LOCK.read_text(encoding="utf-8"))
    for name, forks in locked.items():
        versions = [pinned_version(pin) for pin in forks]
        # a local label (torch's +cpu) would shut out the other builds of the same release
        assert all("+" not in v for v in versions), (name, versions)
        assert len(forks) == 1 or all(pin.marker is not None for pin in forks), (name, forks)
    # the installer bootstrap installs first is pinned too
    assert "uv" in locked


def test_bootstrap_and_lock_sh_agree_on_what_is_installed() -> None:
    script = LOCK_SH.read_text(encoding="utf-8")
    assert re.findall(r"--extra (\w+)", script) == bootstrap_extras()
    bootstrap = BOOTSTRAP.read_text(encoding="utf-8")
    # every install of bootstrap's but torch's own (the lock's release, by version) is
    # constrained by the lock, through uv and through pip
    assert len(re.findall(r'-c "\$LOCK"', bootstrap)) == 3  # uv itself, uv's line, pip's line
    (torch,) = pins(LOCK.read_text(encoding="utf-8"))[canonicalize_name("torch")]
    assert not re.search(rf"\b{re.escape(pinned_version(torch))}\b", bootstrap)  # no 2nd literal


def test_this_environment_is_the_locked_one() -> None:
    """The suite runs in what bootstrap installed: every locked package that applies here is
    installed at its pin (torch's CPU build, 2.13.0+cpu, is the pin's 2.13.0)."""
    drifted = []
    for name, forks in pins(LOCK.read_text(encoding="utf-8")).items():
        for pin in forks:
            if pin.marker is not None and not pin.marker.evaluate():
                continue
            try:
                installed = metadata.version(name)
            except metadata.PackageNotFoundError:
                continue  # not installed where no requirement here needs it (the lock is a cap)
            if not pin.specifier.contains(installed, prereleases=True):
                drifted.append(f"{name} {installed}, the lock pins {pin}")
    assert drifted == [], "run: source scripts/bootstrap.sh\n" + "\n".join(drifted)
