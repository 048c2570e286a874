"""The HTML report in a real headless browser (Debian's chromium, installed by
scripts/ensure-tools.sh): it loads with no console error, the verdict is on the first
screen, and the screenshot is kept (under pytest's tmp_path, and in $KAUDIT_ARTIFACTS
when that is set)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from kronos_audit.report import build_report, render_html

ROOT = Path(__file__).resolve().parents[2]
WINDOW = (1280, 900)


@pytest.fixture(scope="module")
def chromium() -> str:
    path = shutil.which("chromium")
    if path is None:
        proc = subprocess.run(
            ["bash", str(ROOT / "scripts" / "ensure-tools.sh")],
            capture_output=True,
            text=True,
            timeout=1800,
            check=False,
        )
        path = shutil.which("chromium")
        if path is None:
            why = proc.stderr.strip() or f"exit status {proc.returncode}"
            pytest.skip(f"chromium is not installed and scripts/ensure-tools.sh failed: {why}")
    return path


def browse(chromium: str, page: Path, work: Path, *mode: str) -> subprocess.CompletedProcess[str]:
    """Open ``page`` in headless chromium, doing ``mode`` (--dump-dom, --screenshot=...)."""
    profile = work / "profile"
    profile.mkdir(exist_ok=True)
    return subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
            "--enable-logging=stderr",
            "--v=0",
            f"--window-size={WINDOW[0]},{WINDOW[1]}",
            *mode,
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "HOME": str(work)},
    )


def console_errors(stderr: str) -> list[str]:
    return [
        line
        for line in stderr.splitlines()
        if "Uncaught" in line or "ERROR:CONSOLE" in line or ":CONSOLE(" in line
    ]


def test_the_html_report_in_headless_chromium(
    chromium: str, attested: Path, tmp_path: Path
) -> None:
    page = tmp_path / "report.html"
    page.write_text(render_html(build_report([attested])))

    dom = browse(chromium, page, tmp_path, "--dump-dom")
    assert dom.returncode == 0, dom.stderr
    assert console_errors(dom.stderr) == []
    # The page's own script wrote where the verdict landed: on the first screen.
    body = re.search(r"<body([^>]*)>", dom.stdout)
    assert body is not None, dom.stdout[:500]
    attributes = dict(re.findall(r'(data-[a-z-]+)="([^"]*)"', body.group(1)))
    top, bottom = int(attributes["data-verdict-top"]), int(attributes["data-verdict-bottom"])
    assert 0 <= top < bottom <= min(WINDOW[1], int(attributes["data-viewport-height"]))
    assert re.search(r'id="verdict"[^>]*>\s*<h1><span class="word">PASS</span>', dom.stdout)

    shot = tmp_path / "report.png"
    done = browse(chromium, page, tmp_path, f"--screenshot={shot}")
    assert done.returncode == 0, done.stderr
    assert console_errors(done.stderr) == []
    data = shot.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == WINDOW
    assert len(data) > 20_000  # a blank page compresses to a few hundred bytes
    artifacts = os.environ.get("KAUDIT_ARTIFACTS")
    if artifacts:
        Path(artifacts).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, Path(artifacts) / "report-chromium.png")
        shutil.copyfile(page, Path(artifacts) / "report.html")
