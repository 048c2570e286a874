"""git, reached one way: every git kaudit reads or changes goes through here, on GitPython.

Commands run through GitPython's ``Git`` command object as ``git -C ROOT ...``, with
standard input closed and these settings on top of the process's environment: no pager,
no prompt (``GIT_TERMINAL_PROMPT=0``), messages in English (``LC_ALL=C``, so the first
line of git's stderr can be shown as it is), no optional index writes
(``GIT_OPTIONAL_LOCKS=0``: a status never competes with the user's own git for
``index.lock``), object ids meaning those objects (``GIT_NO_REPLACE_OBJECTS=1``: a
``refs/replace/`` entry cannot stand another tree in for a signed commit or a trust ref),
no configuration handed down by a parent git (``GIT_CONFIG_PARAMETERS``,
``GIT_CONFIG_COUNT``) and no alternate object stores named by the environment.

The variables that point git at another repository than the one named (git's own list,
``git rev-parse --local-env-vars``: a hook's ``GIT_DIR`` or ``GIT_INDEX_FILE``) must not
redirect a snapshot. GitPython can add and replace variables but never remove one, so
when the environment holds any of them each is replaced by the value for the repository
at ROOT, found from ROOT's own ``.git``; git then takes that repository as given and
skips its ownership check (``safe.directory``), so kaudit makes it: a repository another
user owns is refused there. The user's configuration is read as git reads it, except
where it could make a recorded patch something other than a patch (colour, an external
diff, a textconv filter, other prefixes): :func:`diff_head` turns those off; and a
replay's worktree is checked out and patched with no hook and no filter driver the
configuration defines (:func:`worktree_add`, :func:`apply`).

Objects at a commit (the trust store, the gate's configuration, the manifests a remote
resume looks for) are read from git's object store through GitPython's object database,
one persistent ``git cat-file`` per :func:`objects` block, never from the work tree.

Every ref and path given to git comes after ``--end-of-options`` or ``--``, so none is
read as an option; GitPython's own guard against unsafe options and protocols is never
waived. A failure raises :class:`GitError` with git's first error line.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from kronos_audit._internal.safeio import UnsafeFile, read_owned
from kronos_audit.errors import Error, one_line

_OBJECT_ID = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")

if TYPE_CHECKING:
    import git as gitpython

# `git rev-parse --local-env-vars` (git 2.39): what git itself clears before it works in
# another repository (a submodule). GitPython cannot clear one: each is set below, to a
# value that means "none" where git has one (_FIXED), else to this repository's own
# (_LOCATING). GIT_CONFIG alone is left as it is: only `git config` reads it, as the one
# file to read, and no value means "the usual files".
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
# The ones that locate the repository: when the environment holds one, all are set to
# the repository at ROOT (see _located).
_LOCATING = (
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_COMMON_DIR",
    "GIT_INDEX_FILE",
    "GIT_OBJECT_DIRECTORY",
    "GIT_GRAFT_FILE",
    "GIT_SHALLOW_FILE",
    "GIT_IMPLICIT_WORK_TREE",
)

_FIXED = {
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_PAGER": "cat",
    "PAGER": "cat",
    "LC_ALL": "C",
    "LANGUAGE": "C",
    "GIT_OPTIONAL_LOCKS": "0",
    "GIT_NO_REPLACE_OBJECTS": "1",
    # The values git reads as "none": no inherited -c settings, no alternate object
    # stores, no prefix; no external diff program and no context-line override.
    "GIT_CONFIG_PARAMETERS": "",
    "GIT_CONFIG_COUNT": "0",
    "GIT_ALTERNATE_OBJECT_DIRECTORIES": "",
    "GIT_PREFIX": "",
    "GIT_REPLACE_REF_BASE": "refs/replace/",
    "GIT_EXTERNAL_DIFF": "",
    "GIT_DIFF_OPTS": "",
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


def _gitpython(root: Path | str | None) -> ModuleType:
    """GitPython, imported on first use: it runs ``git version`` as it loads and refuses
    to load without git."""
    try:
        import git as gitpython
    except ImportError as e:
        raise GitError(f"cannot run git: {one_line(e)}", path=root, returncode=-1) from None
    return gitpython


# -- the environment -----------------------------------------------------------------------


@dataclass(frozen=True)
class _Location:
    """Where a repository's parts are, as its own ``.git`` says."""

    work_tree: Path
    """The top of its work tree."""
    git_dir: Path
    """Its git directory (a linked worktree's own, under the common one)."""
    common_dir: Path
    """The git directory holding its objects, refs and configuration."""


def _located(start: Path) -> _Location:
    """The repository ``start`` is in, found from the directories alone (a ``.git``
    directory or file, or a git directory itself), for when the environment names
    another: git's own search would follow the environment. NoWorkTree in a bare
    repository; NotARepository outside any, or where a ``.git`` file names no
    directory."""
    here = start.absolute()
    while not here.is_dir() and here != here.parent:
        here = here.parent
    for d in (here, *here.parents):
        dotgit = d / ".git"
        git_dir: Path | None = None
        if dotgit.is_dir():
            git_dir, work = dotgit, d
        elif dotgit.is_file():
            try:
                with open(dotgit, "rb") as f:  # a gitfile is one short line: read no more
                    line = f.read(4096).decode("utf-8", "surrogateescape")
            except OSError:
                line = ""
            target = line.strip().removeprefix("gitdir:").strip()
            if not line.startswith("gitdir:") or not target or not (d / target).is_dir():
                raise NotARepository(
                    f"fatal: not a git repository: {dotgit} names no git directory",
                    path=start,
                    returncode=128,
                )
            git_dir, work = (d / target).resolve(), d
        elif d.name == ".git" and (d / "HEAD").is_file():
            git_dir, work = d, d.parent
        elif (d / "HEAD").is_file() and (d / "objects").is_dir() and (d / "refs").is_dir():
            raise NoWorkTree("a bare git repository has no work tree", path=start, returncode=0)
        if git_dir is not None:
            common = git_dir
            try:
                # Git writes it as a one-line regular file: never a link, FIFO or more.
                named = read_owned(git_dir / "commondir", 4096)
                if named is not None:
                    common = (git_dir / named.decode("utf-8").strip()).resolve()
            except (OSError, UnicodeDecodeError, UnsafeFile):
                pass
            return _Location(work.resolve(), git_dir.resolve(), common)
    raise NotARepository(
        "fatal: not a git repository (or any of the parent directories): .git",
        path=start,
        returncode=128,
    )


def _owned(location: _Location, root: Path) -> None:
    """Refuse a repository another user owns, as git's ownership check would (git does
    not check a repository the environment names; for root run through sudo, the sudo
    user's own repositories are accepted, as git accepts them)."""
    me = {os.geteuid()}
    if os.geteuid() == 0 and os.environ.get("SUDO_UID", "").isdigit():
        me.add(int(os.environ["SUDO_UID"]))
    for part in (location.work_tree, location.git_dir):
        if part.stat().st_uid not in me:
            raise GitError(
                f"{part} is owned by another user, and the environment names a git "
                "repository (GIT_DIR or the like): kaudit does not run git there",
                path=root,
                returncode=-1,
            )


def environment(root: Path | None = None) -> dict[str, str]:
    """The variables every git command at ``root`` runs with on top of the process's
    environment (see the module's docstring)."""
    env = dict(_FIXED)
    if root is not None and any(name in os.environ for name in _LOCATING):
        location = _located(root)
        _owned(location, root)
        common = location.common_dir
        env.update(
            GIT_DIR=str(location.git_dir),
            GIT_COMMON_DIR=str(common),
            GIT_INDEX_FILE=str(location.git_dir / "index"),
            GIT_OBJECT_DIRECTORY=str(common / "objects"),
            GIT_GRAFT_FILE=str(common / "info" / "grafts"),
            GIT_SHALLOW_FILE=str(common / "shallow"),
            GIT_WORK_TREE=str(location.work_tree),
            GIT_IMPLICIT_WORK_TREE="1",
        )
    return env


def _with_config(settings: Mapping[str, str]) -> dict[str, str]:
    """``git -c KEY=VALUE`` for each setting, as environment variables (git's
    ``GIT_CONFIG_COUNT``): what the command line could carry, without an option."""
    env = {"GIT_CONFIG_COUNT": str(len(settings))}
    for i, (key, value) in enumerate(settings.items()):
        env[f"GIT_CONFIG_KEY_{i}"] = key
        env[f"GIT_CONFIG_VALUE_{i}"] = value
    return env


# -- running a command ---------------------------------------------------------------------


@dataclass(frozen=True)
class _Done:
    """What one git command did."""

    returncode: int
    """Its exit status."""
    stdout: bytes
    """Its standard output, byte for byte."""
    stderr: str
    """Its standard error, as GitPython decoded it."""


def _first_line(stderr: str) -> str | None:
    """git's first error line (``fatal:``, ``error:``), else its first line: some
    commands tell their progress there first (``Preparing worktree ...``)."""
    lines = [line.strip() for line in stderr.splitlines()]
    lines = [line for line in lines if line]
    errors = [line for line in lines if line.startswith(("fatal: ", "error: "))]
    return next(iter(errors or lines), None)


def _completed(
    root: Path,
    args: Sequence[str],
    *,
    config: Mapping[str, str] | None = None,
    extra_env: Mapping[str, str] | None = None,
    located: bool = True,
) -> _Done:
    gitpython = _gitpython(root)
    env = environment(root) if located else dict(_FIXED)
    if config:
        env.update(_with_config(config))
    if extra_env:
        env.update(extra_env)
    command = gitpython.Git(root)
    try:
        code, out, err = command.execute(
            [command.GIT_PYTHON_GIT_EXECUTABLE, "-C", str(root), *args],
            with_extended_output=True,
            with_exceptions=False,
            stdout_as_string=False,
            strip_newline_in_stdout=False,
            env=env,
        )
    except gitpython.GitCommandNotFound as e:
        cause = getattr(e, "_cause", None) or e.stderr or e
        reason = getattr(cause, "strerror", None) or str(cause).strip()
        raise GitError(f"cannot run git: {reason}", path=root, returncode=-1) from None
    return _Done(code, out or b"", err if isinstance(err, str) else os.fsdecode(err or b""))


def _error(root: Path, args: Sequence[str], done: _Done) -> GitError:
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
    names (status, diff, ls-files, a checkout) are still refused there. As before, the
    search crosses file systems (checkpoints may sit on another mount). When the
    environment names a repository (a hook's ``GIT_DIR``), the work tree is the one
    ``start``'s own ``.git`` names.
    """
    if any(name in os.environ for name in _LOCATING):
        return _located(start).work_tree  # NoWorkTree in a bare repository
    args = ("rev-parse", "--show-toplevel")
    discovery = {"GIT_DISCOVERY_ACROSS_FILESYSTEM": "1"}
    waived = {"safe.directory": "*"}
    done = _completed(start, args, config=waived, extra_env=discovery, located=False)
    if done.returncode == 0:
        return Path(os.fsdecode(done.stdout.rstrip(b"\n"))).resolve()
    error = _error(start, args, done)
    if "not a git repository" in error.message:
        raise NotARepository(error.message, path=start, returncode=done.returncode)
    # In a bare repository or inside a git directory: which one is it?
    probe = _completed(
        start,
        ("rev-parse", "--is-bare-repository", "--absolute-git-dir"),
        config=waived,
        extra_env=discovery,
        located=False,
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


def symbolic_full_name(root: Path, rev: str) -> str:
    """The full name of the ref ``rev`` names (``@{u}``, ``main@{upstream}`` and ``@{push}``:
    ``refs/remotes/origin/main``), as git resolves it.

    Raises GitError with git's own reason when it names no ref (no upstream configured, no
    such branch, a detached HEAD) or git fails otherwise.
    """
    args = ("rev-parse", "--symbolic-full-name", "--verify", "--end-of-options", rev)
    done = _completed(root, args)
    name = os.fsdecode(done.stdout).strip()
    if done.returncode == 0 and name.startswith("refs/"):
        return name
    if done.returncode == 0:
        raise GitError(f"{rev} names no ref", path=root, returncode=0)
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
    """One entry of a tree, as ``git ls-tree --long`` lists it."""

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


_KINDS = {"blob": "blob", "tree": "tree", "submodule": "commit"}


class Objects:
    """The objects of one repository, read through GitPython's object database: one
    persistent ``git cat-file`` answers every read (see :func:`objects`)."""

    def __init__(self, root: Path) -> None:
        self._root = root
        self._repo: gitpython.Repo | None = None

    def _opened(self) -> gitpython.Repo:
        if self._repo is None:
            gitpython = _gitpython(self._root)
            git_dir = Path(text(self._root, "rev-parse", "--absolute-git-dir").rstrip("\n"))
            try:
                repo = gitpython.Repo(git_dir, expand_vars=False)
                # GitPython takes a relative core.worktree (a submodule's, such as
                # ../../../lib) from the process's working directory, not from the git
                # directory, and runs its `git cat-file` there: in another repository, or
                # in none and then wherever the process stands. Objects need no work
                # tree: the command runs at this repository's own top.
                repo.git = gitpython.Git(self._root)
                repo.odb = gitpython.GitCmdObjectDB(
                    os.path.join(repo.common_dir, "objects"), repo.git
                )
            except Exception as e:  # whatever GitPython raises on a repository it cannot open
                raise self._failed("the repository", e) from None
            repo.git.update_environment(**environment(self._root))
            self._repo = repo
        return self._repo

    def close(self) -> None:
        """End the ``git cat-file`` processes."""
        if self._repo is not None:
            self._repo.close()
            self._repo = None

    def _failed(self, what: str, e: BaseException) -> GitError:
        return GitError(f"cannot read {what}: {one_line(e)}", path=self._root, returncode=128)

    def _check_id(self, oid: str) -> None:
        if not _OBJECT_ID.match(oid):
            raise GitError(f"not a full object id: {oid!r}", path=self._root, returncode=128)

    def tree(self, commit: str, directory: str, *, limit: int) -> list[TreeEntry]:
        """The entries of ``directory`` at ``commit`` (a full commit id), at most
        ``limit`` of them; none when the commit has no such directory."""
        self._check_id(commit)
        repo = self._opened()
        gitpython = _gitpython(self._root)
        try:
            top = gitpython.Commit(repo, bytes.fromhex(commit)).tree
            try:
                found = top / directory if directory not in ("", ".") else top
            except KeyError:
                return []
            if found.type != "tree":
                return []
            entries: list[TreeEntry] = []
            for item in found:
                if len(entries) >= limit:
                    break
                kind = _KINDS.get(item.type, item.type)
                entries.append(
                    TreeEntry(
                        f"{item.mode:06o}",
                        kind,
                        item.hexsha,
                        repo.odb.info(item.binsha).size if kind == "blob" else None,
                        item.path.encode(errors="surrogateescape").decode("utf-8", "replace"),
                    )
                )
            return entries
        except Exception as e:  # a malformed or missing object, whatever GitPython raises
            raise self._failed(f"{directory or '.'}/ at {commit[:12]}", e) from None

    def blob(self, oid: str, *, limit: int) -> bytes:
        """The content of the blob ``oid``, as stored (no filter, no textconv); GitError
        when it is not a blob of at most ``limit`` bytes."""
        self._check_id(oid)
        repo = self._opened()
        try:
            info = repo.odb.info(bytes.fromhex(oid))
        except Exception as e:
            raise self._failed(f"object {oid[:12]}", e) from None
        if info.type != b"blob" or info.size > limit:
            raise GitError(
                f"object {oid[:12]} is not a blob of at most {limit} bytes",
                path=self._root,
                returncode=128,
            )
        try:
            data: bytes = repo.odb.stream(bytes.fromhex(oid)).read()
        except Exception as e:
            raise self._failed(f"object {oid[:12]}", e) from None
        return data


@contextmanager
def objects(root: Path) -> Iterator[Objects]:
    """The objects of the repository at ``root`` (its work tree's top), one persistent
    ``git cat-file`` for the block, started at the first read and ended with the block."""
    store = Objects(root)
    try:
        yield store
    finally:
        store.close()


def ls_tree_paths(root: Path, commit: str) -> list[str]:
    """Every path of the tree at ``commit`` that is not a tree itself (files, links,
    submodules), recursively, from its top."""
    listing = run(
        root, "ls-tree", "-r", "-z", "--name-only", "--full-tree", "--end-of-options", commit
    )
    return [os.fsdecode(name) for name in listing.split(b"\0") if name]


# -- work trees ----------------------------------------------------------------------------


def _inert(root: Path) -> dict[str, str]:
    """Settings under which a checkout or a patch runs nothing the configuration names:
    no hook, no filter driver (each ``filter.NAME`` the configuration defines emptied:
    git skips a driver with no command), no file-system monitor, no descent into
    submodules."""
    settings = {
        "core.hooksPath": os.devnull,
        "core.fsmonitor": "false",
        "submodule.recurse": "false",
    }
    done = _completed(root, ("config", "-z", "--name-only", "--get-regexp", r"^filter\."))
    if done.returncode not in (0, 1):
        raise _error(root, ("config",), done)
    for key in os.fsdecode(done.stdout).split("\0"):
        name, dot, _ = key.removeprefix("filter.").rpartition(".")
        if key.startswith("filter.") and dot:
            for part in ("smudge", "clean", "process"):
                settings[f"filter.{name}.{part}"] = ""
            settings[f"filter.{name}.required"] = "false"
    return settings


def _run_inert(root: Path, config_root: Path, *args: str) -> None:
    done = _completed(root, args, config=_inert(config_root))
    if done.returncode != 0:
        raise _error(root, args, done)


def worktree_add(root: Path, dest: Path, commit: str) -> None:
    """A detached worktree of ``root`` at ``commit`` in ``dest``, checked out with no
    hook and no filter (see :func:`_inert`)."""
    _run_inert(root, root, "worktree", "add", "--detach", "--end-of-options", str(dest), commit)


def worktree_remove(root: Path, dest: Path) -> None:
    """Remove the worktree at ``dest``, changes and all."""
    run(root, "worktree", "remove", "--force", "--end-of-options", str(dest))


def worktree_prune(root: Path) -> None:
    """Forget worktrees whose directories are gone."""
    run(root, "worktree", "prune")


def apply(tree: Path, patch: Path) -> None:
    """Apply the patch file ``patch`` to the work tree ``tree`` (not to its index), with
    no hook and no filter (see :func:`_inert`)."""
    _run_inert(tree, tree, "apply", "--whitespace=nowarn", "--", str(patch))
