"""`kaudit show`: a manifest summarised, without verifying it."""

from __future__ import annotations

import hashlib
import json
import shlex
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

import click

from kronos_audit._internal.frozen import thaw
from kronos_audit.cli.options import json_option
from kronos_audit.cli.output import Column, out, safe, shown, shown_recorded
from kronos_audit.errors import Error

if TYPE_CHECKING:
    from kronos_audit.statement.manifest import Manifest


@click.command()
@click.argument("manifest", type=click.Path(path_type=Path))
@json_option("Print the decoded statement as JSON.")
def show(manifest: Path, as_json: bool) -> None:
    """Summarise a manifest, or a replay attestation (without verifying it: see
    `kaudit verify`).

    An attestation is shown with the comparison it records: the tolerances its verdict
    was reached with, where they came from, and each dataset judged with a tolerance.

    \b
    Example:
      kaudit show checkpoints/heat/step-00000200.h5.kaudit.json
      kaudit show checkpoints/heat/step-00000200.h5.replay.json
    """
    from kronos_audit.checkpoint.layout import ATTESTATION_SUFFIX, resolve_target
    from kronos_audit.statement.manifest import read_manifest

    target = resolve_target(manifest)
    if target.name.endswith(ATTESTATION_SUFFIX):
        _show_attestation(target, as_json)
        return
    m = read_manifest(target)
    if as_json:
        # ensure_ascii: control characters in names come out as \u escapes, never raw.
        click.echo(json.dumps(thaw(m.statement), indent=2, sort_keys=True, ensure_ascii=True))
        return
    # Nothing here is verified, and anyone may have written it: every value goes through
    # _text, which shows it as inert text (no rich markup, no terminal control) and shows
    # a missing value as "none", never as Python's None.
    p = m.record
    g, env = p.git, p.environment
    rows: list[tuple[str, str]] = [
        ("manifest", _text(shown(m.path))),
        ("checkpoint", f"{_text(shown_recorded(m.subject_name, m.path))}  ({_text(p.size)} bytes)"),
        ("sha256", _text(m.subject_sha256)),
        ("run / step", f"{_text(m.run)} / {_text(m.step)}"),
        ("created", _text(p.created)),
    ]
    if p.format is not None:
        rows.append(("format", _text(p.format)))
    parent = (
        f"{_text(_recorded(p.parent_manifest, m.path), 'location not recorded')} "
        f"({_text(p.parent)})"
        if p.parent is not None
        else "none"
    )
    rows.append(("parent", parent))
    dirty = f"  [yellow]dirty[/], patch {_text(g.patch_sha256)}" if g.dirty else ""
    rows.append(("git", f"{_text(g.commit)} on {_text(g.branch, '(detached)')}{dirty}"))
    rows.append(("remote", _text(g.remote)))
    rows.append(
        (
            "python",
            f"{_text(env.python_implementation)} {_text(env.python_version)}, "
            f"{len(env.packages)} packages",
        )
    )
    rows.append(
        (
            "platform",
            f"{_text(env.system)} {_text(env.machine)}, {_text(env.cpu_model)}",
        )
    )
    rows.append(("blas", f"{_text(env.blas_name)} {_text(env.blas_version)}"))
    if env.threadpools is not None:  # locks before they were recorded have none
        pools = ", ".join(
            " ".join(str(pool[k]) for k in ("internal_api", "version") if pool.get(k) is not None)
            + f" ({pool.get('user_api')}, {pool.get('num_threads')} threads)"
            for pool in env.threadpools
        )
        rows.append(("threadpools", _text(pools or "none loaded")))
    variables = " ".join(f"{k}={v}" for k, v in env.variables.items())
    rows.append(("numeric env", _text(variables or None)))
    rows.append(("env lock", _text(env.digest)))
    rows.append(("seeds", _text(", ".join(str(s) for s in p.seeds) or None)))
    rows.append(("command", _text(shlex.join(p.command) if p.command else "not recorded")))
    rows.append(("cwd", _text(p.cwd)))
    if p.attributes:
        rows.append(("attributes", _text(json.dumps(thaw(p.attributes), sort_keys=True))))
    if p.restart_count is not None:
        rows.append(("restarts", _text(p.restart_count)))
    if p.scheduler is not None:
        job = p.scheduler
        where = ", ".join(x for x in (job.partition, job.nodelist) if x)
        rows.append(
            (
                "scheduler",
                _text(
                    f"{job.name} job {job.job_id}, requeued {job.restart_count} time(s)"
                    + (f" ({where})" if where else "")
                ),
            )
        )
    if p.writer is not None:
        rows.append(("writer", _text(p.writer.describe())))
    if p.shards is not None:
        rows.append(
            (
                "shards",
                _text(
                    f"{p.shards.count} ranks{_rank_change(m, p.shards.count)}, "
                    f"{p.shards.bytes:,} bytes; layout "
                    + json.dumps(thaw(p.shards.layout), sort_keys=True)
                ),
            )
        )
    if p.directory is not None:
        rows.append(
            (
                "directory",
                f"{p.directory.count} files, {p.directory.bytes:,} bytes; Merkle root "
                f"{p.directory.root[:16]}...",
            )
        )
    signers = ", ".join(_text(s.keyid or "(no keyid)") for s in m.envelope.signatures)
    rows.append(("signed by", signers))
    # One line per field, the value whole: a long path or digest is never folded.
    for label, value in rows:
        out.print(f"[bold]{label:<13}[/]{value}".rstrip())
    if m.datasets is not None:
        out.table(
            [Column("path"), Column("dtype"), Column("shape"), Column("sha256")],
            [
                (
                    _text(ds.path),
                    _text(ds.dtype),
                    "null" if ds.shape is None else _text(list(ds.shape)),
                    _text(ds.sha256[:16] + "..."),
                )
                for ds in m.datasets
            ],
            title=f"{len(m.datasets)} {'datasets' if p.format in (None, 'hdf5') else 'tensors'}",
        )
    elif p.shards is not None:
        out.print("a sharded step: its index and every shard are covered by `kaudit verify`")
    elif p.format == "pickle":
        out.print(
            "[yellow]a pickle[/]: covered by the file digest only; ok does not mean safe to load"
        )
    elif p.directory is not None:
        out.table(
            [Column("file"), Column("size"), Column("sha256"), Column("tensors")],
            [
                (
                    _text(f.path),
                    f"{f.size:,}",
                    _text(f.sha256[:16] + "..."),
                    "file digest" if f.datasets is None else str(len(f.datasets)),
                )
                for f in p.directory.files
            ],
            title=f"a directory step of {p.directory.count} files",
        )
    else:
        out.print("not HDF5: covered by the file digest only")


def _show_attestation(path: Path, as_json: bool) -> None:
    """An attestation's verdict and the comparison it records, unverified."""
    from kronos_audit.statement.attestation import read_attestation

    a = read_attestation(path)
    if as_json:
        click.echo(json.dumps(thaw(a.statement), indent=2, sort_keys=True, ensure_ascii=True))
        return
    r = a.replay
    patch = f" + patch {_text(r.patch_sha256)}" if r.patch_sha256 else ""
    parent = "the start" if r.parent is None else f"step {_text(r.parent.step)}"
    rows: list[tuple[str, str]] = [
        ("attestation", _text(shown(a.path))),
        (
            "attests",
            f"{_text(shown_recorded(r.manifest.path, a.path))} ({_text(r.manifest.sha256)})",
        ),
        ("run / step", f"{_text(r.manifest.run)} / {_text(r.manifest.step)}"),
        ("outcome", _text(r.outcome.value)),
        ("replayed", f"{_text(r.replayed_at)} from {parent} by {_text(r.tool)}"),
        ("code", f"{_text(r.commit)}{patch}"),
    ]
    lines = r.comparison.lines()
    rows.append(("compared", _text(lines[0])))
    rows += [("", _text(line)) for line in lines[1:]]
    signers = ", ".join(_text(s.keyid or "(no keyid)") for s in a.envelope.signatures)
    rows.append(("signed by", signers))
    for label, value in rows:
        out.print(f"[bold]{label:<13}[/]{value}".rstrip())


def _rank_change(m: Manifest, count: int) -> str:
    """`` (the parent step had N)`` when the parent step, found beside this one, was
    written by another number of ranks (a restart on another count, an elastic job
    re-formed); empty when it had as many, or cannot be found."""
    parent = _parent_beside(m)
    if parent is None:
        return ""
    had = 1 if parent.record.shards is None else parent.record.shards.count
    return "" if had == count else f" (the parent step had {had})"


def _parent_beside(m: Manifest) -> Manifest | None:
    """The parent manifest of the sharded step ``m``, from the run directory ``m`` was found
    in, or None.

    Nothing here is verified, so the recorded names are only a hint: the parent is looked
    for under the recorded name relative to this step's run directory (the run directory
    found, not one named by the manifest), a regular file read once and bounded, and it is
    the parent only if its bytes have the recorded digest. A recorded name that leaves the
    run directory is not followed.
    """
    from kronos_audit._internal.safeio import MANIFEST_LIMIT, UnsafeFile, read_regular
    from kronos_audit.statement.manifest import parse_manifest

    recorded, digest = m.record.parent_manifest, m.record.parent
    if recorded is None or digest is None:
        return None
    # A sharded step's subject is <run dir>/step-<N>/index.jsonl, relative to the
    # repository root, as its parent's recorded place is.
    run = PurePosixPath(m.subject_name).parent.parent
    name = PurePosixPath(recorded)
    if name.is_absolute() or ".." in name.parts or not name.is_relative_to(run):
        return None
    relative = name.relative_to(run)
    if not 1 <= len(relative.parts) <= 2:  # a step's file, or a step directory's manifest
        return None
    here = m.path.parent.parent
    candidate = here.joinpath(*relative.parts)
    try:
        if not candidate.resolve().is_relative_to(here.resolve()):
            return None
        data = read_regular(candidate, MANIFEST_LIMIT, follow_symlinks=False)
        if hashlib.sha256(data).hexdigest() != digest:
            return None  # another file at that place: not the parent
        return parse_manifest(data, candidate)
    except (OSError, RuntimeError, UnsafeFile, Error):
        return None


def _recorded(name: str | None, beside: Path) -> str | None:
    return None if name is None else shown_recorded(name, beside)


def _text(value: object, missing: str = "none") -> str:
    """A value read from a manifest, as rich markup that prints it as inert text."""
    return missing if value is None else safe(value)
