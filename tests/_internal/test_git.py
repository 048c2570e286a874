"""git, reached one way (kronos_audit._internal.git, on GitPython), and finding the work
tree (kronos_audit.project.repository.find_project) with it: real repositories, real git."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from kronos_audit._internal import git
from kronos_audit.errors import ProjectError, UsageError
from kronos_audit.keys.anchors import read_tree_files, resolve_ref
from kronos_audit.project.repository import find_project
from kronos_audit.provenance.gitstate import git_state
from tests.helpers import git as run_git


def head(repo: Path) -> str:
    return run_git(repo, "rev-parse", "HEAD").strip()


# -- finding the work tree -------------------------------------------------------------------


def test_the_work_tree_is_found_from_below_it_and_from_inside_its_git_directory(
    git_repo: Path,
) -> None:
    deep = git_repo / "a" / "b"
    deep.mkdir(parents=True)
    assert find_project(deep).root == git_repo.resolve()
    assert find_project(deep / "not-yet" / "step-1.h5").root == git_repo.resolve()
    assert find_project(git_repo / ".git" / "objects").root == git_repo.resolve()
    assert git.toplevel(deep) == git_repo.resolve()


def test_a_symlinked_path_finds_the_real_work_tree(git_repo: Path, tmp_path: Path) -> None:
    link = tmp_path / "link"
    link.symlink_to(git_repo)
    assert find_project(link / "solver.py").root == git_repo.resolve()


def test_outside_a_repository_and_in_a_bare_one_are_refused(tmp_path: Path) -> None:
    loose = tmp_path / "loose"
    loose.mkdir()
    with pytest.raises(ProjectError, match=r"not inside a git repository \(run `git init`"):
        find_project(loose)
    with pytest.raises(git.NotARepository, match="not a git repository") as info:
        git.toplevel(loose)
    assert info.value.returncode == 128

    bare = tmp_path / "bare.git"
    run_git(tmp_path, "init", "-q", "--bare", str(bare))
    with pytest.raises(ProjectError, match="a bare git repository has no work tree") as e:
        find_project(bare)
    assert e.value.path == bare.resolve()


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a repository away needs root")
def test_a_repository_another_user_owns_is_found_and_its_config_runs_nothing(
    git_repo: Path, tmp_path: Path
) -> None:
    """Verifying a colleague's checkout must keep working (git refuses such a repository
    for most commands), and finding it must not run what its configuration names."""
    marker = tmp_path / "ran"
    hook = tmp_path / "fsmonitor.sh"
    hook.write_text(f"#!/bin/sh\ntouch {marker}\n")
    hook.chmod(0o755)
    run_git(git_repo, "config", "core.fsmonitor", str(hook))
    (git_repo / "solver.py").write_text("print('changed')\n")
    for path in [git_repo, *git_repo.rglob("*")]:
        os.lchown(path, 65534, 65534)  # nobody
    tmp_path.chmod(0o755)

    assert find_project(git_repo / "solver.py").root == git_repo.resolve()
    assert not marker.exists()
    # The commands that could run what the configuration names are git's to refuse.
    with pytest.raises(ProjectError, match="dubious ownership"):
        git_state(git_repo)
    assert not marker.exists()


def test_the_search_crosses_nothing_the_environment_points_at(
    git_repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A git hook runs kaudit with GIT_DIR, GIT_WORK_TREE and GIT_INDEX_FILE set for its
    own repository: they must not redirect kaudit's git to it."""
    other = tmp_path / "other"
    other.mkdir()
    run_git(other, "init", "-q", "-b", "other")
    (other / "x").write_text("x\n")
    run_git(other, "add", "x")
    run_git(other, "commit", "-q", "-m", "other")
    monkeypatch.setenv("GIT_DIR", str(other / ".git"))
    monkeypatch.setenv("GIT_WORK_TREE", str(other))
    monkeypatch.setenv("GIT_INDEX_FILE", str(other / ".git" / "index"))
    assert find_project(git_repo).root == git_repo.resolve()
    state = git_state(git_repo)
    monkeypatch.delenv("GIT_DIR")
    monkeypatch.delenv("GIT_WORK_TREE")
    monkeypatch.delenv("GIT_INDEX_FILE")
    assert state.commit == head(git_repo) != head(other)
    assert state.branch == "main"
    assert state.dirty is False


def test_without_git_on_the_path_the_error_says_so(
    git_repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(git.GitError, match="cannot run git") as info:
        git.run(git_repo, "status")
    assert info.value.returncode == -1
    with pytest.raises(ProjectError, match="cannot find the git work tree: cannot run git"):
        find_project(git_repo)


# -- one error, with git's own line --------------------------------------------------------


def test_a_failure_raises_git_error_with_gits_first_line(git_repo: Path) -> None:
    with pytest.raises(git.GitError) as info:
        git.run(git_repo, "cat-file", "blob", "0" * 40)
    assert info.value.message == f"fatal: git cat-file {'0' * 40}: bad file"
    assert info.value.returncode == 128
    assert info.value.path == git_repo
    assert "\n" not in str(info.value)


def test_output_is_byte_for_byte(git_repo: Path) -> None:
    data = b"\x00\xff no newline at the end\r\n\n"
    (git_repo / "blob.bin").write_bytes(data)
    run_git(git_repo, "add", "blob.bin")
    oid = run_git(git_repo, "rev-parse", ":blob.bin").strip()
    with git.objects(git_repo) as store:
        assert store.blob(oid, limit=len(data)) == data
        with pytest.raises(git.GitError, match="not a blob of at most 3 bytes"):
            store.blob(oid, limit=3)
    assert git.run(git_repo, "cat-file", "blob", oid) == data


def test_the_environment_is_fixed(git_repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GIT_EXTERNAL_DIFF", "/bin/false")
    monkeypatch.setenv("GIT_PAGER", "less")
    monkeypatch.setenv("GIT_CONFIG_PARAMETERS", "'core.hooksPath'='/tmp'")
    env = git.environment(git_repo)
    assert env["GIT_EXTERNAL_DIFF"] == ""
    assert env["GIT_PAGER"] == "cat"
    assert env["GIT_TERMINAL_PROMPT"] == "0"
    assert env["GIT_NO_REPLACE_OBJECTS"] == "1"
    assert env["GIT_CONFIG_PARAMETERS"] == ""
    assert env["LC_ALL"] == "C"
    assert "GIT_DIR" not in env  # the environment names no repository: git finds it
    monkeypatch.setenv("GIT_DIR", "/elsewhere")
    monkeypatch.setenv("GIT_INDEX_FILE", "/elsewhere/index")
    env = git.environment(git_repo / "sub")
    assert env["GIT_DIR"] == str(git_repo.resolve() / ".git")
    assert env["GIT_WORK_TREE"] == str(git_repo.resolve())
    assert env["GIT_INDEX_FILE"] == str(git_repo.resolve() / ".git" / "index")
    # Each of git's own variables that name a repository is set (GitPython cannot drop
    # one) to "none" or to this repository's own; GIT_CONFIG alone only `git config` reads.
    listed = run_git(Path.cwd(), "rev-parse", "--local-env-vars").split()
    assert set(listed) - set(env) <= {"GIT_CONFIG", "GIT_INTERNAL_SUPER_PREFIX"}
    assert set(listed) <= set(git._LOCAL_REPO_VARIABLES)


def test_a_linked_worktrees_hook_environment_does_not_redirect(
    git_repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What git exports to a pre-commit hook in a linked worktree (an absolute GIT_DIR
    and GIT_INDEX_FILE) names that worktree, not the repository kaudit was asked about."""
    linked = tmp_path / "linked"
    run_git(git_repo, "worktree", "add", "-q", "-b", "side", str(linked))
    (linked / "solver.py").write_text("print('side')\n")
    run_git(linked, "commit", "-q", "-am", "side")
    gitdir = run_git(linked, "rev-parse", "--absolute-git-dir").strip()
    main_head = head(git_repo)
    monkeypatch.setenv("GIT_DIR", gitdir)
    monkeypatch.setenv("GIT_INDEX_FILE", f"{gitdir}/index")
    monkeypatch.setenv("GIT_PREFIX", "")
    assert git.toplevel(git_repo / ".git") == git_repo.resolve()
    assert git.commit_of(git_repo, "HEAD") == main_head
    assert "# branch.head main" in git.status(git_repo, ".").splitlines()
    assert git.toplevel(linked) == linked.resolve()
    assert "# branch.head side" in git.status(linked, ".").splitlines()
    with git.objects(git_repo) as store:
        (entry,) = [e for e in store.tree(main_head, "", limit=10) if e.path == "solver.py"]
        assert store.blob(entry.oid, limit=100) == b"print('solve')\n"


def test_with_a_hook_environment_commondir_is_read_only_as_a_regular_file(
    git_repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where kaudit finds the repository itself (a hook's GIT_DIR is set), a linked
    worktree's ``commondir`` names the git directory whose objects and refs are used: a
    link or a FIFO there (each holding another directory's name) is not followed, and
    the FIFO does not hang."""
    linked = tmp_path / "linked"
    run_git(git_repo, "worktree", "add", "-q", "-b", "side", str(linked))
    gitdir = Path(run_git(linked, "rev-parse", "--absolute-git-dir").strip())
    commondir = gitdir / "commondir"
    monkeypatch.setenv("GIT_DIR", str(gitdir))
    assert git.environment(linked)["GIT_COMMON_DIR"] == str((git_repo / ".git").resolve())

    elsewhere = tmp_path / "elsewhere.git"  # where the planted names point
    elsewhere.mkdir()
    named = tmp_path / "names-elsewhere"
    named.write_text(f"{elsewhere}\n")
    commondir.unlink()
    commondir.symlink_to(named)
    assert git.environment(linked)["GIT_COMMON_DIR"] == str(gitdir.resolve())

    commondir.unlink()
    os.mkfifo(commondir)
    # A writer holds it open with a line waiting: a read through it would take that line
    # at once rather than hang, so following it shows as the wrong directory.
    held = os.open(commondir, os.O_RDWR | os.O_NONBLOCK)
    try:
        os.write(held, f"{elsewhere}\n".encode())
        assert git.environment(linked)["GIT_COMMON_DIR"] == str(gitdir.resolve())
    finally:
        os.close(held)


def test_with_a_hook_environment_a_gitfile_naming_nothing_is_no_repository(
    git_repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where kaudit finds the repository itself (a hook's GIT_DIR is set), a ``.git``
    file that names no directory is refused in one line, as git refuses it."""
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / ".git").write_text("gitdir: ../nowhere\n")
    monkeypatch.setenv("GIT_DIR", str(git_repo / ".git"))
    with pytest.raises(git.NotARepository, match=r"broken/\.git names no git directory"):
        git.toplevel(broken)
    with pytest.raises(git.NotARepository, match="names no git directory"):
        git.status(broken, ".")


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a repository away needs root")
def test_a_named_repository_another_user_owns_is_refused(
    git_repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """git skips its ownership check for a repository the environment names; the layer
    makes it, so a hook's GIT_DIR cannot open another user's configuration to git."""
    os.chown(git_repo, 65534, 65534)
    os.chown(git_repo / ".git", 65534, 65534)
    with pytest.raises(git.GitError, match="dubious ownership"):
        git.status(git_repo, ".")
    monkeypatch.setenv("GIT_DIR", str(git_repo / ".git"))
    with pytest.raises(git.GitError, match="owned by another user"):
        git.status(git_repo, ".")
    assert git.toplevel(git_repo) == git_repo.resolve()  # finding it runs nothing


# -- refs and paths are never options ------------------------------------------------------


def test_refs_and_paths_that_look_like_options_are_names(git_repo: Path, tmp_path: Path) -> None:
    out = tmp_path / "written"
    assert git.commit_of(git_repo, f"--output={out}") is None
    assert git.commit_of(git_repo, "--all") is None
    assert not out.exists()
    assert git.commit_of(git_repo, "main") == head(git_repo)

    (git_repo / "-x.txt").write_text("x\n")
    (git_repo / "untracked.txt").write_text("u\n")
    run_git(git_repo, "add", "--", "-x.txt")
    assert git.ls_files(git_repo, ["-x.txt"]) == ["-x.txt"]
    assert git.ls_files(git_repo, ["--others"]) == []  # not the option: no untracked files

    # `-n` would be --no-checkout; as a path it is the worktree's directory.
    git.worktree_add(git_repo, Path("-n"), head(git_repo))
    assert (git_repo / "-n" / "solver.py").read_text() == "print('solve')\n"
    git.worktree_remove(git_repo, Path("-n"))
    assert not (git_repo / "-n").exists()

    with git.objects(git_repo) as store, pytest.raises(git.GitError, match="not a full object id"):
        store.blob("--batch-all-objects", limit=100)


def test_a_trust_ref_that_looks_like_an_option_is_refused(git_repo: Path) -> None:
    for ref in ("-h", "--output=/tmp/x", ""):
        with pytest.raises(UsageError, match="not a git ref name"):
            resolve_ref(git_repo, ref)
    with pytest.raises(UsageError, match="no such ref"):
        resolve_ref(git_repo, "nosuchbranch")
    assert resolve_ref(git_repo, "main").commit == head(git_repo)
    assert resolve_ref(git_repo, "main").ref == "refs/heads/main"


def test_a_replace_ref_does_not_stand_in_for_a_signed_commit(git_repo: Path) -> None:
    """Whoever can write refs/replace/ must not change what a commit id holds: the trust
    store read at a ref, the code a replay checks out."""
    keys = git_repo / ".kaudit" / "trusted-keys"
    keys.mkdir(parents=True)
    (keys / "alice.pub").write_text("alice's key\n")
    run_git(git_repo, "add", ".kaudit")
    run_git(git_repo, "commit", "-q", "-m", "alice")
    trusted = head(git_repo)
    (keys / "mallory.pub").write_text("mallory's key\n")
    run_git(git_repo, "add", ".kaudit")
    run_git(git_repo, "commit", "-q", "-m", "mallory")
    run_git(git_repo, "replace", trusted, head(git_repo))
    assert "mallory.pub" in run_git(
        git_repo, "ls-tree", "--name-only", trusted, ".kaudit/trusted-keys/"
    )

    files, skipped = read_tree_files(git_repo, trusted, ".kaudit/trusted-keys", ".pub")
    assert files == [(".kaudit/trusted-keys/alice.pub", b"alice's key\n")]
    assert skipped == []
    git.worktree_add(git_repo, git_repo.parent / "wt", trusted)
    assert not (git_repo.parent / "wt" / ".kaudit" / "trusted-keys" / "mallory.pub").exists()
    git.worktree_remove(git_repo, git_repo.parent / "wt")


# -- the helpers kaudit uses ---------------------------------------------------------------


def test_ls_tree_reads_entries_with_their_kinds_and_sizes(git_repo: Path) -> None:
    d = git_repo / "d"
    d.mkdir()
    (d / "a.txt").write_bytes(b"12345")
    (d / "link").symlink_to("a.txt")
    (d / "sub").mkdir()
    (d / "sub" / "b").write_text("b\n")
    run_git(git_repo, "add", "d")
    run_git(git_repo, "commit", "-q", "-m", "d")
    with git.objects(git_repo) as store:
        entries = {e.path: e for e in store.tree(head(git_repo), "d", limit=100)}
        assert set(entries) == {"d/a.txt", "d/link", "d/sub"}
        assert (entries["d/a.txt"].mode, entries["d/a.txt"].kind) == ("100644", "blob")
        assert entries["d/a.txt"].size == 5
        assert store.blob(entries["d/a.txt"].oid, limit=5) == b"12345"
        assert entries["d/link"].mode == "120000"
        assert (entries["d/sub"].kind, entries["d/sub"].size) == ("tree", None)
        assert {e.path for e in store.tree(head(git_repo), "d/sub", limit=100)} == {"d/sub/b"}
        assert len(store.tree(head(git_repo), "d", limit=2)) == 2
        assert store.tree(head(git_repo), "nowhere", limit=100) == []
        assert store.tree(head(git_repo), "d/a.txt", limit=100) == []  # not a directory
        with pytest.raises(git.GitError, match="cannot read d/ at 000000000000"):
            store.tree("0" * 40, "d", limit=100)
        with pytest.raises(git.GitError, match="not a blob"):
            store.blob(entries["d/sub"].oid, limit=100)


def test_objects_are_read_by_one_persistent_git_process(
    git_repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = git_repo / "many"
    d.mkdir()
    for i in range(20):
        (d / f"{i}.pub").write_text(f"key {i}\n")
    run_git(git_repo, "add", "many")
    run_git(git_repo, "commit", "-q", "-m", "many")
    commit = head(git_repo)
    trace = tmp_path / "trace"
    monkeypatch.setenv("GIT_TRACE", str(trace))
    with git.objects(git_repo) as store:
        read = [store.blob(e.oid, limit=100) for e in store.tree(commit, "many", limit=100)]
    assert sorted(read) == sorted(f"key {i}\n".encode() for i in range(20))
    started = [
        line for line in trace.read_text().splitlines() if "trace: built-in: git cat-file" in line
    ]
    # one process for the objects' contents, one for their types and sizes
    assert len(started) == 2, started


def test_a_worktree_runs_no_hook_and_no_filter(git_repo: Path, tmp_path: Path) -> None:
    """A replay checks a recorded commit out: its .gitattributes (content from a
    manifest's commit) must not get a filter the configuration defines to run, nor a
    checkout hook; and the patch is applied the same way."""
    ran = tmp_path / "ran"
    ran.mkdir()
    run_git(git_repo, "config", "filter.pump.smudge", f"touch {ran}/smudge; cat")
    run_git(git_repo, "config", "filter.pump.clean", f"touch {ran}/clean; cat")
    run_git(git_repo, "config", "filter.pump.required", "true")
    hook = git_repo / ".git" / "hooks" / "post-checkout"
    hook.write_text(f"#!/bin/sh\ntouch {ran}/hook\n")
    hook.chmod(0o755)
    (git_repo / ".gitattributes").write_text("*.py filter=pump\n")
    run_git(git_repo, "add", ".gitattributes")
    run_git(git_repo, "commit", "-q", "-m", "attributes")
    for made in ran.iterdir():
        made.unlink()
    (git_repo / "solver.py").write_text("print('patched')\n")
    patch = tmp_path / "p.patch"
    patch.write_bytes(git.diff_head(git_repo, "--binary", pathspecs=(".",)))
    for made in ran.iterdir():
        made.unlink()  # the user's own diff: their own configuration
    dest = tmp_path / "wt"
    git.worktree_add(git_repo, dest, head(git_repo))
    git.apply(dest, patch)
    assert (dest / "solver.py").read_text() == "print('patched')\n"
    assert sorted(p.name for p in ran.iterdir()) == []
    git.worktree_remove(git_repo, dest)
    run_git(git_repo, "worktree", "add", "-q", "--detach", str(dest))  # git's own way runs them
    assert sorted(p.name for p in ran.iterdir()) == ["hook", "smudge"]


def test_status_and_is_ignored(git_repo: Path) -> None:
    (git_repo / ".gitignore").write_text("*.log\n")
    lines = git.status(git_repo, ".").splitlines()
    assert f"# branch.oid {head(git_repo)}" in lines
    assert "# branch.head main" in lines
    assert not [line for line in lines if not line.startswith("#")]  # untracked: not listed
    (git_repo / "solver.py").write_text("changed\n")
    assert [line for line in git.status(git_repo, ".").splitlines() if line[0] != "#"]
    assert git.is_ignored(git_repo, "x.log") is True
    assert git.is_ignored(git_repo, "x.txt") is False
    with pytest.raises(git.GitError):
        git.is_ignored(git_repo.parent, "x.log")  # not a repository


def test_a_worktree_at_a_commit_and_a_patch_applied_to_it(git_repo: Path, tmp_path: Path) -> None:
    (git_repo / "solver.py").write_text("print('patched')\n")
    patch = tmp_path / "p.patch"
    patch.write_bytes(git.diff_head(git_repo, "--binary", pathspecs=(".",)))
    dest = tmp_path / "wt"
    git.worktree_add(git_repo, dest, head(git_repo))
    assert (dest / "solver.py").read_text() == "print('solve')\n"
    git.apply(dest, patch)
    assert (dest / "solver.py").read_text() == "print('patched')\n"
    with pytest.raises(git.GitError, match=r"wt: error: patch failed: solver\.py:1$"):
        git.apply(dest, patch)
    with pytest.raises(git.GitError, match=r"repo: fatal: .* already exists$"):
        git.worktree_add(git_repo, dest, head(git_repo))
    git.worktree_remove(git_repo, dest)  # changes and all
    assert not dest.exists()
    assert str(dest) not in run_git(git_repo, "worktree", "list")

    git.worktree_add(git_repo, dest, head(git_repo))
    shutil.rmtree(dest)
    git.worktree_prune(git_repo)
    assert str(dest) not in run_git(git_repo, "worktree", "list")
