"""The `kaudit` group (kronos_audit.cli._app): commands loaded when run, a light
`import kronos_audit`, `python -m kronos_audit`, shell completion, -q/-v, errors as JSON
with --json, and an example in every command's help."""

from __future__ import annotations

import ast
import importlib
import json
import logging
import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

import kronos_audit as ka
import kronos_audit.runtime
from kronos_audit.cli import cli
from kronos_audit.cli._app import COMMANDS, KauditGroup
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from tests.helpers import KAUDIT, assert_bad_input, run_cli, write_checkpoint

HEAVY = ("h5py", "numpy", "jsonschema", "git", "dvc")
"""What no help, completion or plain `import kronos_audit` may import."""

# Runs the CLI on ARGS in this interpreter, then prints (on fd 3's stand-in: the last line
# of stderr) the top-level packages it had imported, whatever way it exited.
PROBE = """
import json, sys
from kronos_audit.cli import main
sys.argv = ["kaudit", *sys.argv[1:]]
try:
    main()
finally:
    loaded = sorted({m.partition(".")[0] for m in sys.modules})
    print("\\nMODULES " + json.dumps(loaded), file=sys.stderr)
"""


def loaded_by(*args: str, env: dict[str, str] | None = None) -> tuple[str, set[str]]:
    """`kaudit ARGS` in a fresh interpreter: its stdout, and the packages it imported."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=60,
    )
    marker = done.stderr.rpartition("MODULES ")[2]
    return done.stdout, set(json.loads(marker))


def every_command(
    group: click.Group = cli, path: tuple[str, ...] = ()
) -> Iterator[tuple[str, ...]]:
    """The path of every command and subcommand (``("keys", "list")``...)."""
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None, name
        yield (*path, name)
        if isinstance(command, click.Group):
            yield from every_command(command, (*path, name))


ALL_COMMANDS = list(every_command())


# -- start-up --------------------------------------------------------------------------


def test_help_imports_no_command_and_no_heavy_library() -> None:
    out, modules = loaded_by("--help")
    for name in COMMANDS:
        assert f"  {name} " in out  # listed, with its short help
    assert not modules & {*HEAVY, "rich", "cryptography"}, modules


@pytest.mark.parametrize("command", ALL_COMMANDS, ids=" ".join)
def test_a_commands_help_imports_no_heavy_library(command: tuple[str, ...]) -> None:
    out, modules = loaded_by(*command, "--help")
    assert "Usage: kaudit " + " ".join(command) in out
    assert not modules & set(HEAVY), modules


POLICIES = (
    "AnyOf",
    "AtFinalStep",
    "Auto",
    "EverySeconds",
    "EverySteps",
    "MemoryLevel",
    "Never",
    "OnPreemption",
    "PartnerLevel",
    "Retention",
    "SaveContext",
    "SavePolicy",
)
"""The names a program may take from kronos_audit without loading the run."""


def test_import_kronos_audit_is_light_before_and_after_a_policy_is_used() -> None:
    code = (
        "import sys, kronos_audit as ka\n"
        "def loaded(): return sorted({m.partition('.')[0] for m in sys.modules})\n"
        "print(*loaded())\n"
        f"for name in {POLICIES!r}: getattr(ka, name)\n"
        "policy = ka.Auto('24h') | ka.EverySteps(5) | ka.EverySeconds(60) | ka.OnPreemption()\n"
        "policy = ka.AnyOf((policy, ka.AtFinalStep(), ka.Never()))\n"
        "assert isinstance(policy, ka.SavePolicy)\n"
        "ctx = ka.SaveContext(step=5, now=1.0, last_step=0, last_time=0.0, stall=0.1,\n"
        "                     write_time=1.0, preempted=False)\n"
        "assert policy.should_save(ctx)\n"
        "ka.Retention(keep=3, keep_every=100)\n"
        "ka.PartnerLevel(every=2, nodes=3)\n"
        "ka.Auto.for_levels(['6h', '30d']).plan([0.1, 30.0])\n"
        "print(*loaded())\n"
        "print('kronos_audit.runtime.run' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    before, after, run_loaded = done.stdout.splitlines()
    assert "kronos_audit" in before.split()
    for loaded in (before, after):
        assert not set(loaded.split()) & {*HEAVY, "click", "rich", "cryptography"}, loaded
    assert run_loaded == "False"


EXPORTING = ("kronos_audit", "kronos_audit.runtime")
"""The packages that give their modules' names lazily."""


def type_checkers_see_all(package_name: str) -> bool:
    """Whether a type checker sees an ``__all__`` in the package: a computed one would
    hide the names its ``TYPE_CHECKING`` block re-exports from ``import *`` of it."""
    source = importlib.import_module(package_name).__file__
    assert source
    tree = ast.parse(Path(source).read_text(encoding="utf-8"))
    return any(
        isinstance(target, ast.Name) and target.id == "__all__"
        for node in tree.body
        if isinstance(node, ast.Assign)
        for target in ast.walk(ast.Tuple(elts=node.targets))
    )


@pytest.mark.parametrize("package_name", EXPORTING)
def test_the_type_checking_imports_are_the_exports_table(package_name: str) -> None:
    """What a type checker is told the package exports is what it exports at run time."""
    package = importlib.import_module(package_name)
    assert package.__file__
    tree = ast.parse(Path(package.__file__).read_text(encoding="utf-8"))
    (block,) = [
        n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING"
    ]
    imported: dict[str, set[str]] = {}
    for node in block.body:
        assert isinstance(node, ast.ImportFrom), ast.unparse(node)
        assert node.module, ast.unparse(node)
        if [alias.name for alias in node.names] == ["*"]:
            # All of a sub-package's names: those its own block re-exports, checked by
            # this test too (its __all__ unseen by type checkers, so they take those).
            assert node.module in EXPORTING, f"{node.module}: not checked here"
            assert not type_checkers_see_all(node.module), f"{node.module}: hide its __all__"
            for module, names in importlib.import_module(node.module)._EXPORTS.items():
                imported.setdefault(module, set()).update(names)
            continue
        for alias in node.names:
            assert alias.asname == alias.name, f"{alias.name}: re-export it as itself"
            imported.setdefault(node.module, set()).add(alias.name)
    exports = package._EXPORTS
    assert imported == {m: set(names) for m, names in exports.items()}
    assert package.__all__ == sorted(n for names in exports.values() for n in names)
    for module, names in exports.items():
        for name in names:
            assert getattr(package, name) is getattr(importlib.import_module(module), name)


def test_every_public_name_resolves() -> None:
    for name in ka.__all__:
        assert getattr(ka, name) is not None, name
    assert set(ka.__all__) <= set(dir(ka))
    with pytest.raises(AttributeError, match="no_such_name"):
        ka.no_such_name  # noqa: B018
    from kronos_audit.errors import Error, UsageError

    assert ka.UsageError is UsageError
    assert ka.Error is Error
    assert issubclass(ka.ToleranceError, ka.Error)
    assert issubclass(ka.CommandStartError, ka.UsageError)


def test_verify_and_snapshot_stay_functions_when_their_modules_are_imported_later() -> None:
    # ka.verify and ka.snapshot are functions, also once the modules that define them are
    # imported after the package.
    code = (
        "import kronos_audit as ka\n"
        "import kronos_audit.verification.batch, kronos_audit.signing.snapshot\n"
        "from kronos_audit import verify\n"
        "print(callable(ka.verify), callable(ka.snapshot), verify is ka.verify)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.split() == ["True", "True", "True"], done.stderr


def test_python_m_kronos_audit_is_kaudit() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "kronos_audit", "interval", "--mtbf", "1h30m", "--cost", "5min",
         "--json"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert (doc["mtbf"], doc["cost"]) == (5400.0, 300.0)
    usage = subprocess.run(
        [sys.executable, "-m", "kronos_audit", "bogus"], capture_output=True, text=True
    )
    assert usage.returncode == 2
    assert "No such command 'bogus'" in usage.stderr


def test_a_mistyped_command_is_answered_with_the_nearest_names() -> None:
    # the installed kaudit, as a user types it: one error line naming the nearest command
    done = subprocess.run([*KAUDIT, "verfy", "run"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stdout == ""
    assert "Error: No such command 'verfy'. Did you mean 'verify'?" in done.stderr.splitlines()
    # in a group of commands too, and with every name near enough
    lst = run_cli("keys", "lst")
    assert lst.exit_code == 2
    assert "No such command 'lst'. Did you mean 'list'?" in lst.stderr
    near = run_cli("keys", "genrate")
    assert "Did you mean one of: 'generate', 'rotate'?" in near.stderr
    # nothing near: no guess; and a command that exists is never second-guessed
    far = run_cli("zzz")
    assert far.exit_code == 2
    assert "No such command 'zzz'." in far.stderr
    assert "Did you mean" not in far.stderr
    assert run_cli("keys", "list").exit_code == 0


# -- shell completion ------------------------------------------------------------------


def complete(words: str) -> tuple[list[str], set[str]]:
    """What bash completion offers after ``words`` (the last one being completed)."""
    parts = words.split(" ")
    out, modules = loaded_by(
        env={
            "_KAUDIT_COMPLETE": "bash_complete",
            "COMP_WORDS": words,
            "COMP_CWORD": str(len(parts) - 1),
        }
    )
    # bash_complete answers "type,value" lines
    return [line.partition(",")[2] for line in out.splitlines()], modules


def test_completion_offers_the_commands_without_importing_them() -> None:
    offered, modules = complete("kaudit ")
    assert offered == sorted(COMMANDS)
    assert not modules & {*HEAVY, "rich", "cryptography"}, modules
    assert complete("kaudit s")[0] == ["show", "snapshot", "status"]


def test_completion_of_subcommands_and_options() -> None:
    offered, modules = complete("kaudit keys ")
    assert offered == ["generate", "list", "revoke", "rotate", "trust"]
    assert not modules & set(HEAVY), modules
    assert sorted(complete("kaudit verify --tru")[0]) == ["--trust-ref", "--trusted-key"]
    assert "--quiet" in complete("kaudit --")[0]


def test_completion_script_for_bash(tmp_path: Path) -> None:
    done = subprocess.run(
        KAUDIT, env={**os.environ, "_KAUDIT_COMPLETE": "bash_source"}, capture_output=True,
        text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "_KAUDIT_COMPLETE=bash_complete" in done.stdout
    assert "complete -o nosort -F _kaudit_completion kaudit" in done.stdout
    # `kaudit completion bash` prints that same script, with -q too
    for args in (("completion", "bash"), ("-q", "completion", "bash")):
        printed = run_cli(*args)
        assert printed.exit_code == 0, printed.output
        assert printed.stdout == done.stdout
    script = tmp_path / "kaudit.bash"
    script.write_text(printed.stdout)
    subprocess.run(["bash", "-n", str(script)], check=True)
    # sourced in a real bash, it completes `kaudit ver` by asking the installed kaudit
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "kaudit").write_text(f'#!/bin/sh\nexec {shlex.join(KAUDIT)} "$@"\n')
    (bin_dir / "kaudit").chmod(0o755)
    shell = subprocess.run(
        ["bash", "-c", f'source {shlex.quote(str(script))}; COMP_WORDS=(kaudit ver); '
         'COMP_CWORD=1; _kaudit_completion kaudit; printf "%s\\n" "${COMPREPLY[@]}"'],
        env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert shell.returncode == 0, shell.stderr
    assert shell.stdout.split() == ["verify"]


@pytest.mark.parametrize("shell", ["zsh", "fish"])
def test_completion_scripts_for_zsh_and_fish(shell: str) -> None:
    printed = run_cli("completion", shell)
    assert printed.exit_code == 0, printed.output
    assert f"_KAUDIT_COMPLETE={shell}_complete" in printed.stdout


def test_completion_for_an_unknown_shell_names_the_shells() -> None:
    assert_bad_input(run_cli("completion", "tcsh"), "'tcsh'", "bash, zsh, fish", no_stdout=True)


# -- the registry and the help ---------------------------------------------------------


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_the_registered_help_is_the_commands_own(name: str) -> None:
    group = cli
    assert isinstance(group, KauditGroup)
    spec = COMMANDS[name]
    fresh = KauditGroup(lazy_commands=COMMANDS)  # nothing imported through it yet
    command = group.get_command(click.Context(group), name)
    assert command is not None
    assert command.name == name
    for limit in (45, 66, 1000):
        assert fresh._short_help(name, limit) == command.get_short_help_str(limit), spec


@pytest.mark.parametrize("command", [(), *ALL_COMMANDS], ids=lambda c: " ".join(c) or "kaudit")
def test_every_help_has_an_example(command: tuple[str, ...]) -> None:
    result = run_cli(*command, "--help")
    assert result.exit_code == 0, result.output
    text = result.stdout
    assert "Example:" in text
    example = text.partition("Example:")[2].splitlines()[1]
    assert example.strip().startswith("kaudit " + " ".join(command).strip())


def test_values_spelled_out_for_a_fast_help_match_the_library() -> None:
    from kronos_audit.checkpoint.location import Location
    from kronos_audit.cli import comparison
    from kronos_audit.cli.commands import log, replay, report, status
    from kronos_audit.compare import Verdict
    from kronos_audit.replay import EnvMode, Outcome
    from kronos_audit.report.render import ReportFormat

    assert tuple(m.value for m in ReportFormat) == report.FORMATS
    assert tuple(m.value for m in EnvMode) == replay.ENV_MODES
    assert set(replay.OUTCOME_STYLE) == {o.value for o in Outcome}
    assert set(comparison.STYLE) == set(comparison.SUMMARY_WORDS) == {v.value for v in Verdict}
    assert set(status._COLOURS) == set(log._DATA_STYLE) == {loc.value for loc in Location}


# -- errors as JSON --------------------------------------------------------------------


def test_with_json_an_error_is_one_json_object_on_stdout(tmp_path: Path) -> None:
    missing = tmp_path / "missing.h5.kaudit.json"
    plain = run_cli("show", str(missing))
    assert plain.exit_code == 2
    assert plain.stderr.startswith("kaudit: error: ")
    result = run_cli("show", "--json", str(missing))
    assert result.exit_code == 2, result.output
    assert result.stderr == ""
    assert json.loads(result.stdout) == {
        "error": "manifest not found",
        "path": str(missing),
        "exit_code": 2,
        "type": "ManifestError",
    }


@pytest.mark.parametrize(
    ("args", "mention"),
    [
        (["replay", "--json"], "Missing argument 'MANIFEST'"),  # a missing argument
        (["status", "--json", "--bogus"], "No such option '--bogus'"),  # before --json is seen
        (["interval", "--json", "--mtbf", "soon", "--cost", "5m"], "'soon' is not a duration"),
        (["diff", "--json", "a.h5", "b.h5", "--rtol", "x"], "--rtol must be a number"),
    ],
)
def test_with_json_usage_errors_are_json_too(args: list[str], mention: str) -> None:
    result = run_cli(*args)
    assert result.exit_code == 2, result.output
    assert result.stderr == ""
    doc = json.loads(result.stdout)
    assert mention in doc["error"]
    assert doc["exit_code"] == 2


def test_a_failed_check_keeps_its_exit_code_in_json(
    project: Project, key: SigningKey, checkpoint: Path
) -> None:
    run_cli("snapshot", str(checkpoint), "--run", "r", "--step", "1")
    os.chmod(checkpoint, 0o644)
    with open(checkpoint, "r+b") as f:
        f.seek(-8, os.SEEK_END)
        f.write(b"tampered")
    result = run_cli("status", "--local-only", "--json", str(checkpoint.parent))
    assert result.exit_code == 1
    assert json.loads(result.stdout)["ok"] is False


def test_run_json_errors_go_to_stderr_with_its_summary() -> None:
    result = run_cli("run", "--json", "--", "kaudit-test-no-such-command")
    assert result.exit_code == 2
    assert result.stdout == ""
    doc = json.loads(result.stderr)
    assert doc["error"] == "cannot run 'kaudit-test-no-such-command': command not found"
    assert doc["type"] == "CommandStartError"


# -- -C ------------------------------------------------------------------------------


def test_dash_c_stands_in_the_repository_it_names(
    project: Project, key: SigningKey, checkpoint: Path, tmp_path: Path
) -> None:
    run_cli("snapshot", str(checkpoint), "--run", "r", "--step", "1")
    name = str(checkpoint.relative_to(project.root))
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    # from outside any repository, the repository is the one -C names, and paths are
    # taken from there
    result = run_cli("-C", str(project.root), "verify", f"{name}.kaudit.json", cwd=outside)
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"ok   {name}.kaudit.json  (run r, step 1;")
    assert run_cli("verify", f"{name}.kaudit.json", cwd=outside).exit_code == 2


@pytest.mark.parametrize("where", ["missing", "a-file"])
def test_dash_c_to_no_directory_is_one_line(tmp_path: Path, where: str) -> None:
    (tmp_path / "a-file").touch()
    result = run_cli("-C", str(tmp_path / where), "status", cwd=tmp_path)
    assert_bad_input(result, f"-C {tmp_path / where}", no_stdout=True)


# -- -q and -v -------------------------------------------------------------------------


def test_quiet_prints_nothing_before_or_after_the_command(git_repo: Path) -> None:
    loud = run_cli("init", cwd=git_repo)
    assert "next: `kaudit keys generate`" in loud.stdout
    for quiet in (run_cli("-q", "init", cwd=git_repo), run_cli("init", "-q", cwd=git_repo)):
        assert quiet.exit_code == 0  # before the command or after it, as git's -q
        assert quiet.stdout == quiet.stderr == ""


def test_verbose_shows_every_check(project: Project, key: SigningKey, checkpoint: Path) -> None:
    run_cli("snapshot", str(checkpoint), "--run", "r", "--step", "1")
    manifest = f"{checkpoint}.kaudit.json"
    normal = run_cli("verify", manifest)
    verbose = run_cli("-v", "verify", manifest)
    after = run_cli("verify", "--verbose", manifest)
    assert normal.exit_code == verbose.exit_code == after.exit_code == 0
    assert "file digest:" not in normal.stdout
    assert "      file digest: sha256 " in verbose.stdout
    assert "      datasets: all 5 dataset hashes match" in verbose.stdout
    assert after.stdout == verbose.stdout


@pytest.mark.parametrize(
    "where",
    [("-q", "-v", "interval"), ("-q", "interval", "-v"), ("interval", "-v", "--quiet")],
)
def test_quiet_and_verbose_exclude_each_other(where: tuple[str, ...]) -> None:
    result = run_cli(*where, "--mtbf", "1h", "--cost", "1m")
    assert result.exit_code == 2
    assert "--quiet and --verbose exclude each other" in result.stderr


@click.command("log-probe")
def _log_probe() -> None:
    """Logs as the library does (a test-only command)."""
    logging.getLogger("kronos_audit.probe").info("copied \x1b[31m into the cache")
    logging.getLogger("kronos_audit.probe").debug("a debug detail")


@pytest.fixture
def log_probe() -> Iterator[None]:
    cli.add_command(_log_probe)
    try:
        yield
    finally:
        assert isinstance(cli, click.Group)
        cli.commands.pop("log-probe")


@pytest.mark.usefixtures("log_probe")
def test_verbose_puts_kronos_audits_log_on_stderr_as_text() -> None:
    assert "copied" not in run_cli("log-probe").stderr
    info = run_cli("-v", "log-probe").stderr
    assert "kaudit: INFO: kronos_audit.probe: copied \\x1b[31m into the cache" in info
    assert "debug detail" not in info
    assert "a debug detail" in run_cli("-vv", "log-probe").stderr
    # after the command too; counted on from the group's, with one handler, not two
    assert run_cli("log-probe", "-v").stderr == info
    both = run_cli("-v", "log-probe", "-v").stderr
    assert both.count("copied") == 1
    assert "a debug detail" in both
    # the handler is gone after the command
    logger = logging.getLogger("kronos_audit")
    assert not [h for h in logger.handlers if isinstance(h, logging.StreamHandler)]


def test_status_exits_1_only_for_a_corrupt_checkpoint(project: Project, key: SigningKey) -> None:
    run_dir = project.root / "checkpoints" / "r"
    for step in (1, 2):
        ckpt = write_checkpoint(run_dir / f"step-{step}.h5", seed=step)
        assert run_cli("snapshot", str(ckpt), "--run", "r", "--step", str(step)).exit_code == 0
    assert run_cli("status", "--local-only", str(run_dir)).exit_code == 0
    (run_dir / "step-1.h5").unlink()
    missing = run_cli("status", "--local-only", str(run_dir))
    assert missing.exit_code == 0  # missing is a place, not a failed check
    assert "1 missing" in missing.stdout
    ckpt = run_dir / "step-2.h5"
    os.chmod(ckpt, 0o644)
    with open(ckpt, "r+b") as f:
        f.seek(-8, os.SEEK_END)
        f.write(b"tampered")
    corrupt = run_cli("status", "--local-only", str(run_dir))
    assert corrupt.exit_code == 1
    assert "1 corrupt, 1 missing" in corrupt.stdout


# -- what `kaudit verify` pays for -----------------------------------------------------

# Runs `kaudit verify MANIFEST`, then prints (as the last line of stderr) every module the
# interpreter had imported, submodules included.
VERIFY_PROBE = """
import json, sys
from kronos_audit.cli import main
sys.argv = ["kaudit", "verify", sys.argv[1]]
try:
    main()
finally:
    print("\\nMODULES " + json.dumps(sorted(sys.modules)), file=sys.stderr)
"""


def test_verify_of_a_present_checkpoint_imports_only_what_it_needs(
    project: Project, key: SigningKey, checkpoint: Path
) -> None:
    assert run_cli("snapshot", str(checkpoint), "--run", "r", "--step", "1").exit_code == 0
    done = subprocess.run(
        [sys.executable, "-c", VERIFY_PROBE, f"{checkpoint}.kaudit.json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ok "), done.stdout
    assert "data checked for 1" in done.stdout
    modules = set(json.loads(done.stderr.rpartition("MODULES ")[2]))
    # What verifying needs: HDF5 and numpy (the dataset hashes), the schema, Ed25519, and
    # the git layer on GitPython (the repository, whose trust store and place checks it
    # reads).
    needed = {"h5py", "numpy", "jsonschema", "cryptography", "kronos_audit._internal.git", "git"}
    assert needed <= modules, needed - modules

    def under(*packages: str) -> set[str]:
        return {m for p in packages for m in modules if m == p or m.startswith(p + ".")}

    # Nothing of DVC (a present checkpoint is never fetched), of comparison, replay, the
    # run loop or signing; none of the modules that run git for another purpose
    # (provenance's git state, replay's worktree, storage's credentials check); and no
    # scan of the installed distributions.
    assert not under(
        "dvc",
        "dvc_data",
        "dvc_objects",
        "importlib.metadata",
        "tomllib",
        "kronos_audit.storage",
        "kronos_audit.compare",
        "kronos_audit.replay",
        "kronos_audit.provenance.environment",
        "kronos_audit.runtime",
        "kronos_audit.signing.snapshot",
        "kronos_audit.signing.sign",
        "kronos_audit.storage.setup",
        "kronos_audit.history.bisect",
        "kronos_audit.history.status",
    )


def test_a_missing_checkpoint_is_still_fetched_through_storage(
    project: Project, key: SigningKey, checkpoint: Path
) -> None:
    # The other side of the lazy import: verification that needs DVC still reaches it.
    assert run_cli("snapshot", str(checkpoint), "--run", "r", "--step", "1").exit_code == 0
    checkpoint.unlink()
    done = subprocess.run(
        [sys.executable, "-c", VERIFY_PROBE, f"{checkpoint}.kaudit.json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "fetched from the DVC remote" in done.stdout  # the project's local remote
    assert "kronos_audit.storage" in json.loads(done.stderr.rpartition("MODULES ")[2])
    assert checkpoint.is_file()


# -- plain output, as rich prints it ---------------------------------------------------


def rich_prints(markup: str) -> str:
    """What rich's Console prints for ``markup`` off a terminal, set up as Output's."""
    import io

    from rich.console import Console

    stream = io.StringIO()
    console = Console(
        file=stream,
        force_terminal=False,
        color_system=None,
        highlight=False,
        emoji=False,
        soft_wrap=True,
    )
    console.print(markup)
    return stream.getvalue()


def markup_corpus(n: int, seed: int) -> list[str]:
    """``n`` strings made of the pieces markup is made of (tags, escapes, brackets,
    backslashes, controls rich drops, tabs, wide and emoji-like text)."""
    import random

    pieces = [
        "[", "]", "\\", "/", "=", "@", "#", " ", "\t", "\r", "\x07", "\x1b", "\n",
        "a", "bold", "red", "[bold]", "[/bold]", "[/]", "[/ ]", "[red on white]",
        "[link=https://x/y]", "[/link]", "[@click]", "[#ff0000]", "[b]", "[/b]",
        "\\[", "\\\\", "é", "界", ":smile:", "[not a tag", "[]", "[A]",
    ]  # fmt: skip
    rng = random.Random(seed)
    return ["".join(rng.choices(pieces, k=rng.randint(0, 10))) for _ in range(n)]


def test_a_name_in_markup_is_printed_as_itself() -> None:
    from rich.markup import escape

    from kronos_audit.cli.output import plain, safe

    for name in markup_corpus(4000, seed=90):
        assert safe(name) == escape(plain(name)), name
        # a name in markup prints as itself (made inert by plain) when it has no
        # backslash: rich's escape() leaves a backslash before "[" or at the end of a
        # name as it is, and rich then reads it as an escape (as kaudit always has: a
        # backslash can be lost, never a tag read).
        line = f"[green]ok[/]  {safe(name)}  [bold]{safe(name)}[/bold]"
        printed = rich_prints(line)  # never a MarkupError
        if "\\" not in name:
            assert printed == f"ok  {plain(name)}  {plain(name)}\n", name


def test_output_off_a_terminal_prints_what_rich_would(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from kronos_audit.cli.output import Output

    cases = [*markup_corpus(300, seed=900), "[/]", "a\tb", "[@click]x[/]", "[red]x[/blue]"]
    for markup in cases:
        try:
            expected: str | type[Exception] = rich_prints(markup)
        except Exception as e:  # rich's own refusal (MarkupError) must be kept
            expected = type(e)
        stream = io.StringIO()
        monkeypatch.setattr(sys, "stdout", stream)
        if isinstance(expected, str):
            Output().print(markup)
            assert stream.getvalue() == expected, markup
        else:
            with pytest.raises(expected):
                Output().print(markup)


def test_plain_output_into_a_closed_pipe_exits_1_without_a_word(
    project: Project, key: SigningKey, checkpoint: Path
) -> None:
    # as rich's Console did: standard output goes to /dev/null, exit 1, no traceback
    assert run_cli("snapshot", str(checkpoint), "--run", "r", "--step", "1").exit_code == 0
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            [*KAUDIT, "verify", f"{checkpoint}.kaudit.json"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    finally:
        os.close(write_end)
    assert (done.returncode, done.stderr) == (1, "")


# -- exit codes ------------------------------------------------------------------------


def test_exit_numbers_are_written_only_in_exit_code() -> None:
    """Every exit the package chooses (``ctx.exit``, ``sys.exit``, ``SystemExit``, an
    error's ``exit_code``, a ``*_EXIT`` constant) names an :class:`ExitCode`, never a
    bare number: kronos_audit/errors.py's ExitCode is the one place they are written."""
    import ast

    from kronos_audit.errors import ExitCode

    assert [(c.name, int(c)) for c in ExitCode] == [
        ("OK", 0),
        ("CHECK_FAILED", 1),
        ("BAD_INPUT", 2),
        ("PREEMPTED", 75),
        ("INTERRUPTED", 130),
        ("TERMINATED", 143),
    ]
    package = Path(ka.__file__).parent

    def numbers(node: ast.AST) -> list[int]:
        return [
            n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and type(n.value) is int
        ]

    offenders = []
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        where = path.relative_to(package.parent)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if name in {"exit", "SystemExit", "Exit"} and any(numbers(a) for a in node.args):
                    offenders.append(f"{where}:{node.lineno}")
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = [
                    t.id if isinstance(t, ast.Name) else getattr(t, "attr", "") for t in targets
                ]
                exits = [n for n in names if n in {"exit_code", "code"} or n.endswith("_EXIT")]
                if exits and node.value is not None and numbers(node.value):
                    offenders.append(f"{where}:{node.lineno}")
    assert not offenders, offenders
