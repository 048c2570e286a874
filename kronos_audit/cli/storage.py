"""`kaudit push`, `pull`, `status`: checkpoints in DVC remotes."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from kronos_audit.cli._app import Column, error_json, out, safe
from kronos_audit.cli.options import json_option, trust_from, trust_options, warn
from kronos_audit.errors import Error, UsageError

if TYPE_CHECKING:
    from kronos_audit.project import Project

REMOTE_OPTION = click.option("--remote", help="DVC remote name (default: the default remote).")

# How `status` colours each location (by its value: the enum lives in the library).
_COLOURS = {
    "local": "yellow",
    "pushed": "green",
    "remote-only": "cyan",
    "pruned": "blue",
    "missing": "red",
    "corrupt": "red",
}


def _manifests(targets: tuple[Path, ...]) -> tuple[Project, list[Path]]:
    """The manifests named: run directories expanded, a checkpoint or a sharded step's
    directory taken for its manifest, attestations passed over (they record a replay, not
    a checkpoint); none named: every manifest in the repository."""
    from kronos_audit.project import find_project
    from kronos_audit.targets import expand_targets, statements_in

    project = find_project(targets[0] if targets else Path.cwd()).require_initialized()
    if targets:
        found = expand_targets(list(targets), attestations=False)
        if not found:
            raise UsageError("no manifest (*.kaudit.json) named", path=targets[0])
        return project, found
    found = list(statements_in(project.root).manifests)
    if not found:
        raise UsageError("no manifest (*.kaudit.json) in this repository", path=project.root)
    return project, found


@click.command()
@click.argument("targets", nargs=-1, type=click.Path(path_type=Path))
@REMOTE_OPTION
@json_option("Print what was pushed as JSON.")
def push(targets: tuple[Path, ...], remote: str | None, as_json: bool) -> None:
    """Push checkpoints (RUN_DIR or MANIFEST...; default: all) to the DVC remote.

    \b
    Example:
      kaudit push checkpoints/heat --remote storage
    """
    from kronos_audit.cli.progress import progress_bar
    from kronos_audit.manifest import checkpoint_path_for
    from kronos_audit.runtime.resume_remote import push_manifests
    from kronos_audit.storage import Storage

    project, manifests = _manifests(targets)
    present = [checkpoint_path_for(m) for m in manifests if checkpoint_path_for(m).exists()]
    absent = [m for m in manifests if not checkpoint_path_for(m).exists()]
    if not present:
        raise UsageError("none of these checkpoints is here to push", path=manifests[0])
    storage = Storage(project)
    with progress_bar() as bar:
        bar.update(f"pushing {len(present)} checkpoint(s)", 0, 0)
        uploaded = storage.push(present, remote)
        # The manifests travel with their data, after it, as Run(push=True) sends them:
        # a run resumes on another machine from the remote (docs/storage.md). All of
        # them, those of pruned checkpoints too: they are the chain.
        sent = push_manifests(storage, manifests, remote)
    if as_json:
        out.json(
            {
                "pushed": [str(c) for c in present],
                "uploaded": uploaded,
                "manifests": sent,
                "not_here": [str(checkpoint_path_for(m)) for m in absent],
            }
        )
        return
    out.print(
        f"pushed {len(present)} checkpoint(s): {uploaded} object(s) uploaded, "
        f"the rest were in the remote already; their {sent} manifest(s) beside them"
        + (f"; {len(absent)} not here (pruned or never pulled), left as they are" if absent else "")
    )


@click.command()
@click.argument("targets", nargs=-1, required=True, type=click.Path(path_type=Path))
@REMOTE_OPTION
@trust_options
@json_option("Print each checkpoint's outcome as JSON.")
@click.pass_context
def pull(
    ctx: click.Context,
    targets: tuple[Path, ...],
    remote: str | None,
    trusted_keys: tuple[Path, ...],
    trust_ref: str | None,
    require_anchor: bool,
    as_json: bool,
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
    from kronos_audit.cli.progress import progress_bar
    from kronos_audit.verify import VerifyResult, trust_problems, verify_each

    _, manifests = _manifests(targets)
    options = trust_from(trusted_keys, trust_ref, require_anchor)
    if not as_json:
        for problem in trust_problems(manifests, options):
            warn(problem)
    results: list[VerifyResult] = []
    errors: list[Error] = []
    with progress_bar() as bar:
        outcomes = verify_each(manifests, fetch=True, trust=options, remote=remote)
        for done, outcome in enumerate(outcomes, 1):
            bar.update("pulling and checking", done, len(manifests))
            if isinstance(outcome, Error):
                errors.append(outcome)
                if not as_json:
                    bar.error(str(outcome))
                continue
            results.append(outcome)
            if as_json:
                continue
            if outcome.ok:
                how = "fetched" if outcome.fetched else "here"
                out.print(f"[green]ok[/]   {safe(outcome.checkpoint)} ({how})")
                continue
            for c in outcome.failures:
                out.print(
                    f"[red]FAIL[/] {safe(outcome.checkpoint)}: {safe(c.name)}: {safe(c.detail)}"
                )
    failed = sum(not r.ok for r in results)
    if as_json:
        out.json(
            {
                "ok": not errors and not failed,
                "results": [
                    {
                        "checkpoint": str(r.checkpoint),
                        "manifest": str(r.manifest),
                        "ok": r.ok,
                        "fetched": r.fetched,
                        "failures": [{"name": c.name, "detail": c.detail} for c in r.failures],
                    }
                    for r in results
                ],
                "errors": [error_json(e) for e in errors],
            }
        )
    ctx.exit(2 if errors else 1 if failed else 0)


@click.command("status")
@click.argument("targets", nargs=-1, type=click.Path(path_type=Path))
@REMOTE_OPTION
@click.option("--local-only", is_flag=True, help="Do not ask the remote.")
@trust_options
@json_option("Print each checkpoint's place as JSON.")
@click.pass_context
def status_command(
    ctx: click.Context,
    targets: tuple[Path, ...],
    remote: str | None,
    local_only: bool,
    trusted_keys: tuple[Path, ...],
    trust_ref: str | None,
    require_anchor: bool,
    as_json: bool,
) -> None:
    """Where each checkpoint (RUN_DIR, CKPT or MANIFEST...; default: all) is: local /
    pushed / remote-only / pruned / missing / corrupt.

    Pruned: not here, and a later manifest of its run, whose signature verifies under the
    trust options (as for `kaudit verify`), records pruning it. Nothing else is verified:
    that is `kaudit verify`.

    Exit 1 when a checkpoint here is corrupt (not the bytes its manifest signs).

    \b
    Example:
      kaudit status checkpoints/heat --local-only
    """
    from kronos_audit.status import status

    project, manifests = _manifests(targets)
    trust = trust_from(trusted_keys, trust_ref, require_anchor)
    entries = status(project, manifests, remote, check_remote=not local_only, trust=trust)
    counts: dict[str, int] = {}
    for e in entries:
        counts[e.location.value] = counts.get(e.location.value, 0) + 1
    corrupt = counts.get("corrupt", 0)
    if as_json:
        out.json(
            {
                "ok": not corrupt,
                "checkpoints": [
                    {
                        "checkpoint": str(e.checkpoint),
                        "manifest": str(e.manifest),
                        "step": e.step,
                        "size": e.size,
                        "location": e.location.value,
                    }
                    for e in entries
                ],
                "counts": dict(sorted(counts.items())),
            }
        )
    else:
        out.table(
            [
                Column("checkpoint"),
                Column("step", "right"),
                Column("size", "right"),
                Column("where"),
            ],
            [
                (
                    safe(project.relative(e.checkpoint)),  # a file's name: text, never markup
                    str(e.step),
                    f"{e.size:,}",
                    f"[{_COLOURS[e.location.value]}]{e.location.value}[/]",
                )
                for e in entries
            ],
        )
        out.print(", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
    ctx.exit(1 if corrupt else 0)
