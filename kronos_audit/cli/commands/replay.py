"""`kaudit replay MANIFEST`: re-run the segment that produced a checkpoint and compare."""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path
from typing import TYPE_CHECKING

import click

from kronos_audit.cli.comparison import STYLE, SUMMARY_WORDS, dataset_details
from kronos_audit.cli.options import (
    ask_passphrase,
    json_option,
    pinned_trust,
    tolerance_options,
    tolerance_policy,
    trust_options,
    warn,
)
from kronos_audit.cli.output import out, safe, shown, shown_recorded
from kronos_audit.errors import ExitCode, UsageError

if TYPE_CHECKING:
    from kronos_audit.keys.anchors import TrustOptions
    from kronos_audit.replay import Attestation, ReplayResult

# By outcome (a StrEnum, so its members look these up).
OUTCOME_STYLE = {
    "REPRODUCED": "[green]REPRODUCED[/]",
    "REPRODUCED_WITHIN_TOLERANCE": "[cyan]REPRODUCED WITHIN TOLERANCE[/]",
    "NOT_REPRODUCED": "[red]NOT REPRODUCED[/]",
}
# kronos_audit.replay.EnvMode's values, spelled out so that `--help` need not import the
# replay engine (a test holds them equal)
ENV_MODES = ("strict", "warn", "ignore")


@click.command()
@click.argument("manifest", type=click.Path(path_type=Path))
@tolerance_options
@click.option(
    "--env",
    "env_mode",
    type=click.Choice(ENV_MODES),
    default="warn",
    show_default=True,
    help="On environment drift from the recorded lock: strict refuses to run (exit 2), "
    "warn reports it and runs, ignore runs without showing it (the result records it).",
)
@click.option(
    "--keep-workdir",
    is_flag=True,
    help="Keep the worktree, the output and the command's logs, and say where.",
)
@json_option("Print the result as JSON.")
@click.option(
    "--attest",
    is_flag=True,
    help="Also write a signed attestation of the result, CKPT.replay.json beside the manifest.",
)
@click.option("--key", help="Signing key for --attest (default: $KAUDIT_KEY, else the only one).")
@click.option(
    "--ranks",
    type=click.IntRange(min=1),
    help="A step of a run on several ranks: replay it on this many (default: the recorded count).",
)
@trust_options
@click.pass_context
def replay(
    ctx: click.Context,
    manifest: Path,
    rtol: str | None,
    atol: str | None,
    ulp: str | None,
    tol: tuple[str, ...],
    env_mode: str,
    keep_workdir: bool,
    as_json: bool,
    attest: bool,
    key: str | None,
    ranks: int | None,
    trust: TrustOptions,
) -> None:
    """Replay the segment that produced MANIFEST's checkpoint and compare.

    The manifest, its parent and their chain are verified; the code is checked out at the
    recorded commit (in a temporary git worktree, with the recorded patch); the recorded
    command runs there, resuming from the parent checkpoint (fetched from the DVC remote
    if missing) and stopping at the manifest's step; its checkpoint is compared with the
    recorded one. Bitwise by default, against the recorded dataset hashes; with a
    tolerance (options as for `kaudit diff`, defaults from [compare] in
    .kaudit/config.toml), against the recorded data. [compare] is read as it is at
    --trust-ref when one is given; else from the work tree, except with --attest: a signed
    verdict takes its tolerances from the command line or the trust ref only (bitwise
    without either). The output and the attestation say where they came from.

    The history is verified with the same trust anchors as `kaudit verify`; --attest
    certifies, so it requires every signer on the way to be anchored (as --require-anchor).

    A step of a run on several ranks is replayed as its ranks were started, with
    `mpiexec -n N` or `torchrun --standalone --nproc_per_node N` (N recorded, or --ranks),
    and compared as one file is, bitwise or with the same tolerances: arrays split in
    blocks are compared as global arrays, so any rank count compares.

    A checkpoint of another tool is compared by its tensors, not its bytes: safetensors,
    npz and npy tensor by tensor; a directory step (a DCP save, a Hugging Face
    checkpoint-N/) is handed its parent's directory and compared file by file, a DCP
    save's tensors by global name; a pickle whose bytes differ by its tensors after a
    verified weights-only torch.load (without torch, by its bytes, saying so).

    Exit 0 when reproduced (bitwise, or within tolerance), 1 when not, naming the
    datasets; 2 when the segment could not be replayed, saying why.

    \b
    Example:
      kaudit replay checkpoints/heat/step-00003000.h5.kaudit.json --attest
    """
    from kronos_audit.checkpoint.layout import resolve_target
    from kronos_audit.cli.progress import progress_bar, replay_output
    from kronos_audit.keys.home import select_key
    from kronos_audit.project.settings import work_tree_tolerances
    from kronos_audit.replay import (
        EnvMode,
        attestation_path_for,
        check_attestation_writable,
        write_attestation,
    )
    from kronos_audit.replay import replay as run_replay

    manifest = resolve_target(manifest)  # a checkpoint or step directory: its manifest
    if key is not None and not attest:
        raise UsageError("--key names the key that signs the attestation: add --attest")
    # A signed verdict depends only on signed or given settings: with --attest, [compare]
    # is read only at --trust-ref, never from the work tree (without either, bitwise).
    # --trust-ref resolved once: [compare] and the history are read at one commit.
    trust = pinned_trust(trust, manifest)
    policy, source, project = tolerance_policy(
        rtol, atol, ulp, tol, manifest, trust=trust, work_tree=not attest
    )
    if attest and trust.trust_ref is None and work_tree_tolerances(project):
        warn(
            "[compare] of the work tree's .kaudit/config.toml is not used for a signed "
            "verdict: give the tolerances (--rtol, --atol, --ulp, --tol) or --trust-ref REF"
        )
    trust = dataclasses.replace(trust, require_anchor=True) if attest else trust
    # A missing or unreadable key stops us before the run.
    signing_key = select_key(key, passphrase=ask_passphrase) if attest else None
    if attest:  # and one that cannot be written, before the replay, not after it
        check_attestation_writable(attestation_path_for(manifest))
    with progress_bar() as bar, replay_output(bar):
        bar.update("replaying", 0, 0)
        result = run_replay(
            manifest,
            policy=policy,
            policy_source=source,
            env=EnvMode(env_mode),
            keep_workdir=keep_workdir,
            trust=trust,
            ranks=ranks,
        )
    attestation = (
        write_attestation(result, signing_key, attestation_path_for(manifest))
        if signing_key is not None
        else None
    )
    if as_json:
        out.json(result.to_json_obj())
    else:
        render(result, attestation, manifest)
    ctx.exit(ExitCode.OK if result.ok else ExitCode.CHECK_FAILED)


def _seconds(x: float) -> str:
    return f"{x:.2f} s"


def _row(label: str, value: str) -> None:
    out.print(f"  [bold]{label:<12}[/] {value}")


def _header(r: ReplayResult, manifest: Path) -> None:
    m = r.manifest
    if r.parent is not None:
        start = f"resumed from step {r.parent.step}"
        if r.parent_fetched:
            start += " (its checkpoint fetched from the DVC remote)"
    else:
        start = "from the start" + (f", seed {r.seed}" if r.seed is not None else "")
    out.print(
        f"replay of [bold]{safe(shown_recorded(m.checkpoint, manifest))}[/] "
        f"(run {safe(m.run)}, step {m.step}), {start}"
    )
    patch = f" + recorded patch {safe(r.patch_sha256[:12])}" if r.patch_sha256 else ""
    _row("code", f"commit {safe(r.commit[:12])}{patch}")
    _row("command", f"{safe(shlex.join(r.command))}  [dim](in {safe(r.cwd)})[/]")
    if r.ranks is not None:
        how = f"launched with {safe(r.launcher)}" if r.launcher else "one process, no launcher"
        _row("ranks", f"{r.ranks}, {how}")
    env = r.environment
    if env.mode != "ignore":  # an EnvMode
        whose = (
            "as the replayed program ran"
            if env.judged_on == "program"  # a JudgedOn
            else "as this process gave the command"
        )
        if env.drift:
            n = len(env.drift)
            _row(
                "environment",
                f"[yellow]drift from the recorded lock, {n} difference{'s' if n != 1 else ''} "
                f"({whose}):[/]",
            )
            for d in env.drift:
                _row("", f"[yellow]{safe(str(d))}[/]")
        else:
            _row("environment", f"[green]no drift[/] from the recorded lock ({whose})")
        if env.notes:
            _row("", "[dim]not drift: " + safe("; ".join(str(d) for d in env.notes)) + "[/]")
    _row("tolerances", _tolerances(r))
    t = r.timings
    _row(
        "time",
        f"command {_seconds(t.command)}, total {_seconds(t.total)} "
        f"(verify {_seconds(t.verify)}, code {_seconds(t.code)}, compare {_seconds(t.compare)})",
    )


def _tolerances(r: ReplayResult) -> str:
    from kronos_audit.compare.policy import policy_text

    source = r.policy_source
    text = f"{safe(policy_text(r.policy))}  [dim]({safe(source.describe())})[/]"
    return f"[yellow]{text}[/]" if source.settings == "work-tree" else text  # a Settings


def render(r: ReplayResult, attestation: Attestation | None, manifest: Path) -> None:
    """The replay's header (code, command, drift, time), the datasets that are not
    identical, and the verdict (with --quiet: nothing when it reproduced, the datasets and
    the verdict when it did not). Files are named as
    :func:`~kronos_audit.cli.output.shown` names them, from ``manifest``, the one replayed."""
    _header(r, manifest)
    failed = not r.ok
    differing = [d for d in r.datasets if d.verdict != "IDENTICAL"]
    if differing:
        out.print()
    for d in differing:
        if d.comparison is not None:  # where, and by how much, as `kaudit diff` says it
            for line in dataset_details(d.comparison):
                out.print(line, failure=failed)
        else:
            head = f"[bold]{safe(d.path)}[/] [{STYLE[d.verdict]}]{d.verdict.value}[/]"
            out.print(head + (f": {safe(d.detail)}" if d.detail else ""), failure=failed)
    out.print(failure=failed and bool(differing))
    basis = (
        "against the recorded data"
        if r.basis != "hashes"
        else "bitwise, against the recorded step's data"
        if r.ranks is not None  # a step's manifest signs its shards, not its datasets
        else "bitwise, against the recorded hashes"
    )
    if r.compared_by == "tensors":  # a ComparedBy: a pickle's, after a weights-only load
        basis = "by tensors, " + ("bitwise" if r.basis == "hashes" else "against the recorded data")
    if not r.datasets:
        what = "file digest " + ("matches" if r.file_identical else "differs")
        what += "" if r.notes else " (not HDF5)"
    else:
        counts = r.counts()
        noun = "tensors" if r.compared_by == "tensors" else "datasets"
        what = f"{len(r.datasets)} {noun}: " + ", ".join(
            f"{n} {SUMMARY_WORDS[v]}" for v, n in counts.items() if n
        )
        failing = [d.path for d in r.failures]
        if failing:
            what += " (" + ", ".join(failing) + ")"
    out.print(f"{OUTCOME_STYLE[r.outcome]}: {safe(what)}  [dim]({basis})[/]", failure=failed)
    if r.cause is not None:
        out.print(f"[yellow]why:[/] {safe(r.cause)}", failure=failed)
    for note in r.notes:
        out.print(f"[dim]note:[/] {safe(note)}")
    for note in r.uncompared:
        out.print(f"[yellow]not compared:[/] {safe(note)}")
    if r.workdir is not None:
        out.print(
            f"work directory kept: {safe(str(r.workdir))} (src/ is a git worktree: "
            "remove it with `git worktree remove --force`)"
        )
    if attestation is not None:
        out.print(f"attestation: {safe(shown(attestation.path))}")
