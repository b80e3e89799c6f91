"""Every case of docs/reliability.md's "Every case tried": each bad argument, file, checkpoint, directory, signal
and process fault, run through the real command line; the tables show its exit code and the last line it printed
on stderr.

    .venv/bin/python benchmarks/reliability_cases.py            # print the tables
    .venv/bin/python benchmarks/reliability_cases.py --write    # and replace them in docs/reliability.md

Runs in a temporary directory (so that the paths it prints are short) with this checkout's command, about 5
minutes on 2 cores. As root, the read-only and unreadable cases run as the unprivileged user ``nobody`` (root
reads and writes anything) and the full-disk case mounts a 12 MB tmpfs; without root those rows say so.
"""

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, when run as a script
from benchmarks._runs import torchrun_workers, write_between

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "reliability.md"
BEGIN, END = "<!-- reliability-cases:begin -->", "<!-- reliability-cases:end -->"
#: The tiny-run flags, shown as ``...`` in the tables.
TINY = ["--block-size", "8", "--eval-interval", "5", "--eval-iters", "2", "--batch-size", "4", "--sample-tokens",
        "0", "--no-progress"]
LONG = ["--max-iters", "100000", "--checkpoint-interval", "1000"]
#: The tiny encoder-decoder's flags (train-seq2seq), shown as ``...`` in the tables too.
S2S_TINY = ["--d-model", "16", "--nhead", "2", "--layers", "1", "--dim-feedforward", "32", "--batch-size", "16",
            "--eval-pairs", "20", "--max-len", "4", "--no-progress"]
NOBODY = 65534
#: Imports what the commands need, then (as root) becomes ``nobody``, then runs the command line on sys.argv.
AS_NOBODY = f"""
import os, sys
import matplotlib.pyplot, numpy, safetensors.torch, torch, tqdm
import typed_transformer.checkpoint, typed_transformer.cli, typed_transformer.training
if os.geteuid() == 0:
    os.setgid({NOBODY}); os.setuid({NOBODY})
sys.exit(typed_transformer.cli.main(sys.argv[1:]))
"""
#: The learning rate replaced by 1e30 from iteration 10 (--lr refuses it), then the command line.
DIVERGING = """
import sys
import typed_transformer.training as training
from typed_transformer.cli import main
real = training.gpt_learning_rate
training.gpt_learning_rate = lambda config, iteration: 1e30 if iteration >= 10 else real(config, iteration)
sys.exit(main(sys.argv[1:]))
"""
#: A command stuck in one torch kernel of hours that never looks for signals (as attention over a 200,000-character
#: pair was): ``ready`` on stdout once the main thread has been inside the kernel for half a second.
STUCK = """
import sys, threading, time
import typed_transformer.cli as cli
entering = threading.Event()
def say_ready():
    entering.wait()
    time.sleep(0.5)
    print("ready", flush=True)
def stuck(args):
    import torch
    ones = torch.ones(1).expand(2**50)
    threading.Thread(target=say_ready, daemon=True).start()
    entering.set()
    return float(ones.sum())
cli._run_training_command = stuck
sys.exit(cli.main(sys.argv[1:]))
"""
#: The audit's candidates (modules in the lab's directory, which the audit imports from).
CANDIDATES = {
    "exits0.py": "import sys\n\ndef attention(q, k, v, *, attn_mask=None, is_causal=False):\n    sys.exit(0)\n",
    "hangs.py": "import time\n\ndef attention(q, k, v, *, attn_mask=None, is_causal=False):\n    while True:\n"
                "        time.sleep(0.01)\n",
    "inplace.py": "from typed_transformer.attention import scaled_dot_product_attention\n\n"
                  "def attention(q, k, v, *, attn_mask=None, is_causal=False):\n"
                  "    out = scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)\n"
                  "    q.mul_(2)  # the right answer, then the query doubled in place\n    return out\n",
}
#: safetensors made impossible to import (a core install), then the command line.
WITHOUT_SAFETENSORS = """
import sys
sys.modules['safetensors'] = None
from typed_transformer.cli import main
sys.exit(main(sys.argv[1:]))
"""


@dataclass
class Outcome:
    code: int
    stderr: str
    note: str = ""  # what else the row must say (a file left untouched, the lines torchrun added)
    stdout: str = ""


@dataclass
class Case:
    section: str
    name: str
    argv: list[str]  # after ``typed-transformer``
    run: Callable[["Lab", "Case"], Outcome] | None = None  # default: the command as it is
    shown: str = ""  # the command column, when not ``typed-transformer ARGV``


def _default_signals() -> None:
    for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(number, signal.SIG_DFL)


class Lab:
    """The temporary directory of the cases, with the files they need."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.executable = str(Path(sys.executable).with_name("typed-transformer"))
        self.env = {**os.environ, "COLUMNS": "120", "PYTHONPATH": os.pathsep.join(
            [str(ROOT / "src"), *filter(None, [os.environ.get("PYTHONPATH")])])}

    def command(self, argv: list[str], *, prelude: str | None = None) -> list[str]:
        return [sys.executable, "-c", prelude, *argv] if prelude else [self.executable, *argv]

    def run(self, argv: list[str], *, prelude: str | None = None, preexec: Callable[[], None] | None = None,
            timeout: float = 600, stdin: str | None = None) -> Outcome:
        """The command, its stdin the file ``stdin`` of the lab (else this script's)."""
        with open(self.work / stdin, "rb") if stdin is not None else contextlib.nullcontext() as given:
            done = subprocess.run(self.command(argv, prelude=prelude), cwd=self.work, capture_output=True, text=True,
                                  env=self.env, preexec_fn=preexec, timeout=timeout, check=False, stdin=given)
        return Outcome(done.returncode, done.stderr, stdout=done.stdout)

    def start(self, argv: list[str]) -> subprocess.Popen[str]:
        """Start the command with the default action of every signal the cases send (this script may run
        under ``nohup`` or in the background, where SIGHUP or SIGINT are ignored and children inherit that)."""
        return subprocess.Popen(self.command(argv), cwd=self.work, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=self.env, preexec_fn=_default_signals)

    def copy_run(self, name: str) -> Path:
        target = self.work / name
        shutil.copytree(self.work / "run", target)
        return target


# -- setting up ---------------------------------------------------------------------------------------------------


def prepare(lab: Lab) -> None:
    """``input.txt`` (20,000 characters of Python's standard-library source), a finished 10-iteration ``run``,
    the bad text files and the re-signed checkpoints."""
    from typed_transformer.data import default_corpus

    work = lab.work
    text, _ = default_corpus()
    (work / "input.txt").write_text(text[:20000], encoding="utf-8")
    made = lab.run(["train", "--data", "input.txt", "--max-iters", "10", *TINY, "--out", "run"])
    if made.code != 0:
        raise SystemExit(f"the 10-iteration run failed:\n{made.stderr}")
    (work / "dir").mkdir()
    (work / "binary.bin").write_bytes(b"abc\0def" * 100)
    (work / "latin1.txt").write_bytes("café au lait\n".encode("latin-1") * 100)
    (work / "empty.txt").write_text("", encoding="utf-8")
    (work / "short.txt").write_text("abcdefgh", encoding="utf-8")
    (work / "reversed.txt").write_text(text[:20000][::-1], encoding="utf-8")
    (work / "longer.txt").write_text(text[:20001], encoding="utf-8")
    (work / "afile").write_text("a file\n", encoding="utf-8")
    (work / "victim.txt").write_text("the victim's content\n", encoding="utf-8")
    os.mkfifo(work / "fifo.safetensors")
    os.mkfifo(work / "fifo.txt")
    os.mkfifo(work / "fifo.toml")
    (work / "empty-run").mkdir()
    (work / "exits.py").write_text("import sys\nsys.exit(3)\n", encoding="utf-8")
    write_corrupt_checkpoints(work)
    prepare_seq2seq(lab)


def prepare_seq2seq(lab: Lab) -> None:
    """``s2s``, a 4-iteration run of the reversal task; the pairs files and stdin files of the seq2seq cases;
    ``junk.safetensors``, ``s2s``'s checkpoint with an extra tensor ``junk.x`` (re-signed)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from typed_transformer.run_files import content_digest

    work = lab.work
    for name, text in CANDIDATES.items():
        (work / name).write_text(text, encoding="utf-8")
    made = lab.run(["train-seq2seq", *S2S_TINY, "--max-iters", "4", "--out", "s2s"])
    if made.code != 0:
        raise SystemExit(f"the seq2seq run failed:\n{made.stderr}")
    words = [f"{a}{b}{c}" for a in "abc" for b in "abc" for c in "ab"]
    (work / "odd.tsv").write_text("".join(f"{w}\t{w[::-1]}\n" for w in words[:-1])
                                  + f"{words[-1]}\u2028\x85\x0c\t{words[-1][::-1]}\n", encoding="utf-8")
    (work / "long.tsv").write_text("".join(f"{w}\t{w[::-1]}\n" for w in words) + "ab" * 300 + "\tba\n",
                                   encoding="utf-8")
    (work / "crlf.txt").write_bytes(b"0123\r\n\r\n31\r\n")
    (work / "notutf8.txt").write_bytes(b"12\n3\xff1\n")
    (work / "longsource.txt").write_text("12\n" + "0123456789" * 60 + "\n", encoding="utf-8")
    (work / "outside.json").write_text("not train-seq2seq's\n", encoding="utf-8")
    with safe_open(str(work / "s2s" / "checkpoint.safetensors"), framework="pt") as handle:
        tensors = {k: handle.get_tensor(k) for k in handle.keys()}  # noqa: SIM118
        metadata = dict(handle.metadata())
    tensors["junk.x"] = torch.zeros(2)
    metadata["sha256"] = content_digest(tensors, metadata)
    save_file(tensors, str(work / "junk.safetensors"), metadata=metadata)


Change = Callable[[dict[str, torch.Tensor], dict[str, str]], object]


def _retype(name: str, dtype: torch.dtype) -> Change:
    return lambda tensors, metadata: tensors.update({name: tensors[name].to(dtype)})


def write_corrupt_checkpoints(work: Path) -> None:
    """Damaged and edited copies of ``run``'s checkpoint; the re-signed ones carry a valid hash, so only the field
    validation can refuse them."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from typed_transformer.run_files import content_digest

    source = work / "run" / "checkpoint.safetensors"

    def rewrite(target: str, change: Change, sign: bool = True) -> None:
        with safe_open(str(source), framework="pt") as handle:
            tensors = {k: handle.get_tensor(k) for k in handle.keys()}  # noqa: SIM118
            metadata = dict(handle.metadata())
        change(tensors, metadata)
        if sign:
            metadata["sha256"] = content_digest(tensors, metadata)
        save_file(tensors, str(work / target), metadata=metadata)

    def meta(key: str, value: object) -> Change:
        return lambda t, m: m.update({key: value if isinstance(value, str) else json.dumps(value)})

    def model_config(**fields: object) -> Change:
        return lambda t, m: m.update(model_config=json.dumps({**json.loads(m["model_config"]), **fields}))

    def nan(t: dict[str, torch.Tensor], m: dict[str, str]) -> None:
        t["model.ln_f.weight"] = t["model.ln_f.weight"].clone()
        t["model.ln_f.weight"][0] = float("nan")

    def exploded(t: dict[str, torch.Tensor], m: dict[str, str]) -> None:
        for name in t:
            if name.startswith("model."):
                t[name] = t[name] * 1e30

    data = bytearray(source.read_bytes())
    data[-100] ^= 0xFF  # a byte of the last tensor
    (work / "flipped.safetensors").write_bytes(bytes(data))
    (work / "truncated.safetensors").write_bytes(source.read_bytes()[: source.stat().st_size // 2])
    save_file({"x": torch.zeros(2)}, str(work / "other.safetensors"), metadata={"format": "pt"})
    rewrite("edited.safetensors", meta("iteration", "11"), sign=False)
    rewrite("nan.safetensors", nan)
    rewrite("iter.safetensors", meta("iteration", "-5"))
    rewrite("history.safetensors", meta("history", [{"iter": 5}, {"iter": 2}]))
    rewrite("config.safetensors", lambda t, m: m.update(train_config=json.dumps(
        {**json.loads(m["train_config"]), "speed": "fast"})))
    rewrite("rng.safetensors", lambda t, m: t.update({"rng.torch": t["rng.torch"][:100].clone()}))
    rewrite("optim.safetensors", lambda t, m: t.pop("optim.0.exp_avg"))
    rewrite("bias.safetensors", model_config(bias="no"))
    rewrite("exploded.safetensors", exploded)
    rewrite("int32.safetensors", _retype("model.ln_f.weight", torch.int32))
    rewrite("step.safetensors", _retype("optim.0.step", torch.int64))
    rewrite("adam.safetensors", lambda t, m: t.update({"optim.1.exp_avg_sq": -t["optim.1.exp_avg_sq"] - 1.0}))
    rewrite("layers.safetensors", model_config(n_layer=2000))
    unreadable = work / "unreadable"
    unreadable.mkdir()
    shutil.copy(source, unreadable / "checkpoint.safetensors")
    os.chmod(unreadable / "checkpoint.safetensors", 0o600 if os.geteuid() == 0 else 0o000)


# -- the cases that need more than one command ----------------------------------------------------------------------


def resumed_from(checkpoint: str) -> Callable[[Lab, Case], Outcome]:
    """``train --resume`` into a directory (named by the case's --out) holding the checkpoint file ``checkpoint``."""
    def run(lab: Lab, case: Case) -> Outcome:
        out = lab.work / case.argv[case.argv.index("--out") + 1]
        out.mkdir()
        if (lab.work / checkpoint).is_fifo():
            os.mkfifo(out / "checkpoint.safetensors")
        else:
            shutil.copy(lab.work / checkpoint, out / "checkpoint.safetensors")
        return lab.run(case.argv)
    return run


def copy_of_run(lab: Lab, case: Case) -> Outcome:
    lab.copy_run(case.argv[case.argv.index("--out") + 1])
    return lab.run(case.argv)


def lock_is(kind: str) -> Callable[[Lab, Case], Outcome]:
    def run(lab: Lab, case: Case) -> Outcome:
        lock = lab.copy_run(case.argv[case.argv.index("--out") + 1]) / ".lock"
        if kind == "link":
            lock.symlink_to(Path("..") / "victim.txt")
        elif kind == "directory":
            lock.mkdir()
        else:
            os.mkfifo(lock)
        outcome = lab.run(case.argv)
        if kind == "link":
            content = (lab.work / "victim.txt").read_text(encoding="utf-8")
            outcome.note = f"victim.txt unchanged ({content.strip()!r})"
        return outcome
    return run


def as_nobody(setup: Callable[[Lab], None]) -> Callable[[Lab, Case], Outcome]:
    """The command as the unprivileged user ``nobody`` (as root; otherwise as the user, for whom the file modes
    already hold)."""
    def run(lab: Lab, case: Case) -> Outcome:
        setup(lab)
        if os.geteuid() == 0:
            os.chmod(lab.work, 0o755)
        return lab.run(case.argv, prelude=AS_NOBODY)
    return run


def private_directory(lab: Lab) -> None:
    private = lab.work / "private"
    private.mkdir()
    shutil.copy(lab.work / "run" / "checkpoint.safetensors", private)
    os.chmod(private, 0o700 if os.geteuid() == 0 else 0o000)


def read_only_out(lab: Lab) -> None:
    (lab.work / "ro").mkdir(mode=0o555)
    os.chmod(lab.work / "ro", 0o555)


def small_disk(lab: Lab, case: Case) -> Outcome:
    small = lab.work / "small"
    small.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=12m", "tmpfs", str(small)], capture_output=True,
                             check=False)
    if mounted.returncode != 0:
        return Outcome(-1, "", "not run: mounting a tmpfs needs root")
    try:
        return lab.run(case.argv)
    finally:
        subprocess.run(["umount", str(small)], check=True)


def file_size_limit(lab: Lab, case: Case) -> Outcome:
    import resource

    lab.copy_run("o2")
    limit = 5000 * 1024
    return lab.run(case.argv, preexec=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)))


def busy(lab: Lab, case: Case) -> Outcome:
    lab.copy_run("busy")
    first = lab.start(["train", "--data", "input.txt", "--resume", *LONG, *TINY, "--out", "busy"])
    try:
        assert first.stderr is not None
        for line in first.stderr:  # the first run trains (it holds the lock) before the second starts
            if line.startswith("iter"):
                break
        return lab.run(case.argv)
    finally:
        first.kill()
        first.communicate()


def diverging(lab: Lab, case: Case) -> Outcome:
    lab.copy_run("g1")
    return lab.run(case.argv, prelude=DIVERGING)


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def signalled(*signals: int, after: str | float | None = "iter") -> Callable[[Lab, Case], Outcome]:
    """Start the command; send ``signals`` (0.1 s apart) once a line starting with ``after`` is printed on
    stderr, or once it has used ``after`` seconds of CPU time (generate prints at the end: by 10 s it has
    imported torch, loaded the checkpoint and is generating), or (None) 0.3 s after the start, while torch is
    being imported."""
    def run(lab: Lab, case: Case) -> Outcome:
        process = lab.start(case.argv)
        if after is None:
            time.sleep(0.3)
        elif isinstance(after, float):
            while process.poll() is None and _cpu_seconds(process.pid) < after:
                time.sleep(0.1)
        else:
            assert process.stderr is not None
            for line in process.stderr:
                if line.startswith(after):
                    break
        for number in signals:
            process.send_signal(number)
            time.sleep(0.1)
        _, stderr = process.communicate(timeout=300)
        return Outcome(process.returncode, stderr)
    return run


def torchrun(argv: list[str]) -> list[str]:
    return [str(Path(sys.executable).with_name("torchrun")), "--standalone", "--nproc-per-node", "2", "-m",
            "typed_transformer", *argv]


def _ours(stderr: str) -> tuple[str, str]:
    """(our lines, what torchrun added) of a torchrun run's stderr."""
    ours = [line for line in stderr.splitlines() if line.startswith("typed-transformer")]
    traceback = "a `ChildFailedError` traceback" if "ChildFailedError" in stderr else "no traceback"
    gloo = " and a gloo traceback" if any(line.startswith("[rank") for line in stderr.splitlines()) else ""
    return "\n".join(ours), f"{len(ours)} line(s) of ours; then torchrun's own report ({traceback}{gloo})"


def torchrun_refusal(lab: Lab, case: Case) -> Outcome:
    lab.copy_run("main-job")
    done = subprocess.run(torchrun(case.argv), cwd=lab.work, capture_output=True, text=True, env=lab.env,
                          timeout=600, check=False)
    ours, note = _ours(done.stderr)
    return Outcome(done.returncode, ours, note)


def torchrun_killed(rank: int) -> Callable[[Lab, Case], Outcome]:
    """Two processes, a checkpoint every 20 iterations; ``kill -9`` of rank ``rank`` after the first save."""
    def run(lab: Lab, case: Case) -> Outcome:
        out = lab.work / case.argv[case.argv.index("--out") + 1]
        launcher = subprocess.Popen(torchrun(case.argv), cwd=lab.work, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, env=lab.env)
        try:
            deadline = time.monotonic() + 300
            while not (out / "checkpoint.safetensors").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(1.0)  # a few steps past the save
            os.kill(torchrun_workers(launcher.pid)[rank], signal.SIGKILL)
            _, stderr = launcher.communicate(timeout=300)
        finally:
            if launcher.poll() is None:
                launcher.kill()
                launcher.wait()
        ours, note = _ours(stderr)
        return Outcome(launcher.returncode, ours, note)
    return run


def audit_exit(lab: Lab, case: Case) -> Outcome:
    return lab.run(case.argv)


def audit_report(lab: Lab, case: Case) -> Outcome:
    """The audit's FAIL line (its report is on stdout; stderr stays empty), the report's length beside it."""
    outcome = lab.run(case.argv)
    fails = [line for line in outcome.stdout.splitlines() if "FAIL" in line]
    if outcome.stderr.strip() or not fails:
        raise RuntimeError(f"expected a FAIL line on stdout and nothing on stderr:\n{outcome.stdout}{outcome.stderr}")
    lines = len(outcome.stdout.splitlines())
    return Outcome(outcome.code, fails[0], f"the report's FAIL line, on stdout ({lines} line(s) of report); "
                   "stderr empty")


def pairs_kept(lab: Lab, case: Case) -> Outcome:
    """train-seq2seq on ``odd.tsv``: every line one pair, the unusual characters in the vocabulary."""
    from typed_transformer.seq2seq_data import read_pairs
    from typed_transformer.seq2seq_training import load_seq2seq

    outcome = lab.run(case.argv)
    path = lab.work / case.argv[case.argv.index("--data") + 1]
    lines = path.read_bytes().count(b"\n")
    chars = load_seq2seq(lab.work / case.argv[case.argv.index("--out") + 1]).vocab.chars
    held = [f"U+{ord(c):04X}" for c in "\u2028\x85\x0c" if c in chars]
    outcome.note = (f"{len(read_pairs(path))} pairs from the file's {lines} lines; the vocabulary holds "
                    f"{', '.join(held)}")
    return outcome


def stdin_from(name: str | None) -> Callable[[Lab, Case], Outcome]:
    """The command with stdin the lab's file ``name``, or (None) closed, as ``<&-`` closes it."""
    def run(lab: Lab, case: Case) -> Outcome:
        if name is None:
            return lab.run(case.argv, preexec=lambda: os.close(0))
        outcome = lab.run(case.argv, stdin=name)
        outcome.note = f"stdout: {len(outcome.stdout.splitlines())} translation(s)" if outcome.code == 0 else ""
        return outcome
    return run


def config_link(lab: Lab, case: Case) -> Outcome:
    out = lab.work / case.argv[case.argv.index("--out") + 1]
    out.mkdir()
    (out / "config.json").symlink_to(Path("..") / "outside.json")
    outcome = lab.run(case.argv)
    content = (lab.work / "outside.json").read_text(encoding="utf-8")
    kind = "a symbolic link" if (out / "config.json").is_symlink() else "a file"
    outcome.note = f"outside.json unchanged ({content.strip()!r}); {out.name}/config.json now {kind}"
    return outcome


def edited_data(lab: Lab, case: Case) -> Outcome:
    """Train 2 iterations on ``edited.tsv``, swap two characters of a target (the same characters), resume."""
    data = lab.work / "edited.tsv"
    data.write_text((lab.work / "odd.tsv").read_text(encoding="utf-8"), encoding="utf-8")
    first = lab.run([*case.argv[:case.argv.index("--resume")], *case.argv[case.argv.index("--resume") + 1:]])
    if first.code != 0:
        raise RuntimeError(f"the first run failed:\n{first.stderr}")
    data.write_text(data.read_text(encoding="utf-8").replace("aab\tbaa", "aab\taba", 1), encoding="utf-8")
    return lab.run(case.argv)


def stuck_then_sigterm(lab: Lab, case: Case) -> Outcome:
    """The command stuck in one long torch call, SIGTERM once it is in it; the note says how soon it ended."""
    process = subprocess.Popen(lab.command(case.argv, prelude=STUCK), cwd=lab.work, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=lab.env, preexec_fn=_default_signals)
    try:
        assert process.stdout is not None
        if process.stdout.readline() != "ready\n":
            raise RuntimeError("the stuck command did not say ready")
        sent = time.monotonic()
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=300)
        took = time.monotonic() - sent
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return Outcome(process.returncode, stderr, f"ended {took:.1f} s after the signal")


def killed_and_resumed(lab: Lab, case: Case) -> Outcome:
    """An uninterrupted run; the same run killed (kill -9) once its first checkpoint is on disk, then resumed;
    the note compares the two checkpoints tensor by tensor. One thread: with ``--threads auto`` two runs repeat
    each other only under the same step times (docs/reliability.md; the tests inject them)."""
    from typed_transformer.seq2seq_training import load_seq2seq

    out = case.argv.index("--out") + 1
    straight = [*case.argv[:out], "k-whole", *case.argv[out + 1:]]
    straight.remove("--resume")
    fresh = [word for word in case.argv if word != "--resume"]
    whole = lab.run(straight)
    if whole.code != 0:
        raise RuntimeError(f"the uninterrupted run failed:\n{whole.stderr}")
    checkpoint = lab.work / case.argv[out] / "checkpoint.safetensors"
    process = lab.start(fresh)
    while not checkpoint.exists() and process.poll() is None:
        time.sleep(0.01)
    process.kill()
    process.communicate()
    if process.returncode != -signal.SIGKILL:
        raise RuntimeError(f"the run ended before it was killed (exit {process.returncode})")
    killed_at = load_seq2seq(checkpoint).iteration
    outcome = lab.run(case.argv)
    a, b = load_seq2seq(lab.work / "k-whole"), load_seq2seq(checkpoint)
    weights = a.model.state_dict()
    equal = sum(torch.equal(value, b.model.state_dict()[name]) for name, value in weights.items())
    same = "equal" if a.history == b.history else "different"
    outcome.note = (f"killed after the checkpoint of iteration {killed_at}; {equal} of {len(weights)} tensors "
                    f"bit-identical to the uninterrupted run's, histories {same}")
    return outcome


def without_safetensors(lab: Lab, case: Case) -> Outcome:
    outcome = lab.run(case.argv, prelude=WITHOUT_SAFETENSORS)
    outcome.stderr = outcome.stderr.replace(f"'{ROOT}[", "'.[")  # the checkout, as a clone names it
    return outcome


# -- the cases ----------------------------------------------------------------------------------------------------


def _quote(word: str) -> str:
    """``word`` as a shell command shows it."""
    return word if word and all(c.isalnum() or c in "-_./:=" for c in word) else f"'{word}'"


def _arguments() -> list[Case]:
    fresh = ["train", "--data", "input.txt", "--out", "fresh"]
    generate = ["generate", "--checkpoint", "run"]
    rows = [(f"train {' '.join(map(_quote, extra))}", [*fresh, *extra]) for extra in (
        ["--lr", "inf"], ["--lr", "1e30"], ["--lr", "nan"], ["--lr", "0"], ["--batch-size", "1000000000"],
        ["--eval-iters", "1000000000"], ["--seed", "18446744073709551616"], ["--seed", "-1"], ["--max-iters", "0"],
        ["--block-size", "100000"], ["--dropout", "1"], ["--preset", "huge"], ["--batch-size", "4096", "--block-size",
                                                                               "8192"],
        ["--batch-size", "4096", "--eval-iters", "1000"], ["--resume", "--overwrite"])]
    rows += [(f"generate {' '.join(map(_quote, extra))}", [*generate, *extra]) for extra in (
        ["--temperature", "1e-300"], ["--temperature", "0"], ["--top-k", "0"], ["--top-p", "1.5"],
        ["--max-new-tokens", "-3"], ["--seed", "18446744073709551616"], ["--prompt", ""], ["--prompt", "snow ☃"],
        ["--top-p", "1e-300", "--max-new-tokens", "20"])]
    rows += [("train --config a FIFO", ["train", "--config", "fifo.toml", "--data", "input.txt", "--out", "fresh"])]
    return [Case("Arguments", name, argv) for name, argv in rows]


def _data() -> list[Case]:
    rows = [("--data missing", "missing.txt"), ("--data a directory", "dir"), ("--data binary", "binary.bin"),
            ("--data not UTF-8", "latin1.txt"), ("--data empty", "empty.txt"), ("--data too short", "short.txt"),
            ("--data a FIFO", "fifo.txt"), ("--data a device", "/dev/zero")]
    return [Case("Data file", name, ["train", "--data", path, "--out", "fresh", *TINY]) for name, path in rows]


def _checkpoint() -> list[Case]:
    rows = [("missing", "nothing.safetensors"), ("one byte flipped in a tensor", "flipped.safetensors"),
            ("truncated", "truncated.safetensors"), ("another program's safetensors", "other.safetensors"),
            ("metadata edited (iteration)", "edited.safetensors"), ("a FIFO", "fifo.safetensors"),
            ("NaN weights (re-signed)", "nan.safetensors"), ("iteration -5 (re-signed)", "iter.safetensors"),
            ("history out of order (re-signed)", "history.safetensors"),
            ("unknown train_config key (re-signed)", "config.safetensors"),
            ("RNG state cut short (re-signed)", "rng.safetensors"),
            ("optimizer tensor missing (re-signed)", "optim.safetensors"),
            ("model_config bias='no' (re-signed)", "bias.safetensors"),
            ("weights finite but exploded (x1e30, re-signed)", "exploded.safetensors"),
            ("int32 `ln_f.weight` (re-signed)", "int32.safetensors"),
            ("int64 optimizer `step` (re-signed)", "step.safetensors"),
            ("negative `exp_avg_sq` (re-signed)", "adam.safetensors"),
            ("model_config n_layer 2000 beside 4 layers' weights (re-signed)", "layers.safetensors")]
    cases = [Case("Checkpoint", f"generate: {name}", ["generate", "--checkpoint", path]) for name, path in rows]
    cases.append(Case("Checkpoint", "generate: unreadable (mode 600, another user's)",
                      ["generate", "--checkpoint", "unreadable"], as_nobody(lambda lab: None),
                      "typed-transformer generate --checkpoint unreadable  # as nobody"))
    cases.append(Case("Checkpoint", "generate: in a directory the user cannot enter (mode 700, another user's)",
                      ["generate", "--checkpoint", "private/checkpoint.safetensors"], as_nobody(private_directory),
                      "typed-transformer generate --checkpoint private/checkpoint.safetensors  # as nobody"))
    resumed = [("NaN weights (re-signed)", "nan", "nan"), ("RNG state cut short (re-signed)", "rng", "rng"),
               ("int32 `ln_f.weight` (re-signed)", "int32", "int32"),
               ("model_config n_layer 2000 (re-signed)", "layers", "layers"), ("a FIFO", "fifo", "fifo")]
    for name, source, out in resumed:
        cases.append(Case("Checkpoint", f"train --resume: {name}",
                          ["train", "--data", "input.txt", "--resume", "--max-iters", "20", *TINY, "--out",
                           f"resume-{out}"], resumed_from(f"{source}.safetensors")))
    return cases


def _resume() -> list[Case]:
    base = ["train", "--data", "input.txt", "--resume", "--max-iters", "20", *TINY]
    rows = [("--preset seed on a baby run", ["train", "--data", "input.txt", "--resume", "--preset", "seed",
                                               "--max-iters", "20", *TINY, "--out", "r1"]),
            ("--block-size 16", [*base, "--block-size", "16", "--out", "r2"]),
            ("--seed 7", [*base, "--seed", "7", "--out", "r3"]),
            ("the text reversed (same length)", ["train", "--data", "reversed.txt", *base[3:], "--out", "r4"]),
            ("a longer text", ["train", "--data", "longer.txt", *base[3:], "--out", "r5"]),
            ("no more iterations", ["train", "--data", "input.txt", "--resume", "--max-iters", "10", *TINY,
                                    "--out", "r6"])]
    cases = [Case("Resume", name, argv, copy_of_run) for name, argv in rows]
    cases.append(Case("Resume", "--resume without a checkpoint",
                      ["train", "--data", "input.txt", "--resume", *TINY, "--out", "empty-run"]))
    return cases


def _out() -> list[Case]:
    resume = ["train", "--data", "input.txt", "--resume", "--max-iters", "20", *TINY]
    return [
        Case("Output directory", "fresh run over an existing checkpoint",
             ["train", "--data", "input.txt", "--max-iters", "2", *TINY, "--out", "o1"], copy_of_run),
        Case("Output directory", "--out is a file", ["train", "--data", "input.txt", *TINY, "--out", "afile"]),
        Case("Output directory", "--out below a file", ["train", "--data", "input.txt", *TINY, "--out", "afile/run"]),
        Case("Output directory", "--out read-only (as an unprivileged user)",
             ["train", "--data", "input.txt", *TINY, "--out", "ro"], as_nobody(read_only_out),
             "typed-transformer train --data input.txt ... --out ro  # ro is mode 555, run as nobody"),
        Case("Output directory", "disk too small for two checkpoints (a 12 MB tmpfs)",
             ["train", "--data", "input.txt", "--max-iters", "20", *TINY, "--out", "small/run"], small_disk,
             "typed-transformer train --data input.txt --max-iters 20 ... --out small/run  # small: a 12 MB tmpfs"),
        Case("Output directory", "ulimit -f 5000 (5 MB)", [*resume, "--out", "o2"], file_size_limit,
             "ulimit -f 5000; typed-transformer train --data input.txt --resume --max-iters 20 ... --out o2"),
        Case("Output directory", "a second run into the same --out", [*resume, "--out", "busy"], busy),
        Case("Output directory", "`.lock` a symbolic link to ../victim.txt", [*resume, "--out", "lock-link"],
             lock_is("link")),
        Case("Output directory", "`.lock` a directory", [*resume, "--out", "lock-dir"], lock_is("directory")),
        Case("Output directory", "`.lock` a FIFO", [*resume, "--out", "lock-fifo"], lock_is("fifo")),
    ]


def _faults() -> list[Case]:
    train = ["train", "--data", "input.txt", *LONG, *TINY]
    generate = ["generate", "--checkpoint", "run", "--max-new-tokens", "1000000"]
    ddp = ["train", "--data", "input.txt", "--max-iters", "100000", "--checkpoint-interval", "20", *TINY]
    return [
        Case("Divergence", "the learning rate patched to 1e30 from iteration 10",
             ["train", "--data", "input.txt", "--resume", "--max-iters", "20", *TINY, "--out", "g1"], diverging,
             "typed-transformer train --resume ... --out g1  # learning rate patched to 1e30 (--lr refuses it)"),
        Case("Signals", "Ctrl-C while importing", ["generate", "--checkpoint", "run"],
             signalled(signal.SIGINT, after=None), "typed-transformer generate --checkpoint run, then SIGINT"),
        Case("Signals", "SIGTERM while importing", ["generate", "--checkpoint", "run"],
             signalled(signal.SIGTERM, after=None), "typed-transformer generate --checkpoint run, then SIGTERM"),
        Case("Signals", "Ctrl-C during training (saves)", [*train, "--out", "s1"], signalled(signal.SIGINT)),
        Case("Signals", "SIGTERM during training (saves)", [*train, "--out", "s2"], signalled(signal.SIGTERM)),
        Case("Signals", "SIGHUP during training (a closed terminal; saves)", [*train, "--out", "s4"],
             signalled(signal.SIGHUP)),
        Case("Signals", "Ctrl-C twice during training (stops at once)", [*train, "--out", "s3"],
             signalled(signal.SIGINT, signal.SIGINT)),
        Case("Signals", "Ctrl-C during generate", generate, signalled(signal.SIGINT, after=10.0)),
        Case("Signals", "SIGTERM during generate", generate, signalled(signal.SIGTERM, after=10.0)),
        Case("Signals", "SIGTERM inside one torch call of hours", ["generate", "--checkpoint", "run"],
             stuck_then_sigterm, "typed-transformer generate --checkpoint run  # patched: one torch call of hours, "
             "then SIGTERM"),
        Case("Several processes", "torchrun into the directory of a finished run",
             ["train", "--data", "input.txt", *TINY, "--out", "main-job"], torchrun_refusal),
        Case("Several processes", "torchrun, rank 1 killed (kill -9) after a save", [*ddp, "--out", "ddp1"],
             torchrun_killed(1)),
        Case("Several processes", "torchrun, rank 0 killed (kill -9) after a save", [*ddp, "--out", "ddp0"],
             torchrun_killed(0)),
        Case("Audit", "a module that calls sys.exit(3) when imported", ["audit", "exits:attention"], audit_exit),
        Case("Audit", "a candidate that calls sys.exit(0) on its first call", ["audit", "exits0:attention"],
             audit_report),
        Case("Audit", "a candidate that calls sys.exit(0) on its first call (--infer)",
             ["audit", "exits0:attention", "--infer"], audit_report),
        Case("Audit", "a candidate that never returns", ["audit", "hangs:attention", "--call-time-limit", "5"],
             audit_report),
        Case("Audit", "a candidate that never returns (--infer)",
             ["audit", "hangs:attention", "--infer", "--call-time-limit", "5"], audit_report),
        Case("Audit", "a candidate that doubles its query in place after computing the right answer",
             ["audit", "inplace:attention", "--checks", "reference", "--dtypes", "float64", "--max-examples", "4"],
             audit_report),
        Case("Install", "generate without the [train] extra", ["generate", "--checkpoint", "run"],
             without_safetensors, "typed-transformer generate --checkpoint run  # safetensors not installed"),
    ]


def _seq2seq() -> list[Case]:
    translate = ["translate", "--checkpoint", "s2s"]
    return [
        Case("Seq2seq", "a pair holding U+2028, U+0085 and U+000C (one line: one pair)",
             ["train-seq2seq", "--data", "odd.tsv", *S2S_TINY, "--max-iters", "2", "--out", "u1"], pairs_kept),
        Case("Seq2seq", "a pair of 600 characters (the longest sequence is 512)",
             ["train-seq2seq", "--data", "long.tsv", *S2S_TINY, "--max-iters", "2", "--out", "u2"]),
        Case("Seq2seq", "translate with stdin closed", translate, stdin_from(None),
             "typed-transformer translate --checkpoint s2s <&-"),
        Case("Seq2seq", "translate: CRLF lines on stdin", translate, stdin_from("crlf.txt"),
             "typed-transformer translate --checkpoint s2s < crlf.txt  # 0123, an empty line, 31, each ending \\r\\n"),
        Case("Seq2seq", "translate: a byte that is not UTF-8 on stdin", translate, stdin_from("notutf8.txt"),
             "typed-transformer translate --checkpoint s2s < notutf8.txt  # 12, then 3 0xff 1"),
        Case("Seq2seq", "translate: a source of 600 characters", translate, stdin_from("longsource.txt"),
             "typed-transformer translate --checkpoint s2s < longsource.txt  # 12, then 600 digits"),
        Case("Seq2seq", "translate: an extra tensor `junk.x` (re-signed)",
             ["translate", "--checkpoint", "junk.safetensors", "--text", "12"]),
        Case("Seq2seq", "`config.json` a symbolic link to ../outside.json",
             ["train-seq2seq", *S2S_TINY, "--max-iters", "2", "--out", "u3"], config_link),
        Case("Seq2seq", "--resume on an edited data file (the same characters)",
             ["train-seq2seq", "--data", "edited.tsv", *S2S_TINY, "--max-iters", "4", "--resume", "--out", "u4"],
             edited_data, "typed-transformer train-seq2seq --data edited.tsv ... --max-iters 4 --resume --out u4  "
             "# after 2 iterations, aab<TAB>baa edited to aab<TAB>aba"),
        Case("Seq2seq", "kill -9 after the first checkpoint, then --resume",
             ["train-seq2seq", *S2S_TINY, "--max-iters", "600", "--eval-interval", "50", "--threads", "1",
              "--resume", "--out", "u5"], killed_and_resumed,
             "typed-transformer train-seq2seq ... --max-iters 600 --eval-interval 50 --threads 1 --out u5; kill -9; "
             "the same with --resume"),
    ]


CASES: list[Case] = [*_arguments(), *_data(), *_checkpoint(), *_resume(), *_out(), *_seq2seq(), *_faults()]
SECTIONS = list(dict.fromkeys(case.section for case in CASES))
#: Every table's header (the sections of the several-process rows: our lines, then what torchrun added).
HEADER = "| Case | Command | Exit | Last line on stderr |\n|---|---|---|---|"


def shown(case: Case) -> str:
    if case.shown:
        return case.shown
    argv, words, i = case.argv, [], 0
    while i < len(argv):
        tiny = next((flags for flags in (TINY, S2S_TINY) if argv[i:i + len(flags)] == flags), None)
        if tiny is not None:
            words.append("...")
            i += len(tiny)
            continue
        words.append(_quote(argv[i]))
        i += 1
    launcher = ".venv/bin/torchrun --standalone --nproc-per-node 2 -m typed_transformer" \
        if case.section == "Several processes" else "typed-transformer"
    return f"{launcher} {' '.join(words)}"


def _cell(text: str) -> str:
    return f"`{text}`".replace("|", "\\|") if text else "(nothing)"


def row(case: Case, outcome: Outcome) -> str:
    if outcome.code in (-1, -2):
        return f"| {case.name} | {_cell(shown(case))} | - | ({outcome.note}) |"
    lines = [line for line in outcome.stderr.splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    if "Traceback" in outcome.stderr:
        raise SystemExit(f"{case.name}: a traceback:\n{outcome.stderr}")
    note = f" ({outcome.note})" if outcome.note else ""
    return f"| {case.name} | {_cell(shown(case))} | {outcome.code} | {_cell(last)}{note} |"


def run_all(only: str | None = None) -> str:
    with tempfile.TemporaryDirectory(prefix="reliability-") as directory:
        lab = Lab(Path(directory))
        prepare(lab)
        results = []
        for case in CASES:
            if only is not None and not any(part in case.name for part in only.split(",")):
                continue
            started = time.perf_counter()
            try:
                outcome = (case.run or (lambda lab, case: lab.run(case.argv)))(lab, case)
            except Exception as err:  # the other cases still run; --write refuses the tables
                outcome = Outcome(-2, "", f"the script failed: {type(err).__name__}: {err}")
            print(f"{case.section} / {case.name}: exit {outcome.code} ({time.perf_counter() - started:.1f} s)",
                  file=sys.stderr)
            results.append((case, outcome))
    load = os.getloadavg()[0]
    parts = [f"Made by `benchmarks/reliability_cases.py` on {platform.machine()}, {os.cpu_count()} cores, torch "
             f"{torch.__version__}, as {'root' if os.geteuid() == 0 else 'a user'} (load average {load:.2f})."]
    for section in SECTIONS:
        rows = [row(case, outcome) for case, outcome in results if case.section == section]
        if rows:
            parts.append(f"### {section}\n\n{HEADER}\n" + "\n".join(rows))
    return "\n\n".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="replace the tables in docs/reliability.md")
    parser.add_argument("--only", help="run only the cases whose name holds one of these comma-separated words")
    args = parser.parse_args()
    if args.write and args.only:
        parser.error("--write needs every case")
    block = run_all(args.only)
    print(block)
    if "(the script failed: " in block:
        raise SystemExit("a case failed to run (see its row): the page is left as it was")
    if args.write:
        write_between(DOC, BEGIN, END, block)


if __name__ == "__main__":
    main()
