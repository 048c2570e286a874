"""`kaudit init`, `keys`, `snapshot`, `verify`, `show`: the manifest commands."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from kronos_audit import signing, storage
from kronos_audit._internal.secrets import redact
from kronos_audit.cli._app import cli, fail_line, out, safe
from kronos_audit.errors import Error, UsageError
from kronos_audit.manifest import read_manifest
from kronos_audit.project import find_project, init_project
from kronos_audit.snapshot import snapshot as do_snapshot
from kronos_audit.verify import VerifyResult, verify_each


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
    """Signing keys you hold, and the keys this repository trusts."""


def _current_project_trust() -> signing.TrustStore | None:
    try:
        project = find_project(Path.cwd())
    except Error:
        return None
    return project.trust_store() if project.initialized else None


@keys.command("generate")
@click.option("--name", default="default", show_default=True, help="Name of the key pair.")
def keys_generate(name: str) -> None:
    """Make an Ed25519 key pair; trust its public key in this repository."""
    trust = _current_project_trust()
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
    key = signing.generate_key(name)
    out.print(f"key {key.name}: {key.key_id}")
    out.print(f"  private key  {signing.key_dir() / (name + '.key')} (mode 0600)")
    if trust is None:
        out.print("  not in a kaudit repository: run `kaudit keys trust` there to trust it")
    else:
        entry = trust.add(key.private_key.public_key(), name)
        out.print(f"  trusted in   {entry.path}")


@keys.command("list")
def keys_list() -> None:
    """Show the keys you hold and the keys this repository trusts."""
    held = Table(title="keys you hold", title_justify="left")
    held.add_column("name")
    held.add_column("key id", overflow="fold")
    held.add_column("private key", overflow="fold")
    for k in signing.held_keys():
        held.add_row(k.name, k.key_id, str(k.path))
    out.print(held)
    trust = _current_project_trust()
    if trust is None:
        out.print("not in a kaudit repository: no trust store here")
        return
    trusted = Table(title="keys this repository trusts", title_justify="left")
    trusted.add_column("name")
    trusted.add_column("key id", overflow="fold")
    trusted.add_column("file", overflow="fold")
    for t in trust.entries().values():
        trusted.add_row(t.name, t.key_id, str(t.path))
    out.print(trusted)


@keys.command("trust")
@click.argument("pubfile", type=click.Path(path_type=Path))
@click.option("--name", help="Name in the trust store (default: the file's stem).")
def keys_trust(pubfile: Path, name: str | None) -> None:
    """Trust a colleague's public key (PEM) in this repository."""
    public_key = signing.load_public_key(pubfile)
    project = find_project(Path.cwd()).require_initialized()
    entry = project.trust_store().add(public_key, name or pubfile.stem.removesuffix(".pub"))
    out.print(f"trusted {entry.name}: {entry.key_id}")
    out.print(f"  in {entry.path}")


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
    out.print(f"{mark} {r.manifest}  [dim](run {r.run}, step {r.step}{fetched})[/]")
    for c in r.failures:
        out.print(f"      [red]{c.name}[/]: {c.detail}")
    for c in r.checks:
        if c.skipped:
            out.print(f"      [yellow]{c.name} skipped[/]: {c.detail}")


@cli.command()
@click.argument("manifests", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@click.pass_context
def verify(ctx: click.Context, manifests: tuple[Path, ...], as_json: bool) -> None:
    """Check signature, file digest, dataset hashes and parent chain of each manifest.

    Exit 0 when every check holds, 1 when any fails, 2 for bad input.
    """
    results: list[VerifyResult] = []
    errors: list[Error] = []
    for outcome in verify_each(list(manifests)):
        if isinstance(outcome, Error):
            errors.append(outcome)
            if not as_json:
                fail_line(str(outcome))
        else:
            results.append(outcome)
            if not as_json:
                _print_result(outcome)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "ok": not errors and all(r.ok for r in results),
                    "results": [r.to_json_obj() for r in results],
                    "errors": [
                        {"path": str(e.path) if e.path else None, "error": e.message}
                        for e in errors
                    ],
                },
                indent=2,
            )
        )
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
