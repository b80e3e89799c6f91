"""The application's functions stay readable in one sitting: each is under 80 lines.

The app wing is the one tests/structure/test_layout.py draws (every module the commands need beyond the model
and the testing toolkit, subpackages included). A function's length is measured by ``ast`` from its ``def``
(decorators excluded) to its last line, docstring included.
"""

import ast

import pytest

from tests.structure.test_layout import FILES, WINGS

APP = WINGS["app"]
#: Every app function is shorter than this.
LIMIT = 80


def _lengths(module: str) -> dict[str, int]:
    tree = ast.parse(FILES[module].read_text(encoding="utf-8"))
    lengths: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                assert child.end_lineno is not None
                lengths[prefix + child.name] = child.end_lineno - child.lineno + 1
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")

    visit(tree, "")
    return lengths


@pytest.mark.parametrize("module", APP)
def test_no_app_function_is_longer_than_the_limit(module: str) -> None:
    lengths = _lengths(module)
    long = {name: n for name, n in lengths.items() if n >= LIMIT}
    assert not long, f"{module}: functions of {LIMIT} lines or more: {long} (split them)"


def test_the_measure_counts_nested_functions_and_methods() -> None:
    """The measure itself: a method and a nested function are found under their qualified names."""
    assert _lengths("step_loop")["StepLoop.step"] > 5
    assert "measure_matmul_flops.sync" in _lengths("training")
