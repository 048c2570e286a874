"""`kaudit campaign`: a job array's campaign, task by task; the line that resubmits the
missing tasks; its completeness certificate."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from kronos_audit.cli.options import ask_passphrase, json_option, trust_options
from kronos_audit.cli.output import Column, out, safe, shown
from kronos_audit.errors import CampaignError, ExitCode, UsageError

if TYPE_CHECKING:
    from kronos_audit.keys.anchors import TrustOptions
    from kronos_audit.verification.array import ArrayCampaign, TaskState

SHOWN = 5
"""Missing batches, and manifests ignored, named per task; the rest are counted."""
ROWS = 20
"""Tasks in the table: an array of more shows only its tasks that are not done, this
many of them, and counts the rest (``--json`` lists every task)."""


def _missing_text(indices: list[int]) -> str:
    named = ", ".join(str(i) for i in indices[:SHOWN])
    return named + (f", ... ({len(indices)})" if len(indices) > SHOWN else "")


def _state(s: TaskState, array: ArrayCampaign) -> str:
    if s.problem is not None:
        return "does not verify"
    if s.part is None:
        return "not started"
    return "done" if not s.missing(array.n, array.tasks) else "partial"


def _task_json(s: TaskState, array: ArrayCampaign, path: Callable[[Path], str]) -> dict[str, Any]:
    share = array.share(s.task)
    return {
        "task": s.task,
        "run": s.run,
        "state": _state(s, array),
        "done": s.done,
        "share": share,
        "missing": s.missing(array.n, array.tasks),
        "manifest": None if s.part is None else path(s.part.manifest.path),
        "problem": s.problem,
        "ignored": list(s.ignored),
    }


@click.command("campaign")
@click.argument("name")
@click.option(
    "--root",
    type=click.Path(path_type=Path, file_okay=False),
    default=Path("checkpoints"),
    show_default=True,
    help="The directory holding the tasks' run directories (as Run(root=...)).",
)
@click.option(
    "--script",
    help="The batch script the resubmit line names (default: the one Slurm recorded).",
)
@click.option(
    "--certify",
    is_flag=True,
    help="Sign the campaign's completeness certificate (ROOT/NAME.campaign.json).",
)
@click.option("--key", help="Signing key for --certify (default: $KAUDIT_KEY, else the only one).")
@click.option(
    "--push",
    is_flag=True,
    help="With --certify: track the certificate's records with DVC and push them to the "
    "default remote, as a run with push=True does.",
)
@trust_options
@json_option("Print the campaign's tasks as JSON.")
@click.pass_context
def campaign(
    ctx: click.Context,
    name: str,
    root: Path,
    script: str | None,
    certify: bool,
    key: str | None,
    push: bool,
    trust: TrustOptions,
    as_json: bool,
) -> None:
    """A job array's campaign: each task's batches done and missing, the sbatch line
    that resubmits the missing, its completeness certificate.

    Task K of campaign NAME is the run ROOT/NAME.task-K (ka.Run("NAME",
    task=ka.ArrayTask.from_slurm())), read at its last checkpoint once that verifies
    under the trust options (as for `kaudit verify`): the newest whose manifest's
    signature and place hold; newer files named as manifests are listed as ignored.
    The line printed runs the
    incomplete tasks again, with the array's size exported (KAUDIT_ARRAY_TASKS). With
    --certify, once every batch is in, sign ROOT/NAME.campaign.json, the certificate that
    each batch ran exactly once (`kaudit verify` checks it). Above 20 tasks the table
    shows only the tasks not done; --json lists every task.

    With --push the records go to the DVC remote too (NAME.records.dvc beside them:
    commit it with the certificate); a push that fails leaves the certificate and exits 1.

    Exit 0 when every batch is in (and, with --certify, certified), 1 while some are
    missing, 2 for bad input.

    \b
    Example:
      kaudit campaign pi --root checkpoints --certify
    """
    from kronos_audit.keys.anchors import load_keyring
    from kronos_audit.keys.home import select_key
    from kronos_audit.project.repository import find_project
    from kronos_audit.runtime.campaigns.certify import RecordsNotPushed
    from kronos_audit.runtime.campaigns.certify import certify as sign_certificate
    from kronos_audit.verification.array import NoSuchCampaign, read_array
    from kronos_audit.verification.campaign import CampaignRefused
    from kronos_audit.verification.verifier import Verifier

    if key is not None and not certify:
        raise UsageError("--key names the key that signs the certificate: add --certify")
    if push and not certify:
        raise UsageError("--push pushes the certificate's records: add --certify")
    project = find_project(root if root.is_dir() else Path.cwd())
    storage = None
    if push:
        from kronos_audit.storage import Storage

        storage = Storage(project)
        storage.remote_name(None)  # no default remote: bad input, before anything is signed
    signing_key = select_key(key, passphrase=ask_passphrase) if certify else None
    verifier = Verifier(project, load_keyring(project.root, trust))
    try:
        array = read_array(verifier, root, name)
    except NoSuchCampaign as e:
        raise UsageError(str(e)) from None
    except CampaignRefused as e:
        raise CampaignError(str(e)) from None
    line = array.resubmit(script)
    certificate = None
    not_pushed: str | None = None
    if signing_key is not None and line is None:
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", RecordsNotPushed)
                certificate = sign_certificate(
                    verifier, signing_key, name, array.parts(), array.n, storage=storage
                )
        except CampaignRefused as e:
            raise CampaignError(str(e)) from None
        not_pushed = next(
            (str(w.message) for w in caught if issubclass(w.category, RecordsNotPushed)), None
        )
    ok = line is None and not_pushed is None
    if as_json:
        out.json(
            {
                "ok": ok,
                "campaign": name,
                "tasks": array.tasks,
                "n": array.n,
                "done": array.done,
                "resubmit": line,
                "certificate": None if certificate is None else project.relative(certificate),
                "pushed": None if storage is None or certificate is None else not_pushed is None,
                "strays": list(array.strays),
                "parts": [_task_json(s, array, project.relative) for s in array.states],
            }
        )
    else:
        _print(array, line)
        if certificate is not None:
            out.print(f"certified: {safe(shown(certificate))}")
            if not_pushed is not None:
                out.print(f"[red]FAIL[/] {safe(not_pushed)}", failure=True)
            elif storage is not None:
                out.print("its records pushed to the DVC remote")
        elif certify:
            out.print("[red]not certified[/]: batches are missing", failure=True)
    ctx.exit(ExitCode.OK if ok else ExitCode.CHECK_FAILED)


def _print(array: ArrayCampaign, line: str | None) -> None:
    listed = array.states
    if len(listed) > ROWS:  # ten thousand tasks done are one line, not a table
        listed = tuple(s for s in listed if _state(s, array) != "done")
    rows = []
    for s in listed[:ROWS]:
        missing = s.missing(array.n, array.tasks)
        share = array.share(s.task)
        state = _state(s, array)
        colour = {"done": "green", "partial": "yellow"}.get(state, "red")
        rows.append(
            (
                str(s.task),
                f"[{colour}]{state}[/]",
                f"{s.done}/{share}",
                safe(_missing_text(missing)) if missing else "",
            )
        )
    if rows:
        out.table(
            [Column("task", "right"), Column("state"), Column("done", "right"), Column("missing")],
            rows,
        )
    hidden = len(array.states) - len(rows)
    if hidden:
        done = len(array.states) - len(listed)
        out.print(
            f"{hidden} task(s) not in the table: {done} done, {hidden - done} not done "
            "(--json lists every task)"
        )
    for s in array.states:
        if s.problem is not None:
            out.print(f"[red]task {s.task}[/]: {safe(s.problem)}", failure=True)
        for why in s.ignored[:SHOWN]:
            out.print(f"[yellow]task {s.task}[/]: ignored {safe(why)}")
        if len(s.ignored) > SHOWN:
            out.print(f"[yellow]task {s.task}[/]: {len(s.ignored) - SHOWN} more ignored")
    for stray in array.strays:
        out.print(f"[yellow]{safe(stray)}[/]: not a task of this array of {array.tasks}")
    out.print(
        f"campaign {safe(array.campaign)}: {array.done} of {array.n} batches in "
        f"{array.tasks} task(s)"
    )
    if line is not None:
        out.print(f"resubmit the incomplete tasks: {safe(line)}", failure=True)
