"""An import-linter contract type: a name with a leading underscore is not imported from another module.

What a package shares says so by its name (docs/architecture.md, "The ladder"): an underscore name stays with the
module that defines it, and a private module (``loaders._layout``) is reached through its package's public
modules. So ``from loaders._layout import HEADER`` is allowed, ``from loaders.format import _shard_path`` and
``from loaders import _layout`` are not. Dunder names (``__version__``) are not private.

pyproject.toml registers it (``contract_types``) and one contract of this type checks every root package;
``lint-imports`` puts the current directory on ``sys.path``, so it imports this module from the repo root. It
lives here, not in a product package: it is a rule about the code, run by CI, and imports no product module.

The graph (grimp) says which module imports which, at which line, but its ``line_contents`` is only the first line
of a statement, and a parenthesised ``from x import (a,\n _b)`` names ``_b`` on a later line: so the statement
at that line is read from the importer's source with ``ast``.
"""

from __future__ import annotations

import ast
import importlib.util
from functools import cache
from pathlib import Path

import grimp
from importlinter.application import output
from importlinter.domain import fields
from importlinter.domain.contract import Contract, ContractCheck

__all__ = ["PrivateNamesContract"]


class PrivateNamesContract(Contract):
    """No module imports a private name (leading underscore, not a dunder) from another of the graph's modules.

    Options: ``ignore_imports``: ``importer -> imported`` pairs whose private names are allowed (optional).
    """

    type_name = "private_names"

    ignore_imports = fields.SetField(subfield=fields.ImportExpressionField(), required=False)

    def check(self, graph: grimp.ImportGraph, verbose: bool) -> ContractCheck:
        ignored = {(e.importer.expression, e.imported.expression) for e in self.ignore_imports or ()}
        found: list[dict[str, object]] = []
        for importer in sorted(graph.modules):
            for imported in sorted(graph.find_modules_directly_imported_by(importer)):
                if (importer, imported) in ignored:
                    continue
                lines = {d["line_number"] for d in graph.get_import_details(importer=importer, imported=imported)}
                for line in sorted(lines):
                    for name in _private_names_at(importer, line):
                        found.append({"importer": importer, "imported": imported, "line": line, "name": name})
        return ContractCheck(kept=not found, metadata={"imports": found})

    def render_broken_contract(self, check: ContractCheck) -> None:
        output.print_error("Private names imported from another module (rename it without the underscore, or "
                           "keep it in the module that defines it):", bold=False)
        output.new_line()
        for f in check.metadata["imports"]:
            output.print_error(f"- {f['importer']} -> {f['imported']} (l.{f['line']}): {f['name']}", bold=False)
            output.new_line()


def is_private(name: str) -> bool:
    """A leading underscore, unless the name is a dunder (``__version__``, ``__main__``)."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _private_names_at(module: str, line: int) -> list[str]:
    """The private names of the ``from ... import`` statements that start at ``line`` of ``module``'s source (a
    plain ``import a._b`` imports a module by its path: the private-module rule, not this one)."""
    return [alias.name for node in _from_imports(module).get(line, ()) for alias in node.names
            if is_private(alias.name)]


@cache
def _from_imports(module: str) -> dict[int, list[ast.ImportFrom]]:
    """``module``'s ``from ... import`` statements by their first line, wherever they are (functions included)."""
    by_line: dict[int, list[ast.ImportFrom]] = {}
    for node in ast.walk(ast.parse(_source_path(module).read_text())):
        if isinstance(node, ast.ImportFrom):
            by_line.setdefault(node.lineno, []).append(node)
    return by_line


def _source_path(module: str) -> Path:
    """The file of ``module``, found from its root package's folder without importing anything."""
    top, *rest = module.split(".")
    spec = importlib.util.find_spec(top)  # a top-level name: found, not imported
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"{top} is not a package on sys.path")
    base = Path(next(iter(spec.submodule_search_locations))).joinpath(*rest)
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
