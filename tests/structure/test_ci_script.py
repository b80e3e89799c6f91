""".ci/run keeps a .venv the README's set-up made (torch 2.13.0 and the project installed in it) and makes any
other anew; it reports how long each step took (issue 43 item 3)."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = (ROOT / ".ci" / "run").read_text()


def _keep_check() -> str:
    found = re.search(r'\.venv/bin/python -c "(.*?)" 2>/dev/null', SCRIPT, re.S)
    assert found is not None, "the .venv check of .ci/run"
    return found.group(1)


def test_the_readme_venv_is_kept() -> None:
    """This suite's interpreter is the README's .venv (torch 2.13.0, typed_transformer): the check keeps it."""
    assert subprocess.run([sys.executable, "-c", _keep_check()], check=False).returncode == 0


def test_another_venv_is_made_anew(tmp_path: Path) -> None:
    """An interpreter without the project (here: isolated from site-packages) fails the check."""
    done = subprocess.run([sys.executable, "-I", "-S", "-c", _keep_check()], cwd=tmp_path, capture_output=True,
                          check=False)
    assert done.returncode != 0


def test_the_venv_is_removed_only_when_not_kept() -> None:
    assert SCRIPT.count("rm -rf .venv") == 1
    keep, remove = SCRIPT.index("keeping .venv"), SCRIPT.index("rm -rf .venv")
    assert keep < remove  # in the else branch, after the check


def test_each_step_is_timed() -> None:
    steps = re.findall(r'^step "([^"]+)"', SCRIPT, re.M)
    assert steps[0].startswith("set-up")
    assert any("mypy" in s for s in steps)
    assert steps[-1].startswith("pytest -n auto")
    assert "CI steps (wall time" in SCRIPT
