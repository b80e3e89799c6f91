"""The main job's output shown in README.md and docs/training.md: ``typed-transformer train`` with no flags, run in a
temporary directory with the checkout's ``.venv``, printed as ``$ command`` then its output, with the wall time and
the machine's load stated once; then the README's ``generate`` command on that run's checkpoint (its output in
docs/training.md) and the README's ``attention`` command on it (docs/img/attention.png). Run it on an idle machine
(the wall time and the throughput are part of the figure):

    .venv/bin/python benchmarks/readme_main_job.py            # print the blocks
    .venv/bin/python benchmarks/readme_main_job.py --write    # and replace them in the pages, and the picture

tests/docs/test_docs_generated.py checks that the blocks have the lines the commands print today, in their order, and
that the pages show the README's commands.
"""

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, when run as a script
from benchmarks._runs import write_between

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "docs" / "training.md"]
BEGIN, END = "<!-- main-job:begin -->", "<!-- main-job:end -->"
#: The README's generate command on the main job's checkpoint; its output is shown in docs/training.md.
GENERATE = ["generate", "--checkpoint", "runs/gpt", "--prompt", "def ", "--max-new-tokens", "200"]
GENERATE_PAGE = ROOT / "docs" / "training.md"
GENERATE_BEGIN, GENERATE_END = "<!-- main-job-generate:begin -->", "<!-- main-job-generate:end -->"
#: The README's attention command, drawn small enough to ship (docs/attention-maps.md says so).
ATTENTION = ["attention", "--checkpoint", "runs/gpt", "--text", "def main():", "--out", "attention.png",
             "--panel-size", "1.8", "--dpi", "80"]
PICTURE = ROOT / "docs" / "img" / "attention.png"


def shown(argv: list[str]) -> str:
    """``argv`` as the README spells it (``.venv/bin/typed-transformer ...``, shell-quoted where needed)."""
    import shlex

    return " ".join(["$ .venv/bin/typed-transformer", *(f'"{a}"' if shlex.quote(a) != a else a for a in argv)])


def _command(work: str, argv: list[str]) -> subprocess.CompletedProcess[str]:
    executable = Path(sys.executable).with_name("typed-transformer")
    done = subprocess.run([str(executable), *argv], cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, env={**os.environ, "COLUMNS": "120"}, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{argv[0]} exited {done.returncode}: {done.stdout.strip()}")
    return done


def run(picture: Path | None = None) -> tuple[str, str]:
    """The main job's block and the generate block; the attention maps copied to ``picture`` when given."""
    with tempfile.TemporaryDirectory() as work:
        start = time.perf_counter()
        done = _command(work, ["train"])
        seconds = time.perf_counter() - start
        load = os.getloadavg()[0]
        sampled = _command(work, GENERATE)
        _command(work, ATTENTION)
        if picture is not None:
            shutil.copyfile(Path(work) / "attention.png", picture)
    generated = "\n".join(["```", shown(GENERATE), sampled.stdout.rstrip("\n"), "```", "", "Real output, made by "
                           "`benchmarks/readme_main_job.py` from the checkpoint of the run above."])
    return "\n".join([
        "```",
        "$ .venv/bin/typed-transformer train",
        done.stdout.rstrip("\n"),
        "```",
        "",
        f"Real output, made by `benchmarks/readme_main_job.py` on {os.cpu_count()} CPU cores ({platform.machine()}, "
        f"torch {_torch_version()}, load average {load:.2f} when it ended): {seconds / 60:.0f} min "
        f"{seconds % 60:.0f} s wall time, start-up, evaluations, the save, the plot and the sample included.",
    ]), generated


def _torch_version() -> str:
    import torch

    return torch.__version__


def write(block: str, generated: str) -> None:
    for page in PAGES:
        write_between(page, BEGIN, END, block)
    write_between(GENERATE_PAGE, GENERATE_BEGIN, GENERATE_END, generated)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true",
                        help="replace the blocks in README.md and docs/training.md, and docs/img/attention.png")
    args = parser.parse_args()
    block, generated = run(PICTURE if args.write else None)
    print(block)
    print(generated)
    if args.write:
        write(block, generated)
