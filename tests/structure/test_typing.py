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

from tests.support.limits import HANG_SECONDS

ROOT = Path(__file__).resolve().parents[2]
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
                            capture_output=True, text=True, cwd=tmp_path, timeout=HANG_SECONDS)
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


def _core_closure() -> list[str]:
    """The distributions a core-only install has: the project's dependencies (no extras) and theirs."""
    import importlib.metadata as metadata
    import tomllib

    from packaging.requirements import Requirement

    wanted = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["dependencies"]
    seen: dict[str, metadata.Distribution] = {}
    queue = [Requirement(text) for text in wanted]
    while queue:
        requirement = queue.pop()
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        name = requirement.name.lower().replace("_", "-")
        if name in seen:
            continue
        seen[name] = metadata.distribution(name)
        queue.extend(Requirement(text) for text in seen[name].requires or [])
    return sorted(seen)


def _core_site(folder: Path) -> Path:
    """A Python whose site-packages holds only the core's distributions (links to the installed ones)."""
    import importlib.metadata as metadata
    import venv

    venv.EnvBuilder(with_pip=False, symlinks=True).create(folder)
    site = next(folder.glob("lib/python3*/site-packages"))
    for name in _core_closure():
        distribution = metadata.distribution(name)
        tops = {Path(str(f)).parts[0] for f in distribution.files or []}
        for top in tops:
            source = Path(str(distribution.locate_file(top)))
            if top.endswith(".dist-info") or top in ("..", "bin", "__pycache__") or not source.exists():
                continue
            if not (site / top).exists():
                (site / top).symlink_to(source)
    return folder / "bin" / "python"


def test_mypy_passes_on_src_with_only_the_core_installed(tmp_path: Path) -> None:
    """A user who installs the library without extras type-checks against it: mypy on ``src/`` succeeds when
    only the core's dependencies (torch, jaxtyping, beartype, einops, numpy and what they need) are importable.
    The extras' imports (hypothesis, pytest, safetensors, tqdm, matplotlib, transformers) must not break it."""
    pytest.importorskip("mypy")
    pytest.importorskip("packaging")
    python = _core_site(tmp_path / "core")
    missing = subprocess.run([str(python), "-c", "import hypothesis"], capture_output=True, text=True)
    assert missing.returncode != 0, "the core-only environment must not see the extras"
    # The project's mypy.ini (strict), where the extras' modules may be missing. Their names are then Any, so a
    # decorator from them (hypothesis' @composite) is untyped, what they return is Any, and an ignore that the
    # real types need is unused: those three checks alone are relaxed here; the full run, with the extras
    # installed, keeps them.
    result = subprocess.run([sys.executable, "-m", "mypy", "--python-executable", str(python), "--no-error-summary",
                             "--allow-untyped-decorators", "--no-warn-return-any", "--no-warn-unused-ignores",
                             "--cache-dir", str(ROOT / ".mypy_cache" / "core-only"), "src/typed_transformer"],
                            capture_output=True, text=True, cwd=ROOT, timeout=HANG_SECONDS)
    assert result.returncode == 0, result.stdout + result.stderr
