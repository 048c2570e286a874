"""DVC remotes: pushing checkpoints, asking what a remote holds, fetching what a signed
manifest names, and configuring a remote without putting its credentials in git.

Pushing and asking a remote what it holds go through DVC. Both push and fetch take only
the objects verified manifests sign, by md5, never what a ``.dvc`` file says (see
:mod:`kronos_audit.storage.fetch`); a push is confirmed afterwards: every object it was
given must then be in the remote at its signed size.

DVC uploads each object under a temporary name and renames it; a push killed midway
leaves that temporary, which a later push removes once it is provably stale, and two
pushes on one machine upload an object once (:mod:`~kronos_audit.storage.uploads`). An
object truncated under its final name all the same (an older plugin, or tampering) is
not taken as pushed: kaudit compares each remote object's size with the signed one and
deletes one of another size before pushing again, once the local bytes that replace it
are verified; none is deleted for bytes that are not the signed ones.
"""

from __future__ import annotations

import logging
import os
import stat
import time
import urllib.parse
from collections.abc import Callable, Container, Iterable, Sequence
from pathlib import Path
from typing import Any

from kronos_audit._internal import git
from kronos_audit._internal.secrets import SplitURL, is_secret_param, redact, split_credentials
from kronos_audit.errors import Error, PushIncomplete, RemoteUnreachable, StorageError
from kronos_audit.project.repository import Project
from kronos_audit.storage._dvc import (
    dvc_error,
    load_dvc,
    local_cache_path,
    object_path,
    push_objects,
    quiet_dvc,
    remote_odb,
    transfer_failures,
)
from kronos_audit.storage.fetch import (
    FetchItem,
    RemoteSource,
    cache_from_checkpoint,
    cache_not_signed,
    fetch_one,
    local_mismatch,
    read_object,
)
from kronos_audit.storage.tracking import (
    cache_object_path,
    cache_settings,
    check_dvc_config,
    default_remote,
    dvc_file_for,
    ensure_ignored,
    read_dvc_file,
    remove_cache_object,
    write_dvc_file,
)
from kronos_audit.storage.uploads import (
    LOCKS_AT_ONCE,
    UPLOAD_WAIT,
    PushLocks,
    remove_stale_uploads,
)

log = logging.getLogger("kronos_audit.storage")

REPAIRED = (
    "signed but not in DVC's cache here: put there from its bytes here, verified against "
    "the signed size, sha256 and md5"
)
"""What is said of a checkpoint whose cache object :meth:`Storage.repair_tracking` put
back."""


class Storage:
    """DVC operations for one repository; DVC is imported on first use."""

    def __init__(self, project: Project) -> None:
        self.project = project
        self._repo: Any = None
        self._cache: tuple[Path, tuple[str, ...]] | None = None

    @property
    def repo(self) -> Any:
        if self._repo is None:
            self._require_dvc()
            check_dvc_config(self.project)
            load_dvc()
            from dvc.repo import Repo

            self._repo = Repo(str(self.project.root))
        return self._repo

    def has_default_remote(self) -> bool:
        """Whether DVC has a default remote here (``core.remote``): where a command that
        names none goes. Read from DVC's configuration alone, without opening a DVC
        repository (which costs most of a second)."""
        self._require_dvc()
        return default_remote(self.project) is not None

    def _require_dvc(self) -> None:
        if not (self.project.root / ".dvc").is_dir():
            raise StorageError("DVC is not set up here: run `kaudit init`", path=self.project.root)

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
        """Size of each object in the remote, None where it is absent.

        Raises RemoteUnreachable when the remote cannot be asked (a server down, a path
        that cannot be read), StorageError when no such remote is configured."""
        name = self.remote_name(remote)
        odb = self._odb(name)
        found: dict[str, int | None] = {}
        for md5 in set(md5s):
            try:
                found[md5] = int(odb.fs.info(object_path(odb, md5))["size"])
            except FileNotFoundError:
                found[md5] = None
            except Exception as e:
                raise RemoteUnreachable(
                    f"the DVC remote {name!r} is unreachable: {dvc_error(e)}",
                    path=self.project.root,
                ) from None
        return found

    def cache_settings(self) -> tuple[Path, tuple[str, ...]]:
        """DVC's cache directory and link types, resolved once for this Storage (see
        :func:`~kronos_audit.storage.tracking.cache_settings`)."""
        if self._cache is None:
            self._cache = cache_settings(self.project)
        return self._cache

    def _dvc_cache_is(self, cache_dir: Path) -> None:
        """Refuse to push unless DVC's cache is the one kaudit put the objects in."""
        try:
            dvc_md5_dir = Path(local_cache_path(self.repo))
        except StorageError:
            raise
        except Exception as e:
            raise StorageError(f"DVC's cache: {dvc_error(e)}", path=self.project.root) from None
        ours = cache_dir / "files" / "md5"
        if dvc_md5_dir.resolve() != ours.resolve():
            raise StorageError(
                f"DVC's cache is {dvc_md5_dir}, not {ours} where kaudit put the checkpoints: "
                "not pushed",
                path=self.project.root,
            )

    def push(self, items: Sequence[FetchItem], remote: str | None = None) -> int:
        """Upload the objects that verified manifests sign, by their md5, from DVC's cache;
        return how many were uploaded (the rest were in the remote already).

        Only each item's md5, size and sha256 count (what its manifest signs): no ``.dvc``
        file is read. A remote object of another size than signed (a push killed midway, or
        tampering) is deleted, to be uploaded again, only once DVC's cache object here is
        verified to be the signed bytes; otherwise it is left as it is. Afterwards every
        item's object is confirmed in the remote at its signed size. Each object uploaded
        is hashed here first (size, sha256, md5): one that is not the signed data is not
        sent, and its checkpoints are named as not in the remote.

        Raises PushIncomplete (exit 1) naming each checkpoint whose object is not there
        after the push, and StorageError (exit 2) when there is no remote or DVC cannot
        push at all.
        """
        unique = list(dict.fromkeys(items))
        if not unique:
            return 0
        cache_dir, _ = self.cache_settings()
        name = self.remote_name(remote)
        self._dvc_cache_is(cache_dir)
        for item, how in self.repair_tracking(unique):
            log.warning("%s: %s", item.checkpoint, how)
        odb = self._odb(name)
        by_md5: dict[str, list[FetchItem]] = {}
        for item in unique:
            by_md5.setdefault(item.md5, []).append(item)
        refused: dict[Path, str] = {}
        sizes = self.remote_sizes(by_md5, name)
        for md5, group in by_md5.items():
            there = sizes[md5]
            wrong = [i for i in group if there is not None and there != i.size]
            if not wrong:
                continue
            assert there is not None
            # Replaced only by bytes verified here: an object pushed for another checkpoint
            # (a .dvc file edited, a manifest lying about a size) is never lost.
            problem = local_mismatch(cache_object_path(cache_dir, md5), wrong[0])
            if problem is not None:
                for item in wrong:
                    refused[item.checkpoint] = (
                        f"the remote's object {md5} is {there:,} bytes, not the signed "
                        f"{item.size:,}, and was left as it is: DVC's cache object here is "
                        f"not the signed data either ({problem})"
                    )
                continue
            log.warning(
                "remote object %s is %s bytes, not %s: uploading it again",
                md5,
                there,
                wrong[0].size,
            )
            try:
                odb.fs.rm_file(object_path(odb, md5))
            except Exception as e:
                raise StorageError(
                    f"remote unreachable: {dvc_error(e)}", path=self.project.root
                ) from None
        to_push = [
            m for m, group in by_md5.items() if any(i.checkpoint not in refused for i in group)
        ]
        # What goes is hashed first (one of another size in the remote was, above).
        unsigned = cache_not_signed(cache_dir, [by_md5[m] for m in to_push if sizes[m] is None])
        refused = unsigned | refused
        to_push = [m for m in to_push if by_md5[m][0].checkpoint not in unsigned]
        # Beside every object of this push, whether it is uploaded now or was before: the
        # upload a killed push left is found stale only later, once no longer written to.
        remove_stale_uploads(odb, by_md5)
        reasons: list[str] = []
        try:
            # DVC's line for each file it fails to upload is kept back: why (a full or
            # read-only remote) goes into the one line said for each checkpoint.
            with quiet_dvc(), transfer_failures() as reasons:
                transferred, failed = self._upload(odb, to_push, name)
        except Exception as e:
            why = f": {'; '.join(dict.fromkeys(reasons))}" if reasons else ""
            raise StorageError(
                f"push failed: {dvc_error(e)}{why}", path=self.project.root
            ) from None
        after = self.remote_sizes(by_md5, name)
        missing = dict(refused)
        for md5, group in by_md5.items():
            for item in group:
                got = after[md5]
                if item.checkpoint in missing or got == item.size:
                    continue
                if got is not None:
                    why = (
                        f"the remote's object {md5} is {got:,} bytes, not the signed {item.size:,}"
                    )
                elif md5 in failed:
                    why = f"DVC failed to upload the object {md5}" + (
                        f": {'; '.join(dict.fromkeys(reasons))}" if reasons else ""
                    )
                else:
                    why = (
                        f"the object {md5} was not uploaded: DVC's cache here does not hold "
                        "it as the signed data (see DVC's warning)"
                    )
                missing[item.checkpoint] = why
        if missing:
            first, why = next(iter(missing.items()))
            more = f" (and {len(missing) - 1} other checkpoint(s))" if len(missing) > 1 else ""
            raise PushIncomplete(
                f"not in the DVC remote {name!r} after the push: {why}{more}",
                path=first,
                missing=missing,
                uploaded=len(transferred),
            )
        return len(transferred)

    def repair_tracking(self, items: Iterable[FetchItem]) -> list[tuple[FetchItem, str]]:
        """Track again each signed checkpoint here that DVC does not hold (its cache
        object gone or of another size than signed, its ``.dvc`` file missing or naming
        other data: a step signed by an older kaudit before it was tracked, a cache object
        lost): its own bytes, verified against the signed size, sha256 and md5, go into
        DVC's cache (:func:`~kronos_audit.storage.fetch.cache_from_checkpoint`), and its
        ``.dvc`` file (and git-ignore entry) is written as the signed md5 and size say.
        Returns each item repaired with what was done, in words; one whose bytes here
        are not the signed ones is left as it is (the push then says it is not in the
        remote). Nothing is read for an item DVC holds at its signed size."""
        cache_dir, types = self.cache_settings()
        repaired: list[tuple[FetchItem, str]] = []
        for item in dict.fromkeys(items):
            if not os.path.lexists(item.checkpoint):
                continue  # pruned, or never brought here: nothing to track
            obj = cache_object_path(cache_dir, item.md5)
            try:
                st = os.lstat(obj)
                held = stat.S_ISREG(st.st_mode) and st.st_size == item.size
            except OSError:
                held = False
            # A directory step's file is tracked by its directory's .dvc file, never its own.
            entry = (
                (item.md5, item.size)
                if item.member
                else read_dvc_file(dvc_file_for(item.checkpoint))
            )
            if held and entry == (item.md5, item.size):
                continue
            how = "its .dvc file did not name the signed data: written again"
            if not held:
                problem = cache_from_checkpoint(item, obj, types)
                if problem is not None:
                    log.debug("%s: not put into DVC's cache: %s", item.checkpoint, problem)
                    continue
                how = REPAIRED
            if entry != (item.md5, item.size):
                try:
                    if entry is None:
                        ensure_ignored(item.checkpoint.parent, f"/{item.checkpoint.name}")
                    write_dvc_file(item.checkpoint, item.md5, item.size)
                except OSError as e:
                    raise StorageError(
                        f"cannot write its .dvc file: {e.strerror or e}", path=item.checkpoint
                    ) from None
            repaired.append((item, how))
        return repaired

    def _upload(self, odb: Any, md5s: Sequence[str], name: str) -> tuple[set[str], set[str]]:
        """Upload ``md5s`` with DVC; the md5s transferred and those that failed. An object
        another push on this machine is uploading is left to it and waited for (bounded),
        after this push's own uploads, then uploaded only if it is still not there (see
        :mod:`~kronos_audit.storage.uploads`). At most :data:`LOCKS_AT_ONCE` locks are held
        at a time: a push of a million objects opens no million files."""
        transferred: set[str] = set()
        failed: set[str] = set()

        def upload(chunk: list[str]) -> None:
            if chunk:
                done, not_done = push_objects(self.repo, chunk, name)
                transferred.update(done)
                failed.update(not_done)

        theirs: list[str] = []
        with PushLocks(self._remote_identity(name)) as locks:
            for chunk in _batches(md5s):
                mine = locks.take(chunk)
                theirs += [m for m in chunk if m not in set(mine)]
                upload(mine)
                locks.release(mine)  # before any wait: two pushes never wait for each other
            if theirs:
                log.info("%d object(s) being uploaded by another push: waiting", len(theirs))
            deadline = time.monotonic() + UPLOAD_WAIT
            for chunk in _batches(theirs):
                locks.wait(chunk, deadline)
                there = self.remote_sizes(chunk, name)
                upload([m for m in chunk if there[m] is None])
                locks.release(chunk)
        return transferred, failed

    def _remote_identity(self, name: str) -> str:
        """What tells one remote from another for the push locks: its URL, user and port
        as configured here (only ever hashed into a lock's name: a token in the URL is
        never written)."""
        config = self.repo.config["remote"][name]
        return "\0".join(str(config.get(k, "")) for k in ("url", "user", "port"))

    def discard(self, item: FetchItem, *, kept: Container[str] = frozenset()) -> None:
        """Remove a checkpoint that failed verification from the work tree, and from DVC's
        cache the object its verified manifest signs (``item``: its md5 and size, never
        what a ``.dvc`` file says), so that nothing takes it for valid later. The object
        stays when ``kept`` holds its md5: another checkpoint still names the same bytes."""
        item.checkpoint.unlink(missing_ok=True)
        if item.md5 not in kept:
            cache_dir, _ = self.cache_settings()
            remove_cache_object(cache_dir, item.md5, item.size)

    def fetch(
        self,
        checkpoint: Path,
        *,
        md5: str,
        sha256: str,
        size: int,
        remote: str | None = None,
        replace: bool = False,
    ) -> None:
        """Fetch the object whose md5 a verified manifest records to ``checkpoint`` (the
        checkpoint's own path, beside its manifest), checking it before it becomes visible.

        Nothing else is read or trusted: not the ``.dvc`` file, not its ``path``. The bytes
        come from DVC's cache if it holds them (a cache object that does not match is
        removed), else are streamed from the remote, into a temporary file beside the
        checkpoint, reading at most one byte more than ``size``. Only if size, sha256 and
        md5 all match is the temporary put in place, never over anything (a file or a
        symbolic link at ``checkpoint`` is refused), and the object put into DVC's cache.

        With ``replace`` (``kaudit pull --force``), a damaged copy at ``checkpoint`` is
        replaced once the signed bytes are checked in a temporary: its name is renamed
        over, never its bytes written into (a hard link may share them with DVC's cache
        or another checkpoint); a cache object that is not the signed data is unlinked.

        Raises TamperedData (exit 1) if the remote's object is not the signed data, and
        StorageError (exit 2) if it is not in the remote, the remote is unreachable, or
        ``checkpoint`` exists (without ``replace``); then nothing has been written.
        """
        failed = self.fetch_many(
            [FetchItem(checkpoint, md5, sha256, size)], remote, replace=replace
        )
        if failed:
            raise failed[checkpoint]

    def fetch_many(
        self, items: Iterable[FetchItem], remote: str | None = None, *, replace: bool = False
    ) -> dict[Path, Error]:
        """:meth:`fetch` each item, opening the remote once (and giving up on it for the
        rest once it proves unreachable); return the error of each checkpoint not fetched.
        """
        cache_dir, types = self.cache_settings()
        source = RemoteSource(self._open_remote, remote)
        failed: dict[Path, Error] = {}
        for item in dict.fromkeys(items):
            try:
                fetch_one(item, cache_dir, types, source, replace=replace)
            except Error as e:
                failed[item.checkpoint] = e
        return failed

    def remote_reader(self, remote: str | None = None) -> Callable[[FetchItem], bytes]:
        """A reader of small objects (a shard index) from the remote, opened once for all
        of them: each read returns an object's bytes only when they are the signed ones
        (:func:`~kronos_audit.storage.fetch.read_object`: TamperedData otherwise,
        RemoteUnreachable once the remote proves unreachable, StorageError when the object
        is not there)."""
        source = RemoteSource(self._open_remote, remote)
        return lambda item: read_object(item, source)

    def remote_source(self, remote: str | None = None) -> RemoteSource:
        """The remote, opened when first read (:meth:`RemoteSource.read_bounded`)."""
        return RemoteSource(self._open_remote, remote)

    def _open_remote(self, name: str | None) -> tuple[str, Any]:
        chosen = self.remote_name(name)
        return chosen, self._odb(chosen)


def _batches(md5s: Sequence[str]) -> list[list[str]]:
    return [list(md5s[i : i + LOCKS_AT_ONCE]) for i in range(0, len(md5s), LOCKS_AT_ONCE)]


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
    check_dvc_config(project)
    load_dvc()
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
