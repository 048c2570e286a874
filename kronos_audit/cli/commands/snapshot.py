"""`kaudit snapshot`: a signed manifest beside each checkpoint."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import click

from kronos_audit.cli.output import err, plain, safe, settings, shown
from kronos_audit.errors import UsageError


def _parse_attr(values: tuple[str, ...]) -> dict[str, Any]:
    attrs: dict[str, Any] = {}
    for item in values:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--attr {item!r}: expected KEY=VALUE")
        try:
            attrs[key] = json.loads(raw)
        except json.JSONDecodeError:
            attrs[key] = raw
    return attrs


@click.command()
@click.argument("checkpoints", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--run", "run_id", required=True, help="Run id.")
@click.option(
    "--step", required=True, type=click.IntRange(min=0), help="Step the checkpoint holds."
)
@click.option("--seed", "seeds", multiple=True, type=int, help="A seed the run used (repeatable).")
@click.option(
    "--parent", type=click.Path(path_type=Path), help="The previous checkpoint's manifest."
)
@click.option("--command", "command", help="Command line that re-runs this segment.")
@click.option("--attr", "attrs", multiple=True, help="User attribute KEY=VALUE (JSON or text).")
@click.option("--key", help="Signing key name (default: $KAUDIT_KEY, else the only key held).")
@click.option(
    "--allow-secret-files",
    is_flag=True,
    help="Record the uncommitted diff even if it carries a file that looks like a secret "
    "(.env, *.pem, *.key, id_* ...); without it such a diff is refused.",
)
@click.option("--force", is_flag=True, help="Sign again a checkpoint that has a manifest.")
def snapshot(
    checkpoints: tuple[Path, ...],
    run_id: str,
    step: int,
    seeds: tuple[int, ...],
    parent: Path | None,
    command: str | None,
    attrs: tuple[str, ...],
    key: str | None,
    allow_secret_files: bool,
    force: bool,
) -> None:
    """Write a signed manifest beside each checkpoint (CKPT.kaudit.json).

    Prints the path of each manifest written. A checkpoint that is not HDF5 is signed by
    its file digest only (a note on stderr says so). One file signed again under its name
    as a later step of the same run (a restart file rewritten in place) keeps every step
    in DIR/RUN/step-<N>.h5 beside it, each with its manifest, chained.

    \b
    Example:
      kaudit snapshot checkpoints/heat/step-200.h5 --run heat --step 200 --seed 42 \\
        --parent checkpoints/heat/step-100.h5.kaudit.json --command "python heat.py"
    """
    from kronos_audit.signing.snapshot import snapshot as do_snapshot

    try:
        argv = None if command is None else shlex.split(command)
    except ValueError as e:
        raise UsageError(f"--command: {e}") from None
    manifests = do_snapshot(
        list(checkpoints),
        run=run_id,
        step=step,
        seeds=seeds,
        parent=parent,
        command=argv,
        key=key,
        attributes=_parse_attr(attrs),
        allow_secret_files=allow_secret_files,
        force=force,
    )
    if not settings().quiet:  # as `git commit -q`: nothing on success
        for m in manifests:
            click.echo(plain(shown(m.path)))
    for note in manifests.notes:
        err.print(f"kaudit: note: {safe(note)}")
