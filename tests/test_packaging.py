"""What a package index shows of kronos-audit: the metadata a wheel carries, as the build
backend makes it from pyproject.toml, the license text it ships, the one place the version
is written, and the changelog."""

from __future__ import annotations

import email.parser
import re
import subprocess
import sys
import tomllib
from email.message import Message
from pathlib import Path

import pytest

import kronos_audit
from tests.helpers import run_cli

ROOT = Path(kronos_audit.__file__).parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Message, Path]:
    """The METADATA of a wheel built from this tree, and its dist-info directory: the build
    backend's own hook (PEP 517's prepare_metadata_for_build_wheel), without the wheel."""
    pytest.importorskip("setuptools", minversion="77", reason="the build backend pyproject asks")
    out = tmp_path_factory.mktemp("metadata")
    code = (
        "import sys\nfrom setuptools import build_meta\n"
        "print(build_meta.prepare_metadata_for_build_wheel(sys.argv[1]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    dist_info = out / done.stdout.strip().splitlines()[-1]
    text = (dist_info / "METADATA").read_text(encoding="utf-8")
    return email.parser.Parser().parsestr(text), dist_info


def test_the_metadata_names_the_version_written_in_the_package(
    built: tuple[Message, Path],
) -> None:
    metadata, _ = built
    assert metadata["Version"] == kronos_audit.__version__
    assert PYPROJECT["project"]["dynamic"] == ["version"]
    assert "version" not in PYPROJECT["project"]


def test_the_version_is_written_once(built: tuple[Message, Path]) -> None:
    written = re.compile(r"""(__version__|VERSION)\s*=\s*["']""")
    places = [
        p.relative_to(ROOT).as_posix()
        for p in sorted((ROOT / "kronos_audit").rglob("*.py"))
        if written.search(p.read_text(encoding="utf-8"))
    ]
    assert places == ["kronos_audit/_internal/version.py"]  # a leaf every layer may read


def test_kaudit_version_prints_it() -> None:
    done = run_cli("--version")
    assert done.exit_code == 0, done.output
    assert done.stdout.strip() == f"kaudit, version {kronos_audit.__version__}"


def test_the_license_is_an_spdx_expression_with_its_full_text(
    built: tuple[Message, Path],
) -> None:
    metadata, dist_info = built
    assert metadata["License-Expression"] == "Apache-2.0"
    assert metadata.get_all("License-File") == ["LICENSE"]
    assert metadata["License"] is None  # the expression alone, not the old free-text field
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert (dist_info / "licenses" / "LICENSE").read_text(encoding="utf-8") == text
    assert "Apache License\n                           Version 2.0, January 2004" in text
    sections = re.findall(r"^   (\d+)\. [A-Z]", text, flags=re.MULTILINE)
    assert sections == [str(n) for n in range(1, 10)]  # Definitions ... Additional Liability
    assert "END OF TERMS AND CONDITIONS" in text
    assert "APPENDIX: How to apply the Apache License to your work." in text


def test_an_index_shows_classifiers_and_urls(built: tuple[Message, Path]) -> None:
    metadata, _ = built
    classifiers = set(metadata.get_all("Classifier") or [])
    for wanted in (
        "Intended Audience :: Science/Research",
        "Programming Language :: Python :: 3.11",
        "Programming Language :: Python :: 3.12",
        "Programming Language :: Python :: 3.13",
        "Topic :: Scientific/Engineering",
        "Topic :: Security :: Cryptography",
        "Typing :: Typed",
    ):
        assert wanted in classifiers
    assert any(c.startswith("Development Status :: ") for c in classifiers)
    # no license classifier beside the expression (PEP 639 forbids both)
    assert not any(c.startswith("License :: ") for c in classifiers)
    urls = dict(u.split(", ", 1) for u in metadata.get_all("Project-URL") or [])
    assert set(urls) == {"Homepage", "Documentation", "Changelog", "Issues"}
    home = "https://github.com/kronos-audit/kronos-audit"
    assert urls["Homepage"] == home
    assert all(u.startswith(home) for u in urls.values())
    assert metadata["Author"] == "kronos-audit developers"
    assert metadata["Requires-Python"] == PYPROJECT["project"]["requires-python"]


def test_the_linters_are_a_dev_extra_the_bootstrap_installs(
    built: tuple[Message, Path],
) -> None:
    metadata, _ = built
    requires = metadata.get_all("Requires-Dist") or []
    for tool in ("ruff", "mypy", "types-jsonschema"):
        (line,) = [r for r in requires if re.match(rf"{tool}\b", r)]
        assert line.endswith('extra == "dev"'), line
    bootstrap = (ROOT / "scripts" / "bootstrap.sh").read_text(encoding="utf-8")
    installs = re.findall(r'-e "\$ROOT\[([a-z,]+)\]"', bootstrap)
    assert len(installs) == 2  # uv's line and pip's
    assert installs[0] == installs[1]
    extras = installs[0].split(",")
    assert {"dev", "test"} <= set(extras)
    declared = set(metadata.get_all("Provides-Extra") or [])
    assert set(extras) <= declared, set(extras) - declared  # each one the project declares


def test_the_changelog_keeps_a_changelog_and_names_this_version() -> None:
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert text.startswith("# Changelog\n")
    headings = re.findall(r"^## (.*)$", text, flags=re.MULTILINE)
    release = re.compile(r"\[(\d+\.\d+\.\d+)\] - (\d{4}-\d{2}-\d{2}|Unreleased)")
    versions = []
    for heading in headings:
        if heading == "[Unreleased]":
            continue
        match = release.fullmatch(heading)
        assert match, f"not a Keep a Changelog heading: {heading!r}"
        versions.append(match.group(1))
        assert f"\n[{match.group(1)}]: https://" in text  # its link reference
    assert versions[0] == kronos_audit.__version__
    sections = set(re.findall(r"^### (.*)$", text, flags=re.MULTILINE))
    assert sections <= {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}
