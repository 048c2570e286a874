"""tests/no_skip.py: a skip is a note on a developer's machine and a failure where every test
must run (CI sets KAUDIT_TEST_NO_SKIP=1), whichever way the test skips; an expected failure
is neither. Run by pytester in this process, on a test file of its own."""

from __future__ import annotations

import pytest

from tests.no_skip import NO_SKIP

pytest_plugins = ["pytester"]

SKIPPING = """
import pytest


def test_runs():
    pass


def test_needs_a_program():
    pytest.skip("strace is not installed")


@pytest.mark.skipif(True, reason="needs root")
def test_needs_root():
    pass


@pytest.mark.xfail(reason="a known failure")
def test_known_to_fail():
    assert False
"""

SKIPPED_MODULE = """
import pytest

pytest.importorskip("a_module_nobody_has")


def test_never_collected():
    pass
"""


def _run(pytester: pytest.Pytester) -> pytest.RunResult:
    return pytester.runpytest_inprocess("-p", "tests.no_skip", "-p", "no:cacheprovider")


@pytest.fixture(autouse=True)
def plugin_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """The inner runs load this plugin alone: the installed ones (kaudit's own, Hydra's, ...)
    would cost each run a second."""
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")


def test_a_skip_fails_where_every_test_must_run_and_says_why(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(test_skipping=SKIPPING)
    monkeypatch.delenv(NO_SKIP, raising=False)
    _run(pytester).assert_outcomes(passed=1, skipped=2, xfailed=1)

    monkeypatch.setenv(NO_SKIP, "1")
    result = _run(pytester)
    # skipped in the test: failed; by its mark, at setup: an error; the xfail stays one
    result.assert_outcomes(passed=1, failed=1, errors=1, xfailed=1)
    for reason in ("strace is not installed", "needs root"):
        result.stdout.fnmatch_lines([f"skipped where every test must run ({NO_SKIP}=1): *{reason}"])


def test_a_module_skipped_at_collection_fails_too(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(test_skipped_module=SKIPPED_MODULE)
    monkeypatch.delenv(NO_SKIP, raising=False)
    _run(pytester).assert_outcomes(skipped=1)
    monkeypatch.setenv(NO_SKIP, "1")
    result = _run(pytester)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*skipped where every test must run*a_module_nobody_has*"])
