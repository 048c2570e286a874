"""Checkpoint storage: DVC-tracked files, DVC's cache, and DVC remotes.

Each checkpoint ``CKPT`` gets a ``CKPT.dvc`` file beside it (what ``dvc add`` would write),
is git-ignored, and enters DVC's cache without a second full copy: it is linked into
``.dvc/cache/files/md5/..`` following the repository's ``cache.type`` (reflink, hardlink,
symlink, then copy as a last resort). Manifests and ``.dvc`` files are small and meant
for git; so a plain ``dvc pull`` in a fresh clone restores the checkpoints.

Tracking is done here, without importing DVC (which costs most of a second), so a
running program pays nothing for it. Pushing, pulling and asking a remote what it holds
go through DVC's own API.

DVC's push over SSH writes objects in place, so a push killed midway can leave a
truncated object under its final name, which DVC would then take as pushed. kaudit
compares each remote object's size with the recorded one, deletes a short one before
pushing again, and checks the sha256 of everything it pulls: a partial or tampered
object is never taken as valid.
"""

from __future__ import annotations

import configparser
import contextlib
import fcntl
import logging
import os
import shutil
import stat
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from kronos_audit._internal.fsutil import write_atomic
from kronos_audit._internal.secrets import SplitURL, split_credentials
from kronos_audit.errors import StorageError, TamperedData
from kronos_audit.project import Project

log = logging.getLogger("kronos_audit.storage")

DVC_SUFFIX = ".dvc"
DEFAULT_CACHE_TYPES: tuple[str, ...] = ("reflink", "copy")  # DVC's own default
LINK_FRIENDLY_CACHE_TYPES = "reflink,hardlink,symlink,copy"
FICLONE = 0x40049409  # linux/fs.h: _IOW(0x94, 9, int)


def dvc_file_for(checkpoint: Path) -> Path:
    return checkpoint.with_name(checkpoint.name + DVC_SUFFIX)


def _dvc_config(project: Project) -> configparser.ConfigParser:
    config = configparser.ConfigParser(interpolation=None)
    config.read([project.root / ".dvc" / "config", project.root / ".dvc" / "config.local"])
    return config


def cache_settings(project: Project) -> tuple[Path, tuple[str, ...]]:
    """DVC's cache directory and link types for this repository (repo and local config)."""
    config = _dvc_config(project)
    cache_dir = project.root / ".dvc" / "cache"
    types = DEFAULT_CACHE_TYPES
    if config.has_section("cache"):
        if config.has_option("cache", "dir"):
            # DVC resolves a relative cache.dir against the .dvc directory.
            cache_dir = (project.root / ".dvc" / config.get("cache", "dir")).resolve()
        if config.has_option("cache", "type"):
            raw = config.get("cache", "type").strip("[]")
            types = tuple(t.strip().strip("'\"") for t in raw.split(",") if t.strip())
    return cache_dir, types


def cache_object_path(cache_dir: Path, md5: str) -> Path:
    return cache_dir / "files" / "md5" / md5[:2] / md5[2:]


def _reflink(src: Path, dst: Path) -> None:
    with open(src, "rb") as s, open(dst, "wb") as d:
        fcntl.ioctl(d.fileno(), FICLONE, s.fileno())


def link_into_cache(checkpoint: Path, obj: Path, types: Sequence[str], *, owned: bool) -> str:
    """Make ``obj`` (a cache object) hold the checkpoint's bytes; return how.

    Tries ``types`` in order; only ``copy`` copies the data. The object ends read-only, as
    DVC keeps its cache (with a hard link the checkpoint shares that mode) when kaudit
    created the checkpoint (``owned``). A file kaudit did not create (``kaudit snapshot``)
    is never changed: a hard link to it keeps its mode, and ``symlink``, which would move
    it into the cache, is skipped.
    """
    if obj.exists():
        return "present"  # same md5: the cache has these bytes already
    obj.parent.mkdir(parents=True, exist_ok=True)
    tmp = obj.with_name(f".{obj.name}.{uuid.uuid4().hex[:8]}.tmp")
    for kind in types:
        try:
            if kind == "reflink":
                _reflink(checkpoint, tmp)
            elif kind == "hardlink":
                os.link(checkpoint, tmp, follow_symlinks=False)
                if not owned:
                    # The link shares the user's inode: a chmod would change their file.
                    os.replace(tmp, obj)
                    return kind
            elif kind == "symlink":
                if not owned:
                    continue  # it would move the user's file into the cache
                # The data moves into the cache; the checkpoint's name points at it.
                os.replace(checkpoint, tmp)
                os.chmod(tmp, 0o444)
                os.replace(tmp, obj)
                checkpoint.symlink_to(obj)
                return kind
            elif kind == "copy":
                shutil.copyfile(checkpoint, tmp)
                with open(tmp, "rb") as f:
                    os.fsync(f.fileno())
            else:
                continue
        except OSError:
            tmp.unlink(missing_ok=True)
            continue
        os.chmod(tmp, 0o444)
        os.replace(tmp, obj)
        return kind
    why = "" if owned or "symlink" not in types else " (symlink would move this file)"
    raise StorageError(
        f"cannot put the checkpoint into DVC's cache with cache.type {','.join(types)}{why}",
        path=checkpoint,
    )


def ensure_ignored(directory: Path, pattern: str) -> None:
    """Add ``pattern`` to ``directory/.gitignore`` unless it is there."""
    gitignore = directory / ".gitignore"
    try:
        text = gitignore.read_text(encoding="utf-8")
    except FileNotFoundError:
        text = ""
    if pattern in text.splitlines():
        return
    if text and not text.endswith("\n"):
        text += "\n"
    write_atomic(gitignore, (text + pattern + "\n").encode())


def write_dvc_file(checkpoint: Path, md5: str, size: int) -> Path:
    """The ``.dvc`` file ``dvc add`` would write for this checkpoint."""
    path = dvc_file_for(checkpoint)
    name = checkpoint.name
    quoted = (
        name
        if name.replace(".", "").replace("-", "").replace("_", "").isalnum()
        else ('"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"')
    )
    write_atomic(
        path, f"outs:\n- md5: {md5}\n  size: {size}\n  hash: md5\n  path: {quoted}\n".encode()
    )
    return path


def read_dvc_file(path: Path) -> tuple[str, int] | None:
    """(md5, size) from a single-output ``.dvc`` file, or None if it is not one."""
    md5: str | None = None
    size: int | None = None
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    for line in lines:
        key, _, value = line.strip().lstrip("- ").partition(":")
        if key == "md5":
            md5 = value.strip()
        elif key == "size" and value.strip().isdigit():
            size = int(value.strip())
    return (md5, size) if md5 and size is not None else None


def track(
    project: Project,
    checkpoint: Path,
    md5: str,
    size: int,
    *,
    owned: bool,
    ignore_pattern: str | None = None,
) -> Path:
    """Track a checkpoint with DVC: cache object, ``.dvc`` file, git-ignore entry.

    ``owned``: kaudit created the checkpoint, so it may make it read-only or move it into
    the cache (see :func:`link_into_cache`); otherwise the user's file is left as it is.
    """
    cache_dir, types = cache_settings(project)
    how = link_into_cache(checkpoint, cache_object_path(cache_dir, md5), types, owned=owned)
    if how == "copy":
        log.info("%s: copied into DVC's cache (cache.type allows no link here)", checkpoint)
    ensure_ignored(checkpoint.parent, ignore_pattern or f"/{checkpoint.name}")
    return write_dvc_file(checkpoint, md5, size)


# -- DVC remotes ---------------------------------------------------------------------------


class Location(Enum):
    """Where a checkpoint's data is, as ``kaudit status`` shows it."""

    LOCAL = "local"
    """Here and valid, not (fully) in the remote."""
    PUSHED = "pushed"
    """Here and valid, and in the remote."""
    REMOTE_ONLY = "remote-only"
    """Not here; in the remote."""
    MISSING = "missing"
    """Neither here nor in the remote."""
    CORRUPT = "corrupt"
    """Here, but not the bytes its manifest signs."""


@contextlib.contextmanager
def _quiet_dvc() -> Iterator[None]:
    logging.disable(logging.INFO)  # DVC's own chatter; errors still reach us as exceptions
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)


def _dvc_error(e: Exception) -> str:
    text = str(e).strip() or type(e).__name__
    return text.splitlines()[0]


class Storage:
    """DVC operations for one repository; DVC is imported on first use."""

    def __init__(self, project: Project) -> None:
        self.project = project
        self._repo: Any = None

    @property
    def repo(self) -> Any:
        if self._repo is None:
            if not (self.project.root / ".dvc").is_dir():
                raise StorageError(
                    "DVC is not set up here: run `kaudit init`", path=self.project.root
                )
            from dvc.repo import Repo

            self._repo = Repo(str(self.project.root))
        return self._repo

    def remote_name(self, name: str | None = None) -> str:
        chosen = name or self.repo.config["core"].get("remote")
        if not chosen:
            raise StorageError(
                "no DVC remote: add one with `kaudit init --remote URL`", path=self.project.root
            )
        if chosen not in self.repo.config["remote"]:
            raise StorageError(f"no DVC remote named {chosen!r}", path=self.project.root)
        return str(chosen)

    def _odb(self, remote: str | None) -> Any:
        try:
            return self.repo.cloud.get_remote_odb(self.remote_name(remote), "kaudit")
        except StorageError:
            raise
        except Exception as e:  # DVC's errors are many: name it and stop
            raise StorageError(f"remote: {_dvc_error(e)}", path=self.project.root) from None

    def remote_sizes(self, md5s: Iterable[str], remote: str | None = None) -> dict[str, int | None]:
        """Size of each object in the remote, None where it is absent."""
        odb = self._odb(remote)
        found: dict[str, int | None] = {}
        for md5 in set(md5s):
            try:
                found[md5] = int(odb.fs.info(odb.oid_to_path(md5))["size"])
            except FileNotFoundError:
                found[md5] = None
            except Exception as e:
                raise StorageError(
                    f"remote unreachable: {_dvc_error(e)}", path=self.project.root
                ) from None
        return found

    def push(self, checkpoints: Sequence[Path], remote: str | None = None) -> int:
        """Push checkpoints' cache objects; return how many were uploaded.

        A remote object shorter or longer than recorded (a push killed midway) is deleted
        first, so that it is uploaded again rather than taken as pushed.
        """
        entries = [(c, read_dvc_file(dvc_file_for(c))) for c in checkpoints]
        untracked = [c for c, e in entries if e is None]
        if untracked:
            raise StorageError("not tracked by DVC (no .dvc file)", path=untracked[0])
        odb = self._odb(remote)
        sizes = self.remote_sizes([e[0] for _, e in entries if e], remote)
        for _, e in entries:
            assert e is not None
            md5, size = e
            if sizes[md5] is not None and sizes[md5] != size:
                log.warning(
                    "remote object %s is %s bytes, not %s: uploading it again",
                    md5,
                    sizes[md5],
                    size,
                )
                odb.fs.rm_file(odb.oid_to_path(md5))
        try:
            with _quiet_dvc():
                pushed = self.repo.push(
                    targets=[str(dvc_file_for(c)) for c in checkpoints],
                    remote=self.remote_name(remote),
                )
        except Exception as e:
            raise StorageError(f"push failed: {_dvc_error(e)}", path=self.project.root) from None
        return int(pushed or 0)

    def pull(self, checkpoints: Sequence[Path], remote: str | None = None) -> None:
        """Fetch checkpoints from the remote into the cache and the work tree (DVC shows
        a progress bar). The caller verifies them against their manifests.

        Raises TamperedData (exit 1) for an object the remote holds but whose bytes do not
        match its recorded md5: DVC checks each object as it fetches it, refuses such an
        object and deletes it from the remote, so what the remote held is asked first.
        """
        missing = [c for c in checkpoints if not dvc_file_for(c).exists()]
        if missing:
            raise StorageError(
                "not present, and not tracked by DVC (no .dvc file) to fetch", path=missing[0]
            )
        entries = {c: read_dvc_file(dvc_file_for(c)) for c in checkpoints if not c.exists()}
        held = self.remote_sizes([e[0] for e in entries.values() if e], remote)
        try:
            self.repo.pull(
                targets=[str(dvc_file_for(c)) for c in checkpoints],
                remote=self.remote_name(remote) if remote else None,
            )
            return
        except Exception as e:
            reason = _dvc_error(e)
        still_missing = [c for c in entries if not c.exists()]
        for c in still_missing:
            entry = entries[c]
            if entry is not None and held.get(entry[0]) is not None:
                raise TamperedData(
                    "the remote's object does not match its recorded md5, so DVC refused "
                    "it: tampered or damaged in the remote",
                    path=c,
                )
        raise StorageError(
            f"fetching from the DVC remote failed: {reason}",
            path=still_missing[0] if still_missing else checkpoints[0],
        )

    def discard(self, checkpoint: Path) -> None:
        """Remove a checkpoint that failed verification from the work tree and the cache,
        so that nothing takes it for valid later."""
        entry = read_dvc_file(dvc_file_for(checkpoint))
        checkpoint.unlink(missing_ok=True)
        if entry is not None:
            cache_dir, _ = cache_settings(self.project)
            cache_object_path(cache_dir, entry[0]).unlink(missing_ok=True)


# Remote types whose credentials DVC takes as options of their own (`dvc remote modify
# --local NAME user|password`): the URL keeps its shape and only the secret moves.
_CREDENTIAL_OPTIONS = frozenset({"ssh", "http", "https", "webdav", "webdavs"})
# What configure_remote puts in the local config, and so replaces there.
_CREDENTIAL_KEYS = frozenset({"url", "user", "password", "auth"})


def _local_credentials(split: SplitURL) -> dict[str, str]:
    """What goes to DVC's local config (``.dvc/config.local``) for ``split``'s remote."""
    if not split.has_secret:
        return {}
    if split.secret_params or split.scheme not in _CREDENTIAL_OPTIONS:
        # A token in the query string (a presigned or SAS URL) or in the userinfo of a
        # remote type without a user/password option: DVC has no option to hold it, so the
        # whole URL stays in the local config, overriding the public one.
        return {"url": split.url}
    options: dict[str, str] = {}
    if split.user is not None:
        options["user"] = split.user
    if split.password is not None or (split.user is not None and split.scheme != "ssh"):
        # HTTP basic auth needs both; `https://TOKEN@host` is user TOKEN, empty password.
        options["password"] = split.password or ""
    if split.scheme in ("http", "https"):
        options["auth"] = "basic"  # without it DVC's HTTP remote sends no credentials
    return options


def _check_git_ignores(project: Project, path: Path) -> None:
    """Refuse to put credentials in ``path`` (DVC's local config) unless git ignores it."""
    import subprocess

    import git

    relative = str(path.relative_to(project.root))
    try:
        repo = git.Repo(project.root)
        tracked = repo.git.ls_files("--", relative)
        # check-ignore exits 0 for a name git ignores, 1 for one it does not.
        ignored = (
            subprocess.run(
                ["git", "check-ignore", "-q", "--", relative], cwd=project.root, check=False
            ).returncode
            == 0
        )
    except (git.GitError, OSError) as e:
        raise StorageError(f"cannot ask git about {relative}: {e}", path=project.root) from None
    if tracked or not ignored:
        raise StorageError(
            "the remote URL holds credentials, and DVC's local config, where they belong, "
            "is not git-ignored here: add `/config.local` to .dvc/.gitignore "
            "(and `git rm --cached .dvc/config.local` if it is tracked)",
            path=path,
        )


def _make_private(path: Path) -> None:
    """Create ``path`` readable by its owner only, or make it so, before it holds a
    password; refuse a symbolic link or anything but a regular file there."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600)
    except OSError as e:
        raise StorageError(
            f"cannot write DVC's local config: {e.strerror or e} (a symbolic link or not a "
            "regular file?)",
            path=path,
        ) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise StorageError("DVC's local config is not a regular file", path=path)
        if mode & 0o077:
            os.fchmod(fd, stat.S_IMODE(mode) & ~0o077)  # it is about to hold a password
    finally:
        os.close(fd)


def configure_remote(project: Project, url: str, name: str = "storage") -> None:
    """Make ``url`` the repository's default DVC remote (``dvc remote add -d -f``).

    Credentials never reach ``.dvc/config``, which git tracks: a password or token in the
    URL goes to DVC's local config (``.dvc/config.local``, git-ignored, mode 0600) as the
    remote's ``user``/``password`` options (ssh, http(s), webdav), or, for a token DVC
    has no option for (a query-string token), as the whole URL overriding the public one
    there. DVC merges the two when it connects. Error messages never show the secret.
    """
    from dvc.repo import Repo

    split = split_credentials(url)
    local = _local_credentials(split)
    local_path = project.root / ".dvc" / "config.local"
    if local:
        _check_git_ignores(project, local_path)
    try:
        repo = Repo(str(project.root))
        before = repo.config.read("repo")
        previous = before["remote"].get(name), before["core"].get("remote")
        with repo.config.edit() as conf:
            conf["remote"][name] = {"url": split.public}
            conf["core"]["remote"] = name
        try:
            # The remote's credentials and URL in the local config are always replaced: an
            # earlier remote's URL there would override this one, and its password would
            # be sent to this one's host. Options such as `keyfile` stay.
            if local or name in repo.config.read("local")["remote"]:
                if local:
                    _make_private(local_path)
                with repo.config.edit("local") as conf:
                    kept = {
                        k: v
                        for k, v in conf["remote"].pop(name, {}).items()
                        if k not in _CREDENTIAL_KEYS
                    }
                    if kept or local:
                        conf["remote"][name] = kept | local
        except Exception:
            with repo.config.edit(validate=False) as conf:  # leave no remote half-added
                for section, key, value in (
                    ("remote", name, previous[0]),
                    ("core", "remote", previous[1]),
                ):
                    if value is None:
                        conf[section].pop(key, None)
                    else:
                        conf[section][key] = value
            raise
    except StorageError:
        raise
    except Exception as e:
        raise StorageError(
            f"cannot add the DVC remote: {split.scrub(_dvc_error(e))}", path=project.root
        ) from None


def configure_cache_links(project: Project) -> bool:
    """Set ``cache.type`` so checkpoints enter the cache by link, unless one is set."""
    config = _dvc_config(project)
    if config.has_option("cache", "type"):
        return False
    from dvc.repo import Repo

    repo = Repo(str(project.root))
    with repo.config.edit() as conf:
        conf["cache"]["type"] = LINK_FRIENDLY_CACHE_TYPES
    return True


@dataclass(frozen=True)
class StatusEntry:
    """Where one checkpoint's data is."""

    manifest: Path
    """Its manifest."""
    checkpoint: Path
    """The checkpoint file."""
    step: int
    """Its step."""
    location: Location
    """local / pushed / remote-only / missing / corrupt."""
    size: int
    """Recorded size in bytes."""


def status(
    project: Project,
    manifests: Sequence[Path],
    remote: str | None = None,
    *,
    check_remote: bool = True,
) -> list[StatusEntry]:
    """Classify each manifest's checkpoint; the remote is asked once for all of them."""
    import hashlib

    from kronos_audit.manifest import read_manifest

    read = [read_manifest(m) for m in manifests]
    sizes: dict[str, int | None] = {}
    if check_remote:
        md5s = [m.subject_md5 for m in read if m.subject_md5]
        sizes = Storage(project).remote_sizes(md5s, remote)
    entries = []
    for m in read:
        size = int(m.predicate["size"])
        in_remote = m.subject_md5 is not None and sizes.get(m.subject_md5) == size
        path = m.checkpoint_path
        if path.exists():
            with open(path, "rb") as f:
                ok = hashlib.file_digest(f, "sha256").hexdigest() == m.subject_sha256
            location = (
                Location.CORRUPT if not ok else Location.PUSHED if in_remote else Location.LOCAL
            )
        else:
            location = Location.REMOTE_ONLY if in_remote else Location.MISSING
        entries.append(StatusEntry(m.path, path, m.step, location, size))
    return entries
