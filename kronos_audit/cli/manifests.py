"""`kaudit init`, `keys`, `snapshot`, `verify`, `show`: the manifest commands."""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from kronos_audit._internal.frozen import thaw
from kronos_audit.cli._app import Column, err, error_json, out, plain, safe, settings
from kronos_audit.cli.options import ask_passphrase, json_option, trust_from, trust_options, warn
from kronos_audit.errors import Error, UsageError

if TYPE_CHECKING:
    from kronos_audit.project.repository import Project
    from kronos_audit.statement.dsse import KeyId
    from kronos_audit.verification.verify import VerifyResult

# kronos_audit.keys.keyfile.PASSPHRASE_ENV, spelled out so that `--help` need not import the
# signing module (a test holds them equal)
PASSPHRASE_ENV = "KAUDIT_KEY_PASSPHRASE"


@click.command()
@click.option(
    "--remote",
    "remote_url",
    metavar="URL",
    help="Default DVC remote: a directory, ssh://host/path, s3://bucket/path ... A password "
    "or token in it goes to .dvc/config.local (git-ignored), never to .dvc/config.",
)
@click.option("--remote-name", default="storage", show_default=True, help="Its name.")
def init(remote_url: str | None, remote_name: str) -> None:
    """Set up .kaudit/ (config, trust store) and DVC in this git repository.

    \b
    Example:
      kaudit init --remote /shared/kaudit-remote
    """
    from kronos_audit import storage
    from kronos_audit._internal.secrets import redact
    from kronos_audit.keys import home as signing
    from kronos_audit.storage.setup import commit_command, init_project

    project, dvc_created = init_project(Path.cwd())
    if remote_url is not None:
        storage.configure_remote(project, remote_url, remote_name)
    out.print(f"kaudit repository at {safe(project.root)}")
    out.print(f"  config        {safe(project.config_path.relative_to(project.root))}")
    out.print(f"  trusted keys  {safe(project.trust_dir.relative_to(project.root))}/")
    out.print("  dvc           " + ("initialised (.dvc/)" if dvc_created else "already set up"))
    _, link_types = storage.cache_settings(project)
    out.print(f"  dvc cache     cache.type = {safe(','.join(link_types))}")
    if remote_url is not None:
        # Shown with its credentials masked: they went to .dvc/config.local, not to a log.
        shown = redact(remote_url)
        where = " (credentials in .dvc/config.local)" if shown != remote_url else ""
        out.print(f"  dvc remote    {safe(remote_name)} = {safe(shown)} (default){where}")
    command = commit_command(project)
    if command is not None:
        # Nothing is staged: this commits what init made, without anything else staged.
        if Path.cwd().resolve() != project.root.resolve():
            command = f"cd {shlex.quote(str(project.root))} && {command}"
        out.print(f"commit it with: {safe(command)}")
    if not signing.held_keys():
        out.note("next: `kaudit keys generate` to make your signing key")


@click.group()
def keys() -> None:
    """Signing keys you hold, and the keys verification trusts (and on whose word).

    \b
    Example:
      kaudit keys generate --name alice
      kaudit keys list
    """


def _current_project() -> Project | None:
    from kronos_audit.project.repository import find_project

    try:
        project = find_project(Path.cwd())
    except Error:
        return None
    return project if project.initialized else None


@keys.command("generate")
@click.option("--name", default="default", show_default=True, help="Name of the key pair.")
@click.option(
    "--encrypt",
    is_flag=True,
    help=f"Encrypt the private key with a passphrase (${PASSPHRASE_ENV}, else asked).",
)
def keys_generate(name: str, encrypt: bool) -> None:
    """Make an Ed25519 key pair; trust it in your user trust store and in this repository.

    \b
    Example:
      kaudit keys generate --name alice --encrypt
    """
    from kronos_audit.keys import home as signing

    project = _current_project()
    trust = None if project is None else project.trust_store()
    if (
        trust is not None
        and (trust.directory / f"{name}.pub").exists()
        and not (signing.key_dir() / f"{name}.key").exists()
    ):
        # Checked first, so a refusal leaves no key pair behind.
        raise UsageError(
            f"the repository already trusts another key named {name!r}; pick another --name",
            path=trust.directory / f"{name}.pub",
        )
    passphrase = None
    if encrypt:
        passphrase = os.environ.get(PASSPHRASE_ENV) or (
            click.prompt("passphrase", hide_input=True, confirmation_prompt=True, err=True)
            if sys.stdin.isatty()
            else ""
        )
        if not passphrase:
            raise UsageError(f"--encrypt: set {PASSPHRASE_ENV} (no terminal to ask on)")
    key = signing.generate_key(name, passphrase=passphrase)
    out.print(f"key {safe(key.name)}: {key.key_id}")
    encrypted = ", encrypted" if encrypt else ""
    out.print(f"  private key  {safe(signing.key_dir() / (name + '.key'))} (mode 0600{encrypted})")
    out.print(f"  anchored in  {safe(signing.user_trust_dir())} (your user trust store)")
    if trust is None:
        out.note("  not in a kaudit repository: run `kaudit keys trust` there to trust it")
    else:
        entry = trust.add(key.private_key.public_key(), name)
        out.print(f"  trusted in   {safe(entry.path)} (commit it; others anchor it themselves)")


@keys.command("list")
@json_option("Print the keys as JSON.")
@trust_options
def keys_list(
    as_json: bool, trusted_keys: tuple[Path, ...], trust_ref: str | None, require_anchor: bool
) -> None:
    """Show the keys you hold, and every key verification here trusts, with its anchor.

    \b
    Example:
      kaudit keys list --trusted-key alice.pub
    """
    from kronos_audit.keys import home as signing
    from kronos_audit.keys.anchors import describe, load_keyring

    project = _current_project()
    ring = load_keyring(
        None if project is None else project.root,
        trust_from(trusted_keys, trust_ref, require_anchor),
    )
    held = signing.held_keys()
    if as_json:
        out.json(
            {
                "held": [{"name": k.name, "key_id": k.key_id, "path": str(k.path)} for k in held],
                "trusted": [k.to_json_obj() for k in ring.keys.values()],
                "revoked": [
                    {
                        "key_id": r.key_id,
                        "revoked_at": r.revoked_at,
                        "reason": r.reason,
                        "signed_by": r.signer,
                        "source": r.source,
                    }
                    for r in ring.revocations.values()
                ],
                "problems": ring.problems,
            }
        )
        return
    for problem in ring.problems:
        warn(problem)
    # Lines, not a table: a key id is never folded or cut, whatever the terminal's width.
    out.print(f"keys you hold [dim]({safe(signing.key_dir())})[/]:")
    for k in held:
        out.print(f"  {safe(k.name)}  {k.key_id}")
    if not held:
        out.print("  none" + ("" if settings().quiet else ": make one with `kaudit keys generate`"))
    where = "" if project else " (not in a kaudit repository)"
    out.print(f"keys verification trusts{where}:")
    for entries in describe(ring.keys.values()).values():
        for t in entries:
            revoked = ring.revocations.get(t.key_id)
            note = f", [red]revoked at {safe(revoked.revoked_at)}[/]" if revoked else ""
            out.print(f"  {safe(t.name)}  {t.key_id}  {safe(t.describe_anchor())}{note}")
    if not ring.keys:
        out.print("  none")


@keys.command("trust")
@click.argument("pubfile", type=click.Path(path_type=Path))
@click.option("--name", help="Name in the trust store (default: the file's stem).")
@click.option(
    "--user",
    "user_store",
    is_flag=True,
    help="Trust it in your user trust store (an anchor), not in this repository's.",
)
def keys_trust(pubfile: Path, name: str | None, user_store: bool) -> None:
    """Trust a colleague's public key (PEM), obtained out of band.

    \b
    Example:
      kaudit keys trust alice.pub --user     # anchor it for your own verifications
      kaudit keys trust alice.pub            # propose it in the repository (commit it)
    """
    from kronos_audit.keys import home as signing
    from kronos_audit.keys.keyfile import load_public_key
    from kronos_audit.keys.store import TrustStore
    from kronos_audit.project.repository import find_project

    public_key = load_public_key(pubfile)
    label = name or pubfile.name.removesuffix(".pub")
    if user_store:
        entry = TrustStore(signing.user_trust_dir()).add(public_key, label)
    else:
        project = find_project(Path.cwd()).require_initialized()
        entry = project.trust_store().add(public_key, label)
    out.print(f"trusted {safe(entry.name)}: {entry.key_id}")
    out.print(f"  in {safe(entry.path)}")


@keys.command("revoke")
@click.argument("keyid")
@click.option("--reason", required=True, help="Why (compromised, rotated, left the team...).")
@click.option("--key", help="The key that signs the revocation (default: the only one held).")
def keys_revoke(keyid: str, reason: str, key: str | None) -> None:
    """Revoke KEYID: its signatures made from now on fail everywhere the revocation is seen.

    The revocation is signed (by the revoked key itself, or another trusted key) and
    written to .kaudit/revocations/KEYID.json: commit it.

    \b
    Example:
      kaudit keys revoke 3f2a...c9 --reason "laptop stolen" --key alice-2027
    """
    from kronos_audit.keys.anchors import load_keyring
    from kronos_audit.keys.home import select_key
    from kronos_audit.keys.revocation import write_revocation
    from kronos_audit.project.repository import find_project

    project = find_project(Path.cwd()).require_initialized()
    ring = load_keyring(project.root)
    full = _full_key_id(keyid, ring.keys)
    signer = select_key(key, passphrase=ask_passphrase)
    if signer.key_id not in ring.keys:
        raise UsageError(
            f"key {signer.name} is not trusted here, so its revocation would be ignored: "
            "sign with a trusted key (--key)"
        )
    path = write_revocation(project.root, full, reason, signer)
    out.print(f"revoked {full}")
    out.print(f"  signed by {safe(signer.name)} ({signer.key_id[:16]}), in {safe(path)}")


@keys.command("rotate")
@click.argument("old")
@click.option("--name", "new_name", required=True, help="Name of the new key pair.")
def keys_rotate(old: str, new_name: str) -> None:
    """Replace the key pair OLD (a name you hold) by a new one: the new key is made and
    trusted, and OLD is revoked from now on, the revocation signed by OLD itself.

    \b
    Example:
      kaudit keys rotate alice --name alice-2027
    """
    from kronos_audit.keys import home as signing
    from kronos_audit.keys.revocation import write_revocation
    from kronos_audit.project.repository import find_project

    project = find_project(Path.cwd()).require_initialized()
    old_key = signing.select_key(old, passphrase=ask_passphrase)
    new_key = signing.generate_key(new_name)
    project.trust_store().add(new_key.private_key.public_key(), new_name)
    path = write_revocation(
        project.root,
        old_key.key_id,
        f"rotated to {new_name} ({new_key.key_id[:16]})",
        old_key,
    )
    out.print(f"key {safe(new_name)}: {new_key.key_id} (new; trusted in your user store and here)")
    out.print(f"revoked {safe(old)}: {old_key.key_id} from now on, in {safe(path)}")
    out.note("commit .kaudit/ and give the new public key to those who anchor the old one")


def _full_key_id(given: str, known: Mapping[KeyId, object]) -> KeyId:
    from kronos_audit.statement.dsse import KeyId

    if re.fullmatch(r"[0-9a-f]{64}", given):
        return KeyId(given)
    if not re.fullmatch(r"[0-9a-f]{8,63}", given):
        raise UsageError(f"{given!r} is not a key id (hex, at least 8 digits of it)")
    matches = [k for k in known if k.startswith(given)]
    if len(matches) != 1:
        what = "no trusted key" if not matches else f"{len(matches)} trusted keys"
        raise UsageError(f"key id {given}: {what} start with it; give the whole key id")
    return KeyId(matches[0])


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
    its file digest only (a note on stderr says so).

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
    for m in manifests:
        click.echo(plain(m.path))
    for note in manifests.notes:
        err.note(f"kaudit: note: {safe(note)}")  # not with --quiet


def _print_result(r: VerifyResult) -> None:
    mark = "[green]ok[/]  " if r.ok else "[red]FAIL[/]"
    fetched = ", fetched from the DVC remote" if r.fetched else ""
    kind = "attestation, " if r.is_attestation else ""
    # The accepted signature's own words: who signed, which anchor trusted them, and any
    # revocation they were signed before.
    signed = r.signature_check
    signer = "" if signed is None or not signed.ok else f"; {safe(signed.detail)}"
    out.print(
        f"{mark} {safe(r.manifest)}  [dim]({kind}run {safe(r.run)}, step {r.step}{fetched}"
        f"{signer})[/]"
    )
    for c in r.failures:
        out.print(f"      [red]{safe(c.name)}[/]: {safe(c.detail)}")
    verbose = settings().verbose
    for c in r.checks:
        if c.skipped and c.ok:  # a failed one is shown above
            out.print(f"      [yellow]{safe(c.name)} skipped[/]: {safe(c.detail)}")
        elif c.ok and verbose:
            out.print(f"      [green]{safe(c.name)}[/]: {safe(c.detail)}")


def _summary(results: list[VerifyResult], errors: list[Error]) -> dict[str, int]:
    manifests = [r for r in results if not r.is_attestation]
    return {
        "manifests": len(manifests),
        "attestations": len(results) - len(manifests),
        "data_checked": sum(r.data_checked for r in manifests),
        "data_not_checked": sum(not r.data_checked for r in manifests),
        "unanchored": sum(
            r.signer is not None and not r.signer.anchor.anchored and r.ok for r in results
        ),
        "failed": sum(not r.ok for r in results),
        "errors": len(errors),
    }


@click.command()
@click.argument("manifests", nargs=-1, required=True, type=click.Path(path_type=Path))
@trust_options
@click.option("--remote", help="DVC remote to fetch missing data from (default: the default).")
@click.option("--no-fetch", is_flag=True, help="Do not fetch missing data from the DVC remote.")
@click.option(
    "--jobs",
    "-j",
    type=click.IntRange(1, 256),
    default=1,
    show_default=True,
    help="Processes that hash a sharded step's shards (same results whatever the number).",
)
@json_option("Print the results as JSON.")
@click.pass_context
def verify(
    ctx: click.Context,
    manifests: tuple[Path, ...],
    trusted_keys: tuple[Path, ...],
    trust_ref: str | None,
    require_anchor: bool,
    remote: str | None,
    no_fetch: bool,
    jobs: int,
    as_json: bool,
) -> None:
    """Check the signature, place, file digest, dataset hashes and parent chain of each
    manifest (and each replay attestation, CKPT.replay.json). A sharded step's manifest
    (STEP/index.jsonl.kaudit.json) has its index and every rank's shard checked.

    A signature counts when a key an anchor vouches for made it: --trusted-key FILE,
    $KAUDIT_TRUSTED_KEYS, the repository's store at --trust-ref REF, or your user trust
    store. A key that only the work tree's .kaudit/trusted-keys holds is "unanchored":
    it passes unless --require-anchor (implied by --trusted-key and --trust-ref).

    Exit 0 when every check holds, 1 when any fails, 2 for bad input.

    \b
    Example:
      kaudit verify checkpoints/heat --trusted-key alice.pub
    """
    from kronos_audit.cli.progress import count_manifests, progress_bar
    from kronos_audit.verification.verify import trust_problems, verify_each

    options = trust_from(trusted_keys, trust_ref, require_anchor)
    paths = list(manifests)
    results: list[VerifyResult] = []
    errors: list[Error] = []
    if not as_json:
        for problem in trust_problems(paths, options):
            warn(problem)
    with progress_bar() as bar:
        total = count_manifests(paths) if bar.active else 0
        outcomes = verify_each(paths, fetch=not no_fetch, trust=options, remote=remote, jobs=jobs)
        for done, outcome in enumerate(outcomes, 1):
            bar.update("verifying manifests", done, total)
            if isinstance(outcome, Error):
                errors.append(outcome)
                if not as_json:
                    bar.error(str(outcome))
            else:
                results.append(outcome)
                if not as_json:
                    _print_result(outcome)
    summary = _summary(results, errors)
    if as_json:
        out.json(
            {
                "ok": not errors and all(r.ok for r in results),
                "summary": summary,
                "results": [r.to_json_obj() for r in results],
                "errors": [error_json(e) for e in errors],
            }
        )
    elif results:
        counted = []
        if summary["manifests"]:
            counted.append(
                f"{summary['manifests']} manifest(s) verified, "
                f"data checked for {summary['data_checked']}"
            )
        if summary["data_not_checked"]:
            counted.append(f"not checked for {summary['data_not_checked']} (pruned)")
        if summary["attestations"]:
            counted.append(f"{summary['attestations']} attestation(s) verified")
        if summary["unanchored"]:
            counted.append(f"{summary['unanchored']} signed by unanchored keys")
        if summary["failed"]:
            counted.append(f"[red]{summary['failed']} failed[/]")
        out.print(", ".join(counted))
    # Bad input (2) outranks a failed check (1); tampered data fetched is a failed check.
    codes = [e.exit_code for e in errors] + [0 if r.ok else 1 for r in results]
    ctx.exit(max(codes, default=0))


@click.command()
@click.argument("manifest", type=click.Path(path_type=Path))
@json_option("Print the decoded statement as JSON.")
def show(manifest: Path, as_json: bool) -> None:
    """Summarise a manifest (without verifying it: see `kaudit verify`).

    \b
    Example:
      kaudit show checkpoints/heat/step-00000200.h5.kaudit.json
    """
    from kronos_audit.checkpoint.layout import resolve_target
    from kronos_audit.statement.manifest import read_manifest

    m = read_manifest(resolve_target(manifest))
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
        ("manifest", _text(m.path)),
        ("checkpoint", f"{_text(m.subject_name)}  ({_text(p.size)} bytes)"),
        ("sha256", _text(m.subject_sha256)),
        ("run / step", f"{_text(m.run)} / {_text(m.step)}"),
        ("created", _text(p.created)),
    ]
    parent = (
        f"{_text(p.parent_manifest, 'location not recorded')} ({_text(p.parent)})"
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
    if p.shards is not None:
        rows.append(
            (
                "shards",
                _text(
                    f"{p.shards.count} ranks, {p.shards.bytes:,} bytes; layout "
                    + json.dumps(thaw(p.shards.layout), sort_keys=True)
                ),
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
            title=f"{len(m.datasets)} datasets",
        )
    elif p.shards is not None:
        out.print("a sharded step: its index and every shard are covered by `kaudit verify`")
    else:
        out.print("not HDF5: covered by the file digest only")


def _text(value: object, missing: str = "none") -> str:
    """A value read from a manifest, as rich markup that prints it as inert text."""
    return missing if value is None else safe(value)
