"""`kaudit diff A.h5 B.h5`: compare two checkpoints dataset by dataset (or two sharded
steps, array by array, or two directory steps, file by file, by their signed digests)."""

from __future__ import annotations

from pathlib import Path

import click

from kronos_audit.cli.comparison import render_comparison
from kronos_audit.cli.options import json_option, tolerance_options, tolerance_policy
from kronos_audit.cli.output import out
from kronos_audit.errors import ExitCode


@click.command()
@click.argument("a", type=click.Path(path_type=Path))
@click.argument("b", type=click.Path(path_type=Path))
@tolerance_options
@json_option("Print every result as JSON.")
@click.pass_context
def diff(
    ctx: click.Context,
    a: Path,
    b: Path,
    rtol: str | None,
    atol: str | None,
    ulp: str | None,
    tol: tuple[str, ...],
    as_json: bool,
) -> None:
    """Compare checkpoint B with reference checkpoint A, dataset by dataset. A and B are
    checkpoints or their manifests (CKPT.kaudit.json names the checkpoint beside it).

    With no tolerance, anything not bitwise identical is DIFFERENT. An element passes a
    tolerance when |a-b| <= atol + rtol*|a|, or (with --ulp) when a and b are at most N
    ULPs apart. Integer and boolean data compare exactly unless a --tol pattern names
    them; strings, bytes and compound data always compare exactly. Defaults come from
    [compare] in .kaudit/config.toml when the files are in a kaudit repository; options
    given here override them.

    Two sharded steps (their directories or step manifests), written on any two rank
    counts, compare without their data: bitwise by the digests their signed manifests
    record of each array; with a tolerance, by the data of their shards.

    Two directory steps (their directories or manifests, DIR.kaudit.json) compare file by
    file by their signed digests, naming each file added, missing or changed, and tensor
    by tensor where both record per-tensor digests.

    Exit 0 when every dataset is IDENTICAL or WITHIN_TOLERANCE, 1 otherwise, 2 for bad input.

    \b
    Example:
      kaudit diff recorded/step-3000.h5 rerun/step-3000.h5 --rtol 1e-12 --tol 'rng/*:exact'
      kaudit diff on4/step-00000040 on2/step-00000040
      kaudit diff dcp/step-100 dcp/step-200
    """
    from kronos_audit.checkpoint.layout import checkpoint_named
    from kronos_audit.compare import compare_files
    from kronos_audit.replay.directory_diff import diff_directories, directory_manifest_of
    from kronos_audit.replay.step_diff import diff_steps, step_manifest_of

    policy, source, project = tolerance_policy(rtol, atol, ulp, tol, a, b)
    step_a, step_b = step_manifest_of(a), step_manifest_of(b)
    dir_a, dir_b = directory_manifest_of(a), directory_manifest_of(b)
    if step_a is not None and step_b is not None:
        result = diff_steps(step_a, step_b, policy)
    elif dir_a is not None and dir_b is not None:
        result = diff_directories(dir_a, dir_b, policy)
    else:
        result = compare_files(checkpoint_named(a), checkpoint_named(b), policy)
    if as_json:
        doc = result.to_json_obj()
        doc["config"] = None if project is None else project.relative(project.config_path)
        doc["tolerance_source"] = source.to_json_obj()
        out.json(doc)
    else:
        render_comparison(result, source)
    ctx.exit(ExitCode.OK if result.ok else ExitCode.CHECK_FAILED)
