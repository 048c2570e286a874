"""`kaudit completion SHELL`: the shell completion script, as click makes it."""

from __future__ import annotations

import click

from kronos_audit.errors import UsageError

SHELLS = ("bash", "zsh", "fish")
"""The shells click completes for (click.shell_completion's, spelled out so that a test can
hold them equal)."""

COMPLETE_VAR = "_KAUDIT_COMPLETE"
"""The environment variable through which the script asks `kaudit` for completions, the
one click derives from the program's name."""


@click.command()
@click.argument("shell", metavar="SHELL")
@click.pass_context
def completion(ctx: click.Context, shell: str) -> None:
    """Print the shell completion script for SHELL (bash, zsh or fish).

    The script is what `_KAUDIT_COMPLETE=SHELL_source kaudit` prints: sourced, it asks
    `kaudit` itself for the commands, options and values that fit what is typed. It is
    printed with --quiet too (it is what was asked for, as --json's output is).

    \b
    Example:
      kaudit completion bash > ~/.local/share/bash-completion/completions/kaudit
    """
    from click.shell_completion import get_completion_class

    complete = get_completion_class(shell) if shell in SHELLS else None
    if complete is None:
        raise UsageError(f"no completion for shell {shell!r}: choose one of {', '.join(SHELLS)}")
    # The group, whatever name the caller gave it: the script calls `kaudit`.
    script = complete(ctx.find_root().command, {}, "kaudit", COMPLETE_VAR).source()
    click.echo(script, nl=not script.endswith("\n"))
