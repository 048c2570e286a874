"""`kaudit keys`: the signing keys you hold (generate, rotate), and the keys verification
trusts (list, trust, revoke)."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import click

from kronos_audit.cli._app import SuggestingGroup
from kronos_audit.cli.options import ask_passphrase, json_option, trust_options, warn
from kronos_audit.cli.output import out, safe
from kronos_audit.errors import Error, UsageError
from kronos_audit.keys.keyfile import PASSPHRASE_ENV

if TYPE_CHECKING:
    from kronos_audit.keys.anchors import TrustOptions
    from kronos_audit.project.repository import Project
    from kronos_audit.statement.dsse import KeyId


@click.group(cls=SuggestingGroup)
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
        out.print("  not in a kaudit repository: run `kaudit keys trust` there to trust it")
    else:
        entry = trust.add(key.private_key.public_key(), name)
        out.print(f"  trusted in   {safe(entry.path)} (commit it; others anchor it themselves)")


@keys.command("list")
@json_option("Print the keys as JSON.")
@trust_options
def keys_list(as_json: bool, trust: TrustOptions) -> None:
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
        trust,
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
    out.print("commit .kaudit/ and give the new public key to those who anchor the old one")


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
