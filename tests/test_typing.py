"""User code type-checks: ``mypy --strict`` over tests/typing/ finds exactly the errors marked there.

The files there state with ``assert_type`` what mypy must infer (module calls typed as their ``forward``, the
attention function's exact return type, the interop overloads); ``misuse.py`` marks each line mypy must reject
with ``# E: <code>``. Both directions fail the test: a missing inference (an unexpected error, or an
``assert_type`` mismatch) and a misuse that slips through (a marked error that mypy no longer reports).
"""

import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "tests" / "typing"
MARK = re.compile(r"#\s*E:\s*([a-z-]+)\s*$")
ERROR = re.compile(r"^(?P<path>[^:]+):(?P<line>\d+): error: .*\[(?P<code>[a-z-]+)\]$")


def _marked_errors() -> set[tuple[str, int, str]]:
    marked = set()
    for path in sorted(FOLDER.glob("*.py")):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            match = MARK.search(line)
            if match:
                marked.add((path.name, number, match.group(1)))
    return marked


def test_mypy_strict_finds_exactly_the_marked_errors(tmp_path: Path) -> None:
    pytest.importorskip("mypy")
    files = sorted(str(p) for p in FOLDER.glob("*.py"))
    assert len(files) >= 3
    # No config file (the project's mypy.ini excludes this folder): --strict alone, as a user would run it.
    result = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--config-file=", "--no-error-summary",
                             "--cache-dir", str(ROOT / ".mypy_cache" / "user-typing"), *files],
                            capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert result.returncode in (0, 1), result.stderr
    found = set()
    for line in result.stdout.splitlines():
        match = ERROR.match(line)
        if match:
            found.add((Path(match["path"]).name, int(match["line"]), match["code"]))
        else:
            assert ": note: " in line, line  # anything else would be an error this parser missed
    expected = _marked_errors()
    assert len(expected) >= 5
    assert found - expected == set(), f"unexpected mypy errors:\n{result.stdout}"
    assert expected - found == set(), "misuses that mypy no longer rejects"


@pytest.mark.parametrize("name", ["attention_user.py", "model_user.py"])
def test_the_user_files_run(name: str) -> None:
    """The user-style files are real code: they run (assert_type is a no-op at run time)."""
    runpy.run_path(str(FOLDER / name))
