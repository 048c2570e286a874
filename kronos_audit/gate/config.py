"""The gate's configuration: the ``[gate]`` section of ``.kaudit/config.toml``.

::

    [gate]
    runs = ["checkpoints/*"]        # run directories or manifest globs (default: every run)
    segments = 2                    # segments replayed per run, the newest always among them
    seed = 7                        # the sample is drawn from this seed (reproducible)
    env = "warn"                    # strict / warn / ignore (kronos_audit.replay.EnvMode)
    signers = ["tester"]            # key names or ids; each manifest must be signed by one
    rtol = 1e-12                    # tolerances as in [compare]: rtol, atol, ulp ...
    tol = ["fields/*:rtol=1e-9"]    # ... and PATTERN:SPEC rules, the first match wins

    [gate.tolerance."corpus/v1/torch-train"]   # one run (a directory glob) judged apart:
    rtol = 1e-5                                # its own tolerances, in place of the above,
    why = "recorded with the native CPU dispatch"   # and why, which the gate prints

Under ``--trust-ref REF`` the section is read as it is at REF, from git's object store, so
a change under review cannot weaken its own gate; REF is resolved to one fully qualified
ref and its commit once, and the section read at that commit.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from kronos_audit._internal import git
from kronos_audit._internal.safeio import UnsafeFile, read_owned
from kronos_audit.compare import Tolerance, ToleranceError, TolerancePolicy, ToleranceRule
from kronos_audit.errors import Error, ProjectError
from kronos_audit.keys.anchors import PinnedRef, resolve_ref
from kronos_audit.project import settings
from kronos_audit.project.repository import Project
from kronos_audit.replay import EnvMode

SECTION = "gate"
CONFIG_NAME = "config.toml"
KEYS = ("runs", "segments", "seed", "env", "signers", "rtol", "atol", "ulp", "tol", "tolerance")
RUN_TOLERANCE_KEYS = ("rtol", "atol", "ulp", "tol", "why")


@dataclass(frozen=True)
class RunTolerance:
    """A run the gate judges with its own tolerances, and why (``[gate.tolerance.PATTERN]``)."""

    pattern: str
    """The run directories it covers: a glob relative to the repository root, as in
    ``runs``; it covers a manifest whose run directory (or one of its parents) matches."""
    policy: TolerancePolicy
    """Its tolerances, in place of the section's."""
    why: str
    """The reason, printed beside every verdict it decides: a tolerance is a claim about
    the run that a reader must be able to weigh."""

    def describe(self) -> str:
        """``PATTERN (rtol=1e-05, fields/*:atol=0.001): WHY``, on one line."""
        p = self.policy
        specs = ([] if p.default is None else [p.default.spec]) + [str(r) for r in p.rules]
        return f"{self.pattern} ({', '.join(specs)}): {self.why}"

    def to_json_obj(self) -> dict[str, Any]:
        return {"pattern": self.pattern, "policy": self.policy.to_json_obj(), "why": self.why}


class GateConfigError(Error):
    """The ``[gate]`` section cannot be read or says something impossible (exit 2)."""


@dataclass(frozen=True)
class GateConfig:
    """What the gate covers and how strictly."""

    runs: tuple[str, ...] = ()
    """Run directories or manifest globs, relative to the repository root; empty: every
    run in the repository."""
    segments: int = 1
    """Segments replayed per run; the newest checkpoint's is always one of them."""
    seed: int = 0
    """Seed of the sample of older segments."""
    policy: TolerancePolicy = field(default_factory=TolerancePolicy)
    """Tolerances of the replays; the empty policy is bitwise."""
    env: EnvMode = EnvMode.WARN
    """What a replay does on environment drift."""
    signers: tuple[str, ...] = ()
    """Key names or ids (full or a prefix of at least 16 hex digits) one of which must
    have signed each manifest; empty: any signer the trust anchors accept."""
    source: str = "default"
    """Where it was read: ``default`` (no section), a file, or ``REF:.kaudit/config.toml``."""
    tolerances: tuple[RunTolerance, ...] = ()
    """Runs judged with their own tolerances, the first matching pattern deciding."""

    def to_json_obj(self) -> dict[str, Any]:
        return {
            "tolerances": [t.to_json_obj() for t in self.tolerances],
            "runs": list(self.runs),
            "segments": self.segments,
            "seed": self.seed,
            "env": self.env.value,
            "signers": list(self.signers),
            "policy": self.policy.to_json_obj(),
            "source": self.source,
        }


def _strings(table: Mapping[str, Any], key: str, where: str) -> tuple[str, ...]:
    value = table.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise GateConfigError(f"[gate] {key} must be a list of strings", path=where)
    return tuple(value)


def _whole(table: Mapping[str, Any], key: str, default: int, where: str) -> int:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise GateConfigError(f"[gate] {key} must be a whole number >= 0", path=where)
    return value


def _policy(table: Mapping[str, Any], where: str, label: str = "[gate]") -> TolerancePolicy:
    try:
        values = {k: table[k] for k in ("rtol", "atol", "ulp") if k in table}
        default = Tolerance(**values) if values else None
        rules = tuple(
            ToleranceRule.parse(text, origin=label, where=f"{label} tol[{i}] {text!r}")
            for i, text in enumerate(_strings(table, "tol", where))
        )
    except ToleranceError as e:
        raise GateConfigError(e.message, path=where) from None
    except TypeError:
        raise GateConfigError(f"{label} rtol, atol and ulp must be numbers", path=where) from None
    return TolerancePolicy(rules, default)


def _run_tolerances(table: Mapping[str, Any], where: str) -> tuple[RunTolerance, ...]:
    runs = table.get("tolerance", {})
    if not isinstance(runs, Mapping):
        raise GateConfigError('[gate.tolerance] must be a table of "RUN_GLOB" tables', path=where)
    found = []
    for pattern, spec in runs.items():
        label = f"[gate.tolerance.{pattern!r}]"
        pure = PurePosixPath(pattern)
        if not pattern or pure.is_absolute() or ".." in pure.parts:
            raise GateConfigError(f"{label}: must name runs inside the repository", path=where)
        if not isinstance(spec, Mapping):
            raise GateConfigError(f"{label} must be a table", path=where)
        unknown = sorted(set(spec) - set(RUN_TOLERANCE_KEYS))
        if unknown:
            raise GateConfigError(
                f"{label}: unknown key {unknown[0]!r} (expected {', '.join(RUN_TOLERANCE_KEYS)})",
                path=where,
            )
        why = spec.get("why")
        if not isinstance(why, str) or not why.strip():
            raise GateConfigError(
                f'{label}: why = "..." must say why it has a tolerance', path=where
            )
        policy = _policy(spec, where, label)
        if policy == TolerancePolicy():
            raise GateConfigError(f"{label}: no tolerance (rtol, atol, ulp or tol)", path=where)
        found.append(RunTolerance(pattern, policy, why.strip()))
    return tuple(found)


def parse_config(document: Mapping[str, Any], where: str) -> GateConfig:
    """The gate the ``[gate]`` table of a parsed config file describes (the default gate
    when there is none)."""
    table = document.get(SECTION)
    if table is None:
        return GateConfig(source=f"default (no [gate] in {where})")
    if not isinstance(table, Mapping):
        raise GateConfigError("[gate] must be a table", path=where)
    unknown = sorted(set(table) - set(KEYS))
    if unknown:
        raise GateConfigError(
            f"[gate]: unknown key {unknown[0]!r} (expected {', '.join(KEYS)})", path=where
        )
    env = table.get("env", EnvMode.WARN.value)
    if env not in {m.value for m in EnvMode}:
        raise GateConfigError(f"[gate] env must be strict, warn or ignore, got {env!r}", path=where)
    return GateConfig(
        runs=_strings(table, "runs", where),
        segments=_whole(table, "segments", 1, where),
        seed=_whole(table, "seed", 0, where),
        policy=_policy(table, where),
        env=EnvMode(env),
        signers=_strings(table, "signers", where),
        source=where,
        tolerances=_run_tolerances(table, where),
    )


def _parse_toml(data: bytes, where: str) -> dict[str, Any]:
    try:
        return tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise GateConfigError(f"unreadable config: {e}", path=where) from None


def config_at_ref(root: Path, ref: str | PinnedRef) -> GateConfig:
    """The ``[gate]`` section of ``.kaudit/config.toml`` as it is at ``ref``, read from
    git's object store (never the work tree) at the one commit ``ref`` resolves to
    (:func:`kronos_audit.keys.anchors.resolve_ref`)."""
    pinned = resolve_ref(root, ref) if isinstance(ref, str) else ref
    try:
        document, where = settings.config_at_ref(root, pinned)
    except ProjectError as e:
        raise GateConfigError(e.message, path=e.path) from None
    if document is None:
        return GateConfig(source=f"default (no {settings.CONFIG_PATH} at {pinned.describe()})")
    return parse_config(document, where)


def load_config(project: Project, trust_ref: str | PinnedRef | None = None) -> GateConfig:
    """The gate's configuration: at ``trust_ref`` when given, else the work tree's."""
    if trust_ref is not None:
        try:
            return config_at_ref(project.root, trust_ref)
        except git.GitError as e:
            given = trust_ref if isinstance(trust_ref, str) else trust_ref.given
            raise GateConfigError(f"--trust-ref {given}: {e.message}") from None
    where = project.relative(project.config_path)
    try:
        data = read_owned(project.config_path)
    except UnsafeFile as e:
        raise GateConfigError(f"unreadable config: {e.reason}", path=where) from None
    if data is None:
        return GateConfig(source=f"default (no {where})")
    return parse_config(_parse_toml(data, where), where)
