"""`kaudit verify`: the trust model's checks of each manifest and attestation."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from kronos_audit.cli._app import error_json
from kronos_audit.cli.options import (
    json_option,
    json_paths,
    repository_if_none,
    trust_options,
    warn,
)
from kronos_audit.cli.output import error_line, out, safe, settings, shown
from kronos_audit.errors import Error, ExitCode

if TYPE_CHECKING:
    from kronos_audit.keys.anchors import TrustedKey, TrustOptions
    from kronos_audit.verification.results import VerifyResult


class _Said:
    """What many result lines would repeat, said once after the summary: where each
    anchor that trusted a signer is (its path, or the commit read), and the advice for an
    unanchored signer."""

    def __init__(self) -> None:
        self.anchors: dict[str, str] = {}
        self.advice: set[str] = set()
        self._signers: dict[tuple[str, str | None], str] = {}  # a run's lines repeat one

    def detail(self, text: str) -> str:
        """A check's detail with the unanchored advice left for the end."""
        from kronos_audit.keys.anchors import split_advice

        shown, advice = split_advice(text)
        if advice is not None:
            self.advice.add(advice)
        return shown

    def signer(self, r: VerifyResult) -> str:
        """Who signed and which anchor trusted them: the anchor by name (its path once,
        at the end; in full on every line with -v)."""
        signed = r.signature_check
        if signed is None or not signed.ok:
            return ""
        key = r.signer
        known = (signed.detail, None if key is None else key.key_id)
        said = self._signers.get(known)
        if said is None:
            said = self._signers[known] = self._signer(signed.detail, key)
        return said

    def _signer(self, text: str, key: TrustedKey | None) -> str:
        if key is not None and not settings().verbose:
            full, label = key.describe_anchor(), key.anchor_label()
            if full != label and full in text:
                text = text.replace(full, label, 1)
                who = f"{key.name} (key {key.short_id})"
                self.anchors.setdefault(f"{who}, {label}", full)
        return f"; {safe(text)}"

    def print(self) -> None:
        for who, full in sorted(self.anchors.items()):
            out.print(f"[dim]{safe(who.split(', ', 1)[0])}: {safe(full)}[/]")
        for advice in sorted(self.advice):
            out.print(f"unanchored: {safe(advice)}", failure=True)


def _print_result(r: VerifyResult, said: _Said) -> None:
    from kronos_audit.verification.results import CheckStatus, StatementKind

    mark = "[green]ok[/]  " if r.ok else "[red]FAIL[/]"
    failed = not r.ok  # printed with --quiet too
    fetched = ", fetched from the DVC remote" if r.fetched else ""
    if r.kind is StatementKind.CAMPAIGN:
        # One whose signature does not hold was not read: its name says the campaign.
        read = f"{r.step} batches" if r.certificate is not None else "not read"
        sampled = next((c.detail for c in r.checks if c.detail.startswith("sampled ")), None)
        if sampled is not None:
            read += ", " + sampled.split(":", 1)[0]  # "sampled K of n batches"
        what = f"campaign certificate, campaign {safe(r.run)}, {read}"
    else:
        kind = "attestation, " if r.is_attestation else ""
        what = f"{kind}run {safe(r.run)}, step {r.step}"
    # The accepted signature's own words: who signed, which anchor trusted them, and any
    # revocation they were signed before.
    signer = said.signer(r)
    out.print(
        f"{mark} {safe(shown(r.manifest))}  [dim]({what}{fetched}{signer})[/]",
        failure=failed,
    )
    for c in r.failures:
        detail = said.detail(c.detail)
        out.print(f"      [red]{safe(c.name)}[/]: {safe(detail)}", failure=True)
    # What an attested verdict was reached with: its tolerances and where they came from.
    for i, line in enumerate(r.comparison):
        lead = "      compared: " if i == 0 else "        "
        out.print(f"{lead}{safe(line)}", failure=failed)
    verbose = settings().verbose
    for c in r.checks:
        if c.status is CheckStatus.SKIPPED:  # an UNVERIFIED one is shown above
            out.print(f"      [yellow]{safe(c.name)} skipped[/]: {safe(c.detail)}")
        elif c.ok and verbose:
            out.print(f"      [green]{safe(c.name)}[/]: {safe(c.detail)}")


def _summary(results: list[VerifyResult], errors: list[Error]) -> dict[str, Any]:
    """Counts of what was verified: each kind read, how many held (``ok``) and failed,
    the errors (what could not be read at all: a malformed manifest), and where the
    manifests' data is in :class:`~kronos_audit.checkpoint.location.Location`'s words."""
    from kronos_audit.verification.results import StatementKind

    manifests = [r for r in results if r.kind is StatementKind.MANIFEST]
    certificates = sum(r.kind is StatementKind.CAMPAIGN for r in results)
    data: dict[str, int] = {}
    not_checked: dict[str, int] = {}
    for r in manifests:
        if r.data is not None:
            data[r.data.value] = data.get(r.data.value, 0) + 1
            if not r.data_checked:
                not_checked[r.data.value] = not_checked.get(r.data.value, 0) + 1
    return {
        "manifests": len(manifests),
        "attestations": len(results) - len(manifests) - certificates,
        "certificates": certificates,
        "ok": sum(r.ok for r in results),
        "failed": sum(not r.ok for r in results),
        "errors": len(errors),
        "unanchored": sum(
            r.signer is not None and not r.signer.anchor.anchored and r.ok for r in results
        ),
        "data_checked": sum(r.data_checked for r in manifests),
        "data_not_checked": sum(not r.data_checked for r in manifests),
        "data": dict(sorted(data.items())),
        "not_checked": dict(sorted(not_checked.items())),
    }


def _summary_line(results: list[VerifyResult], summary: dict[str, Any]) -> str:
    """The summary in words: ``5 manifest(s): 3 ok, 2 failed; data checked for 3, not
    checked for 2 (pruned); 1 error(s)``."""
    from kronos_audit.verification.results import StatementKind

    clauses = []
    for kind, label in (
        (StatementKind.MANIFEST, "manifest(s)"),
        (StatementKind.ATTESTATION, "attestation(s)"),
        (StatementKind.CAMPAIGN, "campaign certificate(s)"),
    ):
        of_kind = [r for r in results if r.kind is kind]
        if not of_kind:
            continue
        ok = sum(r.ok for r in of_kind)
        counts = [f"{ok} ok"] if ok else []
        if ok < len(of_kind):
            counts.append(f"[red]{len(of_kind) - ok} failed[/]")
        clauses.append(f"{len(of_kind)} {label}: {', '.join(counts)}")
    if summary["manifests"]:
        checked, unchecked = summary["data_checked"], summary["data_not_checked"]
        where = summary["not_checked"]
        if len(where) == 1 and sum(where.values()) == unchecked:
            why = f" ({next(iter(where))})"
        else:
            why = " (" + ", ".join(f"{n} {w}" for w, n in where.items()) + ")" if where else ""
        if not unchecked:
            clauses.append(f"data checked for {checked}")
        elif not checked:
            clauses.append(f"data not checked for {unchecked}{why}")
        else:
            clauses.append(f"data checked for {checked}, not checked for {unchecked}{why}")
    if summary["unanchored"]:
        clauses.append(f"{summary['unanchored']} signed by unanchored keys")
    if summary["errors"]:
        clauses.append(f"[red]{summary['errors']} error(s)[/]")
    return "; ".join(clauses)


@click.command()
@click.argument("manifests", nargs=-1, type=click.Path(path_type=Path))
@trust_options
@click.option("--remote", help="DVC remote to fetch missing data from (default: the default).")
@click.option("--no-fetch", is_flag=True, help="Do not fetch missing data from the DVC remote.")
@click.option(
    "--jobs",
    "-j",
    type=click.IntRange(1, 256),
    default=None,
    help="Threads that hash a sharded step's shards, and, less one, processes that check "
    "a long run's checkpoint files (default: the cores this process may use; the same "
    "results whatever the number).",
)
@click.option(
    "--sample",
    type=click.IntRange(1, 10_000_000),
    default=None,
    metavar="K",
    help="For a campaign certificate: check K batches drawn at random (each one's proof "
    "to the signed root, its result the ledger's) instead of every batch and the tally.",
)
@json_option("Print the results as JSON.")
@click.pass_context
def verify(
    ctx: click.Context,
    manifests: tuple[Path, ...],
    trust: TrustOptions,
    remote: str | None,
    no_fetch: bool,
    jobs: int | None,
    sample: int | None,
    as_json: bool,
) -> None:
    """Check the signature, place, file digest, dataset hashes and parent chain of each
    manifest (and each replay attestation, CKPT.replay.json). A sharded step's manifest
    (STEP/index.jsonl.kaudit.json) has its index and every rank's shard checked.

    A signature counts when a key an anchor vouches for made it: --trusted-key FILE,
    $KAUDIT_TRUSTED_KEYS, the repository's store at --trust-ref REF, or your user trust
    store. A key that only the work tree's .kaudit/trusted-keys holds is "unanchored":
    it fails unless --allow-unanchored (or allow_unanchored in your own config, which
    --require-anchor overrides).

    MANIFESTS are manifests, checkpoints, run directories, replay attestations or
    campaign certificates (NAME.campaign.json); none: every one in the repository.

    Where it reads the DVC remote (it fetched data, or --remote names one), the runs'
    manifests there are read too: a step with two signed children (two chains of one
    run) is a FORK line, and fails.

    Exit 0 when every check holds, 1 when any fails, 2 for bad input.

    \b
    Example:
      kaudit verify checkpoints/heat --trusted-key alice.pub
    """
    from kronos_audit.cli.progress import count_manifests, progress_bar
    from kronos_audit.verification.batch import trust_problems, verify_each

    paths = repository_if_none(manifests)
    results: list[VerifyResult] = []
    errors: list[Error] = []
    said = _Said()
    if not as_json:
        for problem in trust_problems(paths, trust):
            warn(problem)
    with progress_bar() as bar:
        total = count_manifests(paths)  # also what an interrupted verify says it had done
        bar.update("verifying manifests", 0, total)
        outcomes = verify_each(
            paths, fetch=not no_fetch, trust=trust, remote=remote, jobs=jobs, sample=sample
        )
        for done, outcome in enumerate(outcomes, 1):
            if isinstance(outcome, Error):
                errors.append(outcome)
                if not as_json:
                    bar.error(error_line(outcome))
            else:
                results.append(outcome)
                if not as_json:
                    _print_result(outcome, said)
            bar.update("verifying manifests", done, total)  # once it is shown
    # The run's chain in the remote, where this verify reads the remote anyway (it
    # fetched data) or was given one: a present chain needs no DVC at all.
    asked = remote is not None or any(r.fetched for r in results)
    forks = _remote_forks(results, trust, remote, quiet=as_json) if asked and not no_fetch else []
    summary = _summary(results, errors)
    if as_json:
        out.json(
            {
                "ok": not errors and not forks and all(r.ok for r in results),
                "summary": summary,
                "results": [r.to_json_obj(json_paths(*paths)) for r in results],
                "errors": [error_json(e) for e in errors],
            }
            | ({"forks": forks} if forks else {})
        )
    elif results:
        said.print()
        out.print(_summary_line(results, summary))
    if not as_json:
        for fork in forks:
            out.print(f"[red]FORK[/] {safe(fork)}", failure=True)
    # Bad input (2) outranks a failed check (1); tampered data fetched is a failed check.
    codes = [e.exit_code for e in errors] + [
        ExitCode.OK if r.ok else ExitCode.CHECK_FAILED for r in results
    ]
    if forks:
        codes.append(ExitCode.CHECK_FAILED)
    ctx.exit(max(codes, default=ExitCode.OK))


def _remote_forks(
    results: list[VerifyResult], trust: TrustOptions, remote: str | None, *, quiet: bool
) -> list[str]:
    """Each fork of the verified runs' chains in the DVC remote (two signed children of
    one step there); a remote that cannot be read is warned about, and judged no further."""
    from kronos_audit.keys.anchors import load_keyring
    from kronos_audit.project.repository import find_project
    from kronos_audit.verification.forks import signed_forks
    from kronos_audit.verification.results import StatementKind

    runs = [r.run for r in results if r.kind is StatementKind.MANIFEST]
    if not runs:
        return []
    try:
        project = find_project(results[0].manifest.parent)
        return signed_forks(project, runs, load_keyring(project.root, trust), remote)
    except Error as e:
        if not quiet:
            warn(f"the run's chain in the DVC remote was not checked for forks: {e}")
        return []
