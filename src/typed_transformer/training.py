"""Training a GPT on text: AdamW with decay on matrices only, linear warmup then cosine decay, gradient
clipping, periodic evaluation on fixed batches, checkpoints, resumption and a loss plot.

The schedule (nanoGPT's ``get_lr``)::

    lr(it) = lr_max * (it + 1) / (warmup + 1)                                      it < warmup
           = lr_min + (lr_max - lr_min) * (1 + cos(pi * (it - warmup) / (decay - warmup))) / 2   it <= decay
           = lr_min                                                                 otherwise

Resuming restores the weights, the optimizer state, the iteration and every random-number state (batch
sampling and dropout), so a resumed run's loss curve equals the uninterrupted run's.

Resuming a run with a larger ``max_iters`` (and no explicit ``lr_decay_iters``) stretches the schedule: the
decay length is the new ``max_iters``, so from the resume point on the rate is ``lr(it)`` of the longer
schedule, which is higher than the shorter run's (a finished run resumes at the longer schedule's rate at
that iteration, well above ``lr_min``). The steps already taken followed the shorter schedule, so the weights
differ from an uninterrupted run of the new length. Fix ``lr_decay_iters`` from the start to make a run
resumable to any length on one schedule.

Safety (docs/reliability.md): the output directory is locked for the run (:func:`run_directory`); a fresh run
refuses to replace an existing checkpoint unless ``overwrite=True``; a non-finite loss, gradient norm or weight
stops the run with :class:`TrainingDiverged` before anything non-finite is saved (the last checkpoint stays);
SIGINT (Ctrl-C) and SIGTERM stop between two steps and save; a second one stops at once.
"""

import math
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

import torch
from torch import Tensor

from ._signals import Terminated
from .checkpoint import CHECKPOINT_NAME, Checkpoint, RunDirectoryError, run_directory, save_checkpoint, temporary_path
from .data import TextData, get_batch
from .gpt import GPT

__all__ = ["PRESET_TRAINING", "TrainConfig", "TrainResult", "TrainingDiverged", "evaluate", "learning_rate",
           "plot_history", "train"]

#: Training settings of a model preset where they differ from :class:`TrainConfig`'s defaults (nanoGPT's).
#: ``baby``: peak learning rate 3e-3 (min 3e-4) instead of nanoGPT's 1e-3. Over 2000 iterations on Tiny
#: Shakespeare, two seeds each, the full-split validation loss was 1.908 at 1e-3, 1.821 at 2e-3, 1.789 at
#: 3e-3 and 1.784 at 5e-3; 3e-3 is the smallest rate within noise of the best (README, "Quality").
PRESET_TRAINING: dict[str, dict[str, Any]] = {
    "baby": {"learning_rate": 3e-3, "min_lr": 3e-4},
    "seed": {},
}


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation settings; the defaults are nanoGPT's CPU "baby GPT" run (:meth:`for_preset` adds a
    model preset's own settings: the command line's ``train`` starts from those)."""

    max_iters: int = 2000
    batch_size: int = 12
    learning_rate: float = 1e-3
    min_lr: float = 1e-4
    warmup_iters: int = 100
    lr_decay_iters: int | None = None  # default: max_iters
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.99
    grad_clip: float = 1.0
    eval_interval: int = 250
    eval_iters: int = 20
    checkpoint_interval: int = 250
    seed: int = 1337
    sample_tokens: int = 300

    @classmethod
    def for_preset(cls, preset: str, **overrides: Any) -> "TrainConfig":
        """The defaults with the preset's own settings (:data:`PRESET_TRAINING`), then ``overrides``
        (see :meth:`overridden`)."""
        if preset not in PRESET_TRAINING:
            raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESET_TRAINING)}")
        return cls.overridden(PRESET_TRAINING[preset], **overrides)

    @classmethod
    def overridden(cls, base: dict[str, Any], **overrides: Any) -> "TrainConfig":
        """The settings ``base`` (a preset's, or a checkpoint's ``train_config``) with ``overrides``.

        An overridden ``learning_rate`` without ``min_lr`` decays to a tenth of itself, as nanoGPT's does.
        """
        if "learning_rate" in overrides:
            overrides.setdefault("min_lr", overrides["learning_rate"] / 10)
        return cls(**{**base, **overrides})

    def __post_init__(self) -> None:
        positive = ("max_iters", "batch_size", "eval_interval", "eval_iters", "checkpoint_interval")
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        for name in ("learning_rate", "min_lr", "weight_decay", "beta1", "beta2", "grad_clip"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
        for name in ("warmup_iters", "seed", "sample_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"{name} must be an integer, got {value!r}")
        if self.lr_decay_iters is not None and (not isinstance(self.lr_decay_iters, int)
                                                or isinstance(self.lr_decay_iters, bool) or self.lr_decay_iters <= 0):
            raise ValueError(f"lr_decay_iters must be None or a positive integer, got {self.lr_decay_iters!r}")
        if not 0 <= self.beta1 < 1 or not 0 <= self.beta2 < 1:
            raise ValueError(f"beta1 and beta2 must be in [0, 1), got {self.beta1}, {self.beta2}")
        if not (self.learning_rate > 0 and self.min_lr >= 0 and self.min_lr <= self.learning_rate):
            raise ValueError(f"need 0 <= min_lr <= learning_rate and learning_rate > 0, got "
                             f"learning_rate={self.learning_rate}, min_lr={self.min_lr}")
        if self.warmup_iters < 0 or self.sample_tokens < 0 or self.grad_clip < 0 or self.weight_decay < 0:
            raise ValueError("warmup_iters, sample_tokens, grad_clip and weight_decay must be >= 0")


def learning_rate(config: TrainConfig, iteration: int) -> float:
    """The learning rate at ``iteration`` (see the module docstring)."""
    decay = config.lr_decay_iters or config.max_iters
    if iteration < config.warmup_iters:
        return config.learning_rate * (iteration + 1) / (config.warmup_iters + 1)
    if iteration > decay:
        return config.min_lr
    progress = (iteration - config.warmup_iters) / max(decay - config.warmup_iters, 1)
    return config.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (config.learning_rate - config.min_lr)


@torch.no_grad()
def evaluate(model: GPT, batches: dict[str, list[tuple[Tensor, Tensor]]]) -> dict[str, float]:
    """Mean loss over fixed batches for each split, in eval mode."""
    was_training = model.training
    model.eval()
    losses = {}
    for split, pairs in batches.items():
        total = 0.0
        for x, y in pairs:
            _, loss = model(x, y)
            assert loss is not None
            total += float(loss)
        losses[split] = total / len(pairs)
    model.train(was_training)
    return losses


@dataclass
class TrainResult:
    model: GPT
    history: list[dict[str, float]]
    iteration: int
    interrupted: bool
    checkpoint: Path
    sample: str
    #: The signal that stopped an interrupted run (``signal.SIGINT`` or ``signal.SIGTERM``), else None.
    signal: int | None = None


class TrainingDiverged(RuntimeError):
    """The loss, the gradient norm or a weight became NaN or infinite; nothing non-finite was saved.

    ``iteration`` is where it happened, ``checkpoint`` the last (finite) checkpoint kept, or None.
    """

    def __init__(self, message: str, iteration: int, checkpoint: Path | None) -> None:
        super().__init__(message)
        self.iteration = iteration
        self.checkpoint = checkpoint


class _Interrupt:
    """Turn the first Ctrl-C or SIGTERM into a flag checked between steps (a second one stops at once:
    KeyboardInterrupt, or :class:`Terminated` for SIGTERM)."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.requested: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> "_Interrupt":
        if threading.current_thread() is threading.main_thread():  # signal handlers live in the main thread
            for signum in self.SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested is not None:
            raise Terminated if signum == signal.SIGTERM else KeyboardInterrupt
        self.requested = signum

    def __exit__(self, *exc: object) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous if previous is not None else signal.SIG_DFL)


def plot_history(history: list[dict[str, float]], path: Path, title: str = "") -> Path | None:
    """Write the train/val loss curve as a PNG; returns None when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    figure, axes = plt.subplots(figsize=(6, 4), dpi=100)
    for split in ("train", "val"):
        points = [(h["iter"], h[split]) for h in history if split in h]
        if points:
            axes.plot(*zip(*points, strict=True), marker="o", markersize=3, label=split)
    axes.set_xlabel("iteration")
    axes.set_ylabel("cross-entropy (nats/char)")
    axes.set_title(title or "GPT training loss")
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    temporary = temporary_path(path)
    try:
        figure.savefig(temporary, format="png")
        temporary.replace(path)
    finally:
        plt.close(figure)
        temporary.unlink(missing_ok=True)
    return path


def train(
    model: GPT,
    data: TextData,
    config: TrainConfig,
    out_dir: str | Path,
    *,
    resume: Checkpoint | None = None,
    overwrite: bool = False,
    device: str = "cpu",
    progress: bool = True,
    log: TextIO | None = None,
    info: dict[str, Any] | None = None,
    on_step: Callable[[int], None] | None = None,
) -> TrainResult:
    """Train ``model`` on ``data`` and write ``out_dir/checkpoint.safetensors`` and ``out_dir/loss.png``.

    A checkpoint is written every ``checkpoint_interval`` iterations, at the end, and when Ctrl-C or SIGTERM
    stops the run (between two steps, so the saved state is consistent). ``resume`` continues a saved run.

    Raises:
        RunDirectoryError: ``out_dir`` is unusable (a file, not writable, locked by another run), or it holds
            a checkpoint and neither ``resume`` nor ``overwrite`` was given.
        TrainingDiverged: the loss, the gradient norm or the weights became non-finite; the last checkpoint
            (finite) is kept and nothing was saved after it.
        OSError: a checkpoint or the plot could not be written (the previous checkpoint is intact).
    """
    out = Path(out_dir)
    with run_directory(out):
        if resume is None and not overwrite and (out / CHECKPOINT_NAME).exists():
            raise RunDirectoryError(f"{out / CHECKPOINT_NAME} exists: continue that run with --resume or "
                                    "replace it with --overwrite")
        return _train(model, data, config, out, resume=resume, device=device, progress=progress, log=log,
                      info=info, on_step=on_step)


def _non_finite_weight(model: GPT) -> str | None:
    for name, param in model.named_parameters():
        if not bool(torch.isfinite(param).all()):
            return name
    return None


def _train(model: GPT, data: TextData, config: TrainConfig, out: Path, *, resume: Checkpoint | None, device: str,
           progress: bool, log: TextIO | None, info: dict[str, Any] | None,
           on_step: Callable[[int], None] | None) -> TrainResult:
    log = log if log is not None else sys.stderr
    block = model.config.block_size
    model.to(device).train()

    # Fixed evaluation batches: the same windows at every evaluation and after a resume.
    eval_generator = torch.Generator().manual_seed(config.seed + 1)
    eval_batches: dict[str, list[tuple[Tensor, Tensor]]] = {}
    for split, ids in (("train", data.train), ("val", data.val)):
        pairs = (get_batch(ids, config.batch_size, block, eval_generator) for _ in range(config.eval_iters))
        eval_batches[split] = [(x.to(device), y.to(device)) for x, y in pairs]
    optimizer = torch.optim.AdamW(model.parameter_groups(config.weight_decay), lr=config.learning_rate,
                                  betas=(config.beta1, config.beta2))
    batch_generator = torch.Generator().manual_seed(config.seed)
    torch.manual_seed(config.seed)  # dropout
    history: list[dict[str, float]] = []
    start = 0
    saved: tuple[int, Path] | None = None
    plotted = -1  # len(history) when loss.png was last drawn
    if resume is not None:
        if resume.optimizer_state is not None:
            optimizer.load_state_dict(resume.optimizer_state)
        if "batches" in resume.rng:
            batch_generator.set_state(resume.rng["batches"])
        if "torch" in resume.rng:
            torch.set_rng_state(resume.rng["torch"])
        history = list(resume.history)
        start = resume.iteration
        if (out / CHECKPOINT_NAME).exists():
            saved = (start, out / CHECKPOINT_NAME)

    def diverged(iteration: int, what: str) -> TrainingDiverged:
        kept = (f"kept the checkpoint of iteration {saved[0]} ({saved[1]})" if saved is not None
                else "no checkpoint was written")
        return TrainingDiverged(f"training diverged at iteration {iteration}: {what}; {kept}; lower the learning "
                                "rate (--lr)", iteration, saved[1] if saved is not None else None)

    def save(iteration: int) -> Path:
        bad = _non_finite_weight(model)
        if bad is not None:
            raise diverged(iteration, f"weight {bad} holds NaN or infinity")
        # Finite but exploded weights (a huge step) show as a non-finite loss: one batch decides before saving.
        probe = evaluate(model, {"val": eval_batches["val"][:1]})["val"]
        if not math.isfinite(probe):
            raise diverged(iteration, f"the loss of the weights to be saved is {probe}")
        rng = {"batches": batch_generator.get_state(), "torch": torch.get_rng_state()}
        path = save_checkpoint(out / CHECKPOINT_NAME, model, data.tokenizer, iteration=iteration,
                               train_config=asdict(config), history=history, optimizer=optimizer, rng=rng,
                               info=info)
        nonlocal saved, plotted
        saved = (iteration, path)
        if plotted != len(history):  # the curve changes only with a new evaluation
            plot_history(history, out / "loss.png")
            plotted = len(history)
        return path

    tokens_per_step = config.batch_size * block
    bar: Any = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=config.max_iters, initial=start, desc="train", unit="it", file=log, dynamic_ncols=True)

    def say(message: str) -> None:
        if bar is not None:
            bar.write(message)
        else:
            print(message, file=log, flush=True)

    def evaluation(iteration: int) -> None:
        losses = evaluate(model, eval_batches)
        if not all(math.isfinite(v) for v in losses.values()):
            raise diverged(iteration, f"the evaluation loss is {losses}")
        history.append({"iter": iteration, **losses})
        say(f"iter {iteration:5d}: train loss {history[-1]['train']:.4f}, val loss {history[-1]['val']:.4f}")

    interrupted = False
    iteration = start
    last_loss = float("nan")
    try:
        with _Interrupt() as interrupt:
            t0 = time.perf_counter()
            while iteration < config.max_iters:
                if iteration % config.eval_interval == 0 and not any(h["iter"] == iteration for h in history):
                    evaluation(iteration)
                lr = learning_rate(config, iteration)
                for group in optimizer.param_groups:
                    group["lr"] = lr
                x, y = get_batch(data.train, config.batch_size, block, batch_generator)
                _, loss = model(x.to(device), y.to(device))
                assert loss is not None
                last_loss = float(loss.detach())
                if not math.isfinite(last_loss):
                    raise diverged(iteration, f"the training loss is {last_loss}")
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                if config.grad_clip > 0:
                    norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip))
                    if not math.isfinite(norm):
                        raise diverged(iteration, f"the gradient norm is {norm}")
                optimizer.step()
                iteration += 1
                if on_step is not None:
                    on_step(iteration)
                if bar is not None:
                    elapsed = time.perf_counter() - t0
                    speed = tokens_per_step * (iteration - start) / elapsed
                    bar.set_postfix(loss=f"{last_loss:.4f}", tok_s=f"{speed:,.0f}")
                    bar.update(1)
                if interrupt.requested is not None:
                    interrupted = True
                    break
                if iteration % config.checkpoint_interval == 0 and iteration < config.max_iters:
                    save(iteration)
            if not interrupted:
                evaluation(iteration)
            path = save(iteration)
    finally:
        if bar is not None:
            bar.close()

    sample_text = ""
    if config.sample_tokens and not interrupted:
        prompt = torch.tensor([data.tokenizer.encode(data.tokenizer.chars[0] if "\n" not in data.tokenizer.chars
                                                     else "\n")], device=device)
        generated = model.eval().generate(prompt, config.sample_tokens,
                                          generator=torch.Generator(device=device).manual_seed(config.seed))
        sample_text = data.tokenizer.decode(generated[0, 1:].cpu())
        model.train()
    return TrainResult(model, history, iteration, interrupted, path, sample_text,
                       signal=interrupt.requested if interrupted else None)
