"""`kaudit push`: checkpoints whose manifests verify, to a DVC remote."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from kronos_audit.checkpoint.layout import CERTIFICATE_SUFFIX
from kronos_audit.cli._app import error_json
from kronos_audit.cli.options import (
    REMOTE_OPTION,
    json_option,
    manifests_named,
    trust_options,
    warn,
)
from kronos_audit.cli.output import error_line, fail_line, out, safe, shown
from kronos_audit.errors import Error, ExitCode, UsageError

if TYPE_CHECKING:
    from kronos_audit.keys.anchors import TrustOptions
    from kronos_audit.storage import FetchItem


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
    trust: TrustOptions,
    as_json: bool,
) -> None:
    """Push checkpoints (RUN_DIR or MANIFEST...; default: all) to the DVC remote.

    Each manifest's signature and place are verified first; the data goes by the md5 and
    size the manifest signs (.dvc files are not consulted), and is confirmed in the remote
    afterwards. A manifest goes only onto its run's chain in the remote: where another
    chain of the run is there (a second writer pushed its own steps), it is refused,
    naming both steps and both writers, and nothing there is replaced. Exit 1 if a
    manifest does not verify or is refused (it is not pushed) or an object is not in the
    remote after the push, 2 for bad input.

    A campaign certificate (NAME.campaign.json), named on its own, pushes its records
    (NAME.records/) once its signature verifies, tracked by DVC as one directory
    (NAME.records.dvc: commit it with the certificate).

    \b
    Example:
      kaudit push checkpoints/heat --trusted-key alice.pub
    """
    from kronos_audit.cli.progress import progress_bar
    from kronos_audit.errors import PushIncomplete
    from kronos_audit.keys.anchors import load_keyring
    from kronos_audit.storage import Storage
    from kronos_audit.storage.directories import push_listings
    from kronos_audit.storage.remote_chain import push_manifests
    from kronos_audit.storage.steps import step_items
    from kronos_audit.verification.chain import place_check
    from kronos_audit.verification.verifier import Verifier

    certificates = [t for t in targets if t.name.endswith(CERTIFICATE_SUFFIX)]
    if certificates:
        ctx.exit(_push_certificates(certificates, targets, remote, trust, as_json))
    project, manifests = manifests_named(targets)
    keyring = load_keyring(project.root, trust)
    if not as_json:
        for problem in keyring.problems:
            warn(problem)
    verifier = Verifier(project, keyring)
    # What is pushed is what verified manifests sign: a manifest that does not verify is
    # named and neither it nor its data goes.
    bad: dict[Path, Error] = {}  # bad input: exit 2, the others still go
    refused: dict[Path, str] = {}
    items: dict[Path, list[FetchItem]] = {}  # by manifest
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
        elif (objects := step_items(manifest)) is None:
            refused[m] = "not pushed: its shard index is not the one its manifest signs"
        else:
            items[m] = objects  # a checkpoint file; a sharded step's index and every shard
    if not items and not refused and not bad:
        raise UsageError("none of these checkpoints is here to push", path=manifests[0])
    storage = Storage(project)
    missing: dict[Path, str] = {}
    uploaded = 0
    sent = 0
    repaired: list[tuple[FetchItem, str]] = []
    with progress_bar() as bar:
        bar.update(f"pushing {len(items)} checkpoint(s)", 0, 0)
        if items:
            # A step signed but not tracked (signed by an older kaudit before it was
            # tracked, or its cache object lost) is tracked again from its verified bytes
            # here, and said: DVC pushes only what its cache holds. Only once there is a
            # remote to push to (none: exit 2, nothing changed here).
            storage.remote_name(remote)
            repaired = storage.repair_tracking([i for group in items.values() for i in group])
            try:
                uploaded = storage.push([i for group in items.values() for i in group], remote)
            except PushIncomplete as e:
                missing, uploaded = e.missing, e.uploaded
            # A directory step's listing, once its files are there: what `dvc pull` reads.
            listed = {
                verifier.cache.read(m).checkpoint_path: m
                for m, group in items.items()
                if not any(i.checkpoint in missing for i in group)
            }
            unlisted = push_listings(
                storage, [verifier.cache.read(m) for m in listed.values()], remote
            )
            refused.update({listed[path]: why for path, why in unlisted.items()})
        # The manifests travel with their data, after it, as Run(push=True) sends them:
        # a run resumes on another machine from the remote (docs/storage.md). All of
        # them whose data is there (or pruned), those of pruned checkpoints too: they are
        # the chain. One whose data is not in the remote stays here.
        to_send = [
            m
            for m in manifests
            if m not in refused
            and m not in bad
            and (m not in items or not any(i.checkpoint in missing for i in items[m]))
        ]
        # One that another chain of its run in the remote refuses stays here (and the
        # rest of its chain with it): named below, nothing there replaced.
        sent = push_manifests(storage, to_send, remote, refused=refused) if to_send else 0
    # Each checkpoint not in the remote is named with the step it is of.
    read = {path: verifier.cache.read(path) for path in items}
    steps = {
        item.checkpoint: f" (run {read[path].run!r} step {read[path].step})"
        for path, group in items.items()
        for item in group
    }
    ok = not refused and not missing and not bad
    code = ExitCode.BAD_INPUT if bad else ExitCode.OK if ok else ExitCode.CHECK_FAILED
    if as_json:
        out.json(
            {
                "ok": ok,
                "pushed": [
                    project.relative(group[0].checkpoint)
                    for m, group in items.items()
                    if m not in refused and not any(i.checkpoint in missing for i in group)
                ],
                "uploaded": uploaded,
                "repaired": [
                    {"path": project.relative(item.checkpoint), "detail": how}
                    for item, how in repaired
                ],
                "manifests": sent,
                "not_here": [
                    project.relative(verifier.cache.read(m).checkpoint_path) for m in absent
                ],
                "failed": [
                    {"path": project.relative(p), "detail": why}
                    for p, why in [*refused.items(), *missing.items()]
                ],
                "errors": [error_json(e) for e in bad.values()],
            }
        )
        ctx.exit(code)
    for bad_input in bad.values():
        fail_line(error_line(bad_input))
    for item, how in repaired:
        out.print(f"[yellow]repaired[/] {safe(shown(item.checkpoint))}: {safe(how)}")
    for path, why in refused.items():
        out.print(f"[red]FAIL[/] {safe(shown(path))}: {safe(why)}", failure=True)
    for path, why in missing.items():
        out.print(
            f"[red]FAIL[/] {safe(shown(path))}{safe(steps.get(path, ''))}: {safe(why)}",
            failure=True,
        )
    pushed = sum(
        m not in refused and not any(i.checkpoint in missing for i in group)
        for m, group in items.items()
    )
    out.print(
        f"pushed {pushed} checkpoint(s): {_what_went(items, missing, refused, uploaded)}; "
        f"their {sent} manifest(s) beside them"
        + (f"; {len(absent)} not here (pruned or never pulled), left as they are" if absent else "")
        + (f"; {len(refused) + len(missing) + len(bad)} not pushed (above)" if not ok else "")
    )
    ctx.exit(code)


def _push_certificates(
    certificates: list[Path],
    targets: tuple[Path, ...],
    remote: str | None,
    trust: TrustOptions,
    as_json: bool,
) -> ExitCode:
    """``kaudit push`` of campaign certificates: each one's records, once it verifies."""
    from kronos_audit.errors import PushIncomplete
    from kronos_audit.keys.anchors import load_keyring
    from kronos_audit.project.repository import find_project
    from kronos_audit.runtime.campaigns.certify import push_certificate
    from kronos_audit.storage import Storage
    from kronos_audit.verification.campaign import CampaignRefused
    from kronos_audit.verification.verifier import Verifier

    if len(certificates) != len(targets):
        raise UsageError("push campaign certificates on their own, not with checkpoints")
    project = find_project(certificates[0]).require_initialized()
    verifier = Verifier(project, load_keyring(project.root, trust))
    if remote is not None:
        raise UsageError("a certificate's records go to the default remote: drop --remote")
    storage = Storage(project)
    storage.remote_name(None)  # no remote to push to: bad input, nothing read
    failed: dict[Path, str] = {}
    pushed: dict[Path, int] = {}
    for cert in certificates:
        try:
            pushed[cert] = push_certificate(storage, verifier, cert)
        except CampaignRefused as e:
            failed[cert] = str(e)
        except PushIncomplete as e:
            failed[cert] = e.message
    if as_json:
        out.json(
            {
                "ok": not failed,
                "certificates": [project.relative(c) for c in pushed],
                "uploaded": sum(pushed.values()),
                "failed": [{"path": project.relative(p), "detail": w} for p, w in failed.items()],
            }
        )
    else:
        for path, why in failed.items():
            out.print(f"[red]FAIL[/] {safe(shown(path))}: {safe(why)}", failure=True)
        for path, n in pushed.items():
            out.print(f"pushed the records of {safe(shown(path))}: {n} file(s)")
    return ExitCode.CHECK_FAILED if failed else ExitCode.OK


def _what_went(
    items: dict[Path, list[FetchItem]],
    missing: dict[Path, str],
    refused: dict[Path, str],
    uploaded: int,
) -> str:
    """What a push did with the objects of the checkpoints it pushed: how many it uploaded,
    how many were in the remote already, and how many files were identical, sharing one
    object (DVC stores content once, by its md5)."""
    pushed = [
        i
        for m, group in items.items()
        if m not in refused and not any(i.checkpoint in missing for i in group)
        for i in group
    ]
    by_md5: dict[str, int] = {}
    for item in pushed:
        by_md5[item.md5] = by_md5.get(item.md5, 0) + 1
    said = [f"{uploaded} object(s) uploaded"]
    already = len(by_md5) - uploaded
    if already > 0:
        said.append(
            f"{already} in the remote already (each confirmed there, by its signed md5 and size)"
        )
    shared = [n for n in by_md5.values() if n > 1]
    if shared:
        said.append(f"{sum(shared)} identical files stored as {len(shared)} object(s)")
    return ", ".join(said)
