"""The report's charts (kronos_audit.report.charts): nice axis ticks, each caption once,
and pauses shaded only where a run stood still, read back from the HTML page as parsed."""

from __future__ import annotations

import math
import random
from html.parser import HTMLParser
from pathlib import Path

import pytest

from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.report import build_report, render_html
from kronos_audit.report.charts import nice_ticks, tick_label
from tests.replay import recorded
from tests.report.helpers import timed_chain

# The fixtures over the repository recorded once for the session (tests/replay/recorded.py).
heat = recorded.heat
key = recorded.key
project = recorded.project
repo = recorded.repo


def assert_nice(ticks: tuple[float, ...], lo: float, hi: float, max_ticks: int) -> None:
    """``ticks`` cover [lo, hi] in at most ``max_ticks`` even steps of 1, 2 or 5 x 10^k."""
    assert 2 <= len(ticks) <= max_ticks, ticks
    assert ticks[0] <= lo, ticks
    assert ticks[-1] >= hi, ticks
    step = ticks[1] - ticks[0]
    exponent = math.floor(math.log10(step) + 1e-9)
    assert round(step / 10**exponent, 6) in (1, 2, 5), ticks
    for i, t in enumerate(ticks):
        assert math.isclose(t, ticks[0] + i * step, rel_tol=1e-9, abs_tol=step * 1e-9), ticks
        assert math.isclose(t / step, round(t / step), abs_tol=1e-9), ticks  # on the grid


@pytest.mark.parametrize(
    ("lo", "hi", "expected"),
    [
        (0.0, 7.3, (0.0, 2.0, 4.0, 6.0, 8.0)),
        (0.0, 1e-6, (0.0, 2e-7, 4e-7, 6e-7, 8e-7, 1e-6)),
        (3.0, 3.0, (2.0, 2.5, 3.0, 3.5, 4.0)),  # a flat series still spans an axis
        (0.0, 0.0, (-1.0, -0.5, 0.0, 0.5, 1.0)),
        (-7.3, -0.2, (-8.0, -6.0, -4.0, -2.0, 0.0)),
        (-3.0, 12.0, (-5.0, 0.0, 5.0, 10.0, 15.0)),
        (0.1, 0.3, (0.1, 0.15, 0.2, 0.25, 0.3)),
        (0.0, 1e15, (0.0, 2e14, 4e14, 6e14, 8e14, 1e15)),
        (-1e300, 1e300, (-1e300, -5e299, 0.0, 5e299, 1e300)),
        (1.0, 1000.0, (0.0, 200.0, 400.0, 600.0, 800.0, 1000.0)),
    ],
)
def test_nice_ticks_cover_the_range_in_steps_of_1_2_or_5(
    lo: float, hi: float, expected: tuple[float, ...]
) -> None:
    ticks = nice_ticks(lo, hi, 6)
    assert ticks == expected  # exactly: the floats nearest the decimals, no 0.30000000000000004
    assert_nice(ticks, lo, hi, 6)


def test_nice_ticks_of_many_ranges_are_nice() -> None:
    rng = random.Random(7)
    for _ in range(300):
        scale = 10.0 ** rng.uniform(-12, 12)
        lo = rng.uniform(-1, 1) * scale
        hi = lo + rng.uniform(0, 3) * scale
        for max_ticks in (3, 5, 6, 11):
            assert_nice(nice_ticks(lo, hi, max_ticks), lo, hi, max_ticks)


def test_nice_ticks_of_whole_numbers_and_bad_ranges() -> None:
    assert nice_ticks(1, 1, 6, min_step=1) == (0.0, 1.0, 2.0)  # one step: whole steps only
    assert nice_ticks(-17, 0, 6, min_step=1) == (-20.0, -15.0, -10.0, -5.0, 0.0)
    assert [tick_label(t) for t in nice_ticks(0, 1e-6, 6)][:2] == ["0", "2e-07"]
    for lo, hi in ((1.0, 0.0), (0.0, math.inf), (math.nan, 1.0), (-1e308, 1e308)):
        with pytest.raises(ValueError, match="range"):
            nice_ticks(lo, hi, 6)
    with pytest.raises(ValueError, match="3 ticks"):
        nice_ticks(0, 1, 2)  # a range across 0 could never fit


class Page(HTMLParser):
    """What a reader gets of a report page: its text, its figures' captions, the charts'
    accessible names, their shaded bands and each chart's axis labels."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.text: list[str] = []
        self.captions: dict[str, str] = {}  # figcaption id: text
        self.labelled_by: list[str] = []
        self.bands: list[str] = []  # each band's kind
        self.axes: list[dict[str, list[str]]] = []  # per chart, by text-anchor: labels
        self._open: list[tuple[str, dict[str, str]]] = []
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        self._open.append((tag, a))
        if tag == "svg":
            assert "aria-label" not in a  # the name is the caption's, not a second copy
            self.labelled_by.append(a["aria-labelledby"])
            self.axes.append({"middle": [], "end": []})
        if tag == "rect" and a.get("class", "").startswith("band "):
            self.bands.append(a["class"].removeprefix("band "))

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)
        self._open.pop()

    def handle_endtag(self, tag: str) -> None:
        while self._open and self._open.pop()[0] != tag:
            pass

    def handle_data(self, data: str) -> None:
        text = data.strip()
        if not text or any(t in ("style", "script") for t, _ in self._open):
            return
        self.text.append(text)
        tag, a = self._open[-1]
        if tag == "figcaption":
            self.captions[a["id"]] = text
        if tag == "text" and a.get("class") == "tick" and a.get("text-anchor") in ("middle", "end"):
            self.axes[-1][a["text-anchor"]].append(text)


def tick_values(labels: list[str]) -> tuple[float, ...]:
    """``0 ms``, ``2.5 KiB``, ``15``: the numbers; ``1e-20`` ... ``1``: the decades."""
    if all(t == "1" or t.startswith("1e") for t in labels) and len(labels) > 2:
        return tuple(float(t.removeprefix("1e")) if t != "1" else 0.0 for t in labels)
    return tuple(float(t.split()[0]) for t in labels)


@pytest.fixture
def attested(heat: Path) -> Path:
    """The heat run (steps 10, 20, 30) with step 20 replayed and attested; its directory."""
    assert (heat / "step-00000020.h5.replay.json").is_file()
    return heat


def test_each_caption_is_written_once_and_every_axis_is_nice(
    attested: Path, project: Project, key: SigningKey
) -> None:
    """Two runs on one page, one with a replay: five charts, five different captions, each
    once in the page's text (no "X (x against y)" saying it twice, no SVG title with it)."""
    other = timed_chain(project, key, [0.0, 30.0, 95.0, 170.0], "other")
    page = Page(render_html(build_report([attested, other])))
    captions = list(page.captions.values())
    assert sorted(captions) == [
        "Checkpoint size against step, run heat",
        "Checkpoint size against step, run other",
        "Largest relative error per dataset, replay of step 20 (log scale)",
        "Step against wall-clock time, run heat",
        "Step against wall-clock time, run other",
    ]
    for caption in captions:
        assert sum(caption in t for t in page.text) == 1, caption
    assert page.labelled_by == list(page.captions)  # each chart named by its own caption

    charts = {
        page.captions[name]: axes for name, axes in zip(page.labelled_by, page.axes, strict=True)
    }
    for caption, axes in charts.items():
        for anchor, labels in axes.items():
            if anchor == "end" and caption.startswith("Largest"):
                continue  # the bar chart's dataset names
            values = tick_values(labels)
            assert_nice(values, values[0], values[-1], 6)
    other_timeline = charts["Step against wall-clock time, run other"]
    assert other_timeline["middle"] == ["0 min", "1 min", "2 min", "3 min"]  # 170 s: minutes
    assert other_timeline["end"] == ["1", "2", "3", "4"]  # steps: whole numbers only
    errors = charts["Largest relative error per dataset, replay of step 20 (log scale)"]
    assert errors["middle"] == ["1e-20", "1e-15", "1e-10", "1e-5", "1"]


@pytest.mark.parametrize(
    ("seconds", "bands"),
    [
        # a checkpoint a minute, but for one stop of an hour: one band
        ([60.0 * i + 3600.0 * (i > 12) for i in range(20)], ["pause"]),
        # a checkpoint a minute, jittered by up to 25 s either way: none
        ([60.0 * i + random.Random(3).uniform(-25, 25) for i in range(20)], []),
    ],
    ids=["one-long-gap", "jitter"],
)
def test_only_a_gap_that_stands_out_is_shaded(
    project: Project, key: SigningKey, seconds: list[float], bands: list[str]
) -> None:
    page = Page(render_html(build_report([timed_chain(project, key, seconds, "r")])))
    assert page.bands == bands
