"""Checkpoint storage: DVC-tracked files, DVC's cache, and DVC remotes.

The rooms follow dvc-data's split:

- :mod:`~kronos_audit.storage.tracking`: a checkpoint enters DVC's cache by link, gets a
  ``.dvc`` file and a git-ignore entry, without importing DVC; setting DVC up.
- :mod:`~kronos_audit.storage.remote`: :class:`Storage` pushes to a DVC remote, asks what
  it holds and fetches what a signed manifest names (:mod:`~kronos_audit.storage.fetch`
  checks it before it becomes visible); :func:`configure_remote` keeps credentials out of
  git.
- :mod:`~kronos_audit.storage.runs`: :class:`RunFiles`, a run's small files (its
  manifests) beside DVC's objects in the remote, ``kaudit/runs/<run>/``, through DVC's
  file system for that remote; listing and reading bounded.

Storage knows nothing of manifests: callers hand it the md5, sha256 and size a verified
manifest records. DVC's own log chatter is kept to its loggers (see ``_dvc``).
"""

from kronos_audit.storage.fetch import FETCH_CHUNK, FETCHED_MODE, FetchItem
from kronos_audit.storage.remote import Storage, configure_remote
from kronos_audit.storage.runs import RunFiles
from kronos_audit.storage.tracking import (
    DEFAULT_CACHE_TYPES,
    DVC_SUFFIX,
    FICLONE,
    LINK_FRIENDLY_CACHE_TYPES,
    cache_object_path,
    cache_settings,
    configure_cache_links,
    dvc_file_for,
    ensure_ignored,
    forget_ignored,
    init_dvc,
    link_into_cache,
    read_dvc_file,
    remove_cache_object,
    track,
    write_dvc_file,
)

__all__ = [
    "DEFAULT_CACHE_TYPES",
    "DVC_SUFFIX",
    "FETCHED_MODE",
    "FETCH_CHUNK",
    "FICLONE",
    "LINK_FRIENDLY_CACHE_TYPES",
    "FetchItem",
    "RunFiles",
    "Storage",
    "cache_object_path",
    "cache_settings",
    "configure_cache_links",
    "configure_remote",
    "dvc_file_for",
    "ensure_ignored",
    "forget_ignored",
    "init_dvc",
    "link_into_cache",
    "read_dvc_file",
    "remove_cache_object",
    "track",
    "write_dvc_file",
]
