"""The layers of docs/ARCHITECTURE.md run one way: ``host -> firmware -> sim -> hdl``.

``hdl/`` imports nothing from ``sim/``, ``firmware/`` or ``host/``; ``sim/`` nothing from ``host/``. Every import
statement counts, including imports inside functions. Source files cite the papers through docs/references.md,
never by a path outside the repository.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = {"hdl": ("sim", "firmware", "host"), "sim": ("host",)}
OUTSIDE_PATHS = ("/work/shared", "../shared/")


def imported_packages(source: str):
    """(line, top-level package) of every import in ``source``; relative imports are ignored (same package)."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module.split(".")[0]


def violations(layer: str, root: Path = ROOT):
    out = []
    for path in sorted((root / layer).rglob("*.py")):
        for line, pkg in imported_packages(path.read_text()):
            if pkg in FORBIDDEN[layer]:
                out.append(f"{path.relative_to(root)}:{line} imports {pkg}")
    return out


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_no_upward_imports(layer):
    assert violations(layer) == []


def test_checker_catches_an_upward_import(tmp_path):
    """The checker sees a function-local upward import (a mutant of the tree)."""
    (tmp_path / "sim").mkdir()
    (tmp_path / "sim" / "x.py").write_text("import numpy\n\ndef f():\n    from host.attention import merge\n")
    (tmp_path / "sim" / "y.py").write_text("from .x import f\nimport hdl.fp\n")
    assert violations("sim", tmp_path) == ["sim/x.py:4 imports host"]


def test_sources_cite_papers_without_outside_paths():
    bad = []
    for layer in ("hdl", "sim", "firmware", "host", "examples"):
        for path in sorted((ROOT / layer).rglob("*.py")):
            text = path.read_text()
            bad += [f"{path.relative_to(ROOT)}: {p}" for p in OUTSIDE_PATHS if p in text]
    assert bad == []
