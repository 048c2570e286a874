"""`kaudit pull`: checkpoints fetched from a DVC remote, each checked against its signed
manifest before it becomes visible."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

import click

from kronos_audit.cli._app import error_json
from kronos_audit.cli.options import (
    REMOTE_OPTION,
    json_option,
    manifests_named,
    trust_options,
    warn,
)
from kronos_audit.cli.output import error_line, out, safe, shown
from kronos_audit.errors import Error, ExitCode

if TYPE_CHECKING:
    from kronos_audit.keys.anchors import TrustOptions
    from kronos_audit.storage import Storage
    from kronos_audit.verification.results import VerifyResult
    from kronos_audit.verification.verifier import Verifier


@click.command()
@click.argument("targets", nargs=-1, required=True, type=click.Path(path_type=Path))
@REMOTE_OPTION
@trust_options
@click.option(
    "--force",
    is_flag=True,
    help="Replace a local copy that fails its check with the verified remote object "
    "(checked before it replaces anything; DVC's cache objects are never written into).",
)
@json_option("Print each checkpoint's outcome as JSON.")
@click.pass_context
def pull(
    ctx: click.Context,
    targets: tuple[Path, ...],
    remote: str | None,
    trust: TrustOptions,
    force: bool,
    as_json: bool,
) -> None:
    """Fetch checkpoints (RUN_DIR or MANIFEST...) from the DVC remote, each only once its
    manifest's signature and place verify, and check them before they become visible.

    Data is fetched by the md5 the signed manifest records, to the checkpoint's own path;
    .dvc files are not consulted. A local copy that fails its check is reported and left
    as it is, unless --force: then it is replaced by the verified remote object. Exit 1
    if fetched data does not match its signed manifest (it is never left in place) or a
    local copy fails, 2 for bad input.

    \b
    Example:
      kaudit pull checkpoints/heat --trusted-key alice.pub
    """
    from kronos_audit.cli.progress import progress_bar
    from kronos_audit.storage import Storage
    from kronos_audit.verification.batch import trust_problems, verify_each
    from kronos_audit.verification.results import VerifyResult

    project, manifests = manifests_named(targets)
    where = project.relative
    if not as_json:
        for problem in trust_problems(manifests, trust):
            warn(problem)
    results: list[VerifyResult] = []
    errors: list[Error] = []
    verifiers: dict[Path, Verifier] = {}
    storages: dict[Path, Storage] = {}
    replaced: set[Path] = set()
    with progress_bar() as bar:
        outcomes = verify_each(
            manifests, fetch=True, trust=trust, remote=remote, verifiers=verifiers
        )
        for done, outcome in enumerate(outcomes, 1):
            bar.update("pulling and checking", done, len(manifests))
            verifier = _repairable(outcome, verifiers)
            if force and verifier is not None and isinstance(outcome, VerifyResult):
                root = verifier.project.root
                storage = storages.setdefault(root, Storage(verifier.project))
                replaced.add(outcome.manifest)
                outcome = _replace(storage, verifier, outcome, remote)
                verifier = None
            if isinstance(outcome, Error):
                errors.append(outcome)
                if not as_json:
                    bar.error(error_line(outcome))
                continue
            results.append(outcome)
            if as_json:
                continue
            if outcome.ok:
                how = (
                    "replaced by the verified remote copy"
                    if outcome.manifest in replaced
                    else "fetched"
                    if outcome.fetched
                    else "here"
                )
                out.print(f"[green]ok[/]   {safe(shown(outcome.checkpoint))} ({how})")
                continue
            hint = (
                " (the local copy is left as it is: `kaudit pull --force` replaces it with "
                "the verified remote object)"
                if verifier is not None
                else ""
            )
            for c in outcome.failures:
                out.print(
                    f"[red]FAIL[/] {safe(shown(outcome.checkpoint))}: {safe(c.name)}: "
                    f"{safe(c.detail)}{hint}",
                    failure=True,
                )
    failed = sum(not r.ok for r in results)
    if as_json:
        out.json(
            {
                "ok": not errors and not failed,
                "results": [
                    {
                        "checkpoint": where(r.checkpoint),
                        "manifest": where(r.manifest),
                        "ok": r.ok,
                        "fetched": r.fetched,
                        "data": None if r.data is None else r.data.value,
                        "failures": [{"name": c.name, "detail": c.detail} for c in r.failures],
                    }
                    for r in results
                ],
                "errors": [error_json(e) for e in errors],
            }
        )
    ctx.exit(ExitCode.BAD_INPUT if errors else ExitCode.CHECK_FAILED if failed else ExitCode.OK)


def _repairable(outcome: VerifyResult | Error, verifiers: dict[Path, Verifier]) -> Verifier | None:
    """The verifier of a local copy that fails its check while its manifest verifies
    (signature, place and chain hold; only the bytes here are not the signed ones), which
    ``pull --force`` may replace; None for anything else."""
    from kronos_audit.project.repository import find_project
    from kronos_audit.verification.results import CheckName, VerifyResult

    if not isinstance(outcome, VerifyResult) or outcome.ok or outcome.fetched:
        return None
    if outcome.is_attestation or not outcome.data_corrupt:
        return None
    data = {CheckName.FILE_DIGEST, CheckName.DATASETS, CheckName.DATASET}
    if any(c.kind not in data for c in outcome.failures):
        return None
    try:
        verifier = verifiers.get(find_project(outcome.manifest).root)
        manifest = None if verifier is None else verifier.cache.read(outcome.manifest)
    except Error:
        return None
    if verifier is None or manifest is None or manifest.record.shards is not None:
        return None  # a sharded step's shards are not replaced here
    if manifest.subject_md5 is None:
        return None
    return verifier


def _replace(
    storage: Storage, verifier: Verifier, damaged: VerifyResult, remote: str | None
) -> VerifyResult | Error:
    """Replace the damaged local copy ``damaged`` names with the object its verified
    manifest signs (checked in a temporary first), then verify it again. Remote data that
    is not the signed data leaves the copy as it is and is one more failed check."""
    from kronos_audit.errors import TamperedData
    from kronos_audit.verification.results import Check, CheckName

    manifest = verifier.cache.read(damaged.manifest)
    assert manifest.subject_md5 is not None  # _repairable made sure
    try:
        storage.fetch(
            manifest.checkpoint_path,
            md5=manifest.subject_md5,
            sha256=manifest.subject_sha256,
            size=manifest.record.size,
            remote=remote,
            replace=True,
        )
    except TamperedData as e:
        failed = Check(CheckName.FILE_DIGEST, False, f"not replaced: {e.message}")
        return dataclasses.replace(damaged, checks=(*damaged.checks, failed))
    except Error as e:
        return e
    try:
        result = verifier.verify(damaged.manifest)
    except Error as e:
        return e
    return dataclasses.replace(result, fetched=True)
