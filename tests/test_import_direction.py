"""Dependencies point one way: collector <- storage <- api <- entry points (kvscope/).

Dashboards and reports read the store and never import the API: importing one must not load
zmq, FastAPI and the compiled table for a setting. Every import counts, the lazy ones inside
functions and under TYPE_CHECKING included (`ast.walk` sees them all), and so do
`importlib.import_module("...")` calls and the compiled modules' imports.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SOURCES = {
    "collector": "kvscope.collector",
    "storage": "kvscope.storage",
    "api": "kvscope.api",
    "dashboards": "kvscope.dashboards",
    "kvscope": "kvscope",
}
"""Source folder -> the package it installs as (pyproject.toml's package-dir)."""

LAYERS = ("collector", "storage", "api", "dashboards")
ENTRY = "entry points"
"""Everything else under `kvscope.`: kvscope/*.py and kvscope/lab."""

FORBIDDEN = {
    "collector": {"storage", "api", "dashboards", ENTRY},
    "storage": {"api", "dashboards", ENTRY},
    "api": {"dashboards", ENTRY},
    "dashboards": {"api", ENTRY},
}
"""Layer -> the layers it must not import."""

NO_API = {"kvscope.report", "kvscope.store_commands"}
"""Entry points that run without the API (reports, store commands): they import none of it."""

ROOT_MODULES = {p.stem for p in (ROOT / "kvscope").iterdir() if p.suffix == ".py" or p.is_dir()}
ROOT_MODULES |= set(LAYERS)
"""What `from kvscope import X` may import as a module (else X is an attribute of the root)."""

_PYX_IMPORT = re.compile(r"^\s*(?:from|c?import)\s+(kvscope(?:\.\w+)*)", re.MULTILINE)


def module_name(path: Path) -> str:
    folder, *rest = path.relative_to(ROOT).with_suffix("").parts
    parts = [SOURCES[folder], *rest]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(module: str) -> str | None:
    """The layer of a kvscope module; None for the bare `kvscope` package and anything else."""
    parts = module.split(".")
    if parts[0] != "kvscope" or len(parts) == 1:
        return None
    return parts[1] if parts[1] in LAYERS else ENTRY


def source_files() -> Iterator[Path]:
    for folder in SOURCES:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix in (".py", ".pyx") and ".build" not in path.parts:
                yield path


def imports_of(source: str, module: str, is_package: bool = False) -> Iterator[tuple[int, str]]:
    """(line, imported module) for every import in `source`, wherever it is."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                # `from kvscope import api` imports the subpackage; `from x import name` x.
                if base == "kvscope" and alias.name in ROOT_MODULES:
                    yield node.lineno, f"kvscope.{alias.name}"
                else:
                    yield node.lineno, base
        elif (
            isinstance(node, ast.Call)
            and (
                (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                or (isinstance(node.func, ast.Name) and node.func.id == "__import__")
            )
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield node.lineno, node.args[0].value


def violations_in(source: str, module: str, is_package: bool = False) -> list[str]:
    mine = layer_of(module) if module != "kvscope" else None
    found = []
    for line, imported in imports_of(source, module, is_package):
        theirs = layer_of(imported)
        if theirs is None:
            continue
        if (mine in FORBIDDEN and theirs in FORBIDDEN[mine]) or (
            module in NO_API and theirs == "api"
        ):
            found.append(f"{module}:{line} ({mine}) imports {imported} ({theirs})")
    return found


def test_no_import_points_against_the_direction() -> None:
    found = []
    checked = 0
    for path in source_files():
        module = module_name(path)
        text = path.read_text()
        checked += 1
        if path.suffix == ".pyx":  # Cython: not Python's grammar, but its imports read alike
            mine = layer_of(module)
            found += [
                f"{module} ({mine}) imports {name}"
                for name in _PYX_IMPORT.findall(text)
                if mine in FORBIDDEN and layer_of(name) in FORBIDDEN[mine]
            ]
            continue
        found += violations_in(text, module, path.name == "__init__.py")
    assert checked > 80, f"only {checked} source files found under {ROOT}"
    assert found == [], "imports against the direction:\n" + "\n".join(found)


def test_the_check_sees_lazy_relative_and_dynamic_imports() -> None:
    source = """
import typing
if typing.TYPE_CHECKING:
    from kvscope.storage.writer import StoreWriter
def later():
    from ..api import context
    import importlib
    return importlib.import_module("kvscope.dashboards.fleet")
"""
    found = violations_in(source, "kvscope.collector.ingest")
    assert [v.split(" imports ")[1] for v in found] == [
        "kvscope.storage.writer (storage)",
        "kvscope.api (api)",
        "kvscope.dashboards.fleet (dashboards)",
    ]
    assert violations_in("from kvscope import __version__, cli", "kvscope.dashboards.cli") == [
        "kvscope.dashboards.cli:1 (dashboards) imports kvscope.cli (entry points)"
    ]


def test_the_dashboards_load_neither_the_api_nor_sockets() -> None:
    code = (
        "import sys, kvscope.dashboards.generate, kvscope.dashboards.cli\n"
        "print(sorted(m for m in ('fastapi', 'zmq', 'kvscope.api') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
