"""``kaudit log``: the runs of a repository and their chains at a glance, as ``git log``
shows commits.

Each manifest is read once, with the bounded reader
(:class:`kronos_audit.verification.chain.ManifestCache`);
only the newest manifest of each run has its signature checked, and no checkpoint is hashed:
this is a summary, not a verification (that is ``kaudit verify``). Where each checkpoint's
data is, in the words of ``kaudit status``
(:class:`~kronos_audit.checkpoint.location.Location`, placed by
:func:`kronos_audit.history.status.locate` without hashing): ``local`` (the file is here),
``pruned`` (a signed retention record in its run directory prunes it) or ``missing``; when
the DVC remote is asked, ``pushed`` (here and in the remote) and ``remote-only`` too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from kronos_audit._internal.collector import collection_deferred
from kronos_audit.checkpoint.layout import expand_targets, statements_in
from kronos_audit.checkpoint.location import Location
from kronos_audit.errors import Error
from kronos_audit.history.status import locate, pruned_of
from kronos_audit.keys.anchors import TrustOptions, load_keyring
from kronos_audit.project.repository import Project
from kronos_audit.statement.manifest import Manifest
from kronos_audit.verification.chain import ManifestCache
from kronos_audit.verification.verifier import Verifier


@dataclass(frozen=True)
class Signer:
    """Who signed a run's newest manifest, as its signature check found."""

    ok: bool
    """The signature verifies under a key the keyring accepts."""
    name: str | None
    """The key's name in the store that holds it (None: no known key signed)."""
    key_id: str | None
    """The key id (hex sha256 of the public key); for an unknown key, the id its
    signature claims (None: it claims none)."""
    detail: str
    """Who signed and on whose word, or why the check failed."""

    @property
    def short_id(self) -> str | None:
        return None if self.key_id is None else self.key_id[:16]


@dataclass(frozen=True)
class RunLog:
    """One run's chain, summarised."""

    run: str
    """The run id."""
    directory: Path
    """The run directory its manifests are in."""
    first_step: int
    """The lowest step recorded."""
    newest_step: int
    """The highest step recorded."""
    count: int
    """How many manifests (checkpoints) it has here."""
    newest: Path
    """The newest manifest."""
    commit: str
    """The git commit the newest manifest records."""
    dirty: bool
    """Whether it records uncommitted changes (a patch)."""
    created: str
    """When the newest manifest was made (its ``created``, ISO 8601)."""
    signer: Signer
    """Who signed the newest manifest."""
    locations: Mapping[Location, int] = field(default_factory=lambda: MappingProxyType({}))
    """How many of its checkpoints are where (never ``corrupt``: nothing is hashed)."""

    def to_json_obj(self, path: Callable[[Path], str] = str) -> dict[str, Any]:
        """As JSON, each file named by ``path`` (the CLI's: relative to the repository)."""
        return {
            "run": self.run,
            "directory": path(self.directory),
            "first_step": self.first_step,
            "newest_step": self.newest_step,
            "count": self.count,
            "newest": path(self.newest),
            "commit": self.commit,
            "dirty": self.dirty,
            "created": self.created,
            "signer": {
                "ok": self.signer.ok,
                "name": self.signer.name,
                "key_id": self.signer.key_id,
                "detail": self.signer.detail,
            },
            "data": {loc.value: n for loc, n in self.locations.items() if n},
        }


@dataclass(frozen=True)
class Log:
    """The runs found, newest first, and the manifests that could not be read."""

    runs: tuple[RunLog, ...]
    """One entry per (run directory, run id)."""
    problems: tuple[Error, ...] = ()
    """Manifests skipped as bad input (unreadable, malformed), each with its path."""


def find_manifests(project: Project, targets: Sequence[Path] = ()) -> list[Path]:
    """The manifests under ``targets`` (directories searched, checkpoints and sharded
    step directories taken for their manifests:
    :func:`kronos_audit.checkpoint.layout.expand_targets`),
    or every manifest in the repository (hidden directories such as .git and .dvc skipped)."""
    if not targets:
        return list(statements_in(project.root).manifests)
    found: list[Path] = []
    for target in targets:
        if target.is_dir():
            # a run directory with no manifest yet shows no run, as before
            found += statements_in(target).manifests
        else:
            found += expand_targets([target], attestations=False)
    return sorted(set(found))


def run_log(
    project: Project,
    targets: Sequence[Path] = (),
    *,
    trust: TrustOptions | None = None,
    remote: bool = False,
    remote_name: str | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> Log:
    """Summarise the runs under ``targets`` (default: the whole repository).

    Reads every manifest once (linear in their number); checks only the signature of each
    run's newest manifest; hashes nothing. With ``remote``, the DVC remote is asked (once)
    which unpruned checkpoints it holds: those here are then ``pushed`` or ``local``, those
    not here ``remote-only`` or ``missing``; without it, every checkpoint not here and not
    pruned is ``missing``. ``progress(phase, done, total)`` is told how far reading has got.
    """
    paths = find_manifests(project, targets)
    cache = ManifestCache()
    verifier = Verifier(project, load_keyring(project.root, trust), cache=cache)
    groups: dict[tuple[Path, str], list[Manifest]] = {}
    problems: list[Error] = []
    with collection_deferred():  # a run's thousands of manifests, collected once
        for i, path in enumerate(paths):
            try:
                m = cache.read(path)
            except Error as e:
                problems.append(e)
            else:
                # a sharded step's manifest is in its step directory, inside the run's
                directory = path.parent.parent if m.record.shards is not None else path.parent
                groups.setdefault((directory, m.run), []).append(m)
            if progress is not None:
                progress("reading manifests", i + 1, len(paths))

    every = [m for chain in groups.values() for m in chain]
    entries = locate(
        project,
        every,
        remote_name,
        check_remote=remote and bool(every),
        pruned=pruned_of(verifier, every),
        hash_local=False,
    )
    where = {e.manifest: e.location for e in entries}

    runs = []
    for (directory, run), chain in groups.items():
        chain.sort(key=lambda m: m.step)
        newest = chain[-1]
        signed = verifier.signature(newest)
        key = signed.signer
        counts = dict.fromkeys(Location, 0)
        for m in chain:
            counts[where[m.path]] += 1
        runs.append(
            RunLog(
                run=run,
                directory=directory,
                first_step=chain[0].step,
                newest_step=newest.step,
                count=len(chain),
                newest=newest.path,
                commit=newest.record.git.commit,
                dirty=newest.record.git.patch_sha256 is not None,
                created=newest.record.created,
                signer=Signer(
                    signed.ok,
                    None if key is None else key.name,
                    # no known key: the id the signature claims (unverified, shown as such)
                    next((s.keyid for s in newest.envelope.signatures if s.keyid), None)
                    if key is None
                    else key.key_id,
                    signed.detail,
                ),
                locations=MappingProxyType(counts),
            )
        )
    runs.sort(key=lambda r: (r.created, str(r.directory), r.run), reverse=True)
    return Log(tuple(runs), tuple(problems))
