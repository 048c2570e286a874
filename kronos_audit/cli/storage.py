"""`kaudit push`, `pull`, `status`: checkpoints in DVC remotes."""

from __future__ import annotations

from pathlib import Path

import click
from rich.table import Table

from kronos_audit.cli._app import cli, fail_line, out, safe
from kronos_audit.cli.options import trust_from, trust_options, warn
from kronos_audit.errors import Error, UsageError
from kronos_audit.manifest import MANIFEST_SUFFIX, checkpoint_path_for
from kronos_audit.project import Project, find_project
from kronos_audit.status import status
from kronos_audit.storage import Location, Storage
from kronos_audit.verify import expand_manifest_args, trust_problems, verify_each

REMOTE_OPTION = click.option("--remote", help="DVC remote name (default: the default remote).")


def _manifests(targets: tuple[Path, ...]) -> tuple[Project, list[Path]]:
    """The manifests named (directories expanded; none: every manifest in the repository)."""
    project = find_project(targets[0] if targets else Path.cwd()).require_initialized()
    if targets:
        return project, expand_manifest_args(list(targets))
    found = sorted(
        p
        for p in project.root.rglob("*" + MANIFEST_SUFFIX)
        if not {".git", ".dvc"} & set(p.relative_to(project.root).parts)
    )
    if not found:
        raise UsageError("no manifest (*.kaudit.json) in this repository", path=project.root)
    return project, found


@cli.command()
@click.argument("targets", nargs=-1, type=click.Path(path_type=Path))
@REMOTE_OPTION
def push(targets: tuple[Path, ...], remote: str | None) -> None:
    """Push checkpoints (RUN_DIR or MANIFEST...; default: all) to the DVC remote."""
    project, manifests = _manifests(targets)
    present = [checkpoint_path_for(m) for m in manifests if checkpoint_path_for(m).exists()]
    absent = len(manifests) - len(present)
    if not present:
        raise UsageError("none of these checkpoints is here to push", path=manifests[0])
    uploaded = Storage(project).push(present, remote)
    out.print(
        f"pushed {len(present)} checkpoint(s): {uploaded} object(s) uploaded, "
        f"the rest were in the remote already"
        + (f"; {absent} not here (pruned or never pulled), left as they are" if absent else "")
    )


@cli.command()
@click.argument("targets", nargs=-1, required=True, type=click.Path(path_type=Path))
@REMOTE_OPTION
@trust_options
@click.pass_context
def pull(
    ctx: click.Context,
    targets: tuple[Path, ...],
    remote: str | None,
    trusted_keys: tuple[Path, ...],
    trust_ref: str | None,
    require_anchor: bool,
) -> None:
    """Fetch checkpoints (RUN_DIR or MANIFEST...) from the DVC remote, each only once its
    manifest's signature and place verify, and check them before they become visible.

    Data is fetched by the md5 the signed manifest records, to the checkpoint's own path;
    .dvc files are not consulted. Exit 1 if fetched data does not match its signed
    manifest (it is never left in place), 2 for bad input.

    \b
    Example:
      kaudit pull checkpoints/heat --trusted-key alice.pub
    """
    _, manifests = _manifests(targets)
    options = trust_from(trusted_keys, trust_ref, require_anchor)
    for problem in trust_problems(manifests, options):
        warn(problem)
    failed = errors = 0
    for outcome in verify_each(manifests, fetch=True, trust=options, remote=remote):
        if isinstance(outcome, Error):
            errors += 1
            fail_line(str(outcome))
            continue
        if outcome.ok:
            how = "fetched" if outcome.fetched else "here"
            out.print(f"[green]ok[/]   {safe(outcome.checkpoint)} ({how})")
            continue
        failed += 1
        for c in outcome.failures:
            out.print(f"[red]FAIL[/] {safe(outcome.checkpoint)}: {safe(c.name)}: {safe(c.detail)}")
    ctx.exit(2 if errors else 1 if failed else 0)


@cli.command("status")
@click.argument("targets", nargs=-1, type=click.Path(path_type=Path))
@REMOTE_OPTION
@click.option("--local-only", is_flag=True, help="Do not ask the remote.")
def status_command(targets: tuple[Path, ...], remote: str | None, local_only: bool) -> None:
    """Where each checkpoint is: local / pushed / remote-only / missing / corrupt."""
    project, manifests = _manifests(targets)
    entries = status(project, manifests, remote, check_remote=not local_only)
    colours = {
        Location.LOCAL: "yellow",
        Location.PUSHED: "green",
        Location.REMOTE_ONLY: "cyan",
        Location.MISSING: "red",
        Location.CORRUPT: "red",
    }
    table = Table()
    for col in ("checkpoint", "step", "size", "where"):
        table.add_column(col, overflow="fold")
    for e in entries:
        table.add_row(
            safe(project.relative(e.checkpoint)),  # a file's name: text, never markup
            str(e.step),
            f"{e.size:,}",
            f"[{colours[e.location]}]{e.location.value}[/]",
        )
    out.print(table)
    counts: dict[str, int] = {}
    for e in entries:
        counts[e.location.value] = counts.get(e.location.value, 0) + 1
    out.print(", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
