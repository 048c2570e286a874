"""`kaudit push`, `pull`, `status`: checkpoints in DVC remotes."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

import click

from kronos_audit.cli._app import Column, error_json, out, plain, safe
from kronos_audit.cli.options import json_option, trust_from, trust_options, warn
from kronos_audit.errors import Error, ExitCode, UsageError

if TYPE_CHECKING:
    from kronos_audit.project.repository import Project
    from kronos_audit.storage import Storage
    from kronos_audit.verification.verify import Verifier, VerifyResult

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
    from kronos_audit.checkpoint.layout import expand_targets, statements_in
    from kronos_audit.project.repository import find_project

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
@trust_options
@json_option("Print what was pushed as JSON.")
@click.pass_context
def push(
    ctx: click.Context,
    targets: tuple[Path, ...],
    remote: str | None,
    trusted_keys: tuple[Path, ...],
    trust_ref: str | None,
    require_anchor: bool,
    as_json: bool,
) -> None:
    """Push checkpoints (RUN_DIR or MANIFEST...; default: all) to the DVC remote.

    Each manifest's signature and place are verified first; the data goes by the md5 and
    size the manifest signs (.dvc files are not consulted), and is confirmed in the remote
    afterwards. Exit 1 if a manifest does not verify (it is not pushed) or an object is
    not in the remote after the push, 2 for bad input.

    \b
    Example:
      kaudit push checkpoints/heat --trusted-key alice.pub
    """
    from kronos_audit.cli.progress import progress_bar
    from kronos_audit.errors import PushIncomplete
    from kronos_audit.keys.anchors import load_keyring
    from kronos_audit.runtime.resume_remote import push_manifests
    from kronos_audit.storage import FetchItem, Storage
    from kronos_audit.verification.verify import Verifier, place_check

    project, manifests = _manifests(targets)
    keyring = load_keyring(project.root, trust_from(trusted_keys, trust_ref, require_anchor))
    if not as_json:
        for problem in keyring.problems:
            warn(problem)
    verifier = Verifier(project, keyring)
    # What is pushed is what verified manifests sign: a manifest that does not verify is
    # named and neither it nor its data goes.
    bad: dict[Path, Error] = {}  # bad input: exit 2, the others still go
    refused: dict[Path, str] = {}
    items: dict[Path, FetchItem] = {}  # by manifest
    absent: list[Path] = []
    for m in manifests:
        try:
            manifest = verifier.cache.read(m)
        except Error as e:
            bad[m] = e
            continue
        signed = verifier.signature(manifest)
        place = place_check(project, manifest)
        if not signed.ok or not place.ok:
            why = f"signature: {signed.detail}" if not signed.ok else f"place: {place.detail}"
            refused[m] = f"not pushed, the manifest does not verify ({why})"
            continue
        checkpoint = manifest.checkpoint_path
        if not checkpoint.exists():
            absent.append(m)
        elif manifest.subject_md5 is None:
            refused[m] = "not pushed: its manifest records no DVC md5 to push the data by"
        else:
            items[m] = FetchItem(
                checkpoint, manifest.subject_md5, manifest.subject_sha256, manifest.record.size
            )
    if not items and not refused and not bad:
        raise UsageError("none of these checkpoints is here to push", path=manifests[0])
    storage = Storage(project)
    missing: dict[Path, str] = {}
    uploaded = 0
    sent = 0
    with progress_bar() as bar:
        bar.update(f"pushing {len(items)} checkpoint(s)", 0, 0)
        if items:
            try:
                uploaded = storage.push(list(items.values()), remote)
            except PushIncomplete as e:
                missing, uploaded = e.missing, e.uploaded
        # The manifests travel with their data, after it, as Run(push=True) sends them:
        # a run resumes on another machine from the remote (docs/storage.md). All of
        # them whose data is there (or pruned), those of pruned checkpoints too: they are
        # the chain. One whose data is not in the remote stays here.
        to_send = [
            m
            for m in manifests
            if m not in refused
            and m not in bad
            and (m not in items or items[m].checkpoint not in missing)
        ]
        sent = push_manifests(storage, to_send, remote) if to_send else 0
    ok = not refused and not missing and not bad
    code = ExitCode.BAD_INPUT if bad else ExitCode.OK if ok else ExitCode.CHECK_FAILED
    if as_json:
        out.json(
            {
                "ok": ok,
                "pushed": [
                    str(i.checkpoint) for i in items.values() if i.checkpoint not in missing
                ],
                "uploaded": uploaded,
                "manifests": sent,
                "not_here": [str(verifier.cache.read(m).checkpoint_path) for m in absent],
                "failed": [{"path": str(p), "detail": why} for p, why in refused.items()]
                + [{"path": str(p), "detail": why} for p, why in missing.items()],
                "errors": [error_json(e) for e in bad.values()],
            }
        )
        ctx.exit(code)
    for bad_input in bad.values():
        click.echo(f"kaudit: error: {plain(str(bad_input))}", err=True)
    for path, why in [*refused.items(), *missing.items()]:
        out.print(f"[red]FAIL[/] {safe(path)}: {safe(why)}")
    pushed = len(items) - len(missing)
    out.print(
        f"pushed {pushed} checkpoint(s): {uploaded} object(s) uploaded, "
        f"the rest were in the remote already (each confirmed there, by its signed md5 and "
        f"size); their {sent} manifest(s) beside them"
        + (f"; {len(absent)} not here (pruned or never pulled), left as they are" if absent else "")
        + (f"; {len(refused) + len(missing) + len(bad)} not pushed (above)" if not ok else "")
    )
    ctx.exit(code)


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
    trusted_keys: tuple[Path, ...],
    trust_ref: str | None,
    require_anchor: bool,
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
    from kronos_audit.verification.verify import VerifyResult, trust_problems, verify_each

    _, manifests = _manifests(targets)
    options = trust_from(trusted_keys, trust_ref, require_anchor)
    if not as_json:
        for problem in trust_problems(manifests, options):
            warn(problem)
    results: list[VerifyResult] = []
    errors: list[Error] = []
    verifiers: dict[Path, Verifier] = {}
    storages: dict[Path, Storage] = {}
    replaced: set[Path] = set()
    with progress_bar() as bar:
        outcomes = verify_each(
            manifests, fetch=True, trust=options, remote=remote, verifiers=verifiers
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
                    bar.error(str(outcome))
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
                out.print(f"[green]ok[/]   {safe(outcome.checkpoint)} ({how})")
                continue
            hint = (
                " (the local copy is left as it is: `kaudit pull --force` replaces it with "
                "the verified remote object)"
                if verifier is not None
                else ""
            )
            for c in outcome.failures:
                out.print(
                    f"[red]FAIL[/] {safe(outcome.checkpoint)}: {safe(c.name)}: "
                    f"{safe(c.detail)}{hint}"
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
    ctx.exit(ExitCode.BAD_INPUT if errors else ExitCode.CHECK_FAILED if failed else ExitCode.OK)


def _repairable(outcome: VerifyResult | Error, verifiers: dict[Path, Verifier]) -> Verifier | None:
    """The verifier of a local copy that fails its check while its manifest verifies
    (signature, place and chain hold; only the bytes here are not the signed ones), which
    ``pull --force`` may replace; None for anything else."""
    from kronos_audit.project.repository import find_project
    from kronos_audit.verification.verify import CheckName, VerifyResult

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
    from kronos_audit.verification.verify import Check, CheckName

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
    from kronos_audit.history.status import status

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
    ctx.exit(ExitCode.CHECK_FAILED if corrupt else ExitCode.OK)
