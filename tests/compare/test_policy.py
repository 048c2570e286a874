"""Tolerances (kronos_audit.compare.policy): specs parsed, rules matched in order, policies
from config and options, bad values refused."""

from __future__ import annotations

import math

import pytest

from kronos_audit.compare import (
    Tolerance,
    ToleranceError,
    TolerancePolicy,
    ToleranceRule,
    Verdict,
    compare_arrays,
)
from kronos_audit.errors import UsageError
from kronos_audit.project.repository import Project
from tests.compare.helpers import tol

# -- policies --------------------------------------------------------------------------


def test_tolerance_specs_parse() -> None:
    assert Tolerance.parse("exact") is None
    assert Tolerance.parse("rtol=1e-12") == Tolerance(rtol=1e-12)
    assert Tolerance.parse("atol=0.5, ulp=4") == Tolerance(atol=0.5, ulp=4)
    assert Tolerance.parse("rtol=0,atol=0") == Tolerance()
    rule = ToleranceRule.parse("fields/*:rtol=1e-12")
    assert rule == ToleranceRule("fields/*", Tolerance(rtol=1e-12), "--tol")
    assert rule.matches("/fields/u")
    assert rule.matches("fields/deep/v")
    assert not rule.matches("/fieldsx")
    assert ToleranceRule.parse("/a:b/c:exact").pattern == "a:b/c"  # split at the last ':'


@pytest.mark.parametrize(
    ("text", "mention"),
    [
        ("fields/*", "expected PATTERN:SPEC"),
        (":rtol=1", "empty pattern"),
        ("x:", "empty tolerance"),
        ("x:rtol", "expected KEY=VALUE"),
        ("x:rtol=abc", "rtol must be a number"),
        ("x:rtol=-1", "non-negative"),
        ("x:atol=nan", "finite"),
        ("x:ulp=1.5", "ulp must be a whole number"),
        ("x:ulp=-2", "must not be negative"),
        ("x:rtl=1", "unknown key 'rtl'"),
        ("x:rtol=1,rtol=2", "rtol given twice"),
        ("x:exactly", "expected KEY=VALUE"),
    ],
)
def test_malformed_tol_specs_are_usage_errors(text: str, mention: str) -> None:
    with pytest.raises(ToleranceError) as err:
        TolerancePolicy.from_options(tol=[text])
    assert isinstance(err.value, UsageError)
    assert err.value.exit_code == 2
    assert mention in str(err.value)
    assert repr(text) in str(err.value)  # says where


def test_first_matching_rule_wins_then_the_default() -> None:
    p = tol(rtol=1e-3, tol=["fields/u:exact", "fields/*:atol=1", "*:ulp=2"])
    assert p.resolve("/fields/u", "float") == (None, "--tol fields/u:exact")
    assert p.resolve("/fields/v", "float") == (Tolerance(atol=1), "--tol fields/*:rtol=0,atol=1")
    assert p.resolve("/x", "integer")[0] == Tolerance(ulp=2)
    p2 = tol(rtol=1e-3)
    assert p2.resolve("/x", "float") == (Tolerance(rtol=1e-3), "global rtol=0.001,atol=0")
    assert p2.resolve("/n", "integer") == (None, "integer data (exact)")
    assert TolerancePolicy().resolve("/x", "float") == (None, "default (exact)")


def write_config(project: Project, text: str) -> None:
    project.config_path.write_text(text + "\n[kaudit]\nconfig_version = 1\n")


def test_policy_from_config_and_overridden_by_options(project: Project) -> None:
    write_config(
        project,
        '[compare]\nrtol = 1e-10\natol = 1e-300\ntol = ["rng/*:exact", "fields/*:ulp=4"]\n',
    )
    base = TolerancePolicy.from_config(project)
    assert base.default == Tolerance(rtol=1e-10, atol=1e-300)
    assert [str(r) for r in base.rules] == ["rng/*:exact", "fields/*:rtol=0,atol=0,ulp=4"]
    assert all(r.origin == "config" for r in base.rules)
    merged = TolerancePolicy.from_options(rtol=1e-6, tol=["rng/*:atol=1"], base=base)
    assert merged.default == Tolerance(rtol=1e-6, atol=1e-300)  # atol kept from the config
    assert merged.resolve("/rng/state", "integer")[0] == Tolerance(atol=1)  # CLI rule first
    assert merged.resolve("/fields/u", "float")[0] == Tolerance(ulp=4)
    assert TolerancePolicy.from_options(base=base) == base


def test_no_compare_section_is_exact(project: Project) -> None:
    assert TolerancePolicy.from_config(project) == TolerancePolicy()


@pytest.mark.parametrize(
    ("section", "mention"),
    [
        ("[compare]\nrtl = 1\n", "unknown key 'rtl'"),
        ("[compare]\nrtol = -1.0\n", "rtol must not be negative"),
        ('[compare]\nrtol = "1e-3"\n', "rtol must be a finite number"),
        ("[compare]\nulp = 1.5\n", "ulp must be a non-negative integer"),
        ('[compare]\ntol = "x:exact"\n', "tol must be a list"),
        ('[compare]\ntol = ["ok:exact", "bad:rtol=x"]\n', "tol[1] 'bad:rtol=x'"),
        ("compare = 3\n", "[compare] must be a table"),
    ],
)
def test_bad_config_names_the_file_and_the_key(
    project: Project, section: str, mention: str
) -> None:
    write_config(project, section)
    with pytest.raises(UsageError) as err:
        TolerancePolicy.from_config(project)
    assert mention in str(err.value)
    assert str(project.config_path) in str(err.value)


def test_tolerance_values_are_validated() -> None:
    with pytest.raises(ToleranceError):
        Tolerance(rtol=-1.0)
    with pytest.raises(ToleranceError):
        Tolerance(atol=math.inf)
    with pytest.raises(ToleranceError):
        Tolerance(ulp=-1)
    with pytest.raises(ToleranceError, match="--rtol/--atol/--ulp"):
        TolerancePolicy.from_options(atol=-1.0)


def test_compare_arrays_with_a_policy_follows_the_integer_rule() -> None:
    p = tol(atol=10)
    assert compare_arrays([1, 2], [1, 3], policy=p).verdict is Verdict.DIFFERENT
    assert compare_arrays([1.0, 2.0], [1.0, 3.0], policy=p).verdict is Verdict.WITHIN_TOLERANCE
    # a tolerance handed over directly applies to integers too
    assert compare_arrays([1, 2], [1, 3], Tolerance(atol=1)).verdict is Verdict.WITHIN_TOLERANCE
    with pytest.raises(TypeError):
        compare_arrays([1.0], [1.0], Tolerance(), policy=p)
