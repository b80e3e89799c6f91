"""No internal words in what a user reads: the project's founding documents by number ("seed 003"), issue
numbers, "the issue measured", or paths a clone does not have (the team's notes, ``../shared/data``)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
INTERNAL = re.compile(r"\bseeds? 0\d\d\b|\bissue \d+\b|the issue measured|shared/notes")
#: Pages and the package must not name the benchmark text's place on the team's machine; a benchmark may read it.
DATA_PATH = re.compile(r"\.\./shared/data")


def test_no_internal_words_in_docs_source_or_benchmarks() -> None:
    read = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")),
            *sorted((ROOT / "src" / "typed_transformer").rglob("*.py"))]
    files: list[tuple[Path, tuple[re.Pattern[str], ...]]] = [(path, (INTERNAL, DATA_PATH)) for path in read]
    files += [(path, (INTERNAL,)) for path in sorted((ROOT / "benchmarks").rglob("*.py"))]
    found = [f"{path.relative_to(ROOT)}:{number}: {match.group(0)}" for path, patterns in files
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             for pattern in patterns for match in pattern.finditer(line)]
    assert found == []
