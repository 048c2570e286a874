"""`kaudit init`, `keys`, `snapshot`, `verify`, `show`: the manifest commands."""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from kronos_audit import signing, storage
from kronos_audit._internal.secrets import redact
from kronos_audit.cli._app import cli, fail_line, out, safe
from kronos_audit.cli.options import ask_passphrase, trust_from, trust_options, warn
from kronos_audit.errors import Error, UsageError
from kronos_audit.init import init_project
from kronos_audit.manifest import read_manifest
from kronos_audit.project import Project, find_project
from kronos_audit.signing import KeyId
from kronos_audit.snapshot import snapshot as do_snapshot
from kronos_audit.trust import describe, load_keyring, write_revocation
from kronos_audit.verify import VerifyResult, trust_problems, verify_each


@cli.command()
@click.option(
    "--remote",
    "remote_url",
    metavar="URL",
    help="Default DVC remote: a directory, ssh://host/path, s3://bucket/path ... A password "
    "or token in it goes to .dvc/config.local (git-ignored), never to .dvc/config.",
)
@click.option("--remote-name", default="storage", show_default=True, help="Its name.")
def init(remote_url: str | None, remote_name: str) -> None:
    """Set up .kaudit/ (config, trust store) and DVC in this git repository."""
    project, dvc_created = init_project(Path.cwd())
    if remote_url is not None:
        storage.configure_remote(project, remote_url, remote_name)
    out.print(f"kaudit repository at {project.root}")
    out.print(f"  config        {project.config_path.relative_to(project.root)}")
    out.print(f"  trusted keys  {project.trust_dir.relative_to(project.root)}/")
    out.print("  dvc           " + ("initialised (.dvc/)" if dvc_created else "already set up"))
    _, link_types = storage.cache_settings(project)
    out.print(f"  dvc cache     cache.type = {','.join(link_types)}")
    if remote_url is not None:
        # Shown with its credentials masked: they went to .dvc/config.local, not to a log.
        shown = redact(remote_url)
        where = " (credentials in .dvc/config.local)" if shown != remote_url else ""
        out.print(f"  dvc remote    {safe(remote_name)} = {safe(shown)} (default){where}")
    if not signing.held_keys():
        out.print("next: `kaudit keys generate` to make your signing key")


@cli.group()
def keys() -> None:
    """Signing keys you hold, and the keys verification trusts (and on whose word)."""


def _current_project() -> Project | None:
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
    help=f"Encrypt the private key with a passphrase (${signing.PASSPHRASE_ENV}, else asked).",
)
def keys_generate(name: str, encrypt: bool) -> None:
    """Make an Ed25519 key pair; trust it in your user trust store and in this repository.

    \b
    Example:
      kaudit keys generate --name alice --encrypt
    """
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
        passphrase = os.environ.get(signing.PASSPHRASE_ENV) or (
            click.prompt("passphrase", hide_input=True, confirmation_prompt=True, err=True)
            if sys.stdin.isatty()
            else ""
        )
        if not passphrase:
            raise UsageError(f"--encrypt: set {signing.PASSPHRASE_ENV} (no terminal to ask on)")
    key = signing.generate_key(name, passphrase=passphrase)
    out.print(f"key {safe(key.name)}: {key.key_id}")
    encrypted = ", encrypted" if encrypt else ""
    out.print(f"  private key  {safe(signing.key_dir() / (name + '.key'))} (mode 0600{encrypted})")
    out.print(f"  anchored in  {safe(signing.user_trust_dir())} (your user trust store)")
    if trust is None:
        out.print("  not in a kaudit repository: run `kaudit keys trust` there to trust it")
    else:
        entry = trust.add(key.private_key.public_key(), name)
        out.print(f"  trusted in   {safe(entry.path)} (commit it; others anchor it themselves)")


@keys.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print the keys as JSON.")
@trust_options
def keys_list(
    as_json: bool, trusted_keys: tuple[Path, ...], trust_ref: str | None, require_anchor: bool
) -> None:
    """Show the keys you hold, and every key verification here trusts, with its anchor."""
    project = _current_project()
    ring = load_keyring(
        None if project is None else project.root,
        trust_from(trusted_keys, trust_ref, require_anchor),
    )
    held = signing.held_keys()
    if as_json:
        click.echo(
            json.dumps(
                {
                    "held": [
                        {"name": k.name, "key_id": k.key_id, "path": str(k.path)} for k in held
                    ],
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
                },
                indent=2,
            )
        )
        return
    for problem in ring.problems:
        warn(problem)
    # Lines, not a table: a key id is never folded or cut, whatever the terminal's width.
    out.print(f"keys you hold [dim]({safe(signing.key_dir())})[/]:")
    for k in held:
        out.print(f"  {safe(k.name)}  {k.key_id}")
    if not held:
        out.print("  none: make one with `kaudit keys generate`")
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
    public_key = signing.load_public_key(pubfile)
    label = name or pubfile.name.removesuffix(".pub")
    if user_store:
        entry = signing.TrustStore(signing.user_trust_dir()).add(public_key, label)
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
    project = find_project(Path.cwd()).require_initialized()
    ring = load_keyring(project.root)
    full = _full_key_id(keyid, ring.keys)
    signer = signing.select_key(key, passphrase=ask_passphrase)
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
    out.print("commit .kaudit/ and give the new public key to those who anchor the old one")


def _full_key_id(given: str, known: Mapping[KeyId, object]) -> KeyId:
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


@cli.command()
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
) -> None:
    """Write a signed manifest beside each checkpoint (CKPT.kaudit.json)."""
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
    )
    for m in manifests:
        click.echo(str(m.path))


def _print_result(r: VerifyResult) -> None:
    mark = "[green]ok[/]  " if r.ok else "[red]FAIL[/]"
    fetched = ", fetched from the DVC remote" if r.fetched else ""
    kind = "attestation, " if r.kind == "attestation" else ""
    # The accepted signature's own words: who signed, which anchor trusted them, and any
    # revocation they were signed before.
    signed = next((c for c in r.checks if c.name == "signature" and c.ok), None)
    signer = "" if signed is None else f"; {safe(signed.detail)}"
    out.print(
        f"{mark} {safe(r.manifest)}  [dim]({kind}run {safe(r.run)}, step {r.step}{fetched}"
        f"{signer})[/]"
    )
    for c in r.failures:
        out.print(f"      [red]{safe(c.name)}[/]: {safe(c.detail)}")
    for c in r.checks:
        if c.skipped and c.ok:  # a failed one is shown above
            out.print(f"      [yellow]{safe(c.name)} skipped[/]: {safe(c.detail)}")


def _summary(results: list[VerifyResult], errors: list[Error]) -> dict[str, int]:
    manifests = [r for r in results if r.kind == "manifest"]
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


@cli.command()
@click.argument("manifests", nargs=-1, required=True, type=click.Path(path_type=Path))
@trust_options
@click.option("--remote", help="DVC remote to fetch missing data from (default: the default).")
@click.option("--no-fetch", is_flag=True, help="Do not fetch missing data from the DVC remote.")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@click.pass_context
def verify(
    ctx: click.Context,
    manifests: tuple[Path, ...],
    trusted_keys: tuple[Path, ...],
    trust_ref: str | None,
    require_anchor: bool,
    remote: str | None,
    no_fetch: bool,
    as_json: bool,
) -> None:
    """Check the signature, place, file digest, dataset hashes and parent chain of each
    manifest (and each replay attestation, CKPT.replay.json).

    A signature counts when a key an anchor vouches for made it: --trusted-key FILE,
    $KAUDIT_TRUSTED_KEYS, the repository's store at --trust-ref REF, or your user trust
    store. A key that only the work tree's .kaudit/trusted-keys holds is "unanchored":
    it passes unless --require-anchor (implied by --trusted-key and --trust-ref).

    Exit 0 when every check holds, 1 when any fails, 2 for bad input.

    \b
    Example:
      kaudit verify checkpoints/heat --trusted-key alice.pub
    """
    options = trust_from(trusted_keys, trust_ref, require_anchor)
    paths = list(manifests)
    results: list[VerifyResult] = []
    errors: list[Error] = []
    if not as_json:
        for problem in trust_problems(paths, options):
            warn(problem)
    for outcome in verify_each(paths, fetch=not no_fetch, trust=options, remote=remote):
        if isinstance(outcome, Error):
            errors.append(outcome)
            if not as_json:
                fail_line(str(outcome))
        else:
            results.append(outcome)
            if not as_json:
                _print_result(outcome)
    summary = _summary(results, errors)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "ok": not errors and all(r.ok for r in results),
                    "summary": summary,
                    "results": [r.to_json_obj() for r in results],
                    "errors": [
                        {"path": str(e.path) if e.path else None, "error": e.message}
                        for e in errors
                    ],
                },
                indent=2,
            )
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


@cli.command()
@click.argument("manifest", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the decoded statement as JSON.")
def show(manifest: Path, as_json: bool) -> None:
    """Summarise a manifest (without verifying it: see `kaudit verify`)."""
    m = read_manifest(manifest)
    if as_json:
        # ensure_ascii: control characters in names come out as \u escapes, never raw.
        click.echo(json.dumps(_thaw(m.statement), indent=2, sort_keys=True, ensure_ascii=True))
        return
    # Nothing here is verified, and anyone may have written it: every value goes through
    # _text, which shows it as inert text (no rich markup, no terminal control) and shows
    # a missing value as "none", never as Python's None.
    p = m.predicate
    g, env = p["git"], p["environment"]
    t = Table.grid(padding=(0, 2))
    t.add_column(style="bold")
    t.add_column(overflow="fold")  # a long path shown whole, not cut short
    t.add_row("manifest", _text(m.path))
    t.add_row("checkpoint", f"{_text(m.subject_name)}  ({_text(p['size'])} bytes)")
    t.add_row("sha256", _text(m.subject_sha256))
    t.add_row("run / step", f"{_text(m.run)} / {_text(m.step)}")
    t.add_row("created", _text(p["created"]))
    parent = (
        f"{_text(p['parent_manifest'], 'location not recorded')} ({_text(p['parent'])})"
        if p["parent"] is not None
        else "none"
    )
    t.add_row("parent", parent)
    dirty = f"  [yellow]dirty[/], patch {_text(g['patch_sha256'])}" if g["dirty"] else ""
    t.add_row("git", f"{_text(g['commit'])} on {_text(g['branch'], '(detached)')}{dirty}")
    t.add_row("remote", _text(g["remote"]))
    python, platform, cpu, blas = env["python"], env["platform"], env["cpu"], env["blas"]
    t.add_row(
        "python",
        f"{_text(python['implementation'])} {_text(python['version'])}, "
        f"{len(env['packages'])} packages",
    )
    t.add_row(
        "platform",
        f"{_text(platform['system'])} {_text(platform['machine'])}, {_text(cpu['model'])}",
    )
    t.add_row("blas", f"{_text(blas['name'])} {_text(blas['version'])}")
    variables = " ".join(f"{k}={v}" for k, v in env["variables"].items())
    t.add_row("numeric env", _text(variables or None))
    t.add_row("env lock", _text(env["digest"]))
    t.add_row("seeds", _text(", ".join(str(s) for s in p["seeds"]) or None))
    t.add_row("command", _text(shlex.join(p["command"]) if p["command"] else "not recorded"))
    t.add_row("cwd", _text(p["cwd"]))
    if p["attributes"]:
        t.add_row("attributes", _text(json.dumps(_thaw(p["attributes"]), sort_keys=True)))
    t.add_row("signed by", ", ".join(_text(s.keyid or "(no keyid)") for s in m.envelope.signatures))
    out.print(t)
    if m.datasets is not None:
        d = Table(title=f"{len(m.datasets)} datasets", title_justify="left")
        for col in ("path", "dtype", "shape", "sha256"):
            d.add_column(col, overflow="fold")
        for ds in m.datasets:
            d.add_row(
                _text(ds.path),
                _text(ds.dtype),
                "null" if ds.shape is None else _text(list(ds.shape)),
                _text(ds.sha256[:16] + "..."),
            )
        out.print(d)
    else:
        out.print("not HDF5: covered by the file digest only")


def _text(value: object, missing: str = "none") -> str:
    """A value read from a manifest, as rich markup that prints it as inert text."""
    return missing if value is None else safe(value)


def _thaw(value: Any) -> Any:
    if isinstance(value, tuple | list):
        return [_thaw(v) for v in value]
    if hasattr(value, "items"):
        return {k: _thaw(v) for k, v in value.items()}
    return value
