"""Every other command output pasted in README.md and docs/: each block is a command of this checkout run in a
temporary directory, shown as ``$ command`` then what it printed (stdout and stderr together, as a terminal shows
them), with the machine, its load and the wall time stated once under it. Run on an idle machine (the speeds are
part of the figures):

    .venv/bin/python benchmarks/pasted_outputs.py --data tinyshakespeare.txt              # print every block
    .venv/bin/python benchmarks/pasted_outputs.py --data tinyshakespeare.txt --write      # and replace them
    .venv/bin/python benchmarks/pasted_outputs.py --data tinyshakespeare.txt --write bench-checks   # one block

A block stands between ``<!-- NAME:begin -->`` and ``<!-- NAME:end -->`` in its page. The text a command reads is
Tiny Shakespeare, copied into the temporary directory as ``tinyshakespeare.txt`` so that the command shown is the
command run. tests/docs/test_docs_generated.py checks that each block shows its command and that the commands and
targets it shows are ones this version has.
"""

import argparse
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, when run as a script
from benchmarks._runs import write_between

ROOT = Path(__file__).resolve().parents[1]
DATA = "tinyshakespeare.txt"


@dataclass(frozen=True)
class Block:
    """One pasted block: the commands run in order (argv as shown; ``.venv/bin/x`` and ``python`` are this
    checkout's), in ``page``; ``setup`` commands run before the command numbered ``setup_at`` and are not shown."""

    page: str
    commands: tuple[tuple[str, ...], ...]
    setup: tuple[tuple[str, ...], ...] = ()
    setup_at: int = 0
    files: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)


TRAIN = (".venv/bin/typed-transformer", "train")
BLOCKS: dict[str, Block] = {
    "bad-input": Block(
        "docs/training.md",
        # After the main job, as the README orders them (runs/gpt holds a checkpoint): --out of its own, or
        # the first line would be "runs/gpt/checkpoint.safetensors exists".
        commands=((*TRAIN, "--data", "/bin/ls", "--out", "runs/ls"),
                  (".venv/bin/typed-transformer", "generate", "--checkpoint", "runs/gpt", "--prompt", "ü€"),
                  (*TRAIN, "--config", "bad.toml")),
        setup=((*TRAIN, "--data", DATA, "--max-iters", "1", "--eval-iters", "1", "--sample-tokens", "0",
                "--no-progress"),),
        setup_at=0, files={"bad.toml": 'preset = "baby"\nn_layers = 8\n'}),
    "ddp-run": Block(
        "docs/training.md",
        commands=((".venv/bin/torchrun", "--standalone", "--nproc-per-node", "2", "-m", "typed_transformer", "train",
                   "--data", DATA, "--max-iters", "100", "--eval-interval", "50", "--sample-tokens", "120",
                   "--no-progress", "--out", "runs/ddp"),)),
    "train-table": Block("docs/training.md", commands=(("bash", "benchmarks/train_table.sh", DATA),)),
    "bench-gpt": Block("docs/lab/benchmarks.md", commands=(("python", "benchmarks/bench.py", "gpt"),)),
    "bench-checks": Block("docs/shape-checking.md", commands=(("python", "benchmarks/bench.py", "checks"),)),
    "test-count": Block("docs/testing.md", commands=(
        ("python", "-m", "pytest", "--collect-only", "-q", "tests", "property_tests"),), env={"CI": "true"}),
}


def shown(argv: tuple[str, ...]) -> str:
    return "$ " + " ".join(shlex.quote(a) if shlex.quote(a) == a else f'"{a}"' for a in argv)


def _argv(argv: tuple[str, ...], work: Path) -> list[str]:
    """What runs: this interpreter's venv for ``.venv/bin/x`` and ``python``; the checkout's scripts."""
    bin_dir = Path(sys.executable).parent
    first, *rest = argv
    if first.startswith(".venv/bin/"):
        first = str(bin_dir / first.removeprefix(".venv/bin/"))
    elif first == "python":
        first = sys.executable
    rest = [str(ROOT / a) if a.startswith("benchmarks/") else a for a in rest]
    if first == "bash":  # a script that runs from the checkout: the text by its full path
        rest = [str(work / a) if a == DATA else a for a in rest]
    if argv[:3] == ("python", "-m", "pytest"):  # the suite is collected where it lives
        rest = [*rest[:-2], str(ROOT / "tests"), str(ROOT / "property_tests")]
    return [first, *rest]


def _run(argv: tuple[str, ...], work: Path, env: dict[str, str], check: bool) -> str:
    done = subprocess.run(_argv(argv, work), cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env={**os.environ, "COLUMNS": "120", **env}, check=False)
    if check and done.returncode != 0:
        raise SystemExit(f"{shown(argv)} exited {done.returncode}:\n{done.stdout.strip()}")
    output = done.stdout.rstrip("\n")
    if argv[:3] == ("python", "-m", "pytest"):  # only the count: the list of test ids is the code itself
        output = output.splitlines()[-1].split(" in ")[0]  # "N tests collected" (the time is the machine's)
    return output.replace(str(work) + os.sep, "").replace(str(ROOT) + os.sep, "")


def run(name: str, data: Path) -> str:
    block = BLOCKS[name]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        shutil.copyfile(data, work / DATA)
        for file, text in block.files.items():
            (work / file).write_text(text, encoding="utf-8")
        lines = ["```"]
        seconds = 0.0
        for i, argv in enumerate(block.commands):
            if i == block.setup_at:
                for setup in block.setup:
                    _run(setup, work, block.env, check=True)
            start = time.perf_counter()
            lines += [shown(argv), _run(argv, work, block.env, check=name != "bad-input")]
            seconds += time.perf_counter() - start
    load = os.getloadavg()[0]
    import torch

    return "\n".join([*lines, "```", "", (
        f"Real output, made by `benchmarks/pasted_outputs.py {name}` on {os.cpu_count()} CPU cores "
        f"({platform.machine()}, torch {torch.__version__}, load average {load:.2f} when it ended): "
        f"{seconds:.0f} s wall time.")])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", choices=[[], *BLOCKS], metavar="NAME",
                        help=f"the blocks to make (default: all): {', '.join(BLOCKS)}")
    parser.add_argument("--data", type=Path, required=True, help="Tiny Shakespeare (the text the runs train on)")
    parser.add_argument("--write", action="store_true", help="replace each block in its page")
    args = parser.parse_args()
    for name in args.names or list(BLOCKS):
        text = run(name, args.data)
        print(f"== {name} ({BLOCKS[name].page})\n{text}\n", flush=True)
        if args.write:
            write_between(ROOT / BLOCKS[name].page, f"<!-- {name}:begin -->", f"<!-- {name}:end -->", text)
