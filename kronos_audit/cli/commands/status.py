"""`kaudit status`: where each checkpoint is (local, pushed, remote-only, pruned, missing,
corrupt)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from kronos_audit.cli.options import (
    REMOTE_OPTION,
    json_option,
    manifests_named,
    trust_options,
    warn,
)
from kronos_audit.cli.output import Column, out, safe, settings, shown
from kronos_audit.errors import ExitCode

if TYPE_CHECKING:
    from kronos_audit.keys.anchors import TrustOptions
    from kronos_audit.runtime.levels.listing import Held

# How `status` colours each location (by its value: the enum lives in the library).
_COLOURS = {
    "local": "yellow",
    "pushed": "green",
    "remote-only": "cyan",
    "pruned": "blue",
    "missing": "red",
    "corrupt": "red",
}


@click.command("status")
@click.argument("targets", nargs=-1, type=click.Path(path_type=Path))
@REMOTE_OPTION
@click.option("--local-only", is_flag=True, help="Do not ask the remote.")
@click.option(
    "--require-remote",
    is_flag=True,
    help="Fail (exit 2) if the remote cannot be read, instead of showing the places here.",
)
@click.option(
    "--level-dir",
    "level_dirs",
    multiple=True,
    metavar="DIR",
    help="A memory level's directory ({node}: any node's): list the steps it holds too.",
)
@trust_options
@json_option("Print each checkpoint's place as JSON.")
@click.pass_context
def status_command(
    ctx: click.Context,
    targets: tuple[Path, ...],
    remote: str | None,
    local_only: bool,
    require_remote: bool,
    level_dirs: tuple[str, ...],
    trust: TrustOptions,
    as_json: bool,
) -> None:
    """Where each checkpoint (RUN_DIR, CKPT or MANIFEST...; default: all) is: local /
    pushed / remote-only / pruned / missing / corrupt.

    Pruned: not here, and a later manifest of its run, whose signature verifies under the
    trust options (as for `kaudit verify`), records pruning it. Nothing else is verified:
    that is `kaudit verify`.

    Before any DVC remote is set up (and without --remote), only the places here are
    shown, as with --local-only: local, pruned, missing or corrupt.

    A remote that cannot be read (a server down, no network) does not fail the command:
    the places here are shown, and one warning line says the remote was not heard. With
    --require-remote that is an error (exit 2).

    A step whose run's DVC remote holds another manifest of it (another chain of the run,
    pushed by a second writer) is not pushed there, whatever data went. A step with two
    children among the run's manifests in the remote (signed by signers the trust options
    accept) is a fork, named in one line.

    With --level-dir (a run's ``ka.MemoryLevel`` directory, ``{node}`` standing for any
    node), the steps its memory and partner levels hold there are listed too, by level
    and shard count: only while those directories exist (node-local RAM, usually gone
    with the job), and only those this machine sees; not verified.

    Exit 1 when a checkpoint here is corrupt (not the bytes its manifest signs), or the
    run's chain forks in the remote.

    \b
    Example:
      kaudit status checkpoints/heat --local-only
    """
    from kronos_audit.history.status import status_report
    from kronos_audit.storage import Storage

    if local_only and require_remote:
        raise click.UsageError("--local-only and --require-remote contradict each other")
    project, manifests = manifests_named(targets)
    # No remote yet (a new repository): what is here, as `git status` before any push.
    ask = not local_only and (
        remote is not None or require_remote or Storage(project).has_default_remote()
    )
    chains = None
    problems: list[str] = []
    if ask:  # every manifest of each run there, read once: this step's, and any fork
        from kronos_audit.statement.manifest import read_manifest
        from kronos_audit.storage.remote_chain import remote_chains

        runs = [read_manifest(m).run for m in manifests]
        chains = remote_chains(Storage(project), runs, remote, problems=problems)
    report = status_report(project, manifests, remote, check_remote=ask, trust=trust, chains=chains)
    unreachable = report.remote_unreachable
    if unreachable is not None and require_remote:
        raise unreachable
    if unreachable is None:  # an unreachable remote is said once, below
        for problem in problems if not as_json else ():
            warn(f"{problem}: not checked for another chain of the run")
    entries = report.entries
    forks: list[str] = []
    if chains:  # only manifests a trusted signer signed fork a chain: a dropped file cannot
        from kronos_audit.keys.anchors import load_keyring
        from kronos_audit.verification.verifier import Verifier

        verifier = Verifier(project, load_keyring(project.root, trust), fetch=False)
        forks = [
            f.describe(run)
            for run, c in chains.items()
            for f in c.forks(lambda m: verifier.signature(m).ok)
        ]
    held = _held(level_dirs, [e.manifest for e in entries])
    plans = _plans(level_dirs, held)
    counts: dict[str, int] = {}
    for e in entries:
        counts[e.location.value] = counts.get(e.location.value, 0) + 1
    corrupt = counts.get("corrupt", 0)
    failed = bool(corrupt or forks)
    if as_json:
        out.json(
            {
                "ok": not failed,
                "checkpoints": [
                    {
                        "checkpoint": project.relative(e.checkpoint),
                        "manifest": project.relative(e.manifest),
                        "step": e.step,
                        "size": e.size,
                        "location": e.location.value,
                    }
                    for e in entries
                ],
                "counts": dict(sorted(counts.items())),
                "remote_asked": ask,
                "remote_unreachable": None if unreachable is None else unreachable.message,
                "forks": forks,
                **({"levels": [h.to_json_obj() for h in held]} if level_dirs else {}),
                **(
                    {"plans": {r: {"step": s, "seconds": p} for r, (s, p) in plans.items()}}
                    if level_dirs
                    else {}
                ),
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
                    safe(shown(e.checkpoint)),  # a file's name: text, never markup
                    str(e.step),
                    f"{e.size:,}",
                    f"[{_COLOURS[e.location.value]}]{e.location.value}[/]",
                )
                for e in entries
            ],
        )
        out.print(", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
        if not ask and not local_only:
            out.print("[dim]no DVC remote yet: places here only (`kaudit init --remote URL`)[/]")
        if unreachable is not None:
            warn(f"{unreachable.message}: places here only (a checkpoint not here is missing)")
        for e in entries:  # with --quiet, what fails the command, and nothing else
            if e.location.value == "corrupt" and settings().quiet:
                out.print(
                    f"[red]corrupt[/] {safe(shown(e.checkpoint))}: not the bytes "
                    "its manifest signs",
                    failure=True,
                )
        for fork in forks:
            out.print(f"[red]FORK[/] {safe(fork)}", failure=True)
        for h in held:
            out.print(
                f"[cyan]{h.level}[/] run {safe(h.run)} step {h.step}: {h.shards} shard"
                f"{'' if h.shards == 1 else 's'}"
            )
        for run, (step, seconds) in plans.items():
            from kronos_audit.runtime.levels.listing import plan_text

            out.print(f"[cyan]plan[/] run {safe(run)} (step {step}): {plan_text(seconds)}")
        if level_dirs and not held:
            out.print("[dim]no step on the levels in the directories given[/]")
    ctx.exit(ExitCode.CHECK_FAILED if failed else ExitCode.OK)


def _plans(
    level_dirs: tuple[str, ...], held: list[Held]
) -> dict[str, tuple[int, dict[str, float]]]:
    """Each run's plan of ``Auto.for_levels``, as its newest memory step records it."""
    if not held:
        return {}
    from kronos_audit.runtime.levels.listing import expand, planned

    directories = expand(list(level_dirs))
    plans: dict[str, tuple[int, dict[str, float]]] = {}
    for run in sorted({h.run for h in held}):
        found = planned(directories, run)
        if found is not None:
            plans[run] = found
    return plans


def _held(level_dirs: tuple[str, ...], manifests: list[Path]) -> list[Held]:
    """The steps the level directories hold of the runs ``manifests`` are of (none
    without a directory)."""
    if not level_dirs:
        return []
    from kronos_audit.errors import Error
    from kronos_audit.runtime.levels.listing import expand, held_steps
    from kronos_audit.statement.manifest import read_manifest

    runs = set()
    for manifest in manifests:
        try:
            runs.add(read_manifest(manifest).run)
        except Error:
            continue  # not a run's: status shows what it can of it
    return held_steps(expand(list(level_dirs)), runs)
