"""`kaudit init`: set up .kaudit/ (config, trust store) and DVC in a git repository."""

from __future__ import annotations

import shlex
from pathlib import Path

import click

from kronos_audit.cli.output import out, safe


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
        out.print("next: `kaudit keys generate` to make your signing key")
