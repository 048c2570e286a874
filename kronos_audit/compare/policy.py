"""Tolerances: which rule applies to which dataset.

A :class:`Tolerance` is ``rtol``, ``atol`` and an optional ``ulp``; ``None`` in its place
means *exact* (bitwise). A :class:`TolerancePolicy` is an ordered list of
:class:`ToleranceRule` (an fnmatch pattern over dataset paths without the leading slash,
and a tolerance) plus a default for floating-point data. The first matching rule wins.

The default never applies to integer or boolean data: those compare exactly unless a rule
names them. Strings, bytes, compound and opaque data always compare exactly.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kronos_audit.compare.kinds import DataKind
from kronos_audit.errors import UsageError

if TYPE_CHECKING:
    from kronos_audit.project.repository import Project

CONFIG_SECTION = "compare"
CONFIG_KEYS = ("rtol", "atol", "ulp", "tol")
SPEC_KEYS = ("rtol", "atol", "ulp")
EXACT_SPEC = "exact"

NUMERIC_KINDS = (DataKind.FLOAT, DataKind.COMPLEX)
"""Kinds of data the policy's default tolerance applies to."""
COUNTED_KINDS = (DataKind.INTEGER, DataKind.BOOLEAN)
"""Kinds compared exactly unless a rule names them."""


class ToleranceError(UsageError):
    """A tolerance (``--rtol``, ``--tol`` spec, or ``[compare]`` in the config) is malformed."""

    def __init__(self, message: str, *, path: Path | str | None = None, where: str = "") -> None:
        super().__init__(message, path=path)
        self.where = where
        """What was being read, e.g. ``--tol 'fields/*:rtol=x'`` or ``[compare] tol[2]``."""


@dataclass(frozen=True)
class Tolerance:
    """How far B may be from A, elementwise, for floating-point data.

    An element passes when ``|a - b| <= atol + rtol * |a|`` (A is the reference), or,
    when ``ulp`` is set, when a and b are at most ``ulp`` units in the last place apart.
    NaN and infinities are never measured: a NaN matches only a NaN, an infinity only the
    same infinity.
    """

    rtol: float = 0.0
    """Relative tolerance, against ``|a|``."""
    atol: float = 0.0
    """Absolute tolerance."""
    ulp: int | None = None
    """Units in the last place also accepted; None: no ULP criterion."""

    def __post_init__(self) -> None:
        for name in ("rtol", "atol"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise ToleranceError(f"{name} must be a finite number, got {v!r}")
            if v < 0:
                raise ToleranceError(f"{name} must not be negative, got {v!r}")
        if self.ulp is not None and (
            isinstance(self.ulp, bool) or not isinstance(self.ulp, int) or self.ulp < 0
        ):
            raise ToleranceError(f"ulp must be a non-negative integer, got {self.ulp!r}")

    @property
    def spec(self) -> str:
        """The ``--tol`` spec that gives this tolerance, e.g. ``rtol=1e-12,atol=0``."""
        parts = [f"rtol={self.rtol:g}", f"atol={self.atol:g}"]
        if self.ulp is not None:
            parts.append(f"ulp={self.ulp}")
        return ",".join(parts)

    def to_json_obj(self) -> dict[str, Any]:
        return {"rtol": self.rtol, "atol": self.atol, "ulp": self.ulp}

    @classmethod
    def parse(cls, spec: str, *, where: str = "tolerance") -> Tolerance | None:
        """``exact`` gives None; ``rtol=..,atol=..,ulp=..`` (any of them, at least one) a
        Tolerance with the others 0 / unset. Raises ToleranceError naming ``where``."""
        text = spec.strip()
        if text == EXACT_SPEC:
            return None
        if not text:
            raise ToleranceError(f"{where}: empty tolerance (use 'exact' or rtol=,atol=,ulp=)")
        values: dict[str, Any] = {}
        for item in text.split(","):
            key, sep, raw = (s.strip() for s in item.partition("="))
            if not sep or not key or not raw:
                raise ToleranceError(f"{where}: expected KEY=VALUE, got {item.strip()!r}")
            if key not in SPEC_KEYS:
                raise ToleranceError(
                    f"{where}: unknown key {key!r} (expected rtol, atol, ulp or 'exact')"
                )
            if key in values:
                raise ToleranceError(f"{where}: {key} given twice")
            values[key] = (
                _parse_int(raw, key, where) if key == "ulp" else _parse_num(raw, key, where)
            )
        try:
            return cls(**values)
        except ToleranceError as e:
            raise ToleranceError(f"{where}: {e.message}") from None


def _parse_num(raw: str, key: str, where: str) -> float:
    try:
        v = float(raw)
    except ValueError:
        raise ToleranceError(f"{where}: {key} must be a number, got {raw!r}") from None
    if not math.isfinite(v) or v < 0:
        raise ToleranceError(f"{where}: {key} must be a finite non-negative number, got {raw!r}")
    return v


def _parse_int(raw: str, key: str, where: str) -> int:
    try:
        v = int(raw)
    except ValueError:
        raise ToleranceError(f"{where}: {key} must be a whole number, got {raw!r}") from None
    if v < 0:
        raise ToleranceError(f"{where}: {key} must not be negative, got {raw!r}")
    return v


def _spec_text(tolerance: Tolerance | None) -> str:
    return EXACT_SPEC if tolerance is None else tolerance.spec


@dataclass(frozen=True)
class ToleranceRule:
    """``PATTERN:SPEC``: the tolerance for datasets whose path matches PATTERN."""

    pattern: str
    """fnmatch pattern (case-sensitive; ``*`` also crosses ``/``) over the dataset path
    without its leading slash, e.g. ``fields/*``."""
    tolerance: Tolerance | None
    """None: exact."""
    origin: str = "--tol"
    """Where the rule came from: ``--tol`` or ``config``."""

    def matches(self, path: str) -> bool:
        return fnmatchcase(path.lstrip("/"), self.pattern)

    def __str__(self) -> str:
        return f"{self.pattern}:{_spec_text(self.tolerance)}"

    @classmethod
    def parse(cls, text: str, *, origin: str = "--tol", where: str | None = None) -> ToleranceRule:
        """Parse ``PATTERN:SPEC`` (split at the last colon; SPEC never holds one)."""
        where = where or f"{origin} {text!r}"
        pattern, sep, spec = text.rpartition(":")
        if not sep:
            raise ToleranceError(f"{where}: expected PATTERN:SPEC, e.g. 'fields/*:rtol=1e-12'")
        pattern = pattern.strip().lstrip("/")
        if not pattern:
            raise ToleranceError(f"{where}: empty pattern before ':'")
        return cls(pattern, Tolerance.parse(spec, where=where), origin)

    def to_json_obj(self) -> dict[str, Any]:
        return {
            "pattern": self.pattern,
            "tolerance": None if self.tolerance is None else self.tolerance.to_json_obj(),
            "origin": self.origin,
        }


@dataclass(frozen=True)
class TolerancePolicy:
    """Ordered rules, then a default for floating-point data. The empty policy is exact."""

    rules: tuple[ToleranceRule, ...] = ()
    """Tried in order; the first that matches a dataset's path decides."""
    default: Tolerance | None = None
    """For float and complex datasets no rule matches; None: exact."""

    def resolve(self, path: str, kind: DataKind | str) -> tuple[Tolerance | None, str]:
        """The tolerance for dataset ``path`` holding ``kind`` data, and where it came from.

        ``kind`` is a :class:`DataKind` (or its value): ``float``, ``complex``, ``integer``,
        ``boolean``, or anything else for data that always compares exactly (``string``,
        ``bytes``, ``compound``, ``opaque``).
        """
        if kind not in NUMERIC_KINDS + COUNTED_KINDS:
            return None, f"{kind} data (exact)"
        for rule in self.rules:
            if rule.matches(path):
                return rule.tolerance, f"{rule.origin} {rule}"
        if kind in COUNTED_KINDS:
            return None, f"{kind} data (exact)"
        if self.default is None:
            return None, "default (exact)"
        return self.default, f"global {self.default.spec}"

    def to_json_obj(self) -> dict[str, Any]:
        return {
            "default": None if self.default is None else self.default.to_json_obj(),
            "rules": [r.to_json_obj() for r in self.rules],
        }

    @classmethod
    def exact(cls) -> TolerancePolicy:
        return cls()

    @classmethod
    def from_options(
        cls,
        *,
        rtol: float | None = None,
        atol: float | None = None,
        ulp: int | None = None,
        tol: Iterable[str] = (),
        base: TolerancePolicy | None = None,
    ) -> TolerancePolicy:
        """The policy the command line asks for, layered over ``base`` (the config's).

        ``tol`` holds ``PATTERN:SPEC`` strings; they are tried before ``base``'s rules.
        Each of ``rtol``, ``atol``, ``ulp`` given replaces that key of ``base``'s default;
        the keys not given keep ``base``'s value (0 / unset when ``base`` has none).
        """
        base = base or cls()
        rules = tuple(ToleranceRule.parse(t, origin="--tol") for t in tol) + base.rules
        default = base.default
        if rtol is not None or atol is not None or ulp is not None:
            old = default or Tolerance()
            where = "--rtol/--atol/--ulp"
            try:
                default = Tolerance(
                    rtol=old.rtol if rtol is None else float(rtol),
                    atol=old.atol if atol is None else float(atol),
                    ulp=old.ulp if ulp is None else ulp,
                )
            except ToleranceError as e:
                raise ToleranceError(f"{where}: {e.message}", where=where) from None
        return cls(rules, default)

    @classmethod
    def from_mapping(
        cls, table: Mapping[str, Any], *, path: Path | str | None = None
    ) -> TolerancePolicy:
        """The policy a ``[compare]`` table describes (keys rtol, atol, ulp, tol)."""
        section = f"[{CONFIG_SECTION}]"
        if not isinstance(table, Mapping):
            raise ToleranceError(f"{section} must be a table", path=path, where=section)
        unknown = sorted(set(table) - set(CONFIG_KEYS))
        if unknown:
            raise ToleranceError(
                f"{section}: unknown key {unknown[0]!r} (expected {', '.join(CONFIG_KEYS)})",
                path=path,
                where=section,
            )
        values: dict[str, Any] = {k: table[k] for k in SPEC_KEYS if k in table}
        default = None
        if values:
            try:
                default = Tolerance(**values)
            except ToleranceError as e:
                raise ToleranceError(f"{section}: {e.message}", path=path, where=section) from None
        raw_rules = table.get("tol", [])
        if not isinstance(raw_rules, list) or not all(isinstance(r, str) for r in raw_rules):
            raise ToleranceError(
                f"{section} tol must be a list of 'PATTERN:SPEC' strings",
                path=path,
                where=f"{section} tol",
            )
        rules = []
        for i, text in enumerate(raw_rules):
            where = f"{section} tol[{i}] {text!r}"
            try:
                rules.append(ToleranceRule.parse(text, origin="config", where=where))
            except ToleranceError as e:
                raise ToleranceError(e.message, path=path, where=where) from None
        return cls(tuple(rules), default)

    @classmethod
    def from_config(cls, project: Project) -> TolerancePolicy:
        """The ``[compare]`` section of the project's ``.kaudit/config.toml`` in the work
        tree (exact if none): for an unsigned, interactive comparison only. What is signed
        or gates reads it at a trust ref
        (:func:`kronos_audit.project.settings.compare_settings`)."""
        table = project.config().get(CONFIG_SECTION)
        if table is None:
            return cls()
        return cls.from_mapping(table, path=project.config_path)


class Settings(enum.StrEnum):
    """Where a ``[compare]`` section a policy is layered over was read."""

    NONE = "none"
    """No configuration was read: only the tolerances given (none given: bitwise)."""
    TRUST_REF = "trust-ref"
    """``.kaudit/config.toml`` as it is at a trust ref, read from git's object store: a
    change under review cannot loosen it."""
    WORK_TREE = "work-tree"
    """The work tree's ``.kaudit/config.toml``: anyone who can commit can change it, so it
    decides only an unsigned, interactive comparison, which says so."""


@dataclass(frozen=True)
class PolicySource:
    """Where a :class:`TolerancePolicy` came from: what a signed verdict records beside it
    so that a reader can weigh its tolerances."""

    settings: Settings = Settings.NONE
    """Which configuration the policy is layered over."""
    config: str | None = None
    """Where that configuration was read (``refs/heads/main at COMMIT:.kaudit/config.toml``,
    ``.kaudit/config.toml``); None with :attr:`Settings.NONE`."""
    given: bool = False
    """Tolerances were given explicitly (``--rtol``, ``--atol``, ``--ulp``, ``--tol``, or
    a program's arguments), in front of the configuration's."""

    def describe(self) -> str:
        """Where the tolerances came from, in words that stand alone in parentheses:
        ``given on the command line, over [compare] at REF at COMMIT:.kaudit/config.toml``."""
        where = {
            Settings.NONE: None,
            Settings.TRUST_REF: f"[compare] at {self.config}",
            Settings.WORK_TREE: f"[compare] of the work tree's {self.config}, not a trust ref",
        }[self.settings]
        if where is None:
            return "given on the command line" if self.given else "no tolerance given or configured"
        return f"given on the command line, over {where}" if self.given else where

    def to_json_obj(self) -> dict[str, Any]:
        return {"settings": self.settings.value, "config": self.config, "given": self.given}

    @classmethod
    def from_json_obj(cls, obj: Mapping[str, Any]) -> PolicySource:
        """The source a schema-valid ``tolerances.source`` object records."""
        config = obj["config"]
        return cls(
            Settings(obj["settings"]), None if config is None else str(config), bool(obj["given"])
        )


def policy_text(policy: TolerancePolicy) -> str:
    """A policy in one line: its rules in order, then the default for float data."""
    parts = [f"{r.origin} {r}" for r in policy.rules]
    rest = "exact (bitwise)" if policy.default is None else f"float data {policy.default.spec}"
    parts.append(f"otherwise {rest}" if parts else rest)
    return "; ".join(parts)
