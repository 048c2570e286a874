"""Options several commands share: whose signatures they accept (the trust anchors)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from kronos_audit.cli._app import plain
from kronos_audit.trust import TrustOptions

F = TypeVar("F", bound=Callable[..., Any])


def trust_options(f: F) -> F:
    """``--trusted-key FILE`` (repeatable), ``--trust-ref REF``, ``--require-anchor``."""
    f = click.option(
        "--require-anchor",
        is_flag=True,
        help="Fail a signature that only the repository's own .kaudit/trusted-keys vouches "
        "for (implied by --trusted-key and --trust-ref).",
    )(f)
    f = click.option(
        "--trust-ref",
        metavar="REF",
        help="Trust the repository's .kaudit/trusted-keys only as it is at this git ref "
        "(the protected base branch in CI), read with git, not from the work tree.",
    )(f)
    return click.option(
        "--trusted-key",
        "trusted_keys",
        multiple=True,
        metavar="FILE",
        type=click.Path(path_type=Path),
        help="Trust this PEM Ed25519 public key, obtained out of band (repeatable; also "
        "$KAUDIT_TRUSTED_KEYS, ':'-separated).",
    )(f)


def trust_from(
    trusted_keys: tuple[Path, ...], trust_ref: str | None, require_anchor: bool
) -> TrustOptions:
    return TrustOptions(tuple(trusted_keys), trust_ref, require_anchor)


def warn(message: str) -> None:
    """One ``kaudit: warning:`` line on stderr (never markup, never control characters)."""
    click.echo(f"kaudit: warning: {plain(message)}", err=True)


def ask_passphrase(name: str) -> str:
    """The passphrase of an encrypted key, asked on the terminal; none without one."""
    if not sys.stdin.isatty():
        return ""
    text: str = click.prompt(f"passphrase for key {name}", hide_input=True, err=True)
    return text
