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
import urllib.parse
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from kronos_audit._internal import git
from kronos_audit._internal.secrets import SplitURL, is_secret_param, redact, split_credentials
from kronos_audit.errors import Error, StorageError
from kronos_audit.project import Project
from kronos_audit.storage._dvc import dvc_error, object_path, quiet_dvc, remote_odb
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
        # Every remote operation of kaudit names its remote here first: the one place
        # where credentials are checked against the URL they were given for.
        check_credentials_bound(self.repo.config, str(chosen), self.project.root)
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
            with quiet_dvc():
                pushed = self.repo.push(
                    targets=[str(dvc_file_for(c)) for c in checkpoints],
                    remote=self.remote_name(remote),
                )
        except Exception as e:
            raise StorageError(f"push failed: {dvc_error(e)}", path=self.project.root) from None
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
# Remote options that hold or unlock a credential without being named like one.
_MORE_CREDENTIAL_OPTIONS = frozenset({"access_key_id", "connection_string", "credentialpath"})
# The configuration levels that can hold a remote's credentials, in DVC's merge order
# (later wins). The repository's own `.dvc/config` is not one: anyone who can commit
# writes it, so whatever it holds is not the owner's secret.
_CREDENTIAL_LEVELS = ("system", "global", "local")


def _is_credential(option: str) -> bool:
    return is_secret_param(option) or option in _MORE_CREDENTIAL_OPTIONS


def _comparable(url: str) -> tuple[str, ...]:
    """``url`` as compared for binding: without credentials, scheme and host in lower
    case, the default port and a trailing ``/`` not mattering."""
    public = split_credentials(url).public
    if "://" not in public:
        return ("", public.rstrip("/"))
    parts = urllib.parse.urlsplit(public)
    try:
        port = parts.port
    except ValueError:
        port = None
    return (
        parts.scheme.lower(),
        (parts.hostname or "").lower(),
        str(port or ""),
        (parts.username or ""),
        parts.path.rstrip("/"),
        parts.query,
    )


def check_credentials_bound(config: Any, name: str, root: Path) -> None:
    """Refuse to use remote ``name`` if any credential for it would go elsewhere than the
    URL it was given for.

    A credential kept outside the tracked ``.dvc/config`` (DVC's local, global or system
    config) counts only beside a ``url`` in the same file, the URL it is bound to (what
    ``kaudit init --remote`` writes). StorageError (exit 2), before DVC opens any
    connection, when such a file holds a credential but no URL, or when the URL DVC would
    connect to, or the one the tracked ``.dvc/config`` names, is not that bound URL: a
    commit that only changes the URL must not send the owner's password to its host.
    The message names the remote, both URLs (credentials masked) and how to accept the
    new URL; it never shows a secret.
    """
    try:
        levels = {level: config.read(level)["remote"].get(name) or {} for level in config.files}
    except Exception as e:  # a config file DVC cannot parse: name it and stop
        raise StorageError(f"cannot read DVC's config: {dvc_error(e)}", path=root) from None
    effective = config["remote"].get(name, {}).get("url")
    tracked = levels.get("repo", {}).get("url")
    for level in _CREDENTIAL_LEVELS:
        options = levels.get(level, {})
        if not any(_is_credential(k) for k in options):
            continue
        where = _level_file(config, level, root)
        bound = options.get("url")
        if bound is None:
            raise StorageError(
                f"DVC remote {name!r}: its credentials in {where} are bound to no URL, so "
                "kaudit does not send them: bind them to the URL they are for with "
                f"`dvc remote modify --{level} {name} url URL` (or give them again with "
                "`kaudit init --remote URL`)",
                path=root,
            )
        for other, what in ((effective, "DVC would connect to"), (tracked, ".dvc/config names")):
            if other is not None and _comparable(other) != _comparable(bound):
                raise StorageError(
                    f"DVC remote {name!r}: {what} {redact(str(other))}, but its credentials "
                    f"in {where} are for {redact(str(bound))}, so kaudit does not send them "
                    "there; if the new URL is right, give its credentials with `kaudit init "
                    f"--remote NEWURL` (or `dvc remote modify --{level} {name} url NEWURL`)",
                    path=root,
                )


def _level_file(config: Any, level: str, root: Path) -> str:
    path = Path(config.files[level])
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


def _local_credentials(split: SplitURL) -> dict[str, str]:
    """What goes to DVC's local config (``.dvc/config.local``) for ``split``'s remote.

    Credentials always go with the URL they were given for (``url``, which then also
    overrides the tracked one): :func:`check_credentials_bound` refuses to send them to
    any other."""
    if not split.has_secret:
        return {}
    if split.secret_params or split.scheme not in _CREDENTIAL_OPTIONS:
        # A token in the query string (a presigned or SAS URL) or in the userinfo of a
        # remote type without a user/password option: DVC has no option to hold it, so the
        # whole URL stays in the local config, overriding the public one.
        return {"url": split.url}
    options: dict[str, str] = {"url": split.public}
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


def _remote_type(url: str | None) -> str:
    """What DVC's schema checks a remote's options against: its URL's scheme."""
    if url is None:
        return ""
    scheme = split_credentials(url).scheme
    return {"https": "http", "webdavs": "webdav"}.get(scheme, scheme)


def configure_remote(project: Project, url: str, name: str = "storage") -> None:
    """Make ``url`` the repository's default DVC remote (``dvc remote add -d -f``).

    Credentials never reach ``.dvc/config``, which git tracks: a password or token in the
    URL goes to DVC's local config (``.dvc/config.local``, git-ignored, mode 0600) as the
    remote's ``user``/``password`` options (ssh, http(s), webdav), or, for a token DVC
    has no option for (a query-string token), as the whole URL overriding the public one
    there. Either way the URL goes beside them, binding them to it
    (:func:`check_credentials_bound`). DVC merges the two when it connects. Error
    messages never show the secret.

    Replacing a remote replaces its credentials and URL in the local config: an earlier
    password is never left to be sent to the new URL. The user's other local options of
    that remote stay while the remote's type stays; a remote of another type (ssh to a
    directory, say) takes none of them, since DVC's schema would refuse them. Nothing is
    changed unless the whole configuration validates afterwards.
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
        previous_local = repo.config.read("local")["remote"].get(name)
        local_existed = os.path.lexists(local_path)
        try:
            if local or previous_local is not None:
                if local:
                    _make_private(local_path)
                old_type = _remote_type(
                    (previous_local or {}).get("url") or (previous[0] or {}).get("url")
                )
                same_type = old_type == _remote_type(split.public)
                # Not validated yet: the old credentials may not fit the new remote's
                # type until they are gone (and the new ones until its URL is in).
                with repo.config.edit("local", validate=False) as conf:
                    kept = {
                        k: v
                        for k, v in conf["remote"].pop(name, {}).items()
                        if same_type and k not in _CREDENTIAL_KEYS and not _is_credential(k)
                    }
                    if kept or local:
                        conf["remote"][name] = kept | local
            with repo.config.edit(validate=False) as conf:
                conf["remote"][name] = {"url": split.public}
                conf["core"]["remote"] = name
            repo.config.validate(repo.config.load_config_to_level())
        except Exception:
            # Leave no remote half-added, nor the old one's credentials half-removed.
            with repo.config.edit(validate=False) as conf:
                for section, key, value in (
                    ("remote", name, previous[0]),
                    ("core", "remote", previous[1]),
                ):
                    if value is None:
                        conf[section].pop(key, None)
                    else:
                        conf[section][key] = value
            if not local_existed:
                local_path.unlink(missing_ok=True)
            elif local_path.is_file() and not local_path.is_symlink():
                with repo.config.edit("local", validate=False) as conf:
                    if previous_local is None:
                        conf["remote"].pop(name, None)
                    else:
                        conf["remote"][name] = previous_local
            raise
    except StorageError:
        raise
    except Exception as e:
        raise StorageError(
            f"cannot add the DVC remote: {split.scrub(dvc_error(e))}", path=project.root
        ) from None
