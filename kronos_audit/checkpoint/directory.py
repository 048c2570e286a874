"""The directory step: another tool's checkpoint directory signed as one step.

A tool that owns its directory (torch DCP's ``.metadata`` and ``__0_0.distcp``, a Hugging
Face ``checkpoint-N/``, an Orbax step) breaks on a file it did not write, so nothing is
written inside it: its manifest is ``DIR.kaudit.json`` beside ``DIR/``. The sharded step's
machinery (:mod:`kronos_audit.checkpoint.shards`) signs it:

- the **file index** is one line per file, in the order of its path (as DVC sorts a
  directory's listing), each the canonical JSON of ``{"md5", "path", "sha256", "size"}``
  and a newline; ``path`` is the file's POSIX path relative to the directory. The index is
  the manifest's subject (its sha256); the manifest's predicate records it whole
  (``directory.files``, each entry with optional per-tensor ``datasets``), so a verifier
  needs nothing but the manifest to name a file added, missing or changed;
- the **Merkle root** over the index's lines (:func:`~kronos_audit.checkpoint.shards.leaf`
  of each line, the sharded step's tree) and the file count are in the predicate too;
- **DVC** tracks the directory as one output, as ``dvc add DIR`` would: each file's
  object in the cache, the listing object ``<md5>.dir`` (:func:`dvc_listing`), and
  ``DIR.dvc`` naming it, so a plain ``dvc pull`` restores the directory.

Dot-files are files like any other (DCP's ``.metadata`` is what ``dcp.load`` reads first).
What a reader could be steered by is refused, at snapshot and at verify: a symbolic link
(in or out of the directory), a FIFO, socket or device, a directory of another file system
mounted inside it; and at snapshot, a second name of one file (a hard link inside the
step; DVC's checkout by hard link makes those of equal files, so verify hashes each name).

Tensors are read from the bytes that were hashed: each file's own (safetensors, npz, HDF5)
through the descriptor its digests came from, and a DCP save's, which span its files,
through the descriptors of its ``.distcp`` files kept open after hashing and its
``.metadata``'s private copy (:func:`hash_step`). Verify reads them again only for a
file that changed, to name each tensor that differs (:func:`check_step`).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kronos_audit._internal.canonical import canonical_json
from kronos_audit._internal.safeio import file_kind
from kronos_audit.checkpoint.formats.common import tensor_path
from kronos_audit.checkpoint.formats.dcp import (
    MAX_METADATA,
    METADATA,
    SNIFF_BYTES,
    is_dcp_metadata,
    is_spanned,
    load_opened,
    tensors_of_directory,
)
from kronos_audit.checkpoint.formats.interface import Format
from kronos_audit.checkpoint.formats.registry import diagnose_signed, digest_opened
from kronos_audit.checkpoint.hashing import DatasetDigest, OpenFile, open_file
from kronos_audit.checkpoint.shards import leaf, tree_levels
from kronos_audit.errors import CheckpointError

MAX_FILES = 1_000_000
"""Most files a directory step may hold (the schema's bound on the signed count)."""
MAX_DEPTH = 64
"""Deepest directory nesting walked inside a step."""
MAX_PATH = 4096
"""Longest relative path of a file in a step, in UTF-8 bytes."""
_HEX = frozenset("0123456789abcdef")


@dataclass(frozen=True)
class ItemDigest:
    """One byte range of a file that its tool reads on its own (a torch DCP item: one
    tensor chunk or one pickled value), hashed as it was written."""

    name: str
    """The tool's name of what it holds (DCP: the fully qualified name, ``model.weight``)."""
    chunk: tuple[int, ...] | None
    """A tensor chunk's offsets in the global tensor; None for a value that is no tensor."""
    offset: int
    """Where its bytes start in the file."""
    length: int
    """How many bytes it takes."""
    sha256: str
    """sha256 of those bytes."""

    @property
    def label(self) -> str:
        """How a message names it: ``tensor model.weight`` (with its chunk's offsets when
        the tensor was saved in chunks) or ``object step``."""
        if self.chunk is None:
            return f"object {self.name}"
        at = f" (chunk at {list(self.chunk)})" if any(self.chunk) else ""
        return f"tensor {self.name}{at}"

    def to_json_obj(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "chunk": None if self.chunk is None else list(self.chunk),
            "offset": self.offset,
            "length": self.length,
            "sha256": self.sha256,
        }


@dataclass(frozen=True)
class FileEntry:
    """One file of a directory step, as the manifest records it."""

    path: str
    """Its POSIX path relative to the directory (``.metadata``, ``model/weights.bin``)."""
    size: int
    """Bytes."""
    sha256: str
    """sha256 of its bytes (64 lower-case hex digits)."""
    md5: str
    """md5 of its bytes: DVC's address for it (32 lower-case hex digits)."""
    datasets: tuple[DatasetDigest, ...] | None = None
    """Its per-tensor (per-dataset) digests, when a reader of its format gave them; None
    when only its file digest covers it."""
    format: str | None = None
    """Its format as the reader was chosen (``safetensors``, ``hdf5``, ``pickle``,
    ``bytes``...): what ``datasets`` were read as, and how verify reads them again. None
    in manifests written before it was recorded."""
    items: tuple[ItemDigest, ...] | None = None
    """The byte ranges its tool reads one by one, each with its digest, when its writer
    hashed them as it wrote them (a DCP save through kaudit's writer); None otherwise."""

    def record(self) -> dict[str, Any]:
        """Its index record: what its line holds."""
        return {"md5": self.md5, "path": self.path, "sha256": self.sha256, "size": self.size}

    def line(self) -> bytes:
        """Its index line: canonical JSON, a newline last."""
        return canonical_json(self.record()) + b"\n"

    def to_json_obj(self) -> dict[str, Any]:
        obj = self.record()
        if self.datasets is not None:
            obj["datasets"] = [d.to_json_obj(extent=True) for d in self.datasets]
        if self.format is not None:
            obj["format"] = self.format
        if self.items is not None:
            obj["items"] = [i.to_json_obj() for i in self.items]
        return obj


def encode_index(files: Sequence[FileEntry]) -> bytes:
    """The file index of ``files`` (already in path order): the signed subject's bytes."""
    return b"".join(f.line() for f in files)


def index_root(files: Sequence[FileEntry]) -> str:
    """The Merkle root (hex) over the index's lines."""
    if not files:
        return leaf(b"").hex()  # an empty directory: the tree of one empty leaf
    return tree_levels([leaf(f.line()) for f in files])[-1][0].hex()


def dvc_listing(files: Sequence[FileEntry]) -> bytes:
    """The bytes of DVC's ``.dir`` object for these files, exactly as DVC writes it
    (``dvc_data``'s ``Tree.as_bytes``: its entries sorted by relative path, ``json.dumps``
    with sorted keys): its md5 is the directory's address in DVC's cache and remote."""
    entries = sorted(({"md5": f.md5, "relpath": f.path} for f in files), key=lambda e: e["relpath"])
    return json.dumps(entries, sort_keys=True).encode("utf-8")


def path_problem(path: object) -> str | None:
    """What is wrong with ``path`` as a signed file's relative path (anyone may have
    written a manifest: it must not point a verifier or a fetch out of the directory),
    or None."""
    if not isinstance(path, str) or not path:
        return "a file's path is empty or not text"
    if len(path.encode("utf-8", "surrogatepass")) > MAX_PATH:
        return f"a file's path is longer than {MAX_PATH} bytes"
    if path.startswith("/") or "\0" in path:
        return f"{path[:80]!r} is not a relative path"
    parts = path.split("/")
    if any(p in ("", ".", "..") for p in parts) or len(parts) > MAX_DEPTH:
        return f"{path[:80]!r} is not a plain relative path (no '.', '..' or empty part)"
    return None


def entry_problem(entry: FileEntry) -> str | None:
    """What is wrong with a signed file entry, or None."""
    problem = path_problem(entry.path)
    if problem is not None:
        return problem
    if not (len(entry.sha256) == 64 and set(entry.sha256) <= _HEX):
        return f"{entry.path[:80]!r}: sha256 is not 64 lower-case hex digits"
    if not (len(entry.md5) == 32 and set(entry.md5) <= _HEX):
        return f"{entry.path[:80]!r}: md5 is not 32 lower-case hex digits"
    for item in entry.items or ():
        if item.offset + item.length > entry.size:
            return f"{entry.path[:80]!r}: item {item.name[:80]!r} ends past the file's end"
    return None


@dataclass(frozen=True)
class Found:
    """What is in a directory, walked without following anything."""

    files: dict[str, tuple[int, int, int]]
    """Each regular file by relative path: ``(size, device, inode)`` as the walk saw it."""
    problems: tuple[str, ...]
    """One line for each thing no step may hold (``weights.bin: is a symbolic link``)."""


def _walk(root: Path) -> Iterator[tuple[str, os.stat_result | None, str | None]]:
    """``(relative path, lstat, problem)`` of everything under ``root``, depth first;
    directories are entered, never through a link, never onto another file system."""
    root_dev = os.lstat(root).st_dev
    stack: list[tuple[Path, str, int]] = [(root, "", 0)]
    while stack:
        directory, prefix, depth = stack.pop()
        try:
            with os.scandir(directory) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as e:
            yield prefix.rstrip("/") or ".", None, f"cannot list it: {e.strerror or e}"
            continue
        for entry in entries:
            rel = prefix + entry.name
            try:
                rel.encode("utf-8")
            except UnicodeEncodeError:
                yield rel.encode("utf-8", "replace").decode(), None, "its name is not UTF-8"
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError as e:
                yield rel, None, f"cannot read it: {e.strerror or e}"
                continue
            if stat.S_ISDIR(st.st_mode):
                if st.st_dev != root_dev:
                    yield rel, None, "is another file system mounted inside the step"
                elif depth + 1 >= MAX_DEPTH:
                    yield rel, None, f"is nested deeper than {MAX_DEPTH} directories"
                else:
                    stack.append((Path(entry.path), rel + "/", depth + 1))
            elif stat.S_ISLNK(st.st_mode):
                yield rel, None, "is a symbolic link: a step holds regular files only"
            elif not stat.S_ISREG(st.st_mode):
                yield rel, None, f"is {file_kind(st.st_mode)}, not a regular file"
            else:
                yield rel, st, None


def scan(directory: Path, *, shared: bool = False) -> Found:
    """Every regular file under ``directory`` and every thing a step may not hold.

    Two names of one file are refused unless ``shared``: a step to sign must not hold
    them (one would change through the other), but DVC's checkout by hard link gives two
    files of equal bytes one inode, so a verifier, which hashes each name, allows them.

    CheckpointError when ``directory`` is not a directory (a link to one is not) or has
    more than :data:`MAX_FILES` entries."""
    try:
        st = os.lstat(directory)
    except FileNotFoundError:
        raise CheckpointError("checkpoint directory not found", path=directory) from None
    except OSError as e:
        raise CheckpointError(f"cannot read it: {e.strerror or e}", path=directory) from None
    if not stat.S_ISDIR(st.st_mode):
        raise CheckpointError(f"is {file_kind(st.st_mode)}, not a directory", path=directory)
    files: dict[str, tuple[int, int, int]] = {}
    seen: dict[tuple[int, int], str] = {}
    problems: list[str] = []
    for rel, lst, problem in _walk(directory):
        if len(files) + len(problems) >= MAX_FILES:
            raise CheckpointError(f"holds more than {MAX_FILES:,} files", path=directory)
        if problem is not None or lst is None:
            problems.append(f"{rel}: {problem}")
            continue
        other = seen.get((lst.st_dev, lst.st_ino))
        if other is not None and not shared:
            # Two names of one file: one changed through the other, unseen by its entry.
            problems.append(f"{rel}: is a hard link to {other}, in the same step")
            continue
        seen.setdefault((lst.st_dev, lst.st_ino), rel)
        files[rel] = (lst.st_size, lst.st_dev, lst.st_ino)
    return Found(dict(sorted(files.items())), tuple(problems))


@dataclass(frozen=True)
class HashedStep:
    """A directory's files hashed to be signed, and the tensors that span them."""

    files: tuple[FileEntry, ...]
    """Every file, in path order, with its digests and its own tensors."""
    format: str | None = None
    """``dcp`` for a torch DCP save, whose tensors span its files; else None."""
    datasets: tuple[DatasetDigest, ...] | None = None
    """The tensors that span the files (a DCP save's, by global name), or None."""


def _same_file(opened: OpenFile, fd_stat: os.stat_result, seen: tuple[int, int, int]) -> bool:
    return (fd_stat.st_size, fd_stat.st_dev, fd_stat.st_ino) == seen and opened.size == seen[0]


def _stamp(opened: OpenFile) -> tuple[int, int]:
    # Not its ctime: a rename over its name changes that, not what the descriptor reads.
    st = os.fstat(opened.fileno())
    return st.st_size, st.st_mtime_ns


def hash_step(directory: Path) -> HashedStep:
    """Every file of ``directory`` hashed, in path order: size, sha256, md5, its format and
    its own tensors' digests (:func:`~kronos_audit.checkpoint.formats.digest_opened`), and,
    for a torch DCP save, the tensors that span its files, by global name. Each file is
    read once, through one descriptor (never a link), and must be the file the walk saw;
    a DCP save's tensors are read from the descriptors that were hashed (``.metadata``
    from its private copy), which must not have been written to meanwhile.
    CheckpointError naming the first thing a step may not hold, or a file that changed
    while read."""
    found = scan(directory)
    if found.problems:
        more = f" (and {len(found.problems) - 1} more)" if len(found.problems) > 1 else ""
        raise CheckpointError(f"{found.problems[0]}{more}", path=directory)
    if not found.files:
        # A tool's save that wrote nothing is no step to restore from.
        raise CheckpointError("holds no file: an empty directory is no step", path=directory)
    dcp = _sniff_dcp(directory, found)
    kept: dict[str, tuple[OpenFile, tuple[int, int]]] = {}
    out: list[FileEntry] = []
    try:
        for rel, seen in found.files.items():
            opened = open_file(directory / rel, follow_symlinks=False)
            keep = dcp and is_spanned(rel)
            try:
                if not _same_file(opened, os.fstat(opened.fileno()), seen):
                    raise CheckpointError(f"{rel}: changed while the step was read", path=directory)
                if keep:
                    kept[rel] = (opened, _stamp(opened))
                if rel == METADATA and keep:
                    if opened.size > MAX_METADATA:
                        raise CheckpointError(
                            f"DCP metadata of {opened.size:,} bytes refused", path=opened.path
                        )
                    opened.read_private()  # parsed from the bytes hashed, nobody else's
                digests = digest_opened(opened, md5=True)
            finally:
                if not keep:
                    opened.close()
            assert digests.md5 is not None
            out.append(
                FileEntry(
                    rel,
                    digests.size,
                    digests.sha256,
                    digests.md5,
                    digests.datasets,
                    format=digests.format,
                )
            )
        if not dcp:
            return HashedStep(tuple(out))
        meta = kept[METADATA][0]
        if not is_dcp_metadata(bytes(meta.view()[:SNIFF_BYTES])):
            raise CheckpointError(f"{METADATA}: replaced while the step was read", path=directory)
        loaded = load_opened(meta, {n: o for n, (o, _) in kept.items() if n != METADATA})
        for rel, (opened, stamp) in kept.items():
            if not opened.private and _stamp(opened) != stamp:
                raise CheckpointError(f"{rel}: written to while the step was read", path=directory)
        datasets = tuple(sorted(loaded.digests.values(), key=lambda d: d.path))
        return HashedStep(tuple(out), Format.DCP.value, datasets)
    finally:
        for opened, _ in kept.values():
            opened.close()


def hash_directory(directory: Path) -> tuple[FileEntry, ...]:
    """The files of :func:`hash_step` of ``directory``, in path order."""
    return hash_step(directory).files


def directory_tensors(directory: Path) -> tuple[str, tuple[DatasetDigest, ...]] | None:
    """The format and the tensors of a directory whose tensors span its files (torch DCP:
    by global name), or None for any other directory, read from its files opened once
    each. For a directory being signed, :func:`hash_step` gives them from the very bytes
    it hashed; this is for one that is not (DCP's ``.metadata`` is parsed by a restricted
    unpickler, and only so)."""
    found = tensors_of_directory(directory)
    return None if found is None else (found[0].value, found[1])


def _sniff_dcp(directory: Path, found: Found) -> bool:
    """Whether the walked ``directory`` is a torch DCP save: its ``.metadata`` is DCP's
    pickle (its first bytes, read through one descriptor) beside ``__R_N.distcp`` files."""
    if METADATA not in found.files or not any(
        is_spanned(rel) and rel != METADATA for rel in found.files
    ):
        return False
    with open_file(directory / METADATA, follow_symlinks=False) as opened:
        return is_dcp_metadata(bytes(opened.view()[:SNIFF_BYTES]))


def make_tree(directory: Path, files: Sequence[FileEntry]) -> None:
    """Make ``directory`` and the subdirectories ``files`` are in, for a fetch to put them
    there. CheckpointError when one is there as anything but a directory (a symbolic link
    there would send the fetched files elsewhere)."""
    wanted = {directory}
    for f in files:
        wanted.update((directory / f.path).parents)
    for d in sorted(p for p in wanted if p == directory or directory in p.parents):
        try:
            os.mkdir(d)
        except FileExistsError:
            pass
        except OSError as e:
            raise CheckpointError(f"cannot make it: {e.strerror or e}", path=d) from None
        if not stat.S_ISDIR(os.lstat(d).st_mode):
            raise CheckpointError("is not a directory: nothing fetched into it", path=d)


def check_files(
    directory: Path, found: Found, signed: Sequence[FileEntry]
) -> dict[str, tuple[str | None, str]]:
    """For each ``signed`` file that ``found`` (:func:`scan` of ``directory``) holds:
    ``(problem, sha256)``, the problem in words (``is 10 bytes, the manifest records 12``,
    ``replaced while read``) or None and the sha256 of its bytes. A file of another size
    than signed is not read; each is read through one descriptor, never a link, and must
    be the file the scan saw. Files ``found`` holds that are not signed are not read."""
    answers: dict[str, tuple[str | None, str]] = {}
    for f in signed:
        seen = found.files.get(f.path)
        if seen is None:
            continue
        if seen[0] != f.size:
            answers[f.path] = (f"is {seen[0]:,} bytes, the manifest records {f.size:,}", "")
            continue
        try:
            with open_file(directory / f.path, follow_symlinks=False) as opened:
                if not _same_file(opened, os.fstat(opened.fileno()), seen):
                    answers[f.path] = ("replaced while read", "")
                    continue
                answers[f.path] = (None, opened.sha256(progress=False))
        except CheckpointError as e:
            answers[f.path] = (e.message, "")
    return answers


@dataclass(frozen=True)
class TensorCheck:
    """The tensors of a changed file of a directory step (or of the step's tensors that
    span its files), read again to name each one that differs."""

    file: str | None
    """The file's relative path; None for the tensors that span the step's files (DCP)."""
    recorded: tuple[DatasetDigest, ...]
    """The signed digests."""
    found: tuple[DatasetDigest, ...] | None
    """The digests of what is there now; None when they could not be read."""
    unreadable: str | None = None
    """Why none could be read (``found`` None)."""
    each: Mapping[str, str] = field(default_factory=dict)
    """Each tensor (by path) that could not be read while the others were, with why."""
    format: str | None = None
    """The signed format they were read as."""


def check_step(
    directory: Path,
    found: Found,
    signed: Sequence[FileEntry],
    spanning: tuple[DatasetDigest, ...] | None = None,
) -> tuple[dict[str, tuple[str | None, str]], list[TensorCheck]]:
    """:func:`check_files` of a step being verified, and the tensors of what changed:
    for each file whose sha256 is not the signed one and whose entry records tensors,
    those tensors read again as its signed format says, from the descriptor just hashed
    (a bounded diagnostic, as for a changed checkpoint file); and, with ``spanning`` (a
    DCP save's signed tensors) when one of the files DCP spreads them over changed, those
    tensors by global name, from the hashed descriptors, ``.metadata`` parsed from its
    private copy and only when its sha256 is the signed one. Files whose sha256 is the
    signed one are not read again: their digest covers their tensors."""
    answers: dict[str, tuple[str | None, str]] = {}
    tensors: list[TensorCheck] = []
    kept: dict[str, OpenFile] = {}
    try:
        for f in signed:
            seen = found.files.get(f.path)
            if seen is None:
                continue
            if seen[0] != f.size:
                answers[f.path] = (f"is {seen[0]:,} bytes, the manifest records {f.size:,}", "")
                continue
            keep = spanning is not None and is_spanned(f.path)
            try:
                opened = open_file(directory / f.path, follow_symlinks=False)
            except CheckpointError as e:
                answers[f.path] = (e.message, "")
                continue
            try:
                answers[f.path] = _hash_one(opened, f, seen, private=keep and f.path == METADATA)
                problem, sha = answers[f.path]
                if problem is None and sha != f.sha256 and f.datasets is not None:
                    datasets, unreadable = diagnose_signed(opened, f.format, f.datasets)
                    tensors.append(
                        TensorCheck(f.path, f.datasets, datasets, unreadable, {}, f.format)
                    )
                if keep and problem is None:
                    kept[f.path] = opened
            finally:
                if kept.get(f.path) is not opened:
                    opened.close()
        if spanning is not None:
            changed = [
                f.path
                for f in signed
                if is_spanned(f.path) and answers.get(f.path, ("missing", "")) != (None, f.sha256)
            ]
            if changed:
                tensors.append(_spanning(signed, spanning, answers, kept, changed))
    finally:
        for opened in kept.values():
            opened.close()
    return answers, tensors


def _hash_one(
    opened: OpenFile, f: FileEntry, seen: tuple[int, int, int], *, private: bool
) -> tuple[str | None, str]:
    if not _same_file(opened, os.fstat(opened.fileno()), seen):
        return "replaced while read", ""
    if private and f.size <= MAX_METADATA:
        return None, opened.read_private()  # DCP's .metadata: parsed from these bytes only
    return None, opened.sha256(progress=False)


def _spanning(
    signed: Sequence[FileEntry],
    spanning: tuple[DatasetDigest, ...],
    answers: Mapping[str, tuple[str | None, str]],
    kept: Mapping[str, OpenFile],
    changed: Sequence[str],
) -> TensorCheck:
    """The check of a DCP save's tensors, some of whose files ``changed``."""
    fmt = Format.DCP.value
    meta = kept.get(METADATA)
    recorded_meta = next((f for f in signed if f.path == METADATA), None)
    if meta is None or recorded_meta is None or answers[METADATA][1] != recorded_meta.sha256:
        why = "missing" if METADATA not in answers else "not the signed one"
        return TensorCheck(
            None,
            spanning,
            None,
            f"{METADATA} is {why}, and only the signed one is parsed "
            f"(changed: {', '.join(changed)})",
            format=fmt,
        )
    try:
        loaded = load_opened(meta, {n: o for n, o in kept.items() if n != METADATA}, go_on=True)
    except CheckpointError as e:
        return TensorCheck(None, spanning, None, e.message, format=fmt)
    found = tuple(sorted(loaded.digests.values(), key=lambda d: d.path))
    each = {tensor_path(fqn): why for fqn, why in loaded.unreadable.items()}
    return TensorCheck(None, spanning, found, None, each, fmt)


__all__ = [
    "MAX_FILES",
    "FileEntry",
    "Found",
    "HashedStep",
    "ItemDigest",
    "TensorCheck",
    "check_files",
    "check_step",
    "directory_tensors",
    "dvc_listing",
    "encode_index",
    "entry_problem",
    "hash_directory",
    "hash_step",
    "index_root",
    "make_tree",
    "path_problem",
    "scan",
]
