"""Runs docs/audit.md's pytest example (three candidates: a correct textbook attention, one scaled by 1/d, one that
ignores its mask) as a user's suite would, and prints what each candidate got, the first line of each failing
candidate's first failure, and the wall time; with ``--load N``, the same run again beside N busy processes.

    python benchmarks/audit_pytest.py                 # idle (target: under 60 s on 2 cores)
    python benchmarks/audit_pytest.py --load 10       # and at load 10 (target: under 3x the idle time)
    python benchmarks/audit_pytest.py --write         # also writes the printed block into docs/audit.md

The example is read from the page (the python block after ``<!-- pytest example -->``), so the page's example is
what runs; tests/docs/test_audit_pytest_example.py runs it the same way.
"""

import argparse
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "audit.md"
MARK = "<!-- pytest example -->"
BEGIN = "<!-- pytest example output: benchmarks/audit_pytest.py --write -->"
END = "<!-- end of pytest example output -->"
CANDIDATES = ("test_correct", "test_wrong_scale", "test_ignores_mask")


def example() -> str:
    """The python block that follows the marker on the page."""
    text = PAGE.read_text()
    found = re.search(re.escape(MARK) + r"\s*```python\n(.*?)```", text, re.S)
    if found is None:
        raise SystemExit(f"{PAGE}: no python block after {MARK}")
    return found.group(1)


def run(folder: Path) -> tuple[float, str]:
    """pytest over the example in ``folder``: (wall seconds, its output)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                           "test_attention_audit.py"], cwd=folder, env=env, capture_output=True, text=True,
                          check=False)
    return time.perf_counter() - start, done.stdout + done.stderr


def summary(output: str) -> dict[str, dict[str, object]]:
    """Per candidate: items passed and failed, and the first line of its first failure."""
    result: dict[str, dict[str, object]] = {}
    for name in CANDIDATES:
        failed = re.findall(rf"^FAILED test_attention_audit\.py::{name}\[(\w+)\]", output, re.M)
        first = re.search(rf"_+ {name}\[\w+\] _+\n(.+)", output)
        result[name] = {"failed": len(failed), "first": first.group(1).strip() if first else ""}
    total = re.search(r"(\d+) failed, (\d+) passed|(\d+) passed", output)
    result["total"] = {"line": total.group(0) if total else output.strip().splitlines()[-1]}
    return result


def _busy() -> None:  # pragma: no cover - a load generator
    while True:
        pass


def block(found: dict[str, dict[str, object]], seconds: float) -> str:
    lines = [f"pytest test_attention_audit.py: {found['total']['line']} in {seconds:.0f} s "
             f"(2 idle cores, one process)"]
    for name in CANDIDATES:
        failed, first = found[name]["failed"], found[name]["first"]
        lines.append(f"{name}: " + ("green" if not failed else f"red, {failed} items; first failure: {first}"))
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--load", type=int, default=0, help="also run beside this many busy processes")
    parser.add_argument("--write", action="store_true", help="write the idle run's block into docs/audit.md")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "test_attention_audit.py").write_text(example())
        seconds, output = run(folder)
        found = summary(output)
        text = block(found, seconds)
        print(text)
        if args.load:
            procs = [multiprocessing.Process(target=_busy, daemon=True) for _ in range(args.load)]
            for p in procs:
                p.start()
            try:
                loaded, output = run(folder)
            finally:
                for p in procs:
                    p.terminate()
            print(f"at load {args.load}: {summary(output)['total']['line']} in {loaded:.0f} s "
                  f"({loaded / seconds:.1f}x the idle run)")
    if args.write:
        page = PAGE.read_text()
        start, end = page.index(BEGIN) + len(BEGIN), page.index(END)
        PAGE.write_text(page[:start] + "\n```text\n" + text + "\n```\n" + page[end:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
