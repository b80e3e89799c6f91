"""The suites' own layout: tests grouped by subject, property tests beside them, shared helpers in one place.

* every test file sits in a subject folder (``tests/core/``, ``tests/toolkit/``, ``tests/app/``, ``tests/docs/``,
  ``tests/structure/``), never loose at the top of ``tests/`` or ``property_tests/``;
* ``property_tests/`` mirrors ``tests/``: each of its folders has the folder of the same subject in ``tests/``;
* the helpers the suites share live in ``tests/support/`` only (``tests/typing/`` holds user-style files for mypy);
* nothing under ``tests/`` imports ``property_tests`` (the property suite may import ``tests.support``).
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SUITES = (ROOT / "tests", ROOT / "property_tests")
SUBJECTS = {"core", "toolkit", "app", "docs", "structure"}
#: Not subjects: the shared helpers, and the user-style files tests/structure/test_typing.py runs mypy over.
OTHER = {"support", "typing"}


def _python_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*.py") if "__pycache__" not in p.parts)


def test_every_test_file_is_in_a_subject_folder() -> None:
    misplaced = [str(p.relative_to(ROOT)) for suite in SUITES for p in _python_files(suite)
                 if p.name.startswith("test_") and p.relative_to(suite).parts[0] not in SUBJECTS]
    assert not misplaced, f"put these in the folder of their subject ({', '.join(sorted(SUBJECTS))}): {misplaced}"


def test_the_folders_are_the_subjects() -> None:
    for suite in SUITES:
        folders = {p.name for p in suite.iterdir() if p.is_dir() and p.name != "__pycache__"}
        unknown = folders - SUBJECTS - (OTHER if suite.name == "tests" else set())
        assert not unknown, f"{suite.name}/ has folders that are no subject: {sorted(unknown)}"
    tests = {p.name for p in (ROOT / "tests").iterdir() if p.is_dir()}
    assert {p.name for p in (ROOT / "property_tests").iterdir() if p.is_dir()} - {"__pycache__"} <= tests


def test_shared_helpers_live_in_tests_support() -> None:
    loose = [str(p.relative_to(ROOT)) for suite in SUITES for p in _python_files(suite)
             if not p.name.startswith("test_") and p.name not in ("__init__.py", "conftest.py")
             and p.relative_to(suite).parts[0] not in OTHER]
    assert not loose, f"helpers belong in tests/support/: {loose}"


def _imported_modules(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
    return found


def test_tests_never_import_the_property_suite() -> None:
    offenders = [str(p.relative_to(ROOT)) for p in _python_files(ROOT / "tests")
                 if any(m == "property_tests" or m.startswith("property_tests.") for m in _imported_modules(p))]
    assert not offenders, f"tests/ imports property_tests in {offenders}: move the helper to tests/support/"


def test_the_import_scan_sees_both_forms(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("import property_tests.core\n\ndef f() -> None:\n    from property_tests import x\n")
    assert _imported_modules(module) == {"property_tests.core", "property_tests"}
