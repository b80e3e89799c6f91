"""The package's dependencies point one way, as docs/index.md#layout says.

Module-level imports between the package's modules must follow ``ORDER`` (a module imports only modules
listed before it). Imports inside functions are the documented exceptions only: the command line imports what
each command needs.
"""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "typed_transformer"

#: Dependency order: each module may import (at module level) only modules listed before it.
ORDER = ["_deprecation", "_signals", "_install", "_files", "_paths", "_activations", "shapecheck", "masks",
         "attention", "positions", "multihead", "layers", "interop", "seq2seq", "gpt", "hf", "plot", "strategies",
         "audit", "config", "data", "seq2seq_data", "checkpoint", "generation", "threads", "training",
         "seq2seq_training", "cli", "__init__", "__main__"]

#: (importer, imported) pairs allowed inside a function body, where the import is the only way back.
LATE_IMPORTS: set[tuple[str, str]] = set()


def _imports(path: Path) -> tuple[set[str], set[str]]:
    """Package modules imported at module level and inside functions."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    top: set[str] = set()
    late: set[str] = set()
    function_nodes = {id(n) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
                      for n in ast.walk(f)}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            names = [node.module] if node.module else [alias.name for alias in node.names]
            (late if id(node) in function_nodes else top).update(name.split(".")[0] for name in names)
    return top, late


MODULES = sorted(p.stem for p in PACKAGE.glob("*.py"))


def test_every_module_has_a_place_in_the_order() -> None:
    assert set(MODULES) <= set(ORDER), f"add {sorted(set(MODULES) - set(ORDER))} to ORDER (and to the docs)"


@pytest.mark.parametrize("module", MODULES)
def test_module_level_imports_point_down(module: str) -> None:
    top, _ = _imports(PACKAGE / f"{module}.py")
    upward = sorted(name for name in top if ORDER.index(name) >= ORDER.index(module))
    assert not upward, f"{module} imports {upward}, which come after it in the dependency order"


@pytest.mark.parametrize("module", [m for m in MODULES if m not in ("cli", "__init__", "__main__")])
def test_late_imports_are_the_documented_ones(module: str) -> None:
    _, late = _imports(PACKAGE / f"{module}.py")
    upward = {name for name in late if ORDER.index(name) >= ORDER.index(module)}
    assert upward <= {imported for importer, imported in LATE_IMPORTS if importer == module}, (
        f"{module} imports {sorted(upward)} inside a function")


def test_gpt_from_hf_gpt2_is_the_hf_function_without_gpt_importing_hf() -> None:
    import typed_transformer
    from typed_transformer.hf import gpt_from_hf_gpt2

    assert typed_transformer.GPT.from_hf_gpt2 is gpt_from_hf_gpt2
    top, late = _imports(PACKAGE / "gpt.py")
    assert "hf" not in top | late
