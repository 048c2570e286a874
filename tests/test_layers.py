"""The package's layers point one way: its import graph, read from the source with ``ast``.

Every import counts, at module level or inside a function (a deferred import is still a
dependency, and a cycle hidden in a function is still a cycle). Those under
``if TYPE_CHECKING:`` never run, but a reader follows them all the same: the layers are
held without them, and the cycles with them too (:func:`typed_graph`). An edge goes to the
module named; importing ``a.b.c`` also runs ``a/__init__`` and ``a/b/__init__``, but those
implicit edges are left out, or every submodule of a package would form a cycle with the
package that re-exports it.
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path

import kronos_audit

PACKAGE = Path(kronos_audit.__file__).parent
NAME = "kronos_audit"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES: dict[str, Path] = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, *, typed: bool = False) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement in ``tree`` that can run (not under ``if TYPE_CHECKING``);
    ``typed``: those under it too."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If) and _is_type_checking(node.test) and not typed:
            yield from _imports(ast.Module(body=node.orelse, type_ignores=[]))
        else:
            yield from _imports(node, typed=typed)


def _resolve(module: str, node: ast.ImportFrom) -> str:
    """The absolute module an ``ImportFrom`` names (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    is_package = MODULES[module].name == "__init__.py"
    base = module.split(".")
    base = base[: len(base) - node.level + (1 if is_package else 0)]
    return ".".join([*base, *([node.module] if node.module else [])])


@functools.cache
def _parsed(module: str) -> ast.Module:
    return ast.parse(MODULES[module].read_text(encoding="utf-8"))


def imported(module: str, *, typed: bool = False) -> set[str]:
    """Everything ``module`` imports: our modules by dotted name, others by top-level name
    (``typed``: with what it imports for type checkers only)."""
    tree = _parsed(module)
    found: set[str] = set()
    for node in _imports(tree, typed=typed):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            target = _resolve(module, node)
            # `from pkg import sub` names the submodule when there is one, else pkg itself.
            names = [
                f"{target}.{alias.name}" if f"{target}.{alias.name}" in MODULES else target
                for alias in node.names
            ]
        for name in names:
            if name == NAME or name.startswith(NAME + "."):
                while name not in MODULES:  # `import a.b.attr` cannot happen; be safe
                    name = name.rpartition(".")[0]
                found.add(name)
            else:
                found.add(name.partition(".")[0])
    found.discard(module)
    return found


# The graphs are built when a test first asks (each module parsed once), not as the module
# is collected: every pytest worker collects it, one runs its tests.


@functools.cache
def _imported_all() -> dict[str, set[str]]:
    return {m: imported(m) for m in MODULES}


@functools.cache
def graph() -> dict[str, set[str]]:
    """The package's modules, each with those of ours it imports."""
    return {m: {i for i in found if i in MODULES} for m, found in _imported_all().items()}


@functools.cache
def typed_graph() -> dict[str, set[str]]:
    """The graph with the imports under ``if TYPE_CHECKING:``: what a reader follows."""
    return {m: {i for i in imported(m, typed=True) if i in MODULES} for m in MODULES}


@functools.cache
def external() -> dict[str, set[str]]:
    """The package's modules, each with the top-level names of others' it imports."""
    return {m: {i for i in found if i not in MODULES} for m, found in _imported_all().items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each strongly connected component that has one (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component: set[str] = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(_a_cycle(graph, component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _a_cycle(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A shortest cycle inside ``component``, as a path that returns to its start."""
    start = min(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & component):
                if w == start:
                    return [*paths[v], start]
                if w not in paths:
                    paths[w] = [*paths[v], w]
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no cycle in {component}")


def importers(prefix: str, targets: set[str]) -> dict[str, set[str]]:
    """Modules under ``prefix`` that import any of ``targets`` (or a module under one)."""
    found: dict[str, set[str]] = {}
    for module, deps in graph().items():
        if module != prefix and not module.startswith(prefix + "."):
            continue
        bad = {d for d in deps if any(d == t or d.startswith(t + ".") for t in targets)}
        if bad:
            found[module] = bad
    return found


# -- the graph builder itself, on made-up packages --------------------------------------


def test_the_builder_sees_imports_in_functions_and_skips_type_checking_blocks() -> None:
    tree = ast.parse(
        "import a\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    import b\nelse:\n    import c\n"
        "def f():\n    import d\n    if TYPE_CHECKING:\n        import e\n"
    )
    names = sorted(alias.name for node in _imports(tree) for alias in node.names)
    assert names == ["TYPE_CHECKING", "a", "c", "d"]


def test_the_cycle_finder_finds_a_cycle_and_only_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]


def test_the_graph_holds_the_package_and_its_known_edges() -> None:
    assert "kronos_audit.storage.tracking" in graph()
    assert "kronos_audit.project.repository" in graph()["kronos_audit.storage.tracking"]
    assert "click" in external()["kronos_audit.cli._app"]


# -- the rules -----------------------------------------------------------------------------


def test_no_import_cycles() -> None:
    found = cycles(graph())
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(c) for c in found)


TYPED_CYCLES_PENDING: dict[tuple[str, str], str] = {}
"""Type-checking imports that still close a cycle, each with why; the edge goes when its
cycle is cut (add none: give the type a home both sides can import)."""


def test_no_import_cycles_even_for_type_checkers() -> None:
    graph = {
        m: deps - {d for (a, d) in TYPED_CYCLES_PENDING if a == m}
        for m, deps in typed_graph().items()
    }
    found = cycles(graph)
    assert not found, "import cycles, counting TYPE_CHECKING:\n" + "\n".join(
        " -> ".join(c) for c in found
    )


def test_only_the_cli_imports_click_and_rich() -> None:
    offenders = {
        m: sorted(external()[m] & {"click", "rich"})
        for m in MODULES
        if external()[m] & {"click", "rich"} and not m.startswith(f"{NAME}.cli")
    }
    assert not offenders, offenders


LAYERS: tuple[str, ...] = (
    "errors",  # the error hierarchy and the exit codes
    "_internal",  # plumbing: atomic files, bounded reads, strict JSON, the git command
    "supervise",  # `kaudit run`'s supervisor and what it tells the program
    "parallel",  # communicators and data layouts, for one rank or many
    "checkpoint",  # the run directory's names, HDF5 files, state trees, hashing
    "compare",  # agreement of two checkpoints, bitwise or within a tolerance
    "statement",  # the signed format an outside verifier reads
    "keys",  # key files, trust stores, anchors, revocations
    "project",  # the repository: where it is, its settings, its trust store
    "provenance",  # environment lock, git state, scheduler record
    "storage",  # DVC: tracking, pushing, fetching, setting a project up
    "signing",  # one manifest for a file or a sharded step; snapshot
    "verification",  # the trust model's steps in order
    "runtime",  # a Run: periodic, atomic, asynchronous checkpoints and restores
    "replay",  # reconstructing a segment and checking agreement
    "history",  # reading runs: log, status, bisect
    "report",  # the auditor's report
    "gate",  # the CI reproducibility gate
    "integrations",  # kaudit inside DCP, Hugging Face, Lightning, Orbax: one module a tool
    "pytest_plugin",  # the `kaudit` fixture
    "cli",  # `kaudit`
    "__main__",  # `python -m kronos_audit`
)
"""The package's layers, lowest first: a module imports only from its own layer and those
below it. Every module of the package belongs to exactly one (``errors`` is the module
``kronos_audit.errors``; ``cli`` is the package ``kronos_audit.cli`` and what is in it)."""


def layer_of(module: str) -> int:
    name = module.removeprefix(NAME + ".").split(".")[0]
    return LAYERS.index(name)


def test_every_module_is_in_a_layer() -> None:
    unplaced = [
        m for m in MODULES if m != NAME and m.removeprefix(NAME + ".").split(".")[0] not in LAYERS
    ]
    assert not unplaced, f"add to LAYERS: {unplaced}"


def test_the_package_root_holds_few_modules() -> None:
    root = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(root) <= 5, root


MODULE_LINES = 700
"""The longest a module may be: one that grows past it holds more than one idea."""


def test_no_module_is_longer_than_the_limit() -> None:
    long = {
        m: n
        for m, path in MODULES.items()
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MODULE_LINES
    }
    assert not long, f"split by meaning (at most {MODULE_LINES} lines): {long}"


BENCH = PACKAGE.parent / "bench"
"""The benchmarks: programs, not the package, held to the package's length all the same."""


def test_no_benchmark_module_is_longer_than_the_limit() -> None:
    modules = sorted(BENCH.rglob("*.py"))
    assert modules, BENCH
    long = {
        path.relative_to(BENCH.parent).as_posix(): n
        for path in modules
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MODULE_LINES
    }
    assert not long, f"split by meaning (at most {MODULE_LINES} lines): {long}"


RUNTIME = f"{NAME}.runtime"
RUNTIME_LINES = 600
"""The longest a module under runtime/ may be: the loop a program runs is read first."""
RUNTIME_MODULES = 12
"""The most modules runtime/ holds beside its sub-packages (steps/, remote/ ...): more, and
a newcomer cannot find a part by its name."""
RUNTIME_PENDING: dict[str, str] = {}
"""Modules of runtime/ that still break one of its two rules, each with why."""


def test_the_runtime_holds_few_short_modules() -> None:
    runtime = MODULES[RUNTIME].parent
    flat = sorted(
        f"{RUNTIME}.{p.stem}"
        for p in runtime.glob("*.py")
        if p.name != "__init__.py" and f"{RUNTIME}.{p.stem}" not in RUNTIME_PENDING
    )
    assert len(flat) <= RUNTIME_MODULES, f"give these a room of their own: {flat}"
    long = {
        m: n
        for m, path in MODULES.items()
        if (m == RUNTIME or m.startswith(RUNTIME + ".")) and m not in RUNTIME_PENDING
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > RUNTIME_LINES
    }
    assert not long, f"split by meaning (at most {RUNTIME_LINES} lines under runtime/): {long}"


def test_no_module_imports_a_higher_layer() -> None:
    upward = {
        (m, d)
        for m, deps in graph().items()
        if m != NAME
        for d in deps
        if d != NAME and layer_of(d) > layer_of(m)
    }
    assert not upward, "\n".join(
        f"{m} ({LAYERS[layer_of(m)]}) imports {d} ({LAYERS[layer_of(d)]})"
        for m, d in sorted(upward)
    )


def _distribution(requirement: str) -> str:
    name = re.match(r"[A-Za-z0-9._-]+", requirement)
    assert name is not None, requirement
    return re.sub(r"[-_.]+", "-", name.group()).lower()


INTEGRATIONS = f"{NAME}.integrations"
"""The package of tool integrations: each of its modules is one tool's, imported by the
programs that use that tool, so it imports the tool at its top; the package itself does not."""
INTEGRATION_EXTRAS = ("dcp", "hf", "lightning", "orbax")


def _is_integration(module: str) -> bool:
    return module.startswith(INTEGRATIONS + ".")


PYPROJECT = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text(encoding="utf-8"))
OPTIONAL = {
    _distribution(r)
    for extra in ("torch", "jax", "mpi", "ray", *INTEGRATION_EXTRAS)
    for r in PYPROJECT["project"]["optional-dependencies"][extra]
}
"""Distributions of the framework extras: imported only inside the functions that need them
(or at the top of the one integration module that is the extra's)."""


@functools.cache
def _providers() -> Mapping[str, list[str]]:
    return importlib.metadata.packages_distributions()  # slow: reads every distribution


def _distributions_of(name: str) -> set[str]:
    return {_distribution(d) for d in _providers().get(name, [name])}


def test_every_third_party_import_is_a_declared_dependency() -> None:
    declared = {_distribution(r) for r in PYPROJECT["project"]["dependencies"]} | OPTIONAL
    # the pytest plugin is loaded only by pytest (entry point pytest11), so pytest is there
    loaded_by = {f"{NAME}.pytest_plugin": {"pytest"}}
    undeclared = {}
    for module, names in external().items():
        for name in names - set(sys.stdlib_module_names) - loaded_by.get(module, set()):
            if not _distributions_of(name) & declared:
                undeclared[name] = module
    assert not undeclared, f"imported but not in [project] dependencies: {undeclared}"


def test_the_framework_extras_are_imported_only_inside_functions() -> None:
    at_top = {}
    for module, path in MODULES.items():
        if _is_integration(module):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        body = [
            n
            for n in tree.body
            if not isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        ]
        for node in _imports(ast.Module(body=body, type_ignores=[])):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
            )
            for name in names:
                top = name.partition(".")[0]
                if top and top not in sys.stdlib_module_names and _distributions_of(top) & OPTIONAL:
                    at_top[top] = module
    assert not at_top, f"an optional extra imported at a module's top level: {at_top}"


def test_importing_kronos_audit_imports_no_framework() -> None:
    # every module of the package, as a program that never touches torch or jax would load it
    # (an integration's module is the tool's: only a program of that tool imports it)
    modules = sorted(m for m in MODULES if not _is_integration(m))
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}:\n"
        "    importlib.import_module(m)\n"
        "frameworks = ('torch', 'jax', 'jaxlib', 'optax', 'ml_dtypes', 'mpi4py',\n"
        "    'transformers', 'safetensors', 'lightning', 'orbax')\n"
        "loaded = sorted(n for n in frameworks if n in sys.modules)\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=PACKAGE.parent)


# -- git: reached one way --------------------------------------------------------------------

GIT_RUNNER = f"{NAME}._internal.git"
"""The one module that runs git, through GitPython (see its docstring)."""


_SPAWN = frozenset(
    {
        "run",
        "Popen",
        "call",
        "check_call",
        "check_output",
        "system",
        "popen",
        "getoutput",
        "getstatusoutput",
        "execv",
        "execvp",
        "execvpe",
        "spawnvp",
        "create_subprocess_exec",
        "create_subprocess_shell",
    }
)


def _is_git(node: ast.AST, *, shell: bool) -> bool:
    if not isinstance(node, ast.Constant) or not isinstance(node.value, str):
        return False
    return (
        node.value == "git"
        or node.value.endswith("/git")
        or (shell and node.value.startswith("git "))
    )


def _runs_git(tree: ast.AST) -> list[int]:
    """Lines that build or run a git command line: a list whose first item is ``"git"``
    (or a path ending in ``/git``); or, given to a call that starts a process, a tuple
    like it, ``"git"`` itself or a shell string starting with ``git ``."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.List) and node.elts and _is_git(node.elts[0], shell=False):
            found.add(node.lineno)
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name not in _SPAWN:
                continue
            for arg in [*node.args, *(k.value for k in node.keywords)]:
                if isinstance(arg, ast.Tuple) and arg.elts:
                    arg = arg.elts[0]
                if _is_git(arg, shell=True):
                    found.add(node.lineno)
    return sorted(found)


def test_the_git_detector_finds_command_lines_and_only_them() -> None:
    tree = ast.parse(
        'subprocess.run(["git", "-C", root, "status"])\n'
        'os.system("git status")\n'
        'argv = ["/usr/bin/git", "log"]\n'
        'subprocess.Popen(("git", "log"), stdout=PIPE)\n'
        'os.execvp("git", args)\n'
        'p["git"]["commit"]\n'
        'd = {"git": state}\n'
        'rows.append(("git", f"{commit} on {branch}"))\n'
        'raise Error("not inside a git repository (run `git init` first)")\n'
        'names = ["gitpython", "git"]\n'
    )
    assert _runs_git(tree) == [1, 2, 3, 4, 5]


def test_no_module_builds_a_git_command_line() -> None:
    """git runs through GitPython's command object in the git module, never through a
    process started by hand: the hardening there (environment, hooks, filters) holds for
    every command."""
    offenders = {
        m: lines
        for m, path in MODULES.items()
        if (lines := _runs_git(ast.parse(path.read_text(encoding="utf-8"))))
    }
    assert not offenders, f"run git through {GIT_RUNNER}: {offenders}"


def test_only_the_git_module_imports_gitpython() -> None:
    """GitPython is the git layer, reached through one module; tests, benchmarks and
    examples run git through tests/helpers.py's ``git()`` or the command itself, so that
    what they check does not lean on the layer they check."""
    root = PACKAGE.parent
    sources = [
        p
        for d in ("kronos_audit", "tests", "bench", "examples")
        for p in sorted((root / d).rglob("*.py"))
    ]
    assert len(sources) > len(MODULES)
    importers = []
    for path in sources:
        for node in _imports(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                names = [node.module or ""] if not node.level else []
            if any(n == "git" or n.startswith("git.") for n in names):
                importers.append(path.relative_to(root).as_posix())
    assert sorted(set(importers)) == [MODULES[GIT_RUNNER].relative_to(root).as_posix()]
    assert [m for m in MODULES if "git" in external()[m]] == [GIT_RUNNER]
