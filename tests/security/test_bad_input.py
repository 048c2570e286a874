"""Bad input stays bad input: whatever nobody signed, kaudit answers with
one line and exit 2, at once; and every name it prints from a file is inert text.

Attacks go through the real CLI: the click app in-process, and a subprocess with a timeout
for anything that could hang. Checkpoints are real HDF5 files, manifests real signatures.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
from click.testing import Result

from kronos_audit._internal.canonical import canonical_json
from kronos_audit._internal.safeio import MANIFEST_LIMIT
from kronos_audit.errors import ManifestError
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.replay import read_attestation
from kronos_audit.signing.snapshot import snapshot
from kronos_audit.statement.dsse import encode_envelope, sign_envelope
from kronos_audit.statement.manifest import MAX_DEPTH, read_manifest, write_manifest
from tests.helpers import KAUDIT, assert_bad_input, git, run_cli, write_checkpoint

ESC = "\x1b"

EVIL_NAMES = {
    "[/]": "[/]",
    "[bold red]x": "[bold red]x",
    # h5py makes groups of the slashes, and folds the double one
    "[link=http://evil]a[/link]": "[link=http:/evil]a[/link]",
    "clear\x1b[2Jscreen": "clear\\x1b[2Jscreen",
    "hyper\x1b]8;;http://x\x1b\\link": "hyper\\x1b]8;;http:/x\\x1b\\link",
    "carriage\rreturn": "carriage\\rreturn",
    "bidi\u202eoverride": "bidi\\u202eoverride",
}
"""Dataset names a hostile checkpoint may hold -> how kaudit must print them."""

ENVELOPE_START = '{"payloadType": "application/vnd.in-toto+json", "signatures": [], '
"""The start of a DSSE envelope, to end with something pathological."""


def write_evil_checkpoint(path: Path, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as f:
        for name in EVIL_NAMES:
            f[name] = rng.standard_normal(4)
        f["text"] = np.array(["\x1b[2J[/]", "plain"], dtype=h5py.string_dtype())
    return path


def assert_inert(text: str) -> None:
    """No escape byte, carriage return or bidi override reaches the terminal."""
    assert ESC not in text
    assert "\r" not in text
    assert "\u202e" not in text


def assert_names_shown(text: str) -> None:
    # rich may fold long table cells, so look for each name without the line breaks
    flat = text.replace("\n", "")
    for shown in EVIL_NAMES.values():
        assert shown in flat, (shown, text)


def clean(result: Result) -> None:
    assert "Traceback" not in result.output
    assert_inert(result.output)


def run_kaudit(*args: str, cwd: Path | None = None, timeout: float = 60) -> tuple[int, str, str]:
    """The installed kaudit as a subprocess: a hang fails the test instead of blocking it."""
    done = subprocess.run(
        [*KAUDIT, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout
    )
    return done.returncode, done.stdout, done.stderr


def one_line(code: int, stdout: str, stderr: str, *mentions: str) -> None:
    assert code == 2, (stdout, stderr)
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("kaudit: error: ")
    for m in mentions:
        assert m in lines[0], lines[0]
    assert "Traceback" not in stderr + stdout


# -- files that are not manifests --------------------------------------------------------


@pytest.fixture
def signed(project: Project, key: SigningKey, checkpoint: Path) -> Path:
    """A valid, signed manifest."""
    (m,) = snapshot(checkpoint, run="run1", step=1)
    return m.path


@pytest.mark.parametrize("command", ["show", "verify"])
def test_a_fifo_manifest_is_refused_at_once(project: Project, command: str) -> None:
    fifo = project.root / "step-00000001.h5.kaudit.json"
    os.mkfifo(fifo)
    # no writer: a reader that opened it blocking would wait for ever
    started = time.monotonic()
    code, out, err = run_kaudit(command, str(fifo), cwd=project.root, timeout=30)
    one_line(code, out, err, f": error: {fifo.name}: ", "FIFO")  # named from the cwd
    assert time.monotonic() - started < 30


def test_a_fifo_with_a_writer_that_never_ends_is_refused(project: Project) -> None:
    fifo = project.root / "x.h5.kaudit.json"
    os.mkfifo(fifo)
    writer = subprocess.Popen(
        [sys.executable, "-c", f"import sys\nwith open({str(fifo)!r}, 'wb') as f:\n"
         "    while True: f.write(b'[' * 65536)"],
    )  # fmt: skip
    try:
        code, out, err = run_kaudit("show", str(fifo), timeout=30)
    finally:
        writer.kill()
        writer.wait()
    one_line(code, out, err, "FIFO")


def test_dev_zero_is_refused_at_once() -> None:
    code, out, err = run_kaudit("show", "/dev/zero", timeout=30)
    one_line(code, out, err, "/dev/zero", "a device, not a regular file")


def test_a_sparse_20_gb_manifest_is_refused_without_reading_it(project: Project) -> None:
    huge = project.root / "step-00000001.h5.kaudit.json"
    with huge.open("wb") as f:
        f.truncate(20 * 2**30)
    before = _bytes_read()
    assert_bad_input(
        run_cli("show", str(huge)), str(huge), f"more than the {MANIFEST_LIMIT:,} allowed"
    )
    assert _bytes_read() - before < MANIFEST_LIMIT  # not one limit's worth read


def _bytes_read() -> int:
    """The bytes this process has read through read(2) and its kin (Linux's rchar)."""
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))


def test_a_manifest_one_byte_over_the_bound_is_refused(project: Project) -> None:
    big = project.root / "big.h5.kaudit.json"
    big.write_bytes(b" " * (MANIFEST_LIMIT + 1))
    assert_bad_input(run_cli("show", str(big)), str(big), "more than the")


def test_a_directory_is_refused(project: Project) -> None:
    d = project.root / "dir.h5.kaudit.json"
    d.mkdir()
    assert_bad_input(run_cli("show", str(d)), str(d), "a directory")


def test_a_socket_is_refused(project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(project.root)  # a socket's path must be short: bind a relative one
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        server.bind("s.h5.kaudit.json")
        server.listen(1)
        code, out, err = run_kaudit("show", "s.h5.kaudit.json", cwd=project.root, timeout=30)
    finally:
        server.close()
    one_line(code, out, err, "s.h5.kaudit.json", "not a regular file")


@pytest.mark.parametrize("command", ["show", "verify"])
def test_a_manifest_that_is_a_symlink_is_refused(
    signed: Path, project: Project, command: str
) -> None:
    # A manifest speaks for the checkpoint beside it: a link elsewhere is not one.
    elsewhere = project.root / "elsewhere"
    elsewhere.mkdir()
    link = elsewhere / signed.name
    link.symlink_to(signed)
    checkpoint = signed.with_name(signed.name.removesuffix(".kaudit.json"))
    (elsewhere / checkpoint.name).write_bytes(checkpoint.read_bytes())
    assert_bad_input(run_cli(command, str(link)), str(link), "symbolic link")
    assert run_cli("show", str(signed)).exit_code == 0  # the file itself is fine


def test_an_attestation_is_read_the_same_way(project: Project) -> None:
    fifo = project.root / "x.h5.replay.json"
    os.mkfifo(fifo)
    with pytest.raises(ManifestError, match="attestation is a FIFO"):
        read_attestation(fifo)
    huge = project.root / "y.h5.replay.json"
    with huge.open("wb") as f:
        f.truncate(20 * 2**30)
    with pytest.raises(ManifestError, match=r"attestation is .* bytes, more than the"):
        read_attestation(huge)
    link = project.root / "z.h5.replay.json"
    link.symlink_to(huge)
    with pytest.raises(ManifestError, match="attestation is a symbolic link"):
        read_attestation(link)
    deep = project.root / "d.h5.replay.json"
    deep.write_text("[" * 100_000)
    with pytest.raises(ManifestError, match="nested more than"):
        read_attestation(deep)


def test_kaudit_verify_refuses_an_attestation_that_is_not_a_file(project: Project) -> None:
    fifo = project.root / "step-00000001.h5.replay.json"
    os.mkfifo(fifo)
    code, out, err = run_kaudit("verify", str(fifo), cwd=project.root, timeout=30)
    one_line(code, out, err, f": error: {fifo.name}: ", "attestation is a FIFO")
    fifo.unlink()
    huge = project.root / "step-00000001.h5.replay.json"
    with huge.open("wb") as f:
        f.truncate(20 * 2**30)
    assert_bad_input(run_cli("verify", str(huge)), str(huge), "more than the")
    huge.unlink()
    huge.write_text(ENVELOPE_START + '"payload": "", "payload": "e30="}')
    assert_bad_input(run_cli("verify", str(huge)), str(huge), "duplicate key 'payload'")


# -- JSON that is not what it seems ---------------------------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[" * 100_000, f"JSON nested more than {MAX_DEPTH} levels deep"),
        ("[" * 500 + "]" * 500, f"JSON nested more than {MAX_DEPTH} levels deep"),
        (ENVELOPE_START + '"payload": "", "n": ' + "7" * 5000 + "}", "5,000 digits"),
        (ENVELOPE_START + '"payload": "", "n": NaN}', "NaN is not a JSON number"),
        (ENVELOPE_START + '"payload": "", "n": -Infinity}', "-Infinity is not a JSON number"),
        (ENVELOPE_START + '"payload": "", "payload": "e30="}', "duplicate key 'payload'"),
    ],
    ids=["deep", "deep-but-parseable", "huge-integer", "nan", "infinity", "duplicate-key"],
)
def test_pathological_json_in_the_envelope_is_one_line(
    project: Project, text: str, message: str
) -> None:
    path = project.root / "m.h5.kaudit.json"
    path.write_text(text)
    for command in ("show", "verify"):
        assert_bad_input(run_cli(command, str(path)), str(path), message)


def test_a_huge_integer_is_refused_even_when_python_would_read_it(project: Project) -> None:
    # PYTHONINTMAXSTRDIGITS=0 lifts Python's own guard; kaudit's does not depend on it.
    before = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    try:
        path = project.root / "m.h5.kaudit.json"
        path.write_text(ENVELOPE_START + '"payload": "", "n": -' + "7" * 5000 + "}")
        assert_bad_input(run_cli("show", str(path)), str(path), "an integer of 5,000 digits")
    finally:
        sys.set_int_max_str_digits(before)


def signed_payload(signed: Path, key: SigningKey, splice: str) -> Path:
    """``signed``'s statement with its attributes replaced by ``splice`` (raw JSON text),
    signed again by the trusted key and written back: the signature holds."""
    statement = json.loads(read_manifest(signed).envelope.payload)
    statement["predicate"]["attributes"] = {"x": "@@X@@"}
    text = canonical_json(statement).decode().replace('"@@X@@"', splice)
    signed.write_bytes(encode_envelope(sign_envelope(text.encode(), key)))
    return signed


@pytest.mark.parametrize(
    ("splice", "message"),
    [
        ("[" * 100_000 + "]" * 100_000, f"payload: JSON nested more than {MAX_DEPTH} levels"),
        ("[" * 900 + "]" * 900, f"payload: JSON nested more than {MAX_DEPTH} levels"),
        ("[" * (MAX_DEPTH - 3) + "]" * (MAX_DEPTH - 3), None),  # at the bound: fine
        ("7" * 5000, "payload: not valid JSON: an integer of 5,000 digits"),
        ("7" * 4300, None),
        ("NaN", "payload: not valid JSON: NaN is not a JSON number"),
        ("Infinity", "payload: not valid JSON: Infinity is not a JSON number"),
        ('{"a": 1, "a": 2}', "payload: not valid JSON: duplicate key 'a'"),
        ('{"a": 1, "b": 2}', None),
    ],
    ids=[
        "deep",
        "deep-but-parseable",
        "at-the-bound",
        "huge-integer",
        "long-integer",
        "nan",
        "infinity",
        "duplicate-key",
        "plain-object",
    ],
)
def test_pathological_json_in_a_signed_payload_is_one_line(
    signed: Path, key: SigningKey, splice: str, message: str | None
) -> None:
    signed_payload(signed, key, splice)
    for command in ("show", "verify"):
        result = run_cli(command, str(signed))
        if message is None:  # the same manifest, without the pathology, is read
            assert result.exit_code == 0, result.output
        else:
            assert_bad_input(result, str(signed), message)


def test_a_payload_with_a_duplicate_top_level_key_is_refused(signed: Path, key: SigningKey) -> None:
    # Python keeps the last "predicate", other readers the first: they would disagree
    # about what was signed.
    statement = json.loads(read_manifest(signed).envelope.payload)
    forged = dict(statement["predicate"], step=900)
    text = canonical_json(statement).decode()
    text = '{"predicate":' + canonical_json(forged).decode() + "," + text[1:]
    signed.write_bytes(encode_envelope(sign_envelope(text.encode(), key)))
    for command in ("show", "verify"):
        assert_bad_input(run_cli(command, str(signed)), str(signed), "duplicate key 'predicate'")


def test_deep_nesting_where_the_schema_looks_is_one_line(signed: Path, key: SigningKey) -> None:
    # jsonschema quotes a value it rejects, whole: a deep one must not reach it.
    statement = json.loads(read_manifest(signed).envelope.payload)
    statement["predicate"]["run"] = "@@X@@"
    text = canonical_json(statement).decode().replace('"@@X@@"', "[" * 900 + "]" * 900)
    signed.write_bytes(encode_envelope(sign_envelope(text.encode(), key)))
    assert_bad_input(run_cli("show", str(signed)), str(signed), "nested more than")


def test_a_huge_schema_violation_is_one_short_line(signed: Path, key: SigningKey) -> None:
    statement = json.loads(read_manifest(signed).envelope.payload)
    statement["predicate"]["run"] = ["x" * 1000] * 1000  # not a string: quoted by jsonschema
    signed.write_bytes(encode_envelope(sign_envelope(canonical_json(statement), key)))
    line = assert_bad_input(run_cli("show", str(signed)), str(signed), "schema violation")
    assert len(line) < 400 + len(str(signed))


def test_a_payload_that_is_not_utf8_is_one_line(signed: Path, key: SigningKey) -> None:
    signed.write_bytes(encode_envelope(sign_envelope(b'{"a": "\xff"}', key)))
    assert_bad_input(run_cli("show", str(signed)), str(signed), "payload: not UTF-8")


def test_utf16_is_not_guessed(signed: Path, key: SigningKey) -> None:
    # json.loads would decode these bytes as UTF-16; DSSE and RFC 8259 say UTF-8.
    text = read_manifest(signed).envelope.payload.decode()
    signed.write_bytes(encode_envelope(sign_envelope(text.encode("utf-16"), key)))
    assert_bad_input(run_cli("show", str(signed)), str(signed), "payload: not UTF-8")


def test_deep_json_through_the_installed_kaudit(project: Project) -> None:
    path = project.root / "m.h5.kaudit.json"
    path.write_text('{"a": ' * 200_000)
    code, out, err = run_kaudit("verify", str(path), cwd=project.root, timeout=60)
    one_line(code, out, err, f": error: {path.name}: ", "nested more than")


# -- names printed as text -------------------------------------------------------------


@pytest.fixture
def evil(project: Project, key: SigningKey) -> Path:
    """A signed checkpoint whose dataset names and attributes are hostile; its manifest."""
    ckpt = write_evil_checkpoint(project.root / "checkpoints" / "run1" / "step-00000001.h5")
    (m,) = snapshot(ckpt, run="run1", step=1, attributes={"note": "[/]\x1b[2J\r\u202e[bold]loud"})
    return m.path


def test_show_prints_names_as_text(evil: Path) -> None:
    result = run_cli("show", str(evil))
    assert result.exit_code == 0, result.output
    clean(result)
    assert_names_shown(result.stdout)
    assert "[bold]loud" in result.stdout  # the attribute, as written
    assert "\\u001b[2J" in result.stdout  # json.dumps escapes it; still not an ESC


def test_show_json_holds_no_control_character(evil: Path) -> None:
    result = run_cli("show", "--json", str(evil))
    assert result.exit_code == 0, result.output
    clean(result)
    paths = {d["path"] for d in json.loads(result.stdout)["predicate"]["datasets"]}
    assert "/clear\x1b[2Jscreen" in paths  # the JSON still says exactly what was recorded


def test_a_name_that_is_a_closing_tag_does_not_crash_rich(
    project: Project, key: SigningKey
) -> None:
    # Handed to rich as markup, "[/]" raises MarkupError ("closing tag ... has nothing to close").
    ckpt = project.root / "checkpoints" / "r" / "step-00000001.h5"
    ckpt.parent.mkdir(parents=True)
    with h5py.File(ckpt, "w") as f:
        f["[/]"] = np.zeros(2)
        f["a\\"] = np.zeros(2)  # a trailing backslash must not escape the markup after it
    (m,) = snapshot(ckpt, run="r", step=1)
    result = run_cli("show", str(m.path))
    assert result.exit_code == 0, result.output
    assert "/[/]" in result.stdout
    assert "/a\\" in result.stdout


def test_diff_prints_names_and_values_as_text(project: Project) -> None:
    a = write_evil_checkpoint(project.root / "a.h5", seed=1)
    b = write_evil_checkpoint(project.root / "b.h5", seed=2)
    with h5py.File(b, "a") as f:
        f["text"][1] = "\x1b]8;;http://x\x1b\\[/]"
    result = run_cli("diff", str(a), str(b))
    assert result.exit_code == 1, result.output
    clean(result)
    assert_names_shown(result.stdout)
    assert "\\x1b]8;;http://x\\x1b\\[/]" in result.stdout.replace("\n", "")  # the value


def test_status_prints_paths_as_text(project: Project, key: SigningKey) -> None:
    # the hostile name above the run's own directory, whose name is the run's
    run_dir = project.root / "checkpoints" / "[bold]\x1b[31mred\r" / "run1"
    ckpt = write_checkpoint(run_dir / "step-00000001.h5", seed=1)
    snapshot(ckpt, run="run1", step=1)
    result = run_cli("status", "--local-only", str(run_dir), cwd=project.root)
    assert result.exit_code == 0, result.output
    clean(result)
    assert "[bold]\\x1b[31mred\\r" in result.stdout.replace("\n", "")


def test_push_prints_no_control_character(
    project: Project, key: SigningKey, tmp_path: Path
) -> None:
    run_dir = project.root / "checkpoints" / "[/]\x1b[2J" / "run1"
    ckpt = write_checkpoint(run_dir / "step-00000001.h5", seed=1)
    snapshot(ckpt, run="run1", step=1)
    remote = tmp_path / "remote"
    remote.mkdir()
    from kronos_audit.storage import configure_remote

    configure_remote(project, str(remote), "storage")
    result = run_cli("push", str(run_dir), cwd=project.root)
    assert result.exit_code == 0, result.output
    clean(result)
    assert "pushed 1 checkpoint(s)" in result.stdout


def test_run_prints_the_command_as_text() -> None:
    result = run_cli(
        "run", "--retries", "0", "--", sys.executable, "-c", "pass", "\x1b[2J[/]\r\u202e"
    )
    assert result.exit_code == 0, result.output
    clean(result)
    assert "\\x1b[2J[/]\\r\\u202e" in result.stderr


def chain(project: Project, name: str, seeds: list[int]) -> Path:
    run_dir = project.root / "checkpoints" / name
    parent = None
    for step, seed in enumerate(seeds, start=1):
        ckpt = write_evil_checkpoint(run_dir / f"step-{step:08d}.h5", seed=seed)
        (m,) = snapshot(ckpt, run=name, step=step, parent=parent)
        parent = m.path
    return run_dir


def test_bisect_prints_names_as_text(project: Project, key: SigningKey) -> None:
    a = chain(project, "a", [1, 2, 3])
    b = chain(project, "b", [1, 2, 4])
    result = run_cli("bisect", str(a), str(b), cwd=project.root)
    assert result.exit_code == 1, result.output
    clean(result)
    assert_names_shown(result.stdout)


EVIL_PROGRAM = """\
import os, sys
import h5py, numpy as np
out = sys.argv[1]
os.makedirs(out, exist_ok=True)
with h5py.File(os.path.join(out, "result.h5"), "w") as f:
    for name in NAMES:
        f[name] = np.frombuffer(os.urandom(32), dtype=np.float64)
"""


@pytest.mark.slow
def test_replay_prints_names_as_text(project: Project, key: SigningKey) -> None:
    root = project.root
    program = root / "evil.py"
    program.write_text(f"NAMES = {list(EVIL_NAMES)!r}\n" + EVIL_PROGRAM)
    git(root, "add", "evil.py")
    git(root, "commit", "-q", "-m", "evil")
    subprocess.run([sys.executable, "evil.py", "rec"], cwd=root, check=True)
    made = run_cli(
        "snapshot", "rec/result.h5", "--run", "evil", "--step", "1",
        "--command", f"{sys.executable} evil.py {{out}}", cwd=root,
    )  # fmt: skip
    assert made.exit_code == 0, made.output
    result = run_cli("replay", str(root / "rec" / "result.h5.kaudit.json"), cwd=root)
    assert result.exit_code == 1, result.output  # os.urandom: not reproduced
    clean(result)
    assert_names_shown(result.stdout)


# -- never Python's None ---------------------------------------------------------------


def test_show_never_prints_none(signed: Path, key: SigningKey) -> None:
    statement = json.loads(read_manifest(signed).envelope.payload)
    p = statement["predicate"]
    p["git"].update(branch=None, remote=None, dirty=True, patch_sha256=None)
    p.update(
        parent=hashlib.sha256(b"a parent elsewhere").hexdigest(),
        parent_manifest=None,
        command=None,
        seeds=[],
        attributes={},
    )
    p["environment"]["variables"] = {}
    write_manifest(signed, sign_envelope(canonical_json(statement), key))
    result = run_cli("show", str(signed))
    assert result.exit_code == 0, result.output
    assert "None" not in result.stdout
    assert "(detached)" in result.stdout
    assert "location not recorded" in result.stdout


def test_snapshot_refuses_attributes_nested_too_deeply(
    project: Project, key: SigningKey, checkpoint: Path
) -> None:
    # What a reader would refuse is never signed: one line, and no manifest.
    deep = "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1)
    result = run_cli(
        "snapshot", str(checkpoint), "--run", "run1", "--step", "1", "--attr", f"deep={deep}",
        cwd=project.root,
    )  # fmt: skip
    assert_bad_input(result, "nested more than")
    assert not list(project.root.rglob("*.kaudit.json"))


@pytest.mark.parametrize("value", ["NaN", "Infinity", "1e400"])
def test_snapshot_refuses_an_attribute_json_cannot_hold_and_writes_nothing(
    project: Project, key: SigningKey, checkpoint: Path, value: str
) -> None:
    before = sorted(p for p in project.root.rglob("*") if ".git" not in p.parts)
    result = run_cli(
        "snapshot", str(checkpoint), "--run", "run1", "--step", "1", "--attr", f"x={value}",
        cwd=project.root,
    )  # fmt: skip
    assert_bad_input(result, str(checkpoint.relative_to(project.root)), "cannot be signed")
    after = sorted(p for p in project.root.rglob("*") if ".git" not in p.parts)
    # No manifest, no .dvc file, no ignore entry, no DVC cache object.
    assert sorted(set(after) ^ set(before)) == []
