"""Where the main job's wall time goes (a script, not library code).

Runs ``typed-transformer train`` (the main job: the baby preset, ``--threads auto``) in this process, through
the command line's own ``main``, with each phase timed by a wrapper around the function that does it: wall
seconds and CPU seconds (all of the process's threads), exclusive of any phase nested inside (the save's
one-batch check counts as an evaluation, not as a checkpoint). Imports are timed at the top of this script,
before anything else imports them; the interpreter's own start-up is timed separately (``python -c pass``, a
median of three). Then, side by side in this process (``torch.utils.benchmark``), the optimizer step of the
baby preset with torch's default AdamW (its foreach path) and with the fused one the training loop uses. ::

    python benchmarks/main_job_profile.py [--data FILE] [--max-iters 2000] [--extra "--lr 3e-3"] [--write PAGE]

``--data`` defaults to Tiny Shakespeare beside the checkout, else the main job's own corpus. ``--write
docs/lab/time-to-quality.md`` replaces the block between that page's ``<!-- main-job-profile -->`` markers
with the output. Run it on an idle machine: under load every phase stretches, and the CPU column shows by how
much less the process got than the wall time it waited.
"""

import time

_STARTED_WALL, _STARTED_CPU = time.perf_counter(), time.process_time()
import torch  # noqa: E402  (timed: the first import of torch in this process)

_TORCH_WALL, _TORCH_CPU = time.perf_counter(), time.process_time()
import typed_transformer.cli  # noqa: E402  (timed: the package and its command line)

_PACKAGE_WALL, _PACKAGE_CPU = time.perf_counter(), time.process_time()

import argparse  # noqa: E402
import contextlib  # noqa: E402
import functools  # noqa: E402
import io  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import shlex  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, when run as a script
from benchmarks._runs import data_file, write_between  # noqa: E402

MARKER = "<!-- main-job-profile -->"


@dataclass
class Phase:
    """One phase: its description, calls, and exclusive wall and CPU seconds."""

    what: str
    calls: int = 0
    wall: float = 0.0
    cpu: float = 0.0


class Profile:
    """Exclusive wall and CPU time per phase: time spent in a phase nested inside another is its own, not the
    outer one's."""

    def __init__(self) -> None:
        self.phases: dict[str, Phase] = {}
        self._stack: list[tuple[str, float, float]] = []  # (phase, wall, cpu) at entry or last resume
        self._wrapped: list[tuple[Any, str, Any]] = []  # (owner, name, what it held before) for restore()

    @contextlib.contextmanager
    def phase(self, key: str) -> Iterator[None]:
        now_wall, now_cpu = time.perf_counter(), time.process_time()
        if self._stack:  # pause the outer phase
            outer, wall, cpu = self._stack[-1]
            self._add(outer, now_wall - wall, now_cpu - cpu, calls=0)
        self._stack.append((key, now_wall, now_cpu))
        try:
            yield
        finally:
            _, wall, cpu = self._stack.pop()
            end_wall, end_cpu = time.perf_counter(), time.process_time()
            self._add(key, end_wall - wall, end_cpu - cpu, calls=1)
            if self._stack:  # resume the outer phase
                outer, _, _ = self._stack[-1]
                self._stack[-1] = (outer, end_wall, end_cpu)

    def _add(self, key: str, wall: float, cpu: float, *, calls: int) -> None:
        phase = self.phases[key]
        phase.wall += wall
        phase.cpu += cpu
        phase.calls += calls

    def wrap(self, owner: Any, name: str, key: str, what: str) -> None:
        """Time every call of ``owner.name`` (a function of a module, or a method of a class) as phase ``key``."""
        self.phases.setdefault(key, Phase(what))
        descriptor = owner.__dict__.get(name) if isinstance(owner, type) else None
        kind = type(descriptor) if isinstance(descriptor, classmethod | staticmethod) else None
        raw = descriptor.__func__ if isinstance(descriptor, classmethod | staticmethod) else getattr(owner, name)

        @functools.wraps(raw)
        def timed(*args: Any, **kwargs: Any) -> Any:
            with self.phase(key):
                return raw(*args, **kwargs)

        inherited = isinstance(owner, type) and name not in vars(owner)
        self._wrapped.append((owner, name, None if inherited else vars(owner)[name]))
        setattr(owner, name, timed if kind is None else kind(timed))

    def restore(self) -> None:
        """Put back every function :meth:`wrap` replaced (last wrapped first)."""
        for owner, name, original in reversed(self._wrapped):
            if original is None:  # a class's inherited method: drop the override
                delattr(owner, name)
            else:
                setattr(owner, name, original)
        self._wrapped.clear()


def instrument(profile: Profile) -> None:
    """Wrap the functions that do each phase of ``typed-transformer train`` (looked up where it calls them)."""
    from typed_transformer import data, gpt, muon, training

    profile.wrap(data, "load_text", "data", "reading the text and encoding it (train/val split)")
    profile.wrap(data, "default_corpus", "data", "")
    profile.wrap(data.TextData, "from_text", "data", "")
    profile.wrap(gpt.GPT, "__init__", "model", "building the model (its meta-device twin imports torch._dynamo)")
    profile.wrap(training, "measure_matmul_flops", "peak",
                 "the peak FLOP/s measurements, at the start and the end (the MFU baseline)")
    profile.wrap(torch.optim.AdamW, "__init__", "optimizer",
                 "building the optimizer (would import torch._dynamo, if not yet imported)")
    profile.wrap(muon.MuonAdamW, "__init__", "optimizer", "")
    profile.wrap(training, "evaluate", "eval", "evaluations (20 batches per split; the check before each save)")
    profile.wrap(training.Trainer, "trial_step", "threads",
                 "timing thread counts (--threads auto) on trial steps that are not kept")
    profile.wrap(training.Trainer, "next_batch", "batch", "drawing the training batches")
    profile.wrap(training.Trainer, "_backward", "backward", "training steps: forward and backward")
    profile.wrap(torch.nn.utils, "clip_grad_norm_", "clip", "training steps: gradient clipping")
    profile.wrap(torch.optim.AdamW, "step", "step", "training steps: the optimizer step (AdamW, or Muon and AdamW)")
    profile.wrap(muon.MuonAdamW, "step", "step", "")
    profile.wrap(training, "save_checkpoint", "save", "writing the checkpoints")
    profile.wrap(training, "plot_history", "plot", "drawing the loss plots (matplotlib's import the first time)")
    profile.wrap(training, "sample_text", "sample", "sampling the text printed at the end")


def interpreter_start(repeats: int = 3) -> float:
    """Median wall seconds of ``python -c pass`` (the interpreter's start-up, before any import of ours)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def optimizer_steps() -> tuple[float, float]:
    """Median seconds of one AdamW step of the baby preset's parameters (with gradients), foreach and fused,
    measured side by side (interleaved ``torch.utils.benchmark`` rounds)."""
    from torch.utils.benchmark import Timer

    from typed_transformer.gpt import GPT, GPTConfig

    samples: dict[str, list[float]] = {"foreach": [], "fused": []}
    optimizers = {}
    for kind in samples:
        torch.manual_seed(0)
        model = GPT(GPTConfig.preset("baby", 65))
        for parameter in model.parameters():
            parameter.grad = torch.randn_like(parameter) * 1e-3
        optimizers[kind] = torch.optim.AdamW(model.parameter_groups(0.1), lr=1e-4, foreach=kind == "foreach",
                                             fused=kind == "fused")
    for _ in range(5):
        for kind, optimizer in optimizers.items():
            measured = Timer("optimizer.step()", globals={"optimizer": optimizer}).blocked_autorange(min_run_time=0.2)
            samples[kind].append(measured.median)
    return statistics.median(samples["foreach"]), statistics.median(samples["fused"])


def run(data: Path, extra: list[str], max_iters: int | None) -> tuple[Profile, float, float, str]:
    """The main job in this process: (phases, wall seconds, CPU seconds, its output)."""
    profile = Profile()
    output = io.StringIO()
    with tempfile.TemporaryDirectory() as out:
        argv = ["train", "--data", str(data), "--out", str(Path(out) / "run"), "--no-progress",
                *(["--max-iters", str(max_iters)] if max_iters is not None else []), *extra]
        instrument(profile)
        try:
            start_wall, start_cpu = time.perf_counter(), time.process_time()
            with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
                code = typed_transformer.cli.main(argv)
            wall, cpu = time.perf_counter() - start_wall, time.process_time() - start_cpu
        finally:
            profile.restore()
    if code != 0:
        raise SystemExit(f"typed-transformer {' '.join(argv)} exited {code}:\n{output.getvalue()[-2000:]}")
    return profile, wall, cpu, output.getvalue()


def report(profile: Profile, wall: float, cpu: float, output: str, *, name: str, extra: list[str],
           max_iters: int | None,
           start: float) -> list[str]:
    decisions = [line.split(" (")[0] for line in output.splitlines() if re.match(r"threads: \d", line)]
    threads = f"thread counts chosen in turn: {', '.join(d.removeprefix('threads: ') for d in decisions)}" \
        if decisions else "threads: as set"
    imports = (_TORCH_WALL - _STARTED_WALL, _TORCH_CPU - _STARTED_CPU, _PACKAGE_WALL - _TORCH_WALL,
               _PACKAGE_CPU - _TORCH_CPU)
    total = start + imports[0] + imports[2] + wall
    iters = "" if max_iters is None else f" --max-iters {max_iters}"
    lines = [f"main job: typed-transformer train --data {name}{iters}"
             f"{' ' + ' '.join(extra) if extra else ''}, torch {torch.__version__}, {os.cpu_count()} cores, load "
             f"average {os.getloadavg()[0]:.2f} at the end; {threads}; wall seconds, and the CPU seconds of all "
             "the process's threads",
             f"{'phase':<68} {'calls':>6} {'wall s':>7} {'CPU s':>7} {'share':>6}",
             f"{'interpreter start-up (python -c pass, timed apart)':<68} {'':>6} {start:>7.2f} {'':>7} "
             f"{start / total:>6.1%}",
             f"{'import torch':<68} {1:>6} {imports[0]:>7.2f} {imports[1]:>7.2f} {imports[0] / total:>6.1%}",
             f"{'import typed_transformer and its command line':<68} {1:>6} {imports[2]:>7.2f} {imports[3]:>7.2f} "
             f"{imports[2] / total:>6.1%}"]
    accounted_wall = accounted_cpu = 0.0
    for phase in profile.phases.values():
        if phase.calls == 0 and not phase.what:
            continue
        accounted_wall += phase.wall
        accounted_cpu += phase.cpu
        lines.append(f"{phase.what:<68} {phase.calls:>6} {phase.wall:>7.2f} {phase.cpu:>7.2f} "
                     f"{phase.wall / total:>6.1%}")
    rest_wall, rest_cpu = wall - accounted_wall, cpu - accounted_cpu
    lines.append(f"{'the rest (arguments, printing, the run lock, the thread tuner, the loop itself)':<68} {'':>6} "
                 f"{rest_wall:>7.2f} {rest_cpu:>7.2f} {rest_wall / total:>6.1%}")
    lines.append(f"{'total':<68} {'':>6} {total:>7.2f}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=None,
                        help="text file (default: Tiny Shakespeare beside the checkout, else the main job's corpus)")
    parser.add_argument("--max-iters", type=int, default=None, help="iterations (default: the main job's)")
    parser.add_argument("--extra", default="", help="flags added to the main job's command (quoted)")
    parser.add_argument("--write", type=Path, default=None, help="a page with two main-job-profile markers")
    args = parser.parse_args()
    extra = shlex.split(args.extra)
    start = interpreter_start()
    with data_file(args.data) as data:
        profile, wall, cpu, output = run(data, extra, args.max_iters)
        name = data.name
    lines = report(profile, wall, cpu, output, name=name, extra=extra, max_iters=args.max_iters, start=start)
    foreach, fused = optimizer_steps()  # after the run, so that the run imported everything itself
    lines.append(f"optimizer step of the baby preset, side by side: torch's default AdamW (foreach) "
                 f"{foreach * 1e3:.2f} ms, fused (the training loop's) {fused * 1e3:.2f} ms = {fused / foreach:.2f}x")
    print("\n".join(lines))
    if args.write is not None:
        write_between(args.write, MARKER, MARKER, "```\n" + "\n".join(lines) + "\n```")
    return 0


if __name__ == "__main__":
    sys.exit(main())
