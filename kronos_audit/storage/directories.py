"""Tracking a directory step with DVC as one directory output, as ``dvc add DIR`` would.

Each file's bytes enter DVC's cache under their md5 (linked, as a checkpoint file's are:
:func:`~kronos_audit.storage.tracking.link_into_cache`), the directory's listing enters it
as ``<md5>.dir`` (:func:`~kronos_audit.checkpoint.directory.dvc_listing`, the bytes DVC
itself writes), and ``DIR.dvc`` beside the directory names ``<md5>.dir``, its size and
its file count. A plain ``dvc pull`` in a fresh clone then restores the directory, and
``dvc status`` finds it unchanged. The listing is always written from a signed file list:
one already in the cache under that md5 that holds other bytes is replaced, never used.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from kronos_audit._internal.fsutil import mkdir_durable, write_atomic
from kronos_audit._internal.safeio import KEY_LIMIT, UnsafeFile, read_regular
from kronos_audit.checkpoint.directory import FileEntry, dvc_listing, path_problem
from kronos_audit.errors import StorageError
from kronos_audit.project.repository import Project
from kronos_audit.statement.manifest import Manifest
from kronos_audit.storage._dvc import dvc_error, object_path, push_objects, quiet_dvc, remote_odb
from kronos_audit.storage.tracking import (
    MD5_PATTERN,
    cache_object_path,
    cache_settings,
    check_gitignore,
    dvc_file_for,
    ensure_ignored,
    link_into_cache,
    sync_names,
)

if TYPE_CHECKING:
    from kronos_audit.storage.fetch import RemoteSource
    from kronos_audit.storage.remote import Storage

DIR_SUFFIX = ".dir"
"""DVC's suffix of a directory's listing object (its md5 ``<md5>.dir``)."""
LISTING_ENTRY = 256
"""The most bytes a listing read back may spend on each file it may name."""


def listing_md5(files: Sequence[FileEntry]) -> str:
    """The md5 of the directory's DVC listing: its address, without ``.dir``."""
    import hashlib

    return hashlib.md5(dvc_listing(files), usedforsecurity=False).hexdigest()


def listing_object_path(cache_dir: Path, md5: str) -> Path:
    """Where DVC keeps the listing ``<md5>.dir`` in the cache ``cache_dir``."""
    return cache_dir / "files" / "md5" / md5[:2] / (md5[2:] + DIR_SUFFIX)


def write_listing(cache_dir: Path, files: Sequence[FileEntry]) -> str:
    """Put the DVC listing of ``files`` into the cache (durable, read-only, as DVC keeps
    it) unless it is there with exactly these bytes; return its md5."""
    data = dvc_listing(files)
    md5 = listing_md5(files)
    obj = listing_object_path(cache_dir, md5)
    try:
        if read_regular(obj, len(data), follow_symlinks=False) == data:
            return md5
    except (UnsafeFile, OSError):
        pass  # absent, or not the listing: written below
    try:
        mkdir_durable(obj.parent)
        if os.path.lexists(obj) and not stat.S_ISDIR(os.lstat(obj).st_mode):
            os.unlink(obj)  # another file under the name (read-only, or a link): replaced
        write_atomic(obj, data)
        os.chmod(obj, 0o444)
    except OSError as e:
        raise StorageError(
            f"cannot put the directory's listing into DVC's cache: {e.strerror or e}", path=obj
        ) from None
    return md5


def _quoted(name: str) -> str:
    if name.replace(".", "").replace("-", "").replace("_", "").isalnum():
        return name
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


def write_directory_dvc_file(directory: Path, md5: str, size: int, nfiles: int) -> Path:
    """The ``DIR.dvc`` file ``dvc add DIR`` would write."""
    path = dvc_file_for(directory)
    write_atomic(
        path,
        (
            f"outs:\n- md5: {md5}{DIR_SUFFIX}\n  size: {size}\n  nfiles: {nfiles}\n"
            f"  hash: md5\n  path: {_quoted(directory.name)}\n"
        ).encode(),
    )
    return path


def read_directory_dvc_file(path: Path) -> tuple[str, int, int] | None:
    """(md5 without ``.dir``, size, nfiles) from a directory's ``.dvc`` file, or None when it
    is not one (or not a small regular file: never a FIFO or a link)."""
    values: dict[str, str] = {}
    try:
        text = read_regular(path, KEY_LIMIT, follow_symlinks=False).decode("utf-8")
    except (UnsafeFile, UnicodeDecodeError):
        return None
    for line in text.splitlines():
        key, _, value = line.strip().lstrip("- ").partition(":")
        values.setdefault(key, value.strip())
    md5 = values.get("md5", "")
    size, nfiles = values.get("size", ""), values.get("nfiles", "")
    if not md5.endswith(DIR_SUFFIX) or not MD5_PATTERN.fullmatch(md5[: -len(DIR_SUFFIX)]):
        return None
    if not (size.isdigit() and nfiles.isdigit() and len(size) < 20 and len(nfiles) < 20):
        return None
    return md5[: -len(DIR_SUFFIX)], int(size), int(nfiles)


def track_directory(
    project: Project,
    directory: Path,
    files: Sequence[FileEntry],
    *,
    settings: tuple[Path, tuple[str, ...]] | None = None,
) -> Path:
    """Track a directory step with DVC as one output: every file's cache object, the
    listing object, ``DIR.dvc`` and a git-ignore entry for ``/DIR``. The user's files are
    left as they are (never moved into the cache). Returns the ``.dvc`` file's path."""
    check_gitignore(directory.parent)  # refused before the cache gets anything
    cache_dir, types = settings if settings is not None else cache_settings(project)
    unsynced: set[Path] = set()
    for f in files:
        obj = cache_object_path(cache_dir, f.md5)
        link_into_cache(directory / f.path, obj, types, owned=False, unsynced=unsynced)
    sync_names(unsynced)  # each fan-out directory once, not once per file
    md5 = write_listing(cache_dir, files)
    ensure_ignored(directory.parent, f"/{directory.name}")
    return write_directory_dvc_file(directory, md5, sum(f.size for f in files), len(files))


def push_listings(
    storage: Storage, manifests: Sequence[Manifest], remote: str | None = None
) -> dict[Path, str]:
    """Upload the DVC listing of each directory step of ``manifests`` (verified by the
    caller; its files pushed already), written into the cache from the signed files
    first, so that a plain ``dvc pull`` finds it. Return, by directory, why a listing is
    not in the remote afterwards (empty when all are)."""
    listed = {
        m.checkpoint_path: m.record.directory.files
        for m in manifests
        if m.record.directory is not None
    }
    return _push_listings(storage, listed, remote)


def push_listing(
    storage: Storage, directory: Path, files: Sequence[FileEntry], remote: str | None = None
) -> str | None:
    """:func:`push_listings` of one directory of ``files`` (a campaign's records, tracked
    by :func:`track_directory`): why its listing is not in the remote afterwards, or None."""
    return _push_listings(storage, {directory: files}, remote).get(directory)


def _push_listings(
    storage: Storage, listed: Mapping[Path, Sequence[FileEntry]], remote: str | None
) -> dict[Path, str]:
    cache_dir, _ = storage.cache_settings()
    name = storage.remote_name(remote)
    oids = {path: write_listing(cache_dir, files) + DIR_SUFFIX for path, files in listed.items()}
    if not oids:
        return {}
    try:
        with quiet_dvc():
            push_objects(storage.repo, sorted(set(oids.values())), name)
        odb = remote_odb(storage.repo, name)
    except Exception as e:  # DVC raises many types: say which, and stop
        raise StorageError(f"push failed: {dvc_error(e)}", path=storage.project.root) from None
    problems: dict[Path, str] = {}
    for path, oid in oids.items():
        try:
            odb.fs.info(object_path(odb, oid))
        except FileNotFoundError:
            problems[path] = f"DVC's listing of the directory, {oid}, is not in the remote"
        except Exception as e:
            problems[path] = f"the remote cannot be asked for {oid}: {dvc_error(e)}"
    return problems


def read_listing(source: RemoteSource, directory: Path, most: int) -> dict[str, str]:
    """The files DVC's listing of ``directory`` names (relative path: md5), read through
    its ``DIR.dvc`` from ``source``: unsigned, so only an address, and at most ``most``
    entries. StorageError when the ``.dvc`` file or the listing is not one, or names a
    file that is not a plain name inside the directory (nothing outside it is ever
    fetched); TamperedData when the listing is not of its md5."""
    dvc_file = dvc_file_for(directory)
    found = read_directory_dvc_file(dvc_file)
    if found is None:
        raise StorageError("not a DVC directory's .dvc file (or not here)", path=dvc_file)
    data = source.read_bounded(found[0] + DIR_SUFFIX, dvc_file, most * LISTING_ENTRY)
    try:
        entries = json.loads(data)
        listed = {e["relpath"]: e["md5"] for e in entries}
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
        raise StorageError("its DVC listing is not one", path=dvc_file) from None
    for relpath, md5 in listed.items():
        if not isinstance(relpath, str) or "/" in relpath or path_problem(relpath) is not None:
            raise StorageError(
                f"its DVC listing names {str(relpath)[:80]!r}, not a file of "
                f"{directory.name}/: nothing fetched",
                path=dvc_file,
            )
        if not isinstance(md5, str) or not MD5_PATTERN.fullmatch(md5):
            raise StorageError(f"its DVC listing's md5 of {relpath!r} is not one", path=dvc_file)
    return listed


__all__ = [
    "DIR_SUFFIX",
    "LISTING_ENTRY",
    "listing_md5",
    "listing_object_path",
    "push_listing",
    "push_listings",
    "read_directory_dvc_file",
    "read_listing",
    "track_directory",
    "write_directory_dvc_file",
    "write_listing",
]
