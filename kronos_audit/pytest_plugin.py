"""A pytest plugin: a project's own tests assert that its runs verify and replay.

Installed with kronos-audit (entry point ``pytest11``), it gives every test session the
fixture ``kaudit``::

    def test_the_campaign_verifies(kaudit):
        kaudit.assert_verifies("checkpoints/heat", trusted_keys=["keys/alice.pub"])

    def test_the_last_segment_replays(kaudit):
        kaudit.assert_replays("checkpoints/heat/step-00000030.h5.kaudit.json", rtol=1e-12)

A failure lists every failed check, one per line. pytest loads this module in every
session of every project that installs kronos-audit, so it imports nothing of the library
until a test asks for the fixture's checks.
"""

from __future__ import annotations

from collections.abc import Sequence
from os import PathLike
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from kronos_audit.keys.anchors import TrustOptions
    from kronos_audit.replay import ReplayResult
    from kronos_audit.verification.results import VerifyResult

StrPath = str | PathLike[str]


def _trust(
    trusted_keys: Sequence[StrPath],
    trust_ref: str | None,
    require_anchor: bool,
    allow_unanchored: bool,
) -> TrustOptions:
    from kronos_audit.keys.anchors import TrustOptions

    return TrustOptions(
        tuple(Path(k) for k in trusted_keys),
        trust_ref,
        require_anchor,
        allow_unanchored=allow_unanchored,
    )


def _g(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


class KauditChecks:
    """The checks the ``kaudit`` fixture offers; each raises AssertionError naming every
    check that failed (bad input, such as a path with no manifest, raises
    :class:`kronos_audit.errors.Error`)."""

    def assert_verifies(
        self,
        target: StrPath | Sequence[StrPath],
        *,
        trusted_keys: Sequence[StrPath] = (),
        trust_ref: str | None = None,
        require_anchor: bool = False,
        allow_unanchored: bool = False,
        fetch: bool = True,
    ) -> tuple[VerifyResult, ...]:
        """Every manifest (and replay attestation) in ``target`` (a run directory, a
        manifest, or several) verifies, as ``kaudit verify`` would say: signature by a
        trusted signer, place, file digest, dataset hashes, parent chain. Returns the
        results."""
        __tracebackhide__ = True
        from kronos_audit.verification.batch import verify

        paths = [target] if isinstance(target, str | PathLike) else list(target)
        results = verify(
            [Path(p) for p in paths],
            trust=_trust(trusted_keys, trust_ref, require_anchor, allow_unanchored),
            fetch=fetch,
        )
        failed = [
            f"{r.manifest}: {c.name}: {c.detail}" for r in results if not r.ok for c in r.failures
        ]
        if failed:
            bad = sum(not r.ok for r in results)
            raise AssertionError(
                f"kaudit: {bad} of {len(results)} manifest(s) do not verify:\n  "
                + "\n  ".join(failed)
            )
        return results

    def assert_replays(
        self,
        manifest: StrPath,
        *,
        rtol: float | None = None,
        atol: float | None = None,
        ulp: int | None = None,
        tol: Sequence[str] = (),
        trusted_keys: Sequence[StrPath] = (),
        trust_ref: str | None = None,
        require_anchor: bool = False,
        allow_unanchored: bool = False,
    ) -> ReplayResult:
        """The segment that produced ``manifest``'s checkpoint replays and agrees with
        it: bitwise, or within the tolerances given (``tol``: ``PATTERN:SPEC`` as for
        ``kaudit replay --tol``), as ``kaudit replay`` would say. Returns the result.

        A test gates a change, so the change cannot loosen it: ``[compare]`` of
        .kaudit/config.toml is read only as it is at ``trust_ref`` (from git's object
        store), never from the work tree; without ``trust_ref`` only the tolerances
        given here apply."""
        __tracebackhide__ = True
        from kronos_audit.compare import PolicySource, TolerancePolicy
        from kronos_audit.project.repository import find_project
        from kronos_audit.project.settings import compare_settings, work_tree_tolerances
        from kronos_audit.replay import replay

        path = Path(manifest)
        project = find_project(path).require_initialized()
        trust = _trust(trusted_keys, trust_ref, require_anchor, allow_unanchored).pin(project.root)
        base, source = compare_settings(project, trust.pinned, work_tree=False)
        policy = TolerancePolicy.from_options(rtol=rtol, atol=atol, ulp=ulp, tol=tol, base=base)
        given = bool(tol) or rtol is not None or atol is not None or ulp is not None
        source = PolicySource(source.settings, source.config, given)
        result = replay(path, policy=policy, policy_source=source, trust=trust)
        if not result.ok:
            lines = []
            for d in result.failures:
                line = f"{d.path}: {d.verdict.value}"
                if d.comparison is not None:
                    c = d.comparison
                    line += f" (max abs {_g(c.max_abs_error)}, max rel {_g(c.max_rel_error)})"
                if d.detail:
                    line += f": {d.detail}"
                lines.append(line)
            if not result.datasets:
                lines.extend(result.notes or ("the file digest differs (not HDF5)",))
            lines.append(f"tolerances: {source.describe()}")
            if trust_ref is None and work_tree_tolerances(project):
                lines.append(
                    "[compare] of the work tree's .kaudit/config.toml is not read by a test: "
                    "pass the tolerances, or trust_ref= to read it at a protected ref"
                )
            raise AssertionError(
                f"kaudit: the segment of {path} (run {result.manifest.run}, step "
                f"{result.manifest.step}) did not reproduce ({result.outcome.value}):\n  "
                + "\n  ".join(lines)
            )
        return result


@pytest.fixture
def kaudit() -> KauditChecks:
    """Assert that runs verify (``kaudit.assert_verifies``) and that segments replay
    within tolerance (``kaudit.assert_replays``)."""
    return KauditChecks()
