"""Where every test must run, a test that skips fails instead, with the reason it gave.

A test that needs what a machine may lack (a program such as strace or Slurm, root, a CPU
with vectorised kernels) skips with the reason: on a developer's machine that is a note in
pytest's summary. In CI a skip would leave a guarantee untested on every change while the
run stays green, so CI sets ``KAUDIT_TEST_NO_SKIP=1`` (``.ci/run``), and there a skip,
at collection, at setup or in the test, is reported as a failure naming what the machine
lacks. An expected failure (``xfail``) is not a skip. tests/conftest.py loads this plugin.
"""

from __future__ import annotations

import os
from collections.abc import Generator

import pytest

NO_SKIP = "KAUDIT_TEST_NO_SKIP"
"""The variable that, set to ``1``, makes every skip a failure."""


def _refuse(report: pytest.TestReport | pytest.CollectReport) -> None:
    if not report.skipped or hasattr(report, "wasxfail") or os.environ.get(NO_SKIP) != "1":
        return
    # A skip's longrepr is (file, line, reason); the reason says what the machine lacks.
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    report.outcome = "failed"
    report.longrepr = f"skipped where every test must run ({NO_SKIP}=1): {reason}"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    _refuse(report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(
    collector: pytest.Collector,
) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    report = yield
    _refuse(report)
    return report
