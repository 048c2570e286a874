"""The git state a checkpoint was made from, and the patch of its uncommitted changes.

The git state is read at each snapshot, since a long run may outlive a commit in its
checkout.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from kronos_audit._internal import git
from kronos_audit._internal.fsutil import write_atomic
from kronos_audit._internal.safeio import is_regular
from kronos_audit._internal.secrets import secret_file_reason, secret_in_patch
from kronos_audit._internal.secrets import strip_credentials as strip_credentials
from kronos_audit.errors import ProjectError, UsageError
from kronos_audit.statement.predicate import GitRecord, Sha256

# Paths whose changes are kaudit's own records, not the code being run.
RECORD_PATHSPECS = (":(exclude).kaudit", ":(exclude)*.kaudit.json", ":(exclude)*.dvc")


PATCH_LIMIT = 256 * 1024 * 1024
"""Bytes of a recorded patch read at most (from the DVC remote, or to push it there)."""


def patch_name(digest: str) -> str:
    """The file name of the patch whose sha256 is ``digest``, here and in the remote."""
    return f"{digest}.patch"


def patch_path(repo_root: Path, digest: str) -> Path:
    return repo_root / ".kaudit" / "patches" / patch_name(digest)


def patch_note(record: GitRecord) -> str | None:
    """What to tell the user once when ``record`` names an uncommitted patch (None when
    the tree was clean): a replay elsewhere needs that file, so it must travel."""
    if record.patch_sha256 is None:
        return None
    name = f".kaudit/patches/{patch_name(record.patch_sha256)}"
    return (
        f"uncommitted changes recorded as {name}: commit it with the manifests, or "
        "`kaudit push` them to the DVC remote, for a replay elsewhere"
    )


# A PEM private key (RSA, EC, OpenSSH, PKCS#8, encrypted or not) in a changed text file,
# whatever the file is called. A basic regular expression, as git's -G takes it.
PRIVATE_KEY_PATTERN = "-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----"


def _refuse_secret_files(repo_root: Path) -> None:
    """Raise UsageError for the first file the recorded patch would carry that looks like
    a secret: by its name (see :func:`kronos_audit._internal.secrets.secret_file_reason`)
    or by holding a PEM private key.

    A file new to the repository (staged, or added with intent) would be published by the
    patch for the first time. A committed one that is modified is refused too: its change
    may be a new secret (a rotated password), and the old one being in the history is no
    reason to record the new one. Deleting such a file publishes nothing and is allowed.
    """
    pathspecs = (".", *RECORD_PATHSPECS)
    try:
        listed = os.fsdecode(
            git.diff_head(repo_root, "--name-status", "--no-renames", "-z", pathspecs=pathspecs)
        ).split("\0")
        keyed = os.fsdecode(
            git.diff_head(
                repo_root,
                "--name-only",
                "--no-renames",
                "--diff-filter=d",
                "-z",
                f"-G{PRIVATE_KEY_PATTERN}",
                pathspecs=pathspecs,
            )
        ).split("\0")
    except git.GitError as e:
        raise ProjectError(f"cannot read git state: {e.message}", path=repo_root) from None
    changes = dict(zip(listed[1::2], listed[0::2], strict=False))
    found = [
        (name, reason)
        for name, status in changes.items()
        if not status.startswith("D") and (reason := secret_file_reason(name))
    ] + [(name, "holds a PEM private key") for name in keyed if name]
    if not found:
        return
    name, reason = found[0]
    if changes.get(name, "A").startswith("A"):
        how = f"unstage it (`git rm --cached -- {name}`)"
    else:
        how = "commit or revert its change first"
    raise UsageError(
        f"looks like a secret ({reason}) and a snapshot would copy it into a patch recorded "
        f"under .kaudit/patches: {how}, or, if it holds no secret, pass --allow-secret-files "
        "(allow_secret_files=True in the Python API)",
        path=repo_root / name,
    )


def _refuse_secret_content(repo_root: Path, patch: bytes) -> None:
    """Raise UsageError when a line the patch adds looks like a secret, whatever its file
    is called (:func:`kronos_audit._internal.secrets.secret_in_patch`): a dotenv line, a
    cloud credential, a token or a private key copied into ``.gitignore`` or a script
    would otherwise be recorded, committed and pushed. The message names the file and
    line, never the secret."""
    found = secret_in_patch(patch)
    if found is None:
        return
    raise UsageError(
        f"line {found.line} looks like a secret ({found.reason}) and a snapshot would copy "
        "it into a patch recorded under .kaudit/patches: remove it or commit the file "
        "without it, or, if it holds no secret, pass --allow-secret-files "
        "(allow_secret_files=True in the Python API)",
        path=repo_root / found.path,
    )


def git_state(repo_root: Path, *, allow_secret_files: bool = False) -> GitRecord:
    """Read HEAD, branch, remote and the uncommitted diff; store the diff content-addressed.

    Raises UsageError, before anything is written, when the diff would carry a file that
    looks like a secret (by its name, or a line it adds: see :func:`_refuse_secret_content`),
    unless ``allow_secret_files``.
    """
    try:
        status = git.status(repo_root, ".", *RECORD_PATHSPECS)
    except git.GitError as e:
        raise ProjectError(f"cannot read git state: {e.message}", path=repo_root) from None
    commit: str | None = None
    branch: str | None = None
    dirty = False
    for line in status.splitlines():
        if line.startswith("# branch.oid "):
            commit = line.split()[2]
        elif line.startswith("# branch.head "):
            head = line.split(maxsplit=2)[2]
            branch = None if head == "(detached)" else head
        elif line and not line.startswith("#"):
            dirty = True
    if commit is None or commit == "(initial)":
        raise ProjectError(
            "the repository has no commit yet: commit the code first so manifests can name it",
            path=repo_root,
        )
    patch_sha256 = None
    if dirty and not allow_secret_files:
        _refuse_secret_files(repo_root)
    if dirty:
        # Keep the bytes exactly: a replay must re-apply this patch as it was.
        try:
            patch = git.diff_head(repo_root, "--binary", pathspecs=(".", *RECORD_PATHSPECS))
        except git.GitError as e:
            raise ProjectError(f"cannot read git state: {e.message}", path=repo_root) from None
        if not allow_secret_files:
            _refuse_secret_content(repo_root, patch)
        patch_sha256 = hashlib.sha256(patch).hexdigest()
        target = patch_path(repo_root, patch_sha256)
        # A name planted there (a link to another file, a FIFO) is not a recorded patch:
        # replaced by the bytes just hashed, never taken for them.
        if not is_regular(target, follow_symlinks=False):
            target.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(target, patch)
    try:
        url = git.remote_url(repo_root)
    except git.GitError as e:
        raise ProjectError(f"cannot read git state: {e.message}", path=repo_root) from None
    remote = strip_credentials(url) if url is not None else None
    return GitRecord(
        commit, branch, dirty, None if patch_sha256 is None else Sha256(patch_sha256), remote
    )


def git_tracked(repo_root: Path, paths: list[Path]) -> list[Path]:
    """Those of ``paths`` that git tracks (a checkpoint must not be: DVC tracks it)."""
    try:
        listed = git.ls_files(repo_root, [str(Path(p).absolute()) for p in paths])
    except git.GitError as e:
        raise ProjectError(f"cannot ask git what it tracks: {e.message}", path=repo_root) from None
    tracked = {Path(repo_root, name).resolve() for name in listed}
    return [p for p in paths if Path(p).resolve() in tracked]
