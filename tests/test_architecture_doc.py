"""docs/architecture.md's list of rooms is written from the package by
scripts/architecture.py: it must be what the package says today, and the script must
notice when it is not."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "architecture.py"


def _check() -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, timeout=120
    )


def test_the_rooms_on_the_page_are_the_package_as_it_is() -> None:
    done = _check()
    assert done.returncode == 0, done.stderr


def test_every_room_and_module_of_the_package_is_on_the_page() -> None:
    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    for room in sorted(
        p for p in (ROOT / "kronos_audit").iterdir() if (p / "__init__.py").exists()
    ):
        assert f"`{room.name}/`" in page, room.name
        for module in sorted(room.glob("*.py")):
            if module.name != "__init__.py":
                assert f"- `{module.stem}`:" in page, f"{room.name}/{module.name}"


def test_a_stale_page_is_found(tmp_path: Path) -> None:
    # The script run on a copy of the repository's page with one room's line edited.
    copy = tmp_path / "repo"
    (copy / "docs").mkdir(parents=True)
    (copy / "scripts").mkdir()
    (copy / "tests").mkdir()
    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    stale = page.replace("- `verifier`:", "- `verifier`: something else it no longer says;", 1)
    assert stale != page
    (copy / "scripts" / "architecture.py").write_text(SCRIPT.read_text(encoding="utf-8"))
    (copy / "tests" / "test_layers.py").write_text(
        (ROOT / "tests" / "test_layers.py").read_text(encoding="utf-8")
    )
    (copy / "kronos_audit").symlink_to(ROOT / "kronos_audit")
    check = [sys.executable, str(copy / "scripts" / "architecture.py"), "--check"]
    (copy / "docs" / "architecture.md").write_text(page, encoding="utf-8")
    fresh = subprocess.run(check, capture_output=True, text=True, timeout=120)
    assert fresh.returncode == 0, fresh.stderr  # the copy itself reads the package
    (copy / "docs" / "architecture.md").write_text(stale, encoding="utf-8")
    done = subprocess.run(check, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "docs/architecture.md is out of date" in done.stderr
