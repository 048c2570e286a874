"""What a command's --help claims about its behaviour, checked against that behaviour: a
help text is the first thing a user trusts, and a claim that drifted from the code
misleads exactly the users who read it."""

from __future__ import annotations

import re

from kronos_audit.project.repository import Project
from kronos_audit.signing.snapshot import snapshot
from tests.helpers import run_cli, untrusted_key, write_checkpoint


def _claim(help_text: str) -> tuple[str, str]:
    """What ``kaudit verify --help`` says an unanchored key does (``passes``/``fails``) and
    the option that turns it the other way."""
    flat = " ".join(help_text.split())
    found = re.search(r'"unanchored": it (passes|fails) unless (--[a-z-]+)', flat)
    assert found is not None, flat
    return found.group(1), found.group(2)


def test_verify_help_says_what_an_unanchored_key_does(project: Project) -> None:
    verdict, option = _claim(run_cli("verify", "--help").stdout)
    # A key that only the work tree's .kaudit/trusted-keys holds.
    k = untrusted_key("proposed")
    project.trust_store().add(k.private_key.public_key(), "proposed")
    ckpt = write_checkpoint(project.root / "checkpoints" / "r" / "step-00000001.h5", 1)
    snapshot(ckpt, run="r", step=1, key=k)
    by_default = run_cli("verify", str(ckpt), cwd=project.root)
    turned = run_cli("verify", option, str(ckpt), cwd=project.root)
    assert "unanchored" in by_default.stdout + turned.stdout
    expected = {"passes": (0, 1), "fails": (1, 0)}[verdict]
    assert (by_default.exit_code, turned.exit_code) == expected, (
        by_default.output,
        turned.output,
    )
