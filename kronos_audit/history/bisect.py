"""Bisect two runs of one program: the first checkpointed step at which they diverge.

Two runs (one per environment, say) are each given by the manifest of their last
checkpoint, or by their run directory. Each chain is walked back through its ``parent``
links and verified on the way (every signature, every link, as
:class:`kronos_audit.verification.verifier.Verifier` checks them). The steps both runs
checkpointed are then searched by bisection for the first one whose checkpoints differ beyond the
tolerance::

    from kronos_audit.history.bisect import bisect
    from kronos_audit.compare import TolerancePolicy

    result = bisect("runs/cpu", "runs/gpu", TolerancePolicy.from_options(rtol=1e-12))
    if result.diverged:
        print(result.first_divergent_step, [d.path for d in result.diverged_datasets])

The search assumes that runs which have diverged stay diverged, as numerical and chaotic
divergence does: ``ceil(log2(n)) + 1`` comparisons decide among ``n`` common steps.
Recorded per-dataset hashes decide a step without reading data whenever they can: equal
hashes agree under any tolerance, and with no tolerance differing hashes differ. Data is
read (fetched from the DVC remote if it is not here, and verified against its manifest)
only when a tolerance has to measure it, and for the report of the step found.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kronos_audit.checkpoint.layout import (
    MANIFEST_SUFFIX,
    STEP_MANIFEST,
    resolve_target,
    statements_in,
)
from kronos_audit.compare import Comparison, DatasetComparison, TolerancePolicy, compare_files
from kronos_audit.errors import BisectError, Error
from kronos_audit.keys.anchors import TrustOptions, load_keyring
from kronos_audit.project.repository import find_project
from kronos_audit.statement.manifest import Manifest
from kronos_audit.verification.chain import ManifestCache
from kronos_audit.verification.verifier import Verifier

FORMAT = "kronos-audit/bisect/v1"
"""The ``format`` of :meth:`BisectResult.to_json_obj`."""


class Decision(enum.StrEnum):
    """How a step's verdict was reached."""

    HASHES = "hashes"
    """From the per-dataset hashes both manifests record: no data read."""
    DATA = "data"
    """By reading both checkpoints and comparing them under the tolerance policy."""


@dataclass(frozen=True)
class Chain:
    """One run's chain of manifests, verified: every signature and every parent link."""

    head: Path
    """The last manifest: the one named, or the newest in the run directory named."""
    run: str
    """The run id the manifests record."""
    manifests: tuple[Manifest, ...]
    """Oldest first: the first checkpoint of the chain, ..., the head."""

    @property
    def steps(self) -> tuple[int, ...]:
        """The steps checkpointed, ascending."""
        return tuple(m.step for m in self.manifests)

    def at(self, step: int) -> Manifest:
        """The manifest of ``step``; KeyError if the run did not checkpoint it."""
        for m in self.manifests:
            if m.step == step:
                return m
        raise KeyError(step)

    def to_json_obj(self, path: Callable[[Path], str] = str) -> dict[str, Any]:
        return {
            "head": path(self.head),
            "run": self.run,
            "checkpoints": len(self.manifests),
            "steps": list(self.steps),
        }


@dataclass(frozen=True)
class StepComparison:
    """The checkpoints of both runs at one step, compared."""

    step: int
    """The step."""
    agrees: bool
    """True when every dataset is IDENTICAL or WITHIN_TOLERANCE."""
    decided_by: Decision
    """Whether the recorded hashes decided, or the data did."""
    a: Path
    """Run A's manifest of this step."""
    b: Path
    """Run B's manifest of this step."""
    hash_differences: tuple[str, ...]
    """Dataset paths whose recorded hashes differ (or that one manifest lacks), sorted."""
    comparison: Comparison | None = None
    """The comparison of the data, when it was read: always for the first divergent step,
    unless retention pruned its data."""

    @property
    def failures(self) -> tuple[str, ...]:
        """The datasets that fail: from the data when read, else from the hashes."""
        if self.comparison is not None:
            return tuple(d.path for d in self.comparison.failures)
        return () if self.agrees else self.hash_differences

    def to_json_obj(self, path: Callable[[Path], str] = str) -> dict[str, Any]:
        return {
            "step": self.step,
            "agrees": self.agrees,
            "decided_by": self.decided_by.value,
            "a": path(self.a),
            "b": path(self.b),
            "hash_differences": list(self.hash_differences),
            "failures": list(self.failures),
            "comparison": None if self.comparison is None else self.comparison.to_json_obj(),
        }


@dataclass(frozen=True)
class BisectResult:
    """Where two runs diverge first, with the comparisons that show it."""

    a: Chain
    """Run A, the reference."""
    b: Chain
    """Run B, the candidate."""
    policy: TolerancePolicy
    """The tolerances the checkpoints were compared under."""
    common_steps: tuple[int, ...]
    """The steps both runs checkpointed, ascending: what was searched."""
    first_divergent_step: int | None
    """The first common step whose checkpoints differ; None when the runs never diverge."""
    last_agreeing_step: int | None
    """The common step before it (it agrees), or the last common step when the runs never
    diverge; None when they diverge at the first common step."""
    probes: tuple[StepComparison, ...]
    """Every step compared, in the order compared (each step once)."""

    @property
    def diverged(self) -> bool:
        return self.first_divergent_step is not None

    @property
    def comparisons(self) -> int:
        """How many steps were compared: about log2 of the common steps, not all of them."""
        return len(self.probes)

    @property
    def data_comparisons(self) -> int:
        """How many of those read the checkpoints' data (the rest used recorded hashes)."""
        return sum(1 for p in self.probes if p.comparison is not None)

    def probe(self, step: int) -> StepComparison:
        """The comparison made at ``step``; KeyError if that step was not compared."""
        for p in self.probes:
            if p.step == step:
                return p
        raise KeyError(step)

    @property
    def first_divergence(self) -> StepComparison | None:
        """The comparison at the first divergent step, its data read (unless pruned)."""
        step = self.first_divergent_step
        return None if step is None else self.probe(step)

    @property
    def diverged_datasets(self) -> tuple[DatasetComparison, ...]:
        """The datasets that fail at the first divergent step, by path, with their verdicts
        and worst mismatches; () when the runs never diverge (or its data was pruned: then
        ``first_divergence.failures`` names them from the recorded hashes)."""
        first = self.first_divergence
        if first is None or first.comparison is None:
            return ()
        return first.comparison.failures

    def to_json_obj(self, path: Callable[[Path], str] = str) -> dict[str, Any]:
        """As JSON, each file named by ``path`` (the CLI's: relative to the repository)."""
        first = self.first_divergence
        return {
            "format": FORMAT,
            "diverged": self.diverged,
            "first_divergent_step": self.first_divergent_step,
            "last_agreeing_step": self.last_agreeing_step,
            "diverged_datasets": [d.to_json_obj() for d in self.diverged_datasets],
            "diverged_paths": [] if first is None else list(first.failures),
            "comparisons": self.comparisons,
            "data_comparisons": self.data_comparisons,
            "common_steps": list(self.common_steps),
            "policy": self.policy.to_json_obj(),
            "a": self.a.to_json_obj(path),
            "b": self.b.to_json_obj(path),
            "probes": [p.to_json_obj(path) for p in self.probes],
        }


# -- chains --------------------------------------------------------------------------------


def head_manifest(path: Path | str, cache: ManifestCache | None = None) -> Manifest:
    """The manifest named, or the newest (highest step) manifest in the run directory named.

    Read through ``cache`` when given: the walk back from the head reads the same
    manifests, and a chain's verifier parses each once."""
    path = Path(path)
    read = (cache or ManifestCache()).read
    if not path.is_dir() or (path / STEP_MANIFEST).is_file():
        return read(resolve_target(path))
    manifests = [read(p) for p in statements_in(path).manifests]
    if not manifests:
        raise BisectError(
            f"no manifest (*{MANIFEST_SUFFIX}) in this directory: name a run directory "
            "or the manifest of a run's last checkpoint",
            path=path,
        )
    newest = max(m.step for m in manifests)
    heads = [m for m in manifests if m.step == newest]
    if len(heads) > 1:
        raise BisectError(
            f"{len(heads)} manifests hold the newest step {newest} "
            f"({heads[0].path.name}, {heads[1].path.name}): name the one to start from",
            path=path,
            step=newest,
        )
    return heads[0]


def read_chain(path: Path | str, verifier: Verifier | None = None, *, label: str = "") -> Chain:
    """Walk a run's chain back from its head (a manifest, or a run directory), verifying
    each manifest's signature and each parent link on the way.

    Raises BisectError naming the manifest where the chain does not verify. ``label``
    (e.g. ``run A``) prefixes the messages.
    """
    cache = ManifestCache() if verifier is None else verifier.cache
    head = head_manifest(path, cache)
    if verifier is None:
        verifier = Verifier(find_project(head.path).require_initialized(), cache=cache)
    return _walk(head, verifier, label)


def _walk(head: Manifest, verifier: Verifier, label: str) -> Chain:
    who = f"{label}: " if label else ""
    signature = verifier.signature(head)
    if not signature.ok:
        raise BisectError(
            f"{who}the manifest does not verify: {signature.detail}",
            path=head.path,
            run=head.run,
            step=head.step,
        )
    manifests = [head]
    current = head
    while current.parent is not None:
        # The verifier's own link check: it finds the parent as `kaudit verify` does (the
        # recorded path, else a sibling with the digest) and checks its signature, run and
        # step. Each link is one manifest back, so the walk ends.
        check, parent = verifier.link(current)
        if parent is None:
            raise BisectError(
                f"{who}the chain does not verify at step {current.step}: {check.detail}",
                path=current.path,
                run=current.run,
                step=current.step,
            )
        manifests.append(parent)
        current = parent
    manifests.reverse()
    return Chain(head.path, head.run, tuple(manifests))


# -- comparing one step --------------------------------------------------------------------


def is_exact(policy: TolerancePolicy) -> bool:
    """Whether the policy allows no tolerance anywhere: bitwise comparison."""
    return policy.default is None and all(r.tolerance is None for r in policy.rules)


def hash_differences(a: Manifest, b: Manifest) -> tuple[str, ...] | None:
    """The dataset paths whose recorded hashes differ between two manifests (() when every
    dataset's is equal), or None when a manifest records no datasets (not HDF5) and the
    files differ."""
    if a.subject_sha256 == b.subject_sha256:
        return ()
    da, db = a.datasets, b.datasets
    if da is None or db is None:
        return None
    in_a = {d.path: d for d in da}
    in_b = {d.path: d for d in db}
    return tuple(sorted(p for p in set(in_a) | set(in_b) if in_a.get(p) != in_b.get(p)))


class _Search:
    """The state of one bisection: verifiers by project, and the steps compared so far."""

    def __init__(
        self, a: Chain, b: Chain, policy: TolerancePolicy, verifiers: _Verifiers, *, fetch: bool
    ) -> None:
        self.a, self.b = a, b
        self.policy = policy
        self.exact = is_exact(policy)
        self.verifiers = verifiers
        self.fetch = fetch
        self.done: dict[int, StepComparison] = {}

    def agrees(self, step: int) -> bool:
        """Compare the checkpoints of ``step``, once; later calls reuse the verdict."""
        if step not in self.done:
            self.done[step] = self._compare(step)
        return self.done[step].agrees

    def _compare(self, step: int) -> StepComparison:
        ma, mb = self.a.at(step), self.b.at(step)
        differences = hash_differences(ma, mb)
        if differences == ():
            # Equal canonical bytes are IDENTICAL, which passes under any tolerance.
            return StepComparison(step, True, Decision.HASHES, ma.path, mb.path, ())
        if differences is not None and self.exact:
            # With no tolerance, a different hash is a DIFFERENT dataset.
            return StepComparison(step, False, Decision.HASHES, ma.path, mb.path, differences)
        comparison = self.read(ma, mb)
        return StepComparison(
            step, comparison.ok, Decision.DATA, ma.path, mb.path, differences or (), comparison
        )

    def with_data(self, step: int) -> None:
        """Read the data of ``step`` for its report, if the hashes decided it and retention
        has not pruned the data (then the hashes' verdict stands alone)."""
        done = self.done[step]
        ma, mb = self.a.at(step), self.b.at(step)
        if done.comparison is not None or any(
            not m.checkpoint_path.exists() and self.verifiers.get(m.path).pruned_by(m) is not None
            for m in (ma, mb)
        ):
            return
        self.done[step] = replace(done, comparison=self.read(ma, mb))

    def read(self, ma: Manifest, mb: Manifest) -> Comparison:
        for m, label in ((ma, "run A"), (mb, "run B")):
            self._have_verified_data(m, label)
        return compare_files(ma.checkpoint_path, mb.checkpoint_path, self.policy)

    def _have_verified_data(self, m: Manifest, label: str) -> None:
        """Fetch the checkpoint if it is not here, then verify it against its manifest."""
        checkpoint = m.checkpoint_path
        verifier = self.verifiers.get(m.path)
        if not checkpoint.exists():
            if verifier.pruned_by(m) is not None:
                raise BisectError(
                    f"{label}: the data of step {m.step} was pruned by retention, and "
                    "comparing it under a tolerance needs the data (bitwise needs only the "
                    "recorded hashes)",
                    path=checkpoint,
                    run=m.run,
                    step=m.step,
                )
            if not self.fetch:
                raise BisectError(
                    f"{label}: the data of step {m.step} is not here",
                    path=checkpoint,
                    run=m.run,
                    step=m.step,
                )
            try:
                # Signature and place first, then only the signed md5, checked before it
                # becomes visible.
                verifier.fetch_data(m)
            except Error as e:
                raise BisectError(
                    f"{label}: the data of step {m.step} is not here, and fetching it "
                    f"failed: {e.message}",
                    path=checkpoint,
                    run=m.run,
                    step=m.step,
                ) from None
        result = verifier.verify(m.path)
        if not result.ok:
            problems = "; ".join(f"{c.name}: {c.detail}" for c in result.failures)
            raise BisectError(
                f"{label}: the checkpoint of step {m.step} does not match its signed "
                f"manifest ({problems})",
                path=m.path,
                run=m.run,
                step=m.step,
            )


class _Verifiers:
    """One Verifier per kaudit repository (the runs may live in two), so that chain links
    checked once are not checked again."""

    def __init__(self, trust: TrustOptions | None = None) -> None:
        self._by_root: dict[Path, Verifier] = {}
        self._trust = trust
        self.cache = ManifestCache()
        """Every manifest read, parsed once (the heads, the chains, the steps compared)."""

    def get(self, path: Path) -> Verifier:
        project = find_project(path).require_initialized()
        if project.root not in self._by_root:
            self._by_root[project.root] = Verifier(
                project, load_keyring(project.root, self._trust), cache=self.cache
            )
        return self._by_root[project.root]


def first_true(n: int, pred: Callable[[int], bool]) -> int:
    """The least i in [0, n-1] with pred(i), given pred(n-1) and that pred stays true once
    true. Calls pred about log2(n) times, never on n-1, and always on i-1 (when i > 0)."""
    lo, hi = 0, n - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if pred(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def bisect(
    a: Path | str,
    b: Path | str,
    policy: TolerancePolicy | None = None,
    *,
    fetch: bool = True,
    trust: TrustOptions | None = None,
) -> BisectResult:
    """Find the first step, among those both runs checkpointed, at which run B's checkpoint
    differs from run A's beyond ``policy`` (exact when None).

    ``a`` and ``b`` are each a run's last manifest or its run directory. Both chains are
    verified first. Assumes that once the runs differ they keep differing; the answer is
    confirmed by comparisons: the step found differs, and the common step before it agrees.
    With ``fetch``, checkpoint data that is needed and not here is pulled from the DVC remote.

    Raises :class:`BisectError` (or another :class:`Error`, all bad input) for a chain that
    does not verify, runs with no common step, and data that cannot be had or read.
    """
    policy = policy or TolerancePolicy()
    verifiers = _Verifiers(trust)
    chains = []
    for given, label in ((Path(a), "run A"), (Path(b), "run B")):
        head = head_manifest(given, verifiers.cache)
        chains.append(_walk(head, verifiers.get(head.path), label))
    chain_a, chain_b = chains
    common = tuple(sorted(set(chain_a.steps) & set(chain_b.steps)))
    if not common:
        raise BisectError(
            f"runs {chain_a.run!r} and {chain_b.run!r} checkpointed no step in common "
            f"(A: {_span(chain_a.steps)}; B: {_span(chain_b.steps)})",
            path=chain_b.head,
        )
    search = _Search(chain_a, chain_b, policy, verifiers, fetch=fetch)
    order: list[int] = []

    def agrees(i: int) -> bool:
        step = common[i]
        if step not in search.done:
            order.append(step)
        return search.agrees(step)

    first: int | None = None
    last_agreeing: int | None = common[-1]
    if not agrees(len(common) - 1):
        i = first_true(len(common), lambda j: not agrees(j))
        # The boundary is shown, not inferred: both sides of it were compared on the way
        # (so these calls compare nothing new).
        if agrees(i) or (i > 0 and not agrees(i - 1)):
            raise AssertionError(f"bisection ended off the boundary at step {common[i]}")
        first = common[i]
        last_agreeing = common[i - 1] if i > 0 else None
        search.with_data(first)  # its report: verdicts and worst mismatches
    return BisectResult(
        a=chain_a,
        b=chain_b,
        policy=policy,
        common_steps=common,
        first_divergent_step=first,
        last_agreeing_step=last_agreeing,
        probes=tuple(search.done[s] for s in order),
    )


def _span(steps: tuple[int, ...]) -> str:
    if len(steps) == 1:
        return f"step {steps[0]}"
    return f"{len(steps)} steps, {steps[0]}..{steps[-1]}"
