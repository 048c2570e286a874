"""The git command, run one way: every git kaudit reads or changes goes through here.

Each call runs ``git -C ROOT ...`` with standard input closed and a fixed environment:
no pager, no prompt (``GIT_TERMINAL_PROMPT=0``), messages in English (``LC_ALL=C``, so the
first line of git's stderr can be shown as it is), no optional index writes
(``GIT_OPTIONAL_LOCKS=0``: a status never competes with the user's own git for
``index.lock``), object ids meaning those objects (``GIT_NO_REPLACE_OBJECTS=1``: a
``refs/replace/`` entry cannot stand another tree in for a signed commit or a trust ref),
and none of the variables that point git at another repository than the one named (git's
own list, ``git rev-parse --local-env-vars``: a hook's ``GIT_DIR`` or ``GIT_INDEX_FILE``
must not redirect a snapshot). The user's configuration is read as git reads it, except
where it could make a recorded patch something other than a patch (colour, an external
diff, a textconv filter, other prefixes): :func:`diff_head` turns those off.

Every ref and path given to git comes after ``--end-of-options`` or ``--``, so none is
read as an option. A failure raises :class:`GitError` with git's first error line.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from kronos_audit.errors import Error

# `git rev-parse --local-env-vars` (git 2.39): what git itself clears before it works in
# another repository (a submodule). GIT_NO_REPLACE_OBJECTS is set again below.
_LOCAL_REPO_VARIABLES = (
    "GIT_ALTERNATE_OBJECT_DIRECTORIES",
    "GIT_CONFIG",
    "GIT_CONFIG_PARAMETERS",
    "GIT_CONFIG_COUNT",
    "GIT_OBJECT_DIRECTORY",
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_IMPLICIT_WORK_TREE",
    "GIT_GRAFT_FILE",
    "GIT_INDEX_FILE",
    "GIT_NO_REPLACE_OBJECTS",
    "GIT_REPLACE_REF_BASE",
    "GIT_PREFIX",
    "GIT_INTERNAL_SUPER_PREFIX",
    "GIT_SHALLOW_FILE",
    "GIT_COMMON_DIR",
)
# Variables that change what `git diff` writes: an external diff program, context lines.
_DIFF_VARIABLES = ("GIT_EXTERNAL_DIFF", "GIT_DIFF_OPTS")

_FIXED = {
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_PAGER": "cat",
    "PAGER": "cat",
    "LC_ALL": "C",
    "LANGUAGE": "C",
    "GIT_OPTIONAL_LOCKS": "0",
    "GIT_NO_REPLACE_OBJECTS": "1",
}

# What `git diff` must not do to a patch that replay re-applies: colour it (color.ui =
# always), hand it to an external diff (diff.external, a diff driver's command), convert
# it (a textconv filter), or change its a/ b/ prefixes (diff.noprefix,
# diff.mnemonicPrefix). In git's default configuration these change no byte.
_PLAIN_DIFF = (
    "--no-color",
    "--no-ext-diff",
    "--no-textconv",
    "--src-prefix=a/",
    "--dst-prefix=b/",
)


class GitError(Error):
    """git could not be run, or exited with an error; the message is git's first error line."""

    def __init__(self, message: str, *, path: Path | str | None, returncode: int) -> None:
        super().__init__(message, path=path)
        self.returncode = returncode
        """git's exit status (-1 when git could not be started)."""


class NotARepository(GitError):
    """The directory is not inside a git repository."""


class NoWorkTree(GitError):
    """The directory is in a git repository that has no work tree there (a bare one)."""


def environment() -> dict[str, str]:
    """The environment every git command runs with (see the module's docstring)."""
    dropped = (*_LOCAL_REPO_VARIABLES, *_DIFF_VARIABLES)
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    env.update(_FIXED)
    return env


def _first_line(stderr: bytes) -> str | None:
    """git's first error line (``fatal:``, ``error:``), else its first line: some
    commands tell their progress there first (``Preparing worktree ...``)."""
    lines = [line.strip() for line in stderr.decode("utf-8", "replace").splitlines()]
    lines = [line for line in lines if line]
    errors = [line for line in lines if line.startswith(("fatal: ", "error: "))]
    return next(iter(errors or lines), None)


def _completed(
    root: Path,
    args: Sequence[str],
    *,
    options: Sequence[str] = (),
    extra_env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[bytes]:
    env = environment()
    if extra_env:
        env.update(extra_env)
    try:
        return subprocess.run(
            ["git", *options, "-C", str(root), *args],
            capture_output=True,
            stdin=subprocess.DEVNULL,
            env=env,
            check=False,
        )
    except OSError as e:
        raise GitError(f"cannot run git: {e.strerror or e}", path=root, returncode=-1) from None


def _error(root: Path, args: Sequence[str], done: subprocess.CompletedProcess[bytes]) -> GitError:
    line = _first_line(done.stderr)
    if line is None:
        line = f"git {args[0]} exited with status {done.returncode} and no message"
    return GitError(line, path=root, returncode=done.returncode)


def run(root: Path, *args: str) -> bytes:
    """What ``git -C root ARGS`` writes to its standard output, byte for byte.

    Raises GitError when git exits non-zero or cannot be run.
    """
    done = _completed(root, args)
    if done.returncode != 0:
        raise _error(root, args, done)
    return done.stdout


def text(root: Path, *args: str) -> str:
    """:func:`run`'s output as text (bytes that are not UTF-8 kept as surrogates, as the
    file system's names are)."""
    return os.fsdecode(run(root, *args))


# -- the repository ------------------------------------------------------------------------


def toplevel(start: Path) -> Path:
    """The top of the git work tree that contains the directory ``start``, resolved.

    Raises NotARepository outside any repository and NoWorkTree in a bare one. Inside
    a repository's git directory, the work tree is the one that directory belongs to.

    The repository is found even when another user owns it (git's ``safe.directory``
    check is waived for this one command): finding where a work tree starts reads the
    repository's configuration but runs nothing it names, and verifying someone else's
    checkout must keep working. The commands that could run something the configuration
    names (status, diff, ls-files, a checkout) are still refused by git there. As
    before, the search crosses file systems (checkpoints may sit on another mount).
    """
    args = ("rev-parse", "--show-toplevel")
    discovery = {"GIT_DISCOVERY_ACROSS_FILESYSTEM": "1"}
    waived = ("-c", "safe.directory=*")
    done = _completed(start, args, options=waived, extra_env=discovery)
    if done.returncode == 0:
        return Path(os.fsdecode(done.stdout.rstrip(b"\n"))).resolve()
    error = _error(start, args, done)
    if "not a git repository" in error.message:
        raise NotARepository(error.message, path=start, returncode=done.returncode)
    # In a bare repository or inside a git directory: which one is it?
    probe = _completed(
        start,
        ("rev-parse", "--is-bare-repository", "--absolute-git-dir"),
        options=waived,
        extra_env=discovery,
    )
    if probe.returncode != 0:
        raise error
    bare, _, git_dir = os.fsdecode(probe.stdout).rstrip("\n").partition("\n")
    if bare == "true":
        raise NoWorkTree("a bare git repository has no work tree", path=start, returncode=0)
    if Path(git_dir).name == ".git":
        return Path(git_dir).parent.resolve()
    raise error


def commit_of(root: Path, rev: str) -> str | None:
    """The full id of the commit ``rev`` names, or None when it names none here.

    Raises GitError when git fails otherwise (not a repository, refused ownership).
    """
    args = ("rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}")
    done = _completed(root, args)
    if done.returncode == 0:
        return done.stdout.decode("ascii").strip()
    if done.returncode == 1 and not done.stderr.strip():
        return None
    raise _error(root, args, done)


def refs_named(root: Path, names: Sequence[str]) -> dict[str, str]:
    """Those of ``names`` (full ref names, ``refs/...``) that exist, each with the id of
    the object it points at (a symbolic ref's target's), read once with ``git
    for-each-ref``; a name only matches itself, never a ref under it or a glob."""
    wanted = [n for n in names if n.startswith("refs/")]
    if not wanted:
        return {}
    listing = run(
        root, "for-each-ref", "--format=%(refname)%00%(objectname)", "--end-of-options", *wanted
    )
    found: dict[str, str] = {}
    for line in listing.split(b"\n"):
        name, sep, oid = line.partition(b"\0")
        ref = os.fsdecode(name)
        if sep and ref in wanted:
            found[ref] = oid.decode("ascii")
    return found


def status(root: Path, *pathspecs: str) -> str:
    """``git status --porcelain=v2 --branch --untracked-files=no -- PATHSPECS``."""
    return text(
        root, "status", "--porcelain=v2", "--branch", "--untracked-files=no", "--", *pathspecs
    )


def diff_head(root: Path, *options: str, pathspecs: Sequence[str]) -> bytes:
    """``git diff HEAD OPTIONS -- PATHSPECS``, byte for byte, as git writes it in its
    default configuration whatever the user's says (see ``_PLAIN_DIFF``)."""
    return run(root, "diff", "HEAD", *_PLAIN_DIFF, *options, "--", *pathspecs)


def ls_files(root: Path, paths: Iterable[str]) -> list[str]:
    """Those of ``paths`` (pathspecs) that git tracks, as paths relative to ``root``."""
    listed = run(root, "ls-files", "-z", "--", *paths)
    return [os.fsdecode(name) for name in listed.split(b"\0") if name]


def is_ignored(root: Path, path: str) -> bool:
    """Whether git ignores ``path`` (relative to ``root``)."""
    args = ("check-ignore", "-q", "--", path)
    done = _completed(root, args)
    # check-ignore exits 0 for a name git ignores, 1 for one it does not.
    if done.returncode in (0, 1):
        return done.returncode == 0
    raise _error(root, args, done)


def remote_url(root: Path) -> str | None:
    """The URL of the ``origin`` remote, or else of the first remote in the repository's
    configuration (``.git/config`` and what it includes, in file order), as ``git remote
    get-url`` gives it (``url.*.insteadOf`` applied); None when there is no remote."""
    args = ("config", "--local", "--includes", "-z", "--get-regexp", r"^remote\.")
    done = _completed(root, args)
    if done.returncode == 1 and not done.stderr.strip():
        return None  # no remote.* key
    if done.returncode != 0:
        raise _error(root, args, done)
    names: dict[str, None] = {}
    for record in done.stdout.split(b"\0"):
        key = os.fsdecode(record.partition(b"\n")[0])
        name, dot, _ = key.removeprefix("remote.").rpartition(".")
        if key.startswith("remote.") and dot and name:
            names.setdefault(name, None)
    if not names:
        return None
    chosen = "origin" if "origin" in names else next(iter(names))
    urls = text(root, "remote", "get-url", "--all", "--end-of-options", chosen).splitlines()
    return urls[0] if urls else None


# -- objects at a commit -------------------------------------------------------------------


@dataclass(frozen=True)
class TreeEntry:
    """One line of ``git ls-tree --long``."""

    mode: str
    """The entry's mode: ``100644``, ``100755``, ``120000`` (a link), ``160000``..."""
    kind: str
    """``blob``, ``tree`` or ``commit`` (a submodule)."""
    oid: str
    """The object's id."""
    size: int | None
    """The blob's size in bytes; None for anything but a blob."""
    path: str
    """The path from the top of the tree (bytes that are not UTF-8 replaced)."""


def ls_tree(root: Path, commit: str, directory: str, *, limit: int) -> list[TreeEntry]:
    """The entries of ``directory`` at ``commit``, at most ``limit`` of them."""
    listing = run(root, "ls-tree", "-z", "--long", "--end-of-options", commit, f"{directory}/")
    entries = []
    for record in listing.split(b"\0")[:limit]:
        if not record:
            continue
        meta, _, raw_path = record.partition(b"\t")
        mode, kind, oid, size = meta.decode("ascii").split()
        entries.append(
            TreeEntry(
                mode,
                kind,
                oid,
                int(size) if size.isdigit() else None,
                raw_path.decode("utf-8", "replace"),
            )
        )
    return entries


def ls_tree_paths(root: Path, commit: str) -> list[str]:
    """Every path of the tree at ``commit`` that is not a tree itself (files, links,
    submodules), recursively, from its top."""
    listing = run(
        root, "ls-tree", "-r", "-z", "--name-only", "--full-tree", "--end-of-options", commit
    )
    return [os.fsdecode(name) for name in listing.split(b"\0") if name]


def cat_blob(root: Path, oid: str) -> bytes:
    """The content of the blob ``oid``, as stored (no filter, no textconv)."""
    return run(root, "cat-file", "blob", "--end-of-options", oid)


# -- work trees ----------------------------------------------------------------------------


def worktree_add(root: Path, dest: Path, commit: str) -> None:
    """A detached worktree of ``root`` at ``commit`` in ``dest``."""
    run(root, "worktree", "add", "--detach", "--end-of-options", str(dest), commit)


def worktree_remove(root: Path, dest: Path) -> None:
    """Remove the worktree at ``dest``, changes and all."""
    run(root, "worktree", "remove", "--force", "--end-of-options", str(dest))


def worktree_prune(root: Path) -> None:
    """Forget worktrees whose directories are gone."""
    run(root, "worktree", "prune")


def apply(tree: Path, patch: Path) -> None:
    """Apply the patch file ``patch`` to the work tree ``tree`` (not to its index)."""
    run(tree, "apply", "--whitespace=nowarn", "--", str(patch))
