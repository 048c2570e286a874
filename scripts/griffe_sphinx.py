"""A griffe extension for the docs site (mkdocs.yml): the package's reStructuredText-flavoured
docstrings, read as Markdown.

The docstrings cross-reference with Sphinx roles (:class:`~kronos_audit.errors.Error`,
:meth:`Run.restore`, :mod:`.environment`) and end a paragraph with ``::`` before a literal
block. Markdown has neither: mkdocstrings would print the roles as they are. This extension
rewrites every docstring of the package once it is loaded, as Sphinx would render it:

- a role whose target is an object of kronos_audit becomes a link to the page that
  documents it, or its name in code where the site does not document it (Sphinx's titles:
  ``~`` keeps the last component, ``title <target>`` the title, functions get ``()``);
- a role whose target lies outside the package (``signal.SIGTERM``, ``numpy.ndarray``, a
  builtin) becomes its name in code;
- a role whose target is no object of kronos_audit (misspelt, renamed, moved) or a name
  that is defined nowhere is a warning naming the docstring's file and line, which fails
  ``mkdocs build --strict`` (scripts/test.sh): a broken reference anywhere in the package,
  on the site or not, fails CI;
- ``Paragraph::`` becomes ``Paragraph:`` and a lone ``::`` goes (the indented block after
  them is a Markdown code block as it stands).
"""

from __future__ import annotations

import builtins
import contextlib
import importlib.util
import re
from typing import Any

import griffe

PACKAGE = "kronos_audit"
ROLE = re.compile(
    r":(?:py:)?(?P<role>class|func|meth|attr|mod|exc|data|obj|const):`(?P<text>[^`]+)`"
)
EXPLICIT = re.compile(r"^(?P<title>.+?)\s*<(?P<target>[^<>]+)>$")
CALLABLE_ROLES = frozenset({"func", "meth"})
LOGGER = griffe.get_logger("griffe_sphinx")


class SphinxRoles(griffe.Extension):
    """Rewrite Sphinx roles and ``::`` in every docstring of the package, checking each
    cross-reference against the loaded package."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        if pkg.path != PACKAGE:
            return
        for obj in _walk(pkg):
            if obj.docstring is not None:
                obj.docstring.value = _rewrite(obj, obj.docstring, loader)


def _rewrite(obj: griffe.Object, docstring: griffe.Docstring, loader: griffe.GriffeLoader) -> str:
    def role(match: re.Match[str]) -> str:
        explicit = EXPLICIT.match(match["text"].strip())
        title, target = (
            (explicit["title"], explicit["target"]) if explicit else (None, match["text"].strip())
        )
        linked = not target.startswith("!")
        short = target.lstrip("!").startswith("~")
        target = target.lstrip("!~")
        if title is None:
            title = target.rsplit(".", 1)[-1] if short else target.lstrip(".")
            if match["role"] in CALLABLE_ROLES:
                title += "()"
        code = f"<code>{_escape(title)}</code>"
        path = _resolve(obj, target, loader)
        if path is None:
            return code
        canonical = _canonical(loader, path)
        if canonical is None:
            line = (docstring.lineno or 0) + docstring.value.count("\n", 0, match.start())
            LOGGER.warning(
                "%s:%d: %s names %s, which is not defined",
                obj.relative_filepath,
                line,
                match[0],
                path,
            )
            return code
        if not linked:
            return code
        return f'<autoref identifier="{canonical}" optional>{code}</autoref>'

    value = ROLE.sub(role, docstring.value)
    value = re.sub(r"(?m)^[ \t]*::[ \t]*$", "", value)
    return re.sub(r"(?m)(\S)::[ \t]*$", r"\1:", value)


def _walk(obj: griffe.Object) -> list[griffe.Object]:
    """The object and every object defined in it (an alias, a name a module imports, is
    documented where it is defined)."""
    found = [obj]
    for member in obj.members.values():
        if isinstance(member, griffe.Object):
            found.extend(_walk(member))
    return found


def _resolve(obj: griffe.Object, target: str, loader: griffe.GriffeLoader) -> str | None:
    """The full path a role's target names inside the package (which may not exist), or
    None when it lies outside the package. A name that nothing defines (not in scope, not a
    builtin, not an importable module) is returned as it is, so that it is reported."""
    if target.startswith("."):  # in the docstring's module, else beside it in its package
        module = obj.module
        bases = [module.path] + ([module.parent.path] if module.parent else [])
        candidates = [f"{base}{target}" for base in bases]
        return next((c for c in candidates if _canonical(loader, c)), candidates[-1])
    if target == PACKAGE or target.startswith(f"{PACKAGE}."):
        return target
    head, _, rest = target.partition(".")
    resolved = _in_scope(obj, head)
    if resolved is None:
        if hasattr(builtins, head) or importlib.util.find_spec(head) is not None:
            return None
        return target
    if not (resolved == PACKAGE or resolved.startswith(f"{PACKAGE}.")):
        return None
    return f"{resolved}.{rest}" if rest else resolved


def _in_scope(obj: griffe.Object, name: str) -> str | None:
    """Where ``name`` leads from the docstring's object: its members (a class's inherited
    ones too), then its parents', as Sphinx looks a role's target up."""
    scope: griffe.Object | None = obj
    while scope is not None:
        members: dict[str, griffe.Object | griffe.Alias] = dict(scope.members)
        if isinstance(scope, griffe.Class):
            with contextlib.suppress(griffe.AliasResolutionError, griffe.CyclicAliasError):
                members = dict(scope.all_members)
        if name in members:
            member = members[name]
            return member.target_path if isinstance(member, griffe.Alias) else member.path
        if name == scope.name and not scope.is_module:
            return scope.path
        scope = scope.parent
    return None


def _canonical(loader: griffe.GriffeLoader, path: str) -> str | None:
    """The path where the object ``path`` names is defined (an imported name leads to its
    definition), or None when there is no such object."""
    try:
        found = loader.modules_collection[path]
        return str(found.canonical_path)
    except (KeyError, ValueError, griffe.AliasResolutionError, griffe.CyclicAliasError):
        return None


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
