"""DVC remotes: pushing checkpoints, asking what a remote holds, fetching what a signed
manifest names, and configuring a remote without putting its credentials in git.

Pushing and asking a remote what it holds go through DVC's API. Fetching takes only the
object a verified manifest signs (see :mod:`kronos_audit.storage.fetch`).

DVC's push over SSH writes objects in place, so a push killed midway can leave a
truncated object under its final name, which DVC would then take as pushed. kaudit
compares each remote object's size with the recorded one and deletes a short one before
pushing again: a partial or tampered object is never taken as valid.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from kronos_audit._internal import git
from kronos_audit._internal.secrets import SplitURL, split_credentials
from kronos_audit.errors import Error, StorageError
from kronos_audit.project import Project
from kronos_audit.storage._dvc import (
    dvc_error,
    object_path,
    quiet_dvc,
    remote_odb,
    transfer_failures,
)
from kronos_audit.storage.fetch import FetchItem, RemoteSource, fetch_one
from kronos_audit.storage.tracking import (
    cache_object_path,
    cache_settings,
    dvc_file_for,
    read_dvc_file,
)

log = logging.getLogger("kronos_audit.storage")


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
            return remote_odb(self.repo, self.remote_name(remote))
        except StorageError:
            raise
        except Exception as e:  # DVC's errors are many: name it and stop
            raise StorageError(f"remote: {dvc_error(e)}", path=self.project.root) from None

    def remote_sizes(self, md5s: Iterable[str], remote: str | None = None) -> dict[str, int | None]:
        """Size of each object in the remote, None where it is absent."""
        odb = self._odb(remote)
        found: dict[str, int | None] = {}
        for md5 in set(md5s):
            try:
                found[md5] = int(odb.fs.info(object_path(odb, md5))["size"])
            except FileNotFoundError:
                found[md5] = None
            except Exception as e:
                raise StorageError(
                    f"remote unreachable: {dvc_error(e)}", path=self.project.root
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
                odb.fs.rm_file(object_path(odb, md5))
        try:
            with quiet_dvc(), transfer_failures() as reasons:
                pushed = self.repo.push(
                    targets=[str(dvc_file_for(c)) for c in checkpoints],
                    remote=self.remote_name(remote),
                )
        except Exception as e:
            # DVC counts the files it failed to upload; why (a full or read-only remote)
            # was in its lines for each, kept back so that the user reads one.
            why = f": {'; '.join(dict.fromkeys(reasons))}" if reasons else ""
            raise StorageError(
                f"push failed: {dvc_error(e)}{why}", path=self.project.root
            ) from None
        return int(pushed or 0)

    def discard(self, checkpoint: Path) -> None:
        """Remove a checkpoint that failed verification from the work tree and the cache,
        so that nothing takes it for valid later."""
        entry = read_dvc_file(dvc_file_for(checkpoint))
        checkpoint.unlink(missing_ok=True)
        if entry is not None:
            cache_dir, _ = cache_settings(self.project)
            cache_object_path(cache_dir, entry[0]).unlink(missing_ok=True)

    def fetch(
        self, checkpoint: Path, *, md5: str, sha256: str, size: int, remote: str | None = None
    ) -> None:
        """Fetch the object whose md5 a verified manifest records to ``checkpoint`` (the
        checkpoint's own path, beside its manifest), checking it before it becomes visible.

        Nothing else is read or trusted: not the ``.dvc`` file, not its ``path``. The bytes
        come from DVC's cache if it holds them (a cache object that does not match is
        removed), else are streamed from the remote, into a temporary file beside the
        checkpoint, reading at most one byte more than ``size``. Only if size, sha256 and
        md5 all match is the temporary put in place, never over anything (a file or a
        symbolic link at ``checkpoint`` is refused), and the object put into DVC's cache.

        Raises TamperedData (exit 1) if the remote's object is not the signed data, and
        StorageError (exit 2) if it is not in the remote, the remote is unreachable, or
        ``checkpoint`` exists; then nothing has been written.
        """
        failed = self.fetch_many([FetchItem(checkpoint, md5, sha256, size)], remote)
        if failed:
            raise failed[checkpoint]

    def fetch_many(
        self, items: Iterable[FetchItem], remote: str | None = None
    ) -> dict[Path, Error]:
        """:meth:`fetch` each item, opening the remote once (and giving up on it for the
        rest once it proves unreachable); return the error of each checkpoint not fetched.
        """
        cache_dir, types = cache_settings(self.project)
        source = RemoteSource(self._open_remote, remote)
        failed: dict[Path, Error] = {}
        for item in dict.fromkeys(items):
            try:
                fetch_one(item, cache_dir, types, source)
            except Error as e:
                failed[item.checkpoint] = e
        return failed

    def _open_remote(self, name: str | None) -> tuple[str, Any]:
        chosen = self.remote_name(name)
        return chosen, self._odb(chosen)


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
    relative = str(path.relative_to(project.root))
    try:
        tracked = git.ls_files(project.root, [relative])
        ignored = git.is_ignored(project.root, relative)
    except git.GitError as e:
        raise StorageError(
            f"cannot ask git about {relative}: {e.message}", path=project.root
        ) from None
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
            f"cannot add the DVC remote: {split.scrub(dvc_error(e))}", path=project.root
        ) from None
