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

Scale (docs/training.md): ``batch_size`` is the *global* batch of one optimizer step. It is drawn from one
seeded generator and split into ``world_size * grad_accum`` equal micro-batches: process ``r`` of a
``torch.distributed`` group (``torchrun``) takes rows ``[r B/W, (r+1) B/W)`` and runs them as ``grad_accum``
micro-batches, each loss scaled by ``1/grad_accum``, gradients all-reduced (averaged) by
``DistributedDataParallel`` on the last micro-batch only (``no_sync`` on the others). The mean of equal-sized
micro-batch means is the batch mean, so the data and the update do not depend on the number of processes or
of micro-batches (up to float32 summation order; tested). Rank 0 alone evaluates, prints and writes the
checkpoint and the plot. ``dtype`` runs the forward passes under ``torch.autocast`` (float16 with a
``GradScaler``, CUDA only); ``compile`` runs the training steps through ``torch.compile``.
"""

import contextlib
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
from jaxtyping import Int
from torch import Tensor, nn

from ._signals import Terminated
from .checkpoint import CHECKPOINT_NAME, Checkpoint, RunDirectoryError, run_directory, save_checkpoint, temporary_path
from .data import TextData, get_batch
from .gpt import GPT
from .shapecheck import typechecked

__all__ = [
    "DTYPES",
    "PRESET_TRAINING",
    "TrainConfig",
    "TrainResult",
    "TrainingDiverged",
    "compile_for_generation",
    "evaluate",
    "flops_per_token",
    "learning_rate",
    "measure_matmul_flops",
    "plot_history",
    "train",
]

#: The ``dtype`` choices: the forward passes' autocast dtype (float32: no autocast).
DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

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
    grad_accum: int = 1  # micro-batches per optimizer step in each process; batch_size is the global batch
    dtype: str = "float32"  # autocast dtype of the forward passes (DTYPES)
    compile: bool = False  # torch.compile the training steps

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
        positive = ("max_iters", "batch_size", "eval_interval", "eval_iters", "checkpoint_interval", "grad_accum")
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
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if not isinstance(self.compile, bool):
            raise ValueError(f"compile must be True or False, got {self.compile!r}")
        if self.batch_size % self.grad_accum != 0:
            raise ValueError(f"batch_size={self.batch_size} is not divisible by grad_accum={self.grad_accum}: "
                             "the global batch is split into equal micro-batches")


def learning_rate(config: TrainConfig, iteration: int) -> float:
    """The learning rate at ``iteration`` (see the module docstring)."""
    decay = config.lr_decay_iters or config.max_iters
    if iteration < config.warmup_iters:
        return config.learning_rate * (iteration + 1) / (config.warmup_iters + 1)
    if iteration > decay:
        return config.min_lr
    progress = (iteration - config.warmup_iters) / max(decay - config.warmup_iters, 1)
    return config.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (config.learning_rate - config.min_lr)


def flops_per_token(model: GPT) -> float:
    """Training FLOPs per token (forward and backward): ``6 N + 12 L h d T`` (PaLM's appendix B, nanoGPT's
    ``estimate_mfu``): N parameters without positions, L layers, h heads of size d, context T."""
    c = model.config
    return 6.0 * model.num_parameters() + 12.0 * c.n_layer * c.n_head * (c.n_embd // c.n_head) * c.block_size


def measure_matmul_flops(device: str = "cpu", dtype: torch.dtype = torch.float32, *, size: int = 512,
                         seconds: float = 0.1) -> float:
    """FLOP/s of square ``size`` matmuls in ``dtype`` on ``device`` with torch's current threads (the peak that
    MFU is reported against): the best rate of windows of 4 matmuls, over about ``seconds``. The best window, not
    the mean, so that another process running for part of the measurement does not lower the peak (which
    would overstate MFU; sustained load still does)."""
    generator = torch.Generator().manual_seed(0)  # not the global one: dropout's stream stays untouched
    a = torch.randn(size, size, generator=generator).to(device, dtype)
    b = torch.randn(size, size, generator=generator).to(device, dtype)
    cuda = torch.device(device).type == "cuda"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    torch.mm(a, b)
    sync()
    best = 0.0
    first = start = time.perf_counter()
    while True:
        for _ in range(4):
            torch.mm(a, b)
        sync()
        end = time.perf_counter()
        if end > start:
            best = max(best, 2.0 * size**3 * 4 / (end - start))
        if end - first >= seconds:
            return best
        start = end


@torch.no_grad()
def evaluate(model: GPT, batches: dict[str, list[tuple[Tensor, Tensor]]], *,
             autocast: Callable[[], contextlib.AbstractContextManager[Any]] | None = None) -> dict[str, float]:
    """Mean loss over fixed batches for each split, in eval mode (under ``autocast()`` when given)."""
    was_training = model.training
    model.eval()
    losses = {}
    for split, pairs in batches.items():
        total = 0.0
        for x, y in pairs:
            with autocast() if autocast is not None else contextlib.nullcontext():
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
    #: The training loss of every step of this call (the global batch's mean, the same on every rank).
    losses: list[float] | None = None
    #: Tokens per second of all processes together over the training steps after the first (evaluations,
    #: saves and the first step, which compiles with ``compile``, excluded); NaN after a single step.
    tokens_per_second: float = float("nan")
    #: Model FLOPs utilisation: ``flops_per_token * tokens_per_second / (world_size * peak_flops)``.
    mfu: float = float("nan")


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


def compile_for_generation(model: GPT, *, backend: str = "inductor", max_autotune: bool = True) -> GPT:
    """``model`` with its ``forward`` compiled by ``torch.compile`` for :meth:`GPT.generate`; returns the same model.

    :meth:`GPT.generate` stays eager and checks its arguments at the call; the compiled forward passes run without
    checks. Shapes are dynamic where they change (the cache length after the first step, the window length
    without the cache), so a generation compiles a handful of graphs, not one per step.

    With the ``"inductor"`` backend the weights are *frozen* into the compiled code (inductor's ``freezing``,
    applied only around this model's calls; it needs ``no_grad``, which ``generate`` has) and, with
    ``max_autotune``, each matrix-vector product of a cached step is benchmarked against inductor's own C++
    kernel, which on CPU reads the weights several times faster than the BLAS call eager mode makes (the
    cached step is bound by reading every weight once; see ``typed-transformer bench gpt``). So: compile
    after the weights are final; a compiled model whose weights then change keeps generating with the old ones.
    The first generation pays the compilation (tens of seconds on CPU).
    """
    import torch._inductor.config as inductor_config

    compiled = torch.compile(model.forward, backend=backend)
    if backend != "inductor":
        model.forward = compiled  # type: ignore[method-assign]
        return model
    # Inductor settings for this model's compilations only (they happen during its calls), not process-wide.
    # Autotuning reports each benchmark on stderr by default: quiet here, generation output is the user's.
    settings = {"freezing": True, "max_autotune": max_autotune, "max_autotune_report_choices_stats": False,
                "autotune_num_choices_displayed": 0}

    def forward(*args: Any, **kwargs: Any) -> Any:
        with inductor_config.patch(settings):
            return compiled(*args, **kwargs)

    model.forward = forward  # type: ignore[method-assign]
    return model


def _world() -> tuple[int, int]:
    """(rank, world size) of the initialised default ``torch.distributed`` group, else (0, 1)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


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
    peak_flops: float | None = None,
    compile_backend: str = "inductor",
) -> TrainResult:
    """Train ``model`` on ``data`` and write ``out_dir/checkpoint.safetensors`` and ``out_dir/loss.png``.

    A checkpoint is written every ``checkpoint_interval`` iterations, at the end, and when Ctrl-C or SIGTERM
    stops the run (between two steps, so the saved state is consistent). ``resume`` continues a saved run.

    Inside an initialised ``torch.distributed`` group (``torchrun``) every process calls this with the same
    arguments; the model is wrapped in ``DistributedDataParallel`` and rank 0 alone evaluates, prints, holds the
    run directory's lock and writes files (see the module docstring). ``peak_flops`` (FLOP/s of one process) is
    what MFU is reported against; by default it is measured (:func:`measure_matmul_flops`, in float32 on CPU,
    in ``config.dtype`` on CUDA). ``compile_backend`` is ``torch.compile``'s backend when ``config.compile``.

    Raises:
        RunDirectoryError: ``out_dir`` is unusable (a file, not writable, locked by another run), or it holds
            a checkpoint and neither ``resume`` nor ``overwrite`` was given.
        TrainingDiverged: the loss, the gradient norm or the weights became non-finite; the last checkpoint
            (finite) is kept and nothing was saved after it.
        ValueError: ``batch_size`` is not divisible by ``world_size * grad_accum``, or float16 on a CPU.
        OSError: a checkpoint or the plot could not be written (the previous checkpoint is intact).
    """
    out = Path(out_dir)
    rank, world = _world()
    if config.batch_size % (world * config.grad_accum) != 0:
        raise ValueError(f"batch_size={config.batch_size} is not divisible by {world} processes x grad_accum="
                         f"{config.grad_accum}: the global batch is split into equal micro-batches")
    if config.dtype == "float16" and torch.device(device).type != "cuda":
        raise ValueError("dtype float16 needs CUDA (autocast with a gradient scaler); on CPU use float32 or "
                         "bfloat16")
    with run_directory(out) if rank == 0 else contextlib.nullcontext(out):
        if resume is None and not overwrite and (out / CHECKPOINT_NAME).exists():
            raise RunDirectoryError(f"{out / CHECKPOINT_NAME} exists: continue that run with --resume or "
                                    "replace it with --overwrite")
        return _train(model, data, config, out, resume=resume, device=device, progress=progress, log=log,
                      info=info, on_step=on_step, peak_flops=peak_flops, compile_backend=compile_backend)


def _non_finite_weight(model: GPT) -> str | None:
    for name, param in model.named_parameters():
        if not bool(torch.isfinite(param).all()):
            return name
    return None


def _checked_call(model: GPT, net: nn.Module) -> Callable[[Tensor, Tensor], Tensor]:
    """``net(x, y)``'s loss, with ``x`` and ``y`` shape-checked here, outside the compiled module (checks do
    not run while ``torch.compile`` traces) against the model's vocabulary-free contract: both ``(b, t)``
    with ``t <= block_size``."""
    block = model.config.block_size

    def loss_of(x: Int[Tensor, "b t"], y: Int[Tensor, "b t"]) -> Tensor:
        if x.shape[1] > block:
            raise ValueError(f"train: batches of {x.shape[1]} positions, more than block_size={block}")
        _, loss = net(x, y)
        assert isinstance(loss, Tensor)
        return loss

    return typechecked(loss_of) if net is not model else loss_of


def _train(model: GPT, data: TextData, config: TrainConfig, out: Path, *, resume: Checkpoint | None, device: str,
           progress: bool, log: TextIO | None, info: dict[str, Any] | None,
           on_step: Callable[[int], None] | None, peak_flops: float | None, compile_backend: str) -> TrainResult:
    log = log if log is not None else sys.stderr
    rank, world = _world()
    main = rank == 0
    block = model.config.block_size
    model.to(device).train()
    device_type = torch.device(device).type
    amp_dtype = DTYPES[config.dtype]

    def autocast() -> contextlib.AbstractContextManager[Any]:
        if amp_dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(device_type, dtype=amp_dtype)

    # Fixed evaluation batches: the same windows at every evaluation and after a resume (rank 0 evaluates).
    eval_generator = torch.Generator().manual_seed(config.seed + 1)
    eval_batches: dict[str, list[tuple[Tensor, Tensor]]] = {}
    for split, ids in (("train", data.train), ("val", data.val)) if main else ():
        pairs = (get_batch(ids, config.batch_size, block, eval_generator) for _ in range(config.eval_iters))
        eval_batches[split] = [(x.to(device), y.to(device)) for x, y in pairs]
    optimizer = torch.optim.AdamW(model.parameter_groups(config.weight_decay), lr=config.learning_rate,
                                  betas=(config.beta1, config.beta2), fused=True if device_type == "cuda" else None)
    scaler = torch.amp.GradScaler(device_type) if config.dtype == "float16" else None
    batch_generator = torch.Generator().manual_seed(config.seed)
    torch.manual_seed(config.seed + rank)  # dropout (each rank its own masks)
    history: list[dict[str, float]] = []
    start = 0
    saved: tuple[int, Path] | None = None
    plotted = -1  # len(history) when loss.png was last drawn
    if resume is not None:
        if resume.optimizer_state is not None:
            optimizer.load_state_dict(resume.optimizer_state)
        if "batches" in resume.rng:
            batch_generator.set_state(resume.rng["batches"])
        if "torch" in resume.rng and main:
            torch.set_rng_state(resume.rng["torch"])
        elif not main:  # the checkpoint holds rank 0's dropout state; the others draw fresh masks
            torch.manual_seed(config.seed + rank + 7919 * resume.iteration)
        history = list(resume.history)
        start = resume.iteration
        if (out / CHECKPOINT_NAME).exists():
            saved = (start, out / CHECKPOINT_NAME)

    net: nn.Module = model
    if config.compile:
        net = torch.compile(model, backend=compile_backend)  # type: ignore[assignment]
    ddp: Any = None
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel

        index = torch.device(device).index
        ddp = DistributedDataParallel(net, device_ids=[index] if device_type == "cuda" and index is not None
                                      else None, forward_sync_buffers=False)
        net = ddp
    loss_of = _checked_call(model, net)

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
        probe = evaluate(model, {"val": eval_batches["val"][:1]}, autocast=autocast)["val"]
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
    if main and peak_flops is None:
        peak_flops = measure_matmul_flops(device, torch.float32 if device_type == "cpu" else amp_dtype)
    flops_per_step = flops_per_token(model) * tokens_per_step
    bar: Any = None
    if progress and main:
        from tqdm import tqdm

        bar = tqdm(total=config.max_iters, initial=start, desc="train", unit="it", file=log, dynamic_ncols=True)

    def say(message: str) -> None:
        if bar is not None:
            bar.write(message)
        else:
            print(message, file=log, flush=True)

    def evaluation(iteration: int) -> None:
        if not main:
            return
        losses = evaluate(model, eval_batches, autocast=autocast)
        if not all(math.isfinite(v) for v in losses.values()):
            raise diverged(iteration, f"the evaluation loss is {losses}")
        history.append({"iter": iteration, **losses})
        say(f"iter {iteration:5d}: train loss {history[-1]['train']:.4f}, val loss {history[-1]['val']:.4f}")

    accum = config.grad_accum
    rows = config.batch_size // world  # this rank's share of the global batch
    micro = rows // accum
    step_losses: list[float] = []
    interrupted = False
    stop_signal: int | None = None
    iteration = start
    last_loss = float("nan")
    step_seconds = 0.0
    path = out / CHECKPOINT_NAME
    try:
        with _Interrupt() as interrupt:
            while iteration < config.max_iters:
                if iteration % config.eval_interval == 0 and not any(h["iter"] == iteration for h in history):
                    evaluation(iteration)
                t0 = time.perf_counter()
                lr = learning_rate(config, iteration)
                for group in optimizer.param_groups:
                    group["lr"] = lr
                x, y = get_batch(data.train, config.batch_size, block, batch_generator)
                if world > 1:
                    x, y = x[rank * rows:(rank + 1) * rows], y[rank * rows:(rank + 1) * rows]
                optimizer.zero_grad(set_to_none=True)
                if accum == 1 and world == 1:  # the plain loop, unchanged
                    with autocast():
                        loss = loss_of(x.to(device), y.to(device))
                    last_loss = float(loss.detach())
                    if not math.isfinite(last_loss):
                        raise diverged(iteration, f"the training loss is {last_loss}")
                    (scaler.scale(loss) if scaler is not None else loss).backward()  # type: ignore[no-untyped-call]
                else:
                    total = torch.zeros((), device=device)
                    for m in range(accum):
                        # DDP all-reduces the gradients on the last micro-batch only.
                        sync = ddp is None or m == accum - 1
                        with contextlib.nullcontext() if sync else ddp.no_sync():
                            with autocast():
                                loss = loss_of(x[m * micro:(m + 1) * micro].to(device),
                                               y[m * micro:(m + 1) * micro].to(device))
                            part = loss / accum if accum > 1 else loss
                            (scaler.scale(part) if scaler is not None else part).backward()  # type: ignore[no-untyped-call]
                        total += part.detach().float()
                    if world > 1:
                        import torch.distributed as dist

                        # One small all-reduce: the loss (for every rank's divergence check and the log) and
                        # whether any rank was asked to stop, so that all ranks stop at the same step.
                        asked = 0.0 if interrupt.requested is None else 1.0
                        stats = torch.stack([total, torch.tensor(asked, device=device)])
                        dist.all_reduce(stats)
                        total = stats[0] / world
                        if float(stats[1]) > 0 and interrupt.requested is None:
                            interrupt.requested = signal.SIGINT
                    last_loss = float(total)
                    if not math.isfinite(last_loss):
                        raise diverged(iteration, f"the training loss is {last_loss}")
                if scaler is not None:
                    scaler.unscale_(optimizer)
                if config.grad_clip > 0:
                    norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip))
                    if not math.isfinite(norm) and scaler is None:
                        raise diverged(iteration, f"the gradient norm is {norm}")
                if scaler is not None:
                    scaler.step(optimizer)
                    scaler.update()
                else:
                    optimizer.step()
                if iteration > start:  # the first step (compilation, allocator warm-up) is not counted
                    step_seconds += time.perf_counter() - t0
                step_losses.append(last_loss)
                iteration += 1
                if on_step is not None:
                    on_step(iteration)
                if bar is not None:  # every step counts, so the bar ends at max_iters/max_iters
                    if step_seconds > 0:
                        speed = tokens_per_step * (iteration - start - 1) / step_seconds
                        bar_mfu = (flops_per_step * speed / tokens_per_step / (world * peak_flops) if peak_flops
                                   else None)
                        bar.set_postfix(loss=f"{last_loss:.4f}", tok_s=f"{speed:,.0f}",
                                        mfu="?" if bar_mfu is None else f"{100 * bar_mfu:.1f}%", refresh=False)
                    bar.update(1)
                if interrupt.requested is not None:
                    interrupted = True
                    stop_signal = interrupt.requested
                    break
                if iteration % config.checkpoint_interval == 0 and iteration < config.max_iters and main:
                    save(iteration)
            if not interrupted:
                evaluation(iteration)
            if main:
                path = save(iteration)
    finally:
        if bar is not None:
            bar.close()
    if world > 1:  # every rank leaves together, after rank 0's last save (a rank tearing down early can abort)
        import torch.distributed as dist

        dist.barrier()

    steps = iteration - start - 1  # timed steps: all but the first
    speed = tokens_per_step * steps / step_seconds if steps > 0 and step_seconds > 0 else float("nan")
    mfu = flops_per_step / tokens_per_step * speed / (world * peak_flops) if peak_flops else float("nan")
    sample_text = ""
    if config.sample_tokens and not interrupted and main:
        prompt = torch.tensor([data.tokenizer.encode(data.tokenizer.chars[0] if "\n" not in data.tokenizer.chars
                                                     else "\n")], device=device)
        with autocast():
            generated = model.eval().generate(prompt, config.sample_tokens,
                                              generator=torch.Generator(device=device).manual_seed(config.seed))
        sample_text = data.tokenizer.decode(generated[0, 1:].cpu())
        model.train()
    return TrainResult(model, history, iteration, interrupted, path, sample_text,
                       signal=stop_signal if interrupted else None, losses=step_losses,
                       tokens_per_second=speed, mfu=mfu)
