"""The package as users get it: the wheel built from this checkout carries the licence pyproject.toml declares."""

import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_wheel_ships_the_mit_licence(tmp_path: Path) -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert (project["license"], project["license-files"]) == ("MIT", ["LICENSE"])
    source = tmp_path / "source"  # a copy: building in the checkout would leave build/ and *.egg-info there
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                    "--quiet", "--wheel-dir", str(tmp_path / "dist"), str(source)], check=True)
    (wheel,) = (tmp_path / "dist").glob("typed_transformer-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        licences = [name for name in archive.namelist() if name.endswith(".dist-info/licenses/LICENSE")]
        assert len(licences) == 1, archive.namelist()
        assert archive.read(licences[0]) == (ROOT / "LICENSE").read_bytes()
        metadata = archive.read(next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    assert "License-Expression: MIT" in metadata
    assert "License-File: LICENSE" in metadata
    assert "Copyright (c) 2026 the typed-transformer authors" in (ROOT / "LICENSE").read_text()
