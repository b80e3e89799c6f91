"""Rewrite the printed reports of docs/audit.md from fresh runs of the page's own examples.

    python benchmarks/audit_docs_tables.py            # rewrite docs/audit.md in place
    python benchmarks/audit_docs_tables.py --check    # exit 1 (and name the blocks) when a report is out of date
                                                      # (the checks' ratios aside: they vary by CPU)

Every ``python`` block of the page runs in order in one namespace, as a reader (and tests/docs/test_docs_examples.py)
runs them; a ``text`` block right after a block that prints becomes what it printed. A ``bash`` block of
``$ typed-transformer audit ...`` lines becomes each command, its output and its exit status (``[exit N]``), run
with this interpreter from the repository root. Blocks between ``<!-- begin: ... -->`` and ``<!-- end: ... -->``
markers belong to the script named there: their examples run (later ones may use them), their text is left
alone; a block marked ``skip: next`` (a library installed elsewhere) is neither run nor rewritten. Takes a few
minutes (every example audits a module).
"""

import argparse
import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "audit.md"
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", re.MULTILINE | re.DOTALL)
_MARKED = re.compile(r"<!-- begin: .*?<!-- end: [^>]*-->", re.DOTALL)
#: the ``skip: next`` directive right above a block (tests/docs/test_docs_examples.py skips it the same way)
_SKIPPED = re.compile(r"<!--\s*skip:\s*next\b[^\n]*-->\s*\Z")


def _command(line: str) -> str:
    """``$ typed-transformer audit ...`` run with this interpreter: its stdout, its one-line errors, its status."""
    argv = shlex.split(line.removeprefix("$ "))
    path = os.pathsep.join([str(REPO / "src"), str(REPO)])  # this checkout's sources, not an installed copy
    process = subprocess.run([sys.executable, "-m", "typed_transformer", *argv[1:]], cwd=REPO, capture_output=True,
                             text=True, env={**os.environ, "PYTHONPATH": path}, check=False)
    errors = [err for err in process.stderr.splitlines() if err.startswith("typed-transformer:")]
    return "\n".join([line, *process.stdout.rstrip("\n").splitlines(), *errors, f"[exit {process.returncode}]"])


def regenerate(text: str, compare: Callable[[str], str] = str) -> tuple[str, list[str]]:
    """The page with every printed report rewritten, and the first line of each block that changed (as seen
    through ``compare``: ``--check`` leaves the checks' ratios out, which vary by CPU)."""
    marked = [(m.start(), m.end()) for m in _MARKED.finditer(text)]
    namespace: dict[str, object] = {"__name__": "__main__"}
    pieces, changed, position, printed = [], [], 0, ""
    for match in _FENCE.finditer(text):
        language, body = match.group(1), match.group(2)
        # a block the docs tests skip too (its library is installed by benchmarks/library_envs.sh, not here): kept
        skipped = _SKIPPED.search(text, 0, match.start()) is not None
        if skipped or any(start <= match.start() < end for start, end in marked):  # another script's: run, keep
            if language == "python" and not skipped:
                with contextlib.redirect_stdout(io.StringIO()):
                    exec(compile(body, str(PAGE), "exec"), namespace)
            printed = ""
            continue
        between = text[position:match.start()]
        replacement = body
        if language == "python":
            buffer = io.StringIO()
            with contextlib.redirect_stdout(buffer):
                exec(compile(body, str(PAGE), "exec"), namespace)  # the page's own example
            printed = buffer.getvalue()
        elif language == "text" and printed and not between.strip():
            replacement = printed if printed.endswith("\n") else printed + "\n"
            printed = ""
        elif language == "bash" and body.startswith("$ typed-transformer audit"):
            commands = [line for line in body.splitlines() if line.startswith("$ ")]
            replacement = "\n".join(_command(line) for line in commands) + "\n"
        else:
            printed = ""
        if language != "python" and compare(replacement) != compare(body):
            changed.append(body.splitlines()[0] if body else language)
        pieces += [between, f"```{language}\n{replacement}```\n"]
        position = match.end()
    pieces.append(text[position:])
    return "".join(pieces), changed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only say whether the page is up to date")
    args = parser.parse_args()
    text = PAGE.read_text(encoding="utf-8")
    import torch

    torch.manual_seed(0)  # as tests/docs/test_docs_examples.py runs the page
    with tempfile.TemporaryDirectory() as scratch, contextlib.chdir(scratch):  # examples that write files
        sys.path.insert(0, str(REPO))
        from benchmarks.audit_infer_docs import without_ratios

        new, changed = regenerate(text, without_ratios if args.check else str)
    for first in changed:
        print(f"{'out of date' if args.check else 'rewritten'}: {first[:100]}")
    if args.check:
        return 1 if changed else 0
    PAGE.write_text(new, encoding="utf-8")
    print(f"docs/audit.md: {len(changed)} printed reports rewritten")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
