"""Options and arguments several commands share: ``--json``, whose signatures they accept
(the trust anchors), how closely checkpoints must agree (the tolerances), the DVC remote
and the manifests that TARGETS arguments name.

Nothing here imports the library at module level: a command's ``--help`` stays fast.
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from kronos_audit.cli.output import plain, settings

if TYPE_CHECKING:
    from kronos_audit.compare import PolicySource, TolerancePolicy
    from kronos_audit.keys.anchors import TrustOptions
    from kronos_audit.project.repository import Project

F = TypeVar("F", bound=Callable[..., Any])
R = TypeVar("R")

JSON_META = "kronos_audit.cli.json"
"""Key in ``click.Context.meta``: where the running command prints JSON ("stdout" or
"stderr"), set by ``--json`` (:func:`json_option`) as it is parsed, so an error is
printed as JSON there too."""


def json_option(
    help: str = "Print the result as JSON.", *, stderr: bool = False
) -> Callable[[F], F]:
    """``--json`` (the parameter ``as_json``): print JSON, to stdout (or stderr), and any
    error as one JSON object there too (``error``, ``path``, ``exit_code``, ``type``)."""

    def remember(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
        if value:
            ctx.meta[JSON_META] = "stderr" if stderr else "stdout"
        return value

    return click.option(
        "--json",
        "as_json",
        is_flag=True,
        is_eager=True,  # noted before any other option can fail, so that error is JSON
        callback=remember,
        help=f"{help} Errors too, as one JSON object.",
    )


# -- trust -----------------------------------------------------------------------------


ALLOW_UNANCHORED_META = "kaudit.allow_unanchored"


def _remember_allow_unanchored(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
    if value:
        ctx.meta[ALLOW_UNANCHORED_META] = True
    return value


def trust_options(command: Callable[..., R]) -> Callable[..., R]:
    """``--trusted-key FILE`` (repeatable), ``--trust-ref REF``, ``--require-anchor`` and
    ``--allow-unanchored``, given to the command as one value, ``trust`` (a
    :class:`~kronos_audit.keys.anchors.TrustOptions`)."""

    @functools.wraps(command)
    def with_trust(
        *args: Any,
        trusted_keys: tuple[Path, ...],
        trust_ref: str | None,
        require_anchor: bool,
        **kwargs: Any,
    ) -> R:
        return command(*args, trust=trust_from(trusted_keys, trust_ref, require_anchor), **kwargs)

    f = click.option(
        "--allow-unanchored",
        is_flag=True,
        expose_value=False,
        callback=_remember_allow_unanchored,
        help="Accept a signer that only the repository's own .kaudit/trusted-keys vouches "
        "for (a file anyone can commit); each result says it passed unanchored. Also "
        "`allow_unanchored = true` in [trust] of $KAUDIT_HOME/config.toml.",
    )(with_trust)
    f = click.option(
        "--require-anchor",
        is_flag=True,
        help="Fail a signature that only the repository's own .kaudit/trusted-keys vouches "
        "for even where your config allows it (the default otherwise).",
    )(f)
    f = click.option(
        "--trust-ref",
        metavar="REF",
        help="Trust the repository's .kaudit/trusted-keys only as it is at this git ref "
        "(the protected base branch in CI), read with git, not from the work tree. A short "
        "name must name exactly one ref (else give refs/...); HEAD, @{u} and a full commit "
        "id resolve as in git, and the commit read is printed.",
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
    from kronos_audit.keys.anchors import TrustOptions

    ctx = click.get_current_context(silent=True)
    allow = bool(ctx is not None and ctx.find_root().meta.get(ALLOW_UNANCHORED_META))
    return TrustOptions(tuple(trusted_keys), trust_ref, require_anchor, allow_unanchored=allow)


# -- tolerances ------------------------------------------------------------------------

_TOLERANCE_OPTIONS = (
    click.option("--rtol", metavar="R", help="Relative tolerance, against |A|, for float data."),
    click.option("--atol", metavar="A", help="Absolute tolerance for float data."),
    click.option(
        "--ulp", metavar="N", help="Also accept values at most N units in the last place apart."
    ),
    click.option(
        "--tol",
        "tol",
        multiple=True,
        metavar="PATTERN:SPEC",
        help="Tolerance for datasets matching PATTERN (fnmatch, no leading slash): SPEC is "
        "'exact' or rtol=..,atol=..,ulp=.. (repeatable; the first match wins).",
    ),
)


def tolerance_options(f: F) -> F:
    """Add `kaudit diff`'s tolerance options to a command: ``rtol``, ``atol``, ``ulp``
    (text or None) and ``tol`` (a tuple). Turn them into a policy with :func:`tolerance_policy`."""
    for option in reversed(_TOLERANCE_OPTIONS):
        f = option(f)
    return f


def _number(option: str, raw: str | None, *, whole: bool = False) -> float | int | None:
    from kronos_audit.compare import ToleranceError

    if raw is None:
        return None
    try:
        value: float | int = int(raw) if whole else float(raw)
    except ValueError:
        kind = "a whole number" if whole else "a number"
        raise ToleranceError(f"{option} must be {kind}, got {raw!r}", where=option) from None
    if value < 0 or not math.isfinite(value):
        raise ToleranceError(f"{option} must be finite and not negative, got {raw!r}")
    return value


def config_project(*paths: Path) -> Project | None:
    """The kaudit repository holding the first of ``paths`` that is inside one."""
    from kronos_audit.errors import Error
    from kronos_audit.project.repository import find_project

    for p in paths:
        try:
            project = find_project(p)
        except Error:
            continue
        if project.initialized:
            return project
    return None


def pinned_trust(trust: TrustOptions, *paths: Path) -> TrustOptions:
    """``trust`` with its ``--trust-ref`` resolved once in the kaudit repository holding
    the first of ``paths`` that is in one (unchanged without a ref or a repository), so
    that everything the command reads at the ref is read at one commit."""
    if trust.trust_ref is None:
        return trust
    project = config_project(*paths)
    return trust if project is None else trust.pin(project.root)


def tolerance_policy(
    rtol: str | None,
    atol: str | None,
    ulp: str | None,
    tol: tuple[str, ...],
    *paths: Path,
    trust: TrustOptions | None = None,
    work_tree: bool = True,
) -> tuple[TolerancePolicy, PolicySource, Project | None]:
    """The policy the tolerance options ask for, layered over the [compare] config of the
    kaudit repository holding the first of ``paths`` that is in one; where it came from;
    and that repository.

    The config is read as it is at ``trust``'s trust ref when there is one (never the work
    tree); else the work tree's when ``work_tree`` (an unsigned, interactive comparison,
    which prints where its tolerances came from); else none is read."""
    from kronos_audit.compare import PolicySource, TolerancePolicy
    from kronos_audit.project.settings import compare_settings

    r = _number("--rtol", rtol)
    t = _number("--atol", atol)
    u = _number("--ulp", ulp, whole=True)
    project = config_project(*paths)
    pinned = None
    if project is not None and trust is not None and trust.trust_ref is not None:
        pinned = trust.pin(project.root).pinned
    base, source = compare_settings(project, pinned, work_tree=work_tree)
    policy = TolerancePolicy.from_options(
        rtol=r, atol=t, ulp=None if u is None else int(u), tol=tol, base=base
    )
    given = bool(tol) or r is not None or t is not None or u is not None
    return policy, PolicySource(source.settings, source.config, given), project


# -- storage ---------------------------------------------------------------------------

REMOTE_OPTION = click.option("--remote", help="DVC remote name (default: the default remote).")


def manifests_named(targets: tuple[Path, ...]) -> tuple[Project, list[Path]]:
    """The manifests named: run directories expanded, a checkpoint or a sharded step's
    directory taken for its manifest, attestations passed over (they record a replay, not
    a checkpoint); none named: every manifest in the repository."""
    from kronos_audit.checkpoint.layout import expand_targets, statements_in
    from kronos_audit.errors import UsageError
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


def json_paths(*starts: Path) -> Callable[[Path], str]:
    """How every ``--json`` names a file: a POSIX path relative to the top of the
    repository the command works in (the one holding the first of ``starts``, or the
    working directory), absolute when outside it, wherever the command was run from and
    however the path was given; as the report, the gate and the manifests name them."""
    from kronos_audit.errors import Error
    from kronos_audit.project.repository import find_project

    try:
        return find_project(starts[0] if starts else Path.cwd()).relative
    except Error:
        return lambda path: (Path(path).parent.resolve() / Path(path).name).as_posix()


def repository_if_none(paths: tuple[Path, ...]) -> list[Path]:
    """``paths``; none given: the kaudit repository holding the working directory (as a
    path relative to it, so what is printed is too), for a command that then covers
    every run in it, as ``status``, ``push``, ``log`` and ``gate`` do."""
    import os

    from kronos_audit.checkpoint.layout import statements_in
    from kronos_audit.errors import UsageError
    from kronos_audit.project.repository import find_project

    if paths:
        return list(paths)
    project = find_project(Path.cwd()).require_initialized()
    if not statements_in(project.root).manifests:
        raise UsageError("no manifest (*.kaudit.json) in this repository", path=project.root)
    return [Path(os.path.relpath(project.root))]


# -- asking and warning ----------------------------------------------------------------


def warn(message: str) -> None:
    """One ``kaudit: warning:`` line on stderr (never markup, never control characters);
    none with ``--quiet``, which prints nothing on success."""
    if not settings().quiet:
        click.echo(f"kaudit: warning: {plain(message)}", err=True)


def ask_passphrase(name: str) -> str:
    """The passphrase of an encrypted key, asked on the terminal; none without one."""
    if not sys.stdin.isatty():
        return ""
    text: str = click.prompt(f"passphrase for key {name}", hide_input=True, err=True)
    return text
