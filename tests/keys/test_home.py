"""Where the user's keys live (kronos_audit.keys.home): ``KAUDIT_HOME``, else
``$XDG_CONFIG_HOME/kaudit``, else ``~/.config/kaudit``, and an existing ``~/.config/kaudit``
kept, each with real key files."""

from __future__ import annotations

from pathlib import Path

import pytest

from kronos_audit.errors import SigningKeyError
from kronos_audit.keys.home import generate_key, held_keys, kaudit_home, select_key
from tests.helpers import git


@pytest.fixture
def user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A user's home directory (``~``), with neither KAUDIT_HOME nor XDG_CONFIG_HOME set."""
    home = tmp_path / "user"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("KAUDIT_HOME")
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.chdir(tmp_path)
    return home


def test_the_default_is_config_kaudit_in_the_home_directory(user: Path) -> None:
    key = generate_key("alice")
    assert kaudit_home() == user / ".config" / "kaudit"
    assert (user / ".config" / "kaudit" / "keys" / "alice.key").is_file()
    assert (user / ".config" / "kaudit" / "trusted-keys").is_dir()
    assert select_key().key_id == key.key_id


def test_an_absolute_xdg_config_home_holds_the_keys(
    user: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    key = generate_key("alice")
    assert kaudit_home() == tmp_path / "xdg" / "kaudit"
    assert (tmp_path / "xdg" / "kaudit" / "keys" / "alice.key").is_file()
    assert not (user / ".config").exists()
    assert select_key().key_id == key.key_id


def test_a_relative_xdg_config_home_is_ignored(
    user: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", "relative/config")
    generate_key("alice")
    assert (user / ".config" / "kaudit" / "keys" / "alice.key").is_file()
    assert not (tmp_path / "relative").exists()


def test_kaudit_home_wins_over_xdg_config_home(
    user: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("KAUDIT_HOME", str(tmp_path / "chosen"))
    generate_key("alice")
    assert (tmp_path / "chosen" / "keys" / "alice.key").is_file()
    assert not (tmp_path / "xdg").exists()


def test_keys_made_before_xdg_config_home_was_set_are_not_lost(
    user: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = generate_key("old")  # in ~/.config/kaudit, the only home there was
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    # $XDG_CONFIG_HOME/kaudit does not exist: the keys are where they were
    assert kaudit_home() == user / ".config" / "kaudit"
    assert [k.name for k in held_keys()] == ["old"]
    assert select_key().key_id == old.key_id
    generate_key("second")  # and a new one joins them
    assert (user / ".config" / "kaudit" / "keys" / "second.key").is_file()
    assert not (tmp_path / "xdg").exists()
    # once the user makes $XDG_CONFIG_HOME/kaudit (moving the keys there), it is the home
    (user / ".config" / "kaudit").rename(tmp_path / "moved")
    (tmp_path / "xdg").mkdir()
    (tmp_path / "moved").rename(tmp_path / "xdg" / "kaudit")
    assert kaudit_home() == tmp_path / "xdg" / "kaudit"
    assert select_key("old").key_id == old.key_id


def test_an_existing_xdg_home_is_used_even_beside_an_old_one(
    user: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    generate_key("old")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    (tmp_path / "xdg" / "kaudit").mkdir(parents=True)
    new = generate_key("new")
    assert (tmp_path / "xdg" / "kaudit" / "keys" / "new.key").is_file()
    assert [k.name for k in held_keys()] == ["new"]
    assert select_key().key_id == new.key_id


def test_an_xdg_home_inside_a_repository_is_refused(
    user: Path, git_repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(git_repo / "config"))
    with pytest.raises(SigningKeyError) as info:
        generate_key("alice")
    message = str(info.value)
    assert "$XDG_CONFIG_HOME/kaudit" in message
    assert f"inside the git repository {git_repo}" in message
    assert not (git_repo / "config").exists()
    assert git(git_repo, "status", "--porcelain") == ""
