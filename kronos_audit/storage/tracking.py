"""Tracking checkpoints with DVC: its cache, ``.dvc`` files and git-ignore entries.

Each checkpoint ``CKPT`` gets a ``CKPT.dvc`` file beside it (what ``dvc add`` would write),
is git-ignored, and enters DVC's cache without a second full copy where it can: a
checkpoint kaudit wrote (a run's, which is never written again in place) is linked into
``.dvc/cache/files/md5/..`` following the repository's ``cache.type`` (reflink, hardlink,
symlink, then copy as a last resort), and the object made read-only as DVC keeps it. A
user's file (``kaudit snapshot``) is only ever reflinked or copied: its program may write
it again in place under the same name, which must give it a new file, never change the
signed object (as root, permission bits protect nothing). :func:`stage_copy` takes that
private copy before anything is hashed, so what is signed is exactly what the cache holds.
Manifests and ``.dvc`` files are small and meant for git; so a plain ``dvc pull`` in a
fresh clone restores the checkpoints.

Tracking is done here, without opening a DVC repository (which costs most of a second), so
a running program pays little for it: DVC's configuration is read through DVC's own
``dvc.config`` (:func:`cache_settings`, never by parsing its files, so the global and
system files count as they do for DVC), once per run; so is the default remote
(:func:`default_remote`). Only setting DVC up
(:func:`init_dvc`, :func:`configure_cache_links`) opens a DVC repository.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import re
import shutil
import stat
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kronos_audit._internal.fsutil import fsync_dir, mkdir_durable, write_atomic
from kronos_audit._internal.safeio import (
    KEY_LIMIT,
    UnsafeFile,
    check_owned,
    read_owned,
    read_regular,
)
from kronos_audit.checkpoint.layout import NameKind, parse_name
from kronos_audit.errors import ProjectError, StorageError
from kronos_audit.project.repository import Project
from kronos_audit.storage._dvc import dvc_error, load_dvc, quiet_dvc

log = logging.getLogger("kronos_audit.storage")

DVC_SUFFIX = ".dvc"
DEFAULT_CACHE_TYPES: tuple[str, ...] = ("reflink", "copy")  # DVC's own default
LINK_FRIENDLY_CACHE_TYPES = "reflink,hardlink,symlink,copy"
FICLONE = 0x40049409  # linux/fs.h: _IOW(0x94, 9, int)
MD5_PATTERN = re.compile(r"[0-9a-f]{32}")
"""An md5 as DVC writes it: 32 lower-case hex digits, safe to become a path."""


def dvc_file_for(checkpoint: Path) -> Path:
    return checkpoint.with_name(checkpoint.name + DVC_SUFFIX)


DVC_CONFIG_FILES = ("config", "config.local")
"""DVC's repository-level configuration files in ``.dvc/``: read (and, for ``config.local``,
written) by DVC on kaudit's behalf."""


def check_dvc_config(project: Project) -> None:
    """StorageError unless each of DVC's configuration files in the repository
    (:data:`DVC_CONFIG_FILES`) is missing or a regular file (not a symbolic link) of at
    most :data:`~kronos_audit._internal.safeio.TEXT_LIMIT` bytes.

    DVC opens them by name, following links and without a bound: a ``config.local``
    linked to ``../.env`` would be parsed (its lines shown in DVC's errors) and rewritten
    with credentials by ``kaudit init --remote``, and a FIFO there would block every
    command. Checked before each time kaudit lets DVC load its configuration."""
    for name in DVC_CONFIG_FILES:
        path = project.root / ".dvc" / name
        try:
            check_owned(path)
        except UnsafeFile as e:
            raise StorageError(
                f"{e.reason}: DVC's configuration is read here only from a regular file "
                "(never through a link); replace it with a plain file",
                path=path,
            ) from None


def _dvc_config(project: Project) -> Any:
    """DVC's configuration for this repository as DVC itself loads it: the system, global,
    repository (``.dvc/config``, tracked) and local (``.dvc/config.local``) files merged in
    DVC's order, paths resolved against the file each comes from. Importing ``dvc.config``
    costs tens of milliseconds, not the second ``dvc.repo`` costs."""
    check_dvc_config(project)
    load_dvc()
    from dvc.config import Config

    try:
        return Config(dvc_dir=str(project.root / ".dvc"))
    except Exception as e:  # DVC raises many types (ConfigError, OSError ...): say which
        raise StorageError(
            f"DVC's configuration cannot be read: {dvc_error(e)}", path=project.root
        ) from None


def _link_types(value: object) -> tuple[str, ...]:
    """``cache.type`` as DVC takes it: a list, or a comma-separated string (a level's raw
    value, before DVC's validation turns it into a list)."""
    items = value if isinstance(value, list | tuple) else str(value).strip("[]").split(",")
    return tuple(t for item in items if (t := str(item).strip().strip("'\"")))


def cache_settings(project: Project) -> tuple[Path, tuple[str, ...]]:
    """DVC's cache directory and link types for this repository, as DVC resolves them
    from every level of its configuration (system < global < repo < local).

    Where the data goes is the user's choice, not the repository's: a ``cache.dir``
    that comes from the tracked ``.dvc/config`` and lies outside the repository is
    refused (StorageError), with how to accept it for this machine; and the tracked
    file's ``cache.type`` applies only while the cache is inside the repository. Callers
    on a hot path resolve this once and keep it (it reads DVC's files each time).
    """
    config = _dvc_config(project)
    try:
        levels = {level: config.load_one(level)["cache"] for level in config.files}
    except Exception as e:
        raise StorageError(
            f"DVC's configuration cannot be read: {dvc_error(e)}", path=project.root
        ) from None
    merged = config["cache"]
    if merged.get("local"):
        raise StorageError(
            f"DVC's cache.local ({merged['local']!r}, a remote as the cache) is not "
            "supported by kaudit: unset it with `dvc config --unset cache.local`",
            path=project.root,
        )
    raw_dir = merged.get("dir")
    cache_dir = Path(raw_dir) if raw_dir else project.root / ".dvc" / "cache"
    # Resolved (symbolic links followed) to judge where the bytes really go.
    inside = cache_dir.resolve().is_relative_to(project.root.resolve())
    origin = next((lvl for lvl in reversed(config.LEVELS) if "dir" in levels.get(lvl, {})), None)
    if origin == "repo" and not inside:
        raise StorageError(
            f"DVC's cache.dir {cache_dir} comes from the tracked .dvc/config and lies "
            "outside the repository: refused (where data goes is this machine's choice); "
            f"to accept it here, run `dvc config --local cache.dir {cache_dir}`",
            path=project.root / ".dvc" / "config",
        )
    trusted = [lvl for lvl in config.LEVELS if inside or lvl != "repo"]
    chosen = next(
        (levels[lvl]["type"] for lvl in reversed(trusted) if "type" in levels.get(lvl, {})),
        None,
    )
    types = _link_types(chosen) if chosen is not None else DEFAULT_CACHE_TYPES
    return cache_dir, types or DEFAULT_CACHE_TYPES


def default_remote(project: Project) -> str | None:
    """The name of DVC's default remote here (``core.remote``, from every level of its
    configuration as DVC merges them), or None: read without opening a DVC repository."""
    remote = _dvc_config(project)["core"].get("remote")
    return str(remote) if remote else None


def cache_object_path(cache_dir: Path, md5: str) -> Path:
    return cache_dir / "files" / "md5" / md5[:2] / md5[2:]


def remove_cache_object(cache_dir: Path, md5: str, size: int) -> bool:
    """Unlink DVC's cache object ``md5`` if it is a regular file of ``size`` bytes; return
    whether it was. ``md5`` and ``size`` are what a verified manifest signs (never what a
    ``.dvc`` file or a name says): the caller has checked that no other checkpoint still
    names the object. An object of another size is not the signed bytes and is left for
    ``dvc gc``; a symbolic link or directory there is never followed."""
    if not MD5_PATTERN.fullmatch(md5):
        return False
    obj = cache_object_path(cache_dir, md5)
    try:
        st = obj.lstat()
    except OSError:
        return False
    if not stat.S_ISREG(st.st_mode) or st.st_size != size:
        return False
    try:
        obj.unlink()
    except FileNotFoundError:
        return False
    return True


USER_FILE_TYPES = ("reflink", "copy")
"""How a user's file may enter DVC's cache: a new inode of its own, never a link."""


_KAUDIT_WRITTEN = frozenset({NameKind.CHECKPOINT, NameKind.SHARD, NameKind.INDEX})


def written_by_kaudit(checkpoint: Path) -> bool:
    """Whether ``checkpoint`` is named as kaudit names the files it writes itself and
    never writes again in place (``step-<N>.h5``, a shard, a shard index): only those may
    share an inode with DVC's cache. Any other name is a user's file."""
    parsed = parse_name(checkpoint.name)
    return parsed is not None and parsed.kind in _KAUDIT_WRITTEN


def user_file_types(types: Sequence[str]) -> tuple[str, ...]:
    """``types`` as a file kaudit did not write may use them: a reflink where ``types``
    allow one, else a copy (always: the cache's link types choose how to save a copy,
    never whether the signed bytes may be left where their writer writes)."""
    return (*(t for t in types if t == "reflink"), "copy")


def _copy_data(src: int, dst: int) -> None:
    """Copy ``src`` to ``dst`` to its end in the kernel (``copy_file_range``, which a file
    system that can shares extents or copies on the server), else through memory."""
    try:
        while os.copy_file_range(src, dst, 1 << 30):
            pass
        return
    except OSError as e:
        if e.errno not in (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
            raise
    os.lseek(src, 0, os.SEEK_SET)
    os.lseek(dst, 0, os.SEEK_SET)
    os.ftruncate(dst, 0)
    while chunk := os.read(src, 8 << 20):
        view = memoryview(chunk)
        while view:
            view = view[os.write(dst, view) :]


@dataclass(frozen=True)
class Staged:
    """A private copy of a user's file in DVC's cache, under a temporary name."""

    path: Path
    """The copy (read-only, synced)."""
    how: str
    """``reflink`` or ``copy``."""
    created: tuple[Path, ...]
    """The cache's directories made for it, deepest first: :func:`discard_staged`
    removes them again (when still empty) if the copy is never committed."""


def discard_staged(staged: Staged) -> None:
    """Remove a copy :func:`stage_copy` made and nobody committed, and the directories
    made for it while still empty: a refused snapshot leaves nothing in the cache."""
    staged.path.unlink(missing_ok=True)
    for directory in staged.created:
        try:
            directory.rmdir()
        except OSError:
            return  # not empty (something else went in meanwhile), or gone: left be


def stage_copy(checkpoint: Path, cache_dir: Path, types: Sequence[str]) -> Staged:
    """A private, read-only copy of a user's file in DVC's cache (a reflink where
    ``types`` allow one, else a copy in the kernel), synced, under a temporary name. The
    caller hashes the copy and signs that, so a program writing its file meanwhile
    changes nothing signed, then puts it in place with :func:`commit_staged` (or
    :func:`discard_staged`). The checkpoint is opened once, never through a symbolic
    link, and must be a regular file. StorageError when the cache cannot be written."""
    md5_dir = cache_dir / "files" / "md5"
    created = tuple(d for d in (md5_dir, md5_dir.parent, cache_dir) if not os.path.lexists(d))
    try:
        mkdir_durable(md5_dir)
    except OSError as e:
        raise _cache_failed(checkpoint, md5_dir, e) from None
    tmp = md5_dir / f".kaudit-{uuid.uuid4().hex}.tmp"
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        src = os.open(checkpoint, flags)
    except OSError as e:
        discard_staged(Staged(tmp, "", created))
        raise StorageError(f"cannot read it: {e.strerror or e}", path=checkpoint) from None
    try:
        if not stat.S_ISREG(os.fstat(src).st_mode):
            raise StorageError("is not a regular file", path=checkpoint)
        dst = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o444)
        try:
            how = "copy"
            for kind in user_file_types(types):
                if kind == "reflink":
                    try:
                        fcntl.ioctl(dst, FICLONE, src)
                    except OSError:
                        continue
                    how = kind
                    break
                _copy_data(src, dst)
                break
            os.fsync(dst)
        finally:
            os.close(dst)
    except OSError as e:
        discard_staged(Staged(tmp, "", created))
        raise _cache_failed(checkpoint, md5_dir, e) from None
    except BaseException:
        discard_staged(Staged(tmp, "", created))
        raise
    finally:
        os.close(src)
    return Staged(tmp, how, created)


def commit_staged(staged: Path, obj: Path) -> None:
    """Put a copy made by :func:`stage_copy` (and hashed: its md5 names ``obj``) in place
    as DVC's cache object ``obj``, durably. An object there already is replaced: it is not
    taken on trust (see :func:`link_into_cache`)."""
    try:
        mkdir_durable(obj.parent)
        os.replace(staged, obj)
    except OSError as e:
        staged.unlink(missing_ok=True)
        raise StorageError(
            f"cannot put the checkpoint into DVC's cache at {obj.parent}: {e.strerror or e}",
            path=obj,
        ) from None
    _durable_names(obj.parent)


def _reflink(src: Path, dst: Path) -> None:
    with open(src, "rb") as s, open(dst, "wb") as d:
        fcntl.ioctl(d.fileno(), FICLONE, s.fileno())
        # The clone's extents are the new file's metadata: durable only once it is synced.
        os.fsync(d.fileno())


def link_into_cache(
    checkpoint: Path,
    obj: Path,
    types: Sequence[str],
    *,
    owned: bool,
    unsynced: set[Path] | None = None,
) -> str:
    """Make ``obj`` (a cache object) hold the checkpoint's bytes; return how.

    Tries ``types`` in order; only ``copy`` copies the data. The object ends read-only, as
    DVC keeps its cache (with a hard link the checkpoint shares that mode) when kaudit
    created the checkpoint (``owned``). A file kaudit did not create (``kaudit snapshot``,
    a user's file fetched) is never linked: its writer may write it again in place, and
    through a shared inode (or a symbolic link into the cache) that would change the
    signed object; it is reflinked where ``types`` allow, else copied
    (:func:`user_file_types`), and its own mode is left as it is.

    An object already there under that md5 is not taken on trust: unless it is the
    checkpoint itself (linked before), it is replaced by the checkpoint's bytes, which the
    caller knows to be that md5's (hashed as they were written, or fetched and checked). A
    corrupt or planted object would otherwise be what a push uploads and a fetch links.

    Returns once the object is durable: its bytes synced (a copy, a reflink), then its
    name (and a new fan-out directory's) by an fsync of the directory that holds it, so a
    manifest written afterwards never outlives, across a power cut, the object it signs.
    With ``unsynced``, the directories whose names must be synced are added to it instead,
    for a caller that links many objects to sync each directory once
    (:func:`sync_names`) before it signs over them.
    """

    def durable(directory: Path) -> None:
        if unsynced is None:
            _durable_names(directory)
        else:
            unsynced.add(directory)

    with contextlib.suppress(OSError):
        if os.path.samefile(checkpoint, obj):
            # The checkpoint is the cache object already; made durable again, for a
            # process killed before it synced the name leaves it only in the page cache.
            durable(obj.parent)
            durable(obj.parent.parent)
            return "present"
    try:
        mkdir_durable(obj.parent)
    except OSError as e:  # a full or read-only cache: say so, and which
        raise _cache_failed(checkpoint, obj, e) from None
    tmp = obj.with_name(f".{obj.name}.{uuid.uuid4().hex[:8]}.tmp")
    failed: OSError | None = None  # the last kind's failure: a full disk says so
    for kind in types if owned else user_file_types(types):
        try:
            if kind == "reflink":
                _reflink(checkpoint, tmp)
            elif kind == "hardlink":
                os.link(checkpoint, tmp, follow_symlinks=False)
            elif kind == "symlink":
                # The data moves into the cache; the checkpoint's name points at it.
                os.replace(checkpoint, tmp)
                os.chmod(tmp, 0o444)
                os.replace(tmp, obj)
                durable(obj.parent)
                checkpoint.symlink_to(obj)
                durable(checkpoint.parent)
                return kind
            elif kind == "copy":
                shutil.copyfile(checkpoint, tmp)
                with open(tmp, "rb") as f:
                    os.fsync(f.fileno())
            else:
                continue
        except OSError as e:
            tmp.unlink(missing_ok=True)
            failed = e
            continue
        try:
            os.chmod(tmp, 0o444)
            os.replace(tmp, obj)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise _cache_failed(checkpoint, obj, e) from None
        durable(obj.parent)
        return kind
    last = "" if failed is None else f": {failed.strerror or failed}"
    raise StorageError(
        f"cannot put the checkpoint into DVC's cache with cache.type {','.join(types)}{last}",
        path=checkpoint,
    )


def _durable_names(directory: Path) -> None:
    """fsync ``directory`` after a rename or link into it. A StorageError (not an
    OSError, which would make the caller try the next link type) when it fails: the
    name may not survive a power cut, so nothing may be signed over it."""
    try:
        fsync_dir(directory)
    except OSError as e:
        raise StorageError(
            f"cannot make DVC's cache durable: fsync of {directory}: {e.strerror or e}",
            path=directory,
        ) from None


def sync_names(directories: set[Path]) -> None:
    """fsync each of ``directories`` (what :func:`link_into_cache` left in ``unsynced``),
    deepest first: then every object linked is durable under its name."""
    for directory in sorted(directories, key=lambda d: len(d.parts), reverse=True):
        _durable_names(directory)


def _cache_failed(checkpoint: Path, obj: Path, e: OSError) -> StorageError:
    return StorageError(
        f"cannot put the checkpoint into DVC's cache at {obj.parent}: {e.strerror or e}",
        path=checkpoint,
    )


def _read_gitignore(gitignore: Path) -> str:
    """``gitignore``'s text ("" when there is none), read never through a symbolic link:
    anyone with write access to the repository may have committed one to ``../../.env``,
    and rewriting it would copy the owner's secrets into a tracked file."""
    try:
        data = read_owned(gitignore)
    except UnsafeFile as e:
        raise StorageError(
            f"{e.reason}: kaudit edits a run directory's .gitignore only as a regular "
            "file (never through a link); remove it, or replace it with a plain file",
            path=gitignore,
        ) from None
    try:
        return "" if data is None else data.decode("utf-8")
    except UnicodeDecodeError:
        raise StorageError("is not UTF-8 text: not edited", path=gitignore) from None


def check_gitignore(directory: Path) -> None:
    """StorageError unless ``directory/.gitignore`` is missing or a file kaudit may edit
    (see :func:`ensure_ignored`): to refuse before anything else is written there."""
    _read_gitignore(directory / ".gitignore")


def ensure_ignored(directory: Path, pattern: str) -> None:
    """Add ``pattern`` to ``directory/.gitignore`` unless it is there.

    StorageError, nothing written, when the ``.gitignore`` there is a symbolic link, not a
    regular file (a FIFO is never waited on) or larger than
    :data:`~kronos_audit._internal.safeio.TEXT_LIMIT`."""
    gitignore = directory / ".gitignore"
    text = _read_gitignore(gitignore)
    if pattern in text.splitlines():
        return
    if text and not text.endswith("\n"):
        text += "\n"
    write_atomic(gitignore, (text + pattern + "\n").encode())


def forget_ignored(directory: Path, patterns: Sequence[str]) -> None:
    """Remove these exact lines from ``directory/.gitignore`` (none there: nothing changes).
    Refused as :func:`ensure_ignored` refuses."""
    gitignore = directory / ".gitignore"
    lines = _read_gitignore(gitignore).splitlines()
    kept = [line for line in lines if line not in set(patterns)]
    if kept != lines:
        write_atomic(gitignore, "".join(line + "\n" for line in kept).encode())


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
    """(md5, size) from a single-output ``.dvc`` file, or None if it is not one (or is not
    a small regular file: anyone may have written it, so never a FIFO, /dev/zero or a
    symbolic link to another run's ``.dvc`` file)."""
    md5: str | None = None
    size: int | None = None
    try:
        lines = read_regular(path, KEY_LIMIT, follow_symlinks=False).decode("utf-8").splitlines()
    except (UnsafeFile, UnicodeDecodeError):
        return None
    for line in lines:
        key, _, value = line.strip().lstrip("- ").partition(":")
        if key == "md5" and MD5_PATTERN.fullmatch(value.strip()):
            md5 = value.strip()
        elif key == "size" and value.strip().isdigit() and len(value.strip()) < 20:
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
    settings: tuple[Path, tuple[str, ...]] | None = None,
) -> Path:
    """Track a checkpoint with DVC: cache object, ``.dvc`` file, git-ignore entry.

    ``settings``: DVC's cache directory and link types (:func:`cache_settings`), when the
    caller resolved them once for many checkpoints; else they are read now.

    ``owned``: kaudit created the checkpoint, so it may make it read-only or move it into
    the cache (see :func:`link_into_cache`); otherwise the user's file is left as it is.
    """
    check_gitignore(checkpoint.parent)  # refused before the cache gets anything
    cache_dir, types = settings if settings is not None else cache_settings(project)
    how = link_into_cache(checkpoint, cache_object_path(cache_dir, md5), types, owned=owned)
    if how == "copy":
        log.info("%s: copied into DVC's cache (cache.type allows no link here)", checkpoint)
    ensure_ignored(checkpoint.parent, ignore_pattern or f"/{checkpoint.name}")
    return write_dvc_file(checkpoint, md5, size)


def track_staged(
    checkpoint: Path,
    staged: Path,
    md5: str,
    size: int,
    cache_dir: Path,
    *,
    ignore_pattern: str | None = None,
) -> Path:
    """Track ``checkpoint`` with DVC from ``staged``, the private copy of its bytes that
    :func:`stage_copy` made and the caller hashed (``md5``, ``size``): the copy becomes
    the cache object, and the ``.dvc`` file and git-ignore entry are written. The
    checkpoint itself is not read again nor changed."""
    check_gitignore(checkpoint.parent)
    commit_staged(staged, cache_object_path(cache_dir, md5))
    ensure_ignored(checkpoint.parent, ignore_pattern or f"/{checkpoint.name}")
    return write_dvc_file(checkpoint, md5, size)


def link_from_cache(obj: Path, checkpoint: Path, types: Sequence[str]) -> str:
    """Give the new name ``checkpoint`` (one kaudit writes and never writes again in
    place) the bytes of DVC's cache object ``obj``, which the caller has just made from
    hashed bytes: a hard link to the read-only object where ``types`` allow one (no second
    copy), else a reflink, else a copy, made read-only; return how. Never over a name
    that exists (StorageError)."""
    tmp = checkpoint.with_name(f".kaudit-tmp-{checkpoint.name}-{uuid.uuid4().hex[:8]}")
    how = "copy"
    try:
        for kind in (*types, "copy"):
            try:
                if kind == "hardlink":
                    os.link(obj, tmp, follow_symlinks=False)
                elif kind == "reflink":
                    _reflink(obj, tmp)
                elif kind == "copy":
                    shutil.copyfile(obj, tmp, follow_symlinks=False)
                    with open(tmp, "rb") as f:
                        os.fsync(f.fileno())
                else:
                    continue
            except OSError:
                tmp.unlink(missing_ok=True)
                if kind == "copy":
                    raise
                continue
            how = kind
            break
        if how != "hardlink":
            os.chmod(tmp, 0o444)
        os.link(tmp, checkpoint, follow_symlinks=False)  # never over what is there
    except FileExistsError:
        raise StorageError("exists already: not replaced", path=checkpoint) from None
    except OSError as e:
        raise StorageError(
            f"cannot write it from DVC's cache: {e.strerror or e}", path=checkpoint
        ) from None
    finally:
        tmp.unlink(missing_ok=True)
    _durable_names(checkpoint.parent)
    return how


def configure_cache_links(project: Project) -> bool:
    """Set ``cache.type`` so checkpoints enter the cache by link, unless one is set."""
    if _dvc_config(project)["cache"].get("type"):
        return False  # chosen already, at some level: the user's or the repository's
    check_dvc_config(project)
    load_dvc()
    from dvc.repo import Repo

    repo = Repo(str(project.root))
    with repo.config.edit() as conf:
        conf["cache"]["type"] = LINK_FRIENDLY_CACHE_TYPES
    return True


def init_dvc(project: Project) -> bool:
    """Set DVC up in the project's repository unless it is, and let checkpoints enter its
    cache by link (:func:`configure_cache_links`, unless the repository chose a
    ``cache.type``). Returns whether DVC was initialised now."""
    created = False
    if not (project.root / ".dvc").is_dir():
        load_dvc()
        from dvc.repo.init import init as dvc_init  # slow to import; only init needs it

        # DVC logs a greeting at INFO; our caller reports what was done, once.
        with quiet_dvc():
            try:
                dvc_init(root_dir=str(project.root))
            except Exception as e:  # DVC raises many types: say which, and stop
                raise ProjectError(f"dvc init failed: {e}", path=project.root) from None
        created = True
    configure_cache_links(project)
    return created
