"""scripts/uv_install.py: pip's settings, as `pip config list` shows them, become uv's, and a
setting uv would take differently sends the install back to pip."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "uv_install.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("uv_install", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def only_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """pip with no configuration file at all (os.devnull) and no PIP_* variable: the test
    sets what pip is configured with."""
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    for name in list(os.environ):
        if name.startswith("PIP_") and name != "PIP_CONFIG_FILE":
            monkeypatch.delenv(name)
    return monkeypatch


def test_pip_settings_become_uvs_and_uv_resolves_as_pip(only_env: pytest.MonkeyPatch) -> None:
    only_env.setenv("PIP_INDEX_URL", "https://mirror.example/simple")
    only_env.setenv("PIP_EXTRA_INDEX_URL", "file:///opt/a/simple file:///opt/b/simple")
    only_env.setenv("PIP_FIND_LINKS", "/opt/wheels")
    only_env.setenv("PIP_CONSTRAINT", "/etc/constraints.txt")
    only_env.setenv("PIP_DEFAULT_TIMEOUT", "180")  # pip's own: no bearing on what is installed
    assert _script().uv_environment() == {
        "UV_INDEX_STRATEGY": "unsafe-best-match",  # the best version across every index
        "UV_INDEX_URL": "https://mirror.example/simple",
        "UV_EXTRA_INDEX_URL": "file:///opt/a/simple file:///opt/b/simple",
        "UV_FIND_LINKS": "/opt/wheels",
        "UV_CONSTRAINT": "/etc/constraints.txt",
    }


def test_no_configuration_is_uvs_defaults_resolved_as_pip(only_env: pytest.MonkeyPatch) -> None:
    assert _script().uv_environment() == {"UV_INDEX_STRATEGY": "unsafe-best-match"}


def test_a_setting_uv_would_not_honour_leaves_the_install_to_pip(
    only_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    only_env.setenv("PIP_FIND_LINKS", "/opt/wheels")
    only_env.setenv("PIP_NO_BINARY", ":all:")  # builds from source: uv has no such setting
    script = _script()
    assert script.uv_environment() is None
    # and nothing is installed: the caller is told to use pip instead
    assert script.main(["-e", str(tmp_path)]) == script.CANNOT
