"""The completeness certificate of a finished campaign: signed by the run when its last
batch is checkpointed, and verified by `kaudit verify` by building it again from the
checkpoints it names. Tried as an attacker would: an edited certificate, one signed by
another key, one signed by the trusted key that claims what the checkpoints do not hold
(a batch twice, a batch missing, another worker, another tally), a subject outside the
repository, a manifest swapped."""

from __future__ import annotations

import base64
import concurrent.futures as cf
import dataclasses
import json
import os
import shutil
import socket
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import kronos_audit as ka
from kronos_audit._internal.canonical import canonical_json
from kronos_audit._internal.safeio import MANIFEST_LIMIT
from kronos_audit.checkpoint.layout import shard_path
from kronos_audit.project.repository import Project
from kronos_audit.report import build_report, render_html, render_markdown, report_json
from kronos_audit.runtime.campaigns.certify import certify, write_records
from kronos_audit.statement.campaign import (
    MAX_BATCHES,
    CampaignRecord,
    encode_statement,
    read_certificate,
    result_digest,
    tally,
)
from kronos_audit.statement.dsse import encode_envelope, sign_envelope
from kronos_audit.verification.campaign import CampaignRefused
from kronos_audit.verification.records import stored_batches
from kronos_audit.verification.verifier import Verifier
from tests.helpers import run_cli
from tests.threadranks import ThreadRanks, on_ranks, thread_run

SEED = 11
N = 10


def batch(rng: np.random.Generator, samples: int, fail_at: int = -1) -> dict[str, Any]:
    i = rng.bit_generator.seed_seq.spawn_key[0]  # type: ignore[attr-defined]
    if i == fail_at:
        raise RuntimeError(f"batch {i} lost its node")
    x = rng.random(samples)
    return {"hits": np.int64((x < 0.5).sum()), "sum": np.float64(x.sum())}


def campaign(project: Project, executor: Any = None, **kwargs: Any) -> ka.Run:
    with ka.Run("mc", root=project.root / "checkpoints", seed=SEED, every=ka.EverySteps(4)) as run:
        run.restore()
        run.map_batches(batch, N, executor=executor, samples=64, **kwargs)
    return run


def payload(path: Path) -> dict[str, Any]:
    envelope = json.loads(path.read_bytes())
    statement: dict[str, Any] = json.loads(base64.b64decode(envelope["payload"]))
    return statement


def failures(path: Path) -> list[str]:
    """`kaudit verify PATH`: exit 1, and the failed checks as `name: detail`."""
    result = run_cli("verify", "--json", str(path))
    assert result.exit_code == 1, result.output
    (r,) = json.loads(result.output)["results"]
    return [f"{c['check']}: {c['detail']}" for c in r["checks"] if not c["ok"]]


def certified(cert: Path) -> CampaignRecord:
    """The certificate's record with its batches, read from the records beside it."""
    record = read_certificate(cert).record
    return dataclasses.replace(record, batches=stored_batches(cert, record))


def resign(project: Project, key: ka.SigningKey, record: CampaignRecord) -> Path:
    """What a trusted signer with a bug (or a stolen key) could sign: ``record`` as is
    (its batches written beside it as its records)."""
    path = project.root / "checkpoints" / "mc.campaign.json"
    if record.batches:
        records = write_records(path, record.campaign, record.batches)
        record = dataclasses.replace(record, batches=(), records=records)
    path.write_bytes(encode_envelope(sign_envelope(encode_statement(record), key)))
    return path


def test_a_finished_campaign_is_certified_and_verifies(
    project: Project, key: ka.SigningKey
) -> None:
    with cf.ProcessPoolExecutor(2) as pool:
        campaign(project, pool)
        workers = set(pool._processes)  # the pool's worker processes, by pid
    cert = project.root / "checkpoints" / "mc.campaign.json"
    ok = run_cli("verify", str(cert))
    assert ok.exit_code == 0, ok.output
    assert "campaign certificate, campaign mc, 10 batches" in ok.output
    record = certified(cert)
    assert [b.index for b in record.batches] == list(range(N))
    # Each batch's result, as a serial run computes it, and the pool's workers, not us.
    expected = [batch(ka.runtime.batch_rng(SEED, i), 64) for i in range(N)]
    assert [b.result for b in record.batches] == [result_digest(r) for r in expected]
    ran_on = {b.worker for b in record.batches}
    assert ran_on <= {f"{socket.gethostname()}:{pid}" for pid in workers}, ran_on
    assert f"{socket.gethostname()}:{os.getpid()}" not in ran_on
    assert {b.attempt for b in record.batches} == {1}
    assert record.tally == result_digest(tally(expected))
    assert record.parts[0].manifest == "checkpoints/mc/step-00000010.h5.kaudit.json"
    # `kaudit verify` with no path finds it with the run's manifests.
    everything = run_cli("verify", cwd=project.root)
    assert everything.exit_code == 0, everything.output
    assert "1 campaign certificate(s): 1 ok" in everything.output


def test_a_campaign_restarted_certifies_each_batch_with_the_attempt_that_ran_it(
    project: Project, key: ka.SigningKey, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ka.CampaignError, match="batch 6"):
        campaign(project, fail_at=6)
    assert not (project.root / "checkpoints" / "mc.campaign.json").exists()  # not complete
    monkeypatch.setenv("KAUDIT_RESTART_COUNT", "1")  # as `kaudit run` restarts it
    campaign(project)
    record = certified(project.root / "checkpoints" / "mc.campaign.json")
    assert [b.attempt for b in record.batches] == [1] * 6 + [2] * 4
    assert run_cli("verify", str(project.root / "checkpoints" / "mc.campaign.json")).exit_code == 0


def test_an_edited_or_foreign_signed_certificate_fails_its_signature(
    project: Project, key: ka.SigningKey, mallory: ka.SigningKey
) -> None:
    campaign(project)
    cert = project.root / "checkpoints" / "mc.campaign.json"
    original = cert.read_bytes()
    statement = payload(cert)
    statement["predicate"]["records"]["root"] = "0" * 64
    envelope = json.loads(original)
    envelope["payload"] = base64.b64encode(canonical_json(statement)).decode()
    cert.write_text(json.dumps(envelope))
    unread = "manifest: not read: the certificate's signature or place does not hold"
    assert failures(cert) == [failures(cert)[0], unread]
    assert failures(cert)[0].startswith("signature:")
    record = read_certificate(cert).record
    resign(project, mallory, record)
    assert failures(cert)[0].startswith("signature:")
    assert failures(cert)[1] == unread


@pytest.mark.parametrize(
    "lie",
    ["a batch twice", "a batch missing", "another result", "another worker", "another tally"],
)
def test_a_trusted_signature_over_what_the_checkpoints_do_not_hold_fails(
    project: Project, key: ka.SigningKey, lie: str
) -> None:
    campaign(project)
    cert = project.root / "checkpoints" / "mc.campaign.json"
    record = certified(cert)
    batches = list(record.batches)
    if lie == "a batch twice":
        batches[4] = dataclasses.replace(batches[3])
    elif lie == "a batch missing":
        del batches[4]
    elif lie == "another result":
        batches[2] = dataclasses.replace(batches[2], result=batches[1].result)
    elif lie == "another worker":
        batches[2] = dataclasses.replace(batches[2], worker="gpu7:1")
    lied = dataclasses.replace(
        record,
        batches=tuple(batches),
        tally=batches[0].result if lie == "another tally" else record.tally,
    )
    resign(project, key, lied)
    (failed,) = failures(cert)
    assert failed.startswith("tally:" if lie == "another tally" else "batches:"), failed


def test_a_subject_outside_the_repository_or_swapped_is_refused(
    project: Project, key: ka.SigningKey
) -> None:
    campaign(project)
    cert = project.root / "checkpoints" / "mc.campaign.json"
    record = certified(cert)
    outside = dataclasses.replace(
        record,
        parts=(dataclasses.replace(record.parts[0], manifest="../../../etc/passwd"),),
    )
    resign(project, key, outside)
    assert failures(cert) == [
        "place: part 'mc': its manifest ../../../etc/passwd is not beside it",
        "manifest: not read: the certificate's signature or place does not hold",
    ]
    resign(project, key, record)
    manifest = project.root / record.parts[0].manifest
    manifest.write_bytes(manifest.read_bytes() + b" ")
    (failed,) = failures(cert)
    assert "not the certified manifest" in failed


def test_a_certificate_moved_or_renamed_fails_its_place(
    project: Project, key: ka.SigningKey
) -> None:
    campaign(project)
    cert = project.root / "checkpoints" / "mc.campaign.json"
    renamed = cert.rename(cert.with_name("other.campaign.json"))
    assert failures(renamed)[0] == "place: certifies campaign 'mc': its name is mc.campaign.json"
    (project.root / "elsewhere").mkdir()
    moved = renamed.rename(project.root / "elsewhere" / "mc.campaign.json")
    assert failures(moved)[0] == (
        "place: part 'mc': its manifest checkpoints/mc/step-00000010.h5.kaudit.json "
        "is not beside it"
    )


def test_an_incomplete_campaign_is_not_certified(project: Project, key: ka.SigningKey) -> None:
    with pytest.raises(ka.CampaignError):
        campaign(project, fail_at=3)
    run_dir = project.root / "checkpoints" / "mc"
    last = sorted(run_dir.glob("*.kaudit.json"))[-1]
    verifier = Verifier(project)
    with pytest.raises(CampaignRefused, match=r"not of a campaign of 3 batches|not complete"):
        certify(verifier, key, "mc", [last], 3)
    with pytest.raises(CampaignRefused, match="not complete"):
        certify(verifier, key, "mc", [last], N)
    assert not (project.root / "checkpoints" / "mc.campaign.json").exists()


def test_a_certificate_that_is_not_one_is_one_line_and_exit_2(
    project: Project, key: ka.SigningKey
) -> None:
    campaign(project)
    cert = project.root / "checkpoints" / "mc.campaign.json"
    shutil.copy(cert, project.root / "saved.json")
    cert.write_text("{not json")
    bad = run_cli("verify", str(cert))
    assert bad.exit_code == 2
    assert bad.output.count("\n") == 1
    assert "mc.campaign.json: not valid JSON" in bad.output
    cert.unlink()
    cert.symlink_to(project.root / "saved.json")
    linked = run_cli("verify", str(cert))
    assert linked.exit_code == 2
    assert "symbolic link" in linked.output, linked.output


def test_an_unsigned_certificate_is_refused_before_its_statement_is_read(
    project: Project, key: ka.SigningKey, mallory: ka.SigningKey
) -> None:
    campaign(project)
    cert = project.root / "checkpoints" / "mc.campaign.json"
    statement = payload(cert)
    # What no schema accepts (a batch entry that is not one), many times over, signed by
    # the attacker: the signature is what refuses it, and the statement is never decoded.
    statement["predicate"]["batches"] = [{"index": "x" * 64}] * 5_000
    cert.write_bytes(encode_envelope(sign_envelope(canonical_json(statement), mallory)))
    failed = failures(cert)
    assert failed[0].startswith("signature: signed by a key no trust anchor holds"), failed
    shown = run_cli("verify", str(cert))
    assert "(campaign certificate, campaign mc, not read)" in shown.output, shown.output
    assert failed[1:] == ["manifest: not read: the certificate's signature or place does not hold"]
    # The report says the same of the campaign's run, and reads nothing more of it.
    (run,) = report_json(build_report([project.root / "checkpoints"]))["runs"]
    assert run["ok"] is False
    assert run["campaign"]["failures"] == failed


def test_a_certificate_is_bounded_in_batches_and_size(project: Project, key: ka.SigningKey) -> None:
    campaign(project)
    cert = project.root / "checkpoints" / "mc.campaign.json"
    statement = payload(cert)
    statement["predicate"]["n"] = MAX_BATCHES + 1
    cert.write_bytes(encode_envelope(sign_envelope(canonical_json(statement), key)))
    too_many = run_cli("verify", str(cert))
    assert too_many.exit_code == 2, too_many.output
    assert too_many.output.count("\n") == 1
    assert "mc.campaign.json" in too_many.output
    assert str(MAX_BATCHES) in too_many.output.replace(",", ""), too_many.output
    # A file larger than any signed file kaudit reads is refused by its size, unread.
    with cert.open("r+b") as f:
        f.truncate(MANIFEST_LIMIT + 1)
    too_large = run_cli("verify", str(cert))
    assert too_large.exit_code == 2, too_large.output
    assert "more than the 67,108,864 allowed" in too_large.output, too_large.output
    verifier = Verifier(project)
    last = project.root / "checkpoints" / "mc" / "step-00000010.h5.kaudit.json"
    with pytest.raises(CampaignRefused, match=f"at most {MAX_BATCHES:,}"):
        certify(verifier, key, "mc", [last], MAX_BATCHES + 1)


def test_a_campaign_on_three_ranks_is_certified_from_rank_0s_shard(
    project: Project, key: ka.SigningKey
) -> None:
    def program(comm: ThreadRanks) -> None:
        with thread_run(project.root, "mc", comm) as run:
            run.restore()
            run.map_batches(batch, N, samples=64)

    on_ranks(3, program)
    cert = project.root / "checkpoints" / "mc.campaign.json"
    ok = run_cli("verify", str(cert))
    assert ok.exit_code == 0, ok.output
    record = certified(cert)
    assert record.parts[0].manifest == "checkpoints/mc/step-00000010/index.jsonl.kaudit.json"
    expected = [batch(ka.runtime.batch_rng(5, i), 64) for i in range(N)]
    assert [b.result for b in record.batches] == [result_digest(r) for r in expected]
    assert record.tally == result_digest(tally(expected))


def test_a_certified_sharded_step_is_verified_whole_every_shard(
    project: Project, key: ka.SigningKey
) -> None:
    def program(comm: ThreadRanks) -> None:
        with thread_run(project.root, "mc", comm) as run:
            run.restore()
            run.map_batches(batch, N, samples=64)

    on_ranks(3, program)
    cert = project.root / "checkpoints" / "mc.campaign.json"
    step = project.root / "checkpoints" / "mc" / "step-00000010"
    shard = shard_path(step, 1, 3)
    # Rank 1's shard holds no batch, but the certificate names the step, and the step is
    # every rank's shard: another file of the same size in its place fails the certificate.
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.unlink()
    shard.write_bytes(bytes(data))
    (failed,) = failures(cert)
    assert failed.startswith("manifest: "), failed
    assert "shards: shard of rank 1 of 3: sha256 mismatch" in failed, failed


def test_the_report_shows_the_campaign_its_restart_and_workers(
    project: Project, key: ka.SigningKey, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ka.CampaignError):
        campaign(project, fail_at=6)
    monkeypatch.setenv("KAUDIT_RESTART_COUNT", "1")
    campaign(project)
    report = build_report([project.root / "checkpoints"])
    (run,) = report_json(report)["runs"]
    here = f"{socket.gethostname()}:{os.getpid()}"
    assert run["ok"] is True
    assert run["campaign"] == {
        "certificate": "checkpoints/mc.campaign.json",
        "verified": True,
        "failures": [],
        "n": N,
        "attempts": [{"attempt": 1, "batches": 6}, {"attempt": 2, "batches": 4}],
        "workers": [{"worker": here, "batches": N}],
        "rerun": 4,
        # the first attempt stopped at batch 6: what it had recorded was kept
        "workers_lost": [{"worker": here, "batches": 6}],
    }
    assert run["chain"]["batches"] is True
    assert "4 run again after a restart" in render_markdown(report)
    assert "Workers lost: 1" in render_markdown(report)
    html = render_html(report)
    assert "<h3>Campaign</h3>" in html
    assert "Batches done against wall-clock time, run mc" in html
    # A certificate that does not verify fails the run's report.
    record = certified(project.root / "checkpoints" / "mc.campaign.json")
    resign(project, key, dataclasses.replace(record, tally=record.batches[0].result))
    failed = build_report([project.root / "checkpoints"])
    (run,) = report_json(failed)["runs"]
    assert run["ok"] is False
    assert run["campaign"]["failures"] == ["tally: the tally summed from the ledgers differs"]


def test_the_gate_covers_a_campaign_certificate(project: Project, key: ka.SigningKey) -> None:
    """`kaudit gate` verifies a certificate with the run's manifests: a change that breaks
    it fails the gate."""
    campaign(project)
    config = project.root / ".kaudit" / "config.toml"
    config.write_text(config.read_text() + "\n[gate]\nsegments = 0\n")  # verify only
    passed = run_cli("gate", "--json", cwd=project.root)
    assert passed.exit_code == 0, passed.output
    names = [c["name"] for c in json.loads(passed.output)["cases"]]
    assert "checkpoints/mc.campaign.json" in names
    record = certified(project.root / "checkpoints" / "mc.campaign.json")
    resign(project, key, dataclasses.replace(record, tally=record.batches[0].result))
    failed = run_cli("gate", "--json", cwd=project.root)
    assert failed.exit_code == 1, failed.output
    (broken,) = [c for c in json.loads(failed.output)["cases"] if not c["ok"]]
    assert broken["name"] == "checkpoints/mc.campaign.json"
