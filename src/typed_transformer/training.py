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
resumable to any length on one schedule. What ``train --resume`` accepts of the flags, the preset, the seed and
the text is :func:`resumed_run`'s.

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
import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

import torch
from jaxtyping import Int
from torch import Tensor, nn

from ._deprecation import warn_deprecated
from .checkpoint import Checkpoint, save_checkpoint
from .config import DTYPES, PRESET_TRAINING, TrainConfig
from .data import CharTokenizer, TextData, get_batch
from .generation import sample_text
from .gpt import GPT, GPTConfig
from .muon import MuonAdamW, muon_groups
from .plot import plot_history
from .run_files import CHECKPOINT_NAME, RunDirectoryError, run_directory
from .shapecheck import shape_checked, typechecked
from .step_loop import PeerFailed, StepLoop, TrainingDiverged, rank_and_world
from .threads import at_each_count, resolve_threads

__all__ = [
    "DTYPES",
    "PRESET_TRAINING",
    "PeerFailed",
    "TrainConfig",
    "TrainResult",
    "Trainer",
    "TrainingDiverged",
    "check_run_sizes",
    "evaluate",
    "flops_per_token",
    "gpt_learning_rate",
    "measure_matmul_flops",
    "measure_peak_flops",
    "remeasure_peak",
    "resumed_run",
    "train",
]


def measure_peak_flops(device: str, dtype: torch.dtype, threads: int | str | None) -> tuple[float, int]:
    """The peak FLOP/s that MFU is reported against, and the thread count it was measured at: with a fixed
    count (``threads`` an int, or the user's ``OMP_NUM_THREADS``/``torch.set_num_threads``), at that count; with
    ``"auto"`` on CPU, the fastest of the candidate counts (:func:`~typed_transformer.threads.at_each_count`),
    since the steps will run at the fastest count too (one thread when another process holds a core, where the
    default count's matmuls collapse and would make MFU read several hundred percent)."""
    choice = resolve_threads(threads)
    if choice.count is not None or torch.device(device).type != "cpu":
        if choice.source == "--threads" and choice.count is not None:
            torch.set_num_threads(choice.count)
        return measure_matmul_flops(device, dtype), torch.get_num_threads()
    rates = at_each_count(lambda: measure_matmul_flops(device, dtype))
    best = max(rates, key=lambda count: rates[count])
    return rates[best], best


def gpt_learning_rate(config: TrainConfig, iteration: int) -> float:
    """The GPT's learning rate at ``iteration``, nanoGPT's ``get_lr`` (see the module docstring): warmup to
    ``learning_rate``, cosine decay to ``min_lr`` at ``lr_decay_iters`` (default ``max_iters``), ``min_lr`` after."""
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
def evaluate(model: GPT, batches: dict[str, list[tuple[Int[Tensor, "b t"], Int[Tensor, "b t"]]]], *,
             autocast: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
             ) -> dict[str, float]:
    """Mean loss over fixed batches for each split, in eval mode under ``autocast()`` (default: none)."""
    was_training = model.training
    model.eval()
    losses = {}
    for split, pairs in batches.items():
        total = 0.0
        for x, y in pairs:
            with autocast():
                _, loss = model(x, y)
            assert loss is not None
            total += float(loss)
        losses[split] = total / len(pairs)
    model.train(was_training)
    return losses


evaluate = typechecked(evaluate)


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
    #: Model FLOPs utilisation: ``flops_per_token * tokens_per_second / (world_size * peak_flops)``, against the
    #: higher of the peaks measured at the start and the end of the run (a load that falls during the run
    #: makes the start's too low), or the given ``peak_flops``.
    mfu: float = float("nan")
    #: The peaks measured at the start and the end (FLOP/s of one process; empty when ``peak_flops`` was given).
    peaks: tuple[float, ...] = ()
    #: The intra-op thread count at the end of the run (``config.threads``, or what ``"auto"`` chose).
    threads: int | None = None


def remeasure_peak(result: TrainResult, start: float, measure: Callable[[], float]) -> TrainResult:
    """``result`` of a finished run whose peak ``start`` was measured at its start: the peak measured again now
    (``measure()``), MFU against the higher of the two (a load that fell during the run made the first too low),
    both in ``peaks``. An interrupted run, or one without a throughput, is returned as it is."""
    if result.interrupted or not math.isfinite(result.mfu):
        return result
    end = measure()
    return dataclasses.replace(result, mfu=result.mfu * start / max(start, end), peaks=(start, end))




#: The most tokens of one step (batch size x block size; the baby run has 768, the seed run 3,072).
MAX_TOKENS_PER_STEP = 2**18
#: The most evaluation tokens (eval iters x batch size x block size), held in memory for the whole run.
MAX_EVAL_TOKENS = 2**24


def check_run_sizes(batch_size: int, block_size: int, eval_iters: int) -> None:
    """Refuse combinations of in-range sizes that cannot fit (each flag alone is bounded by the parser)."""
    step = batch_size * block_size
    if step > MAX_TOKENS_PER_STEP:
        raise ValueError(f"--batch-size {batch_size} x block size {block_size} = {step:,} tokens per step, more than "
                         f"{MAX_TOKENS_PER_STEP:,}; lower --batch-size or --block-size")
    if eval_iters * step > MAX_EVAL_TOKENS:
        raise ValueError(f"--eval-iters {eval_iters} x {step:,} tokens per batch = {eval_iters * step:,} evaluation "
                         f"tokens held in memory, more than {MAX_EVAL_TOKENS:,}; lower --eval-iters or --batch-size")



def resumed_run(resume: Checkpoint, overrides: dict[str, Any], train_overrides: dict[str, Any], *,
                requested_preset: str | None, text: str, text_sha256: str, source: str, out: Path,
                err: TextIO) -> tuple[GPT, TrainConfig, TextData, str]:
    """``train --resume``'s policy: the checkpoint's model, its settings with the command's overrides (the model's
    ``overrides`` and the run's ``train_overrides``, by field name) and the data, after checking that the flags,
    the seed and the text are the saved run's; ``out`` is the run directory, ``err`` where the notes go. Returns
    (model, config, data, preset).

    Raises:
        ValueError: a flag, the preset, the seed or the text differs from the saved run's, the sizes do not fit
            (:func:`check_run_sizes`), or the checkpoint is already at ``max_iters``.
    """
    model = resume.model
    preset = _resumed_preset(requested_preset, resume, overrides)
    for key, value in overrides.items():
        if getattr(model.config, key) != value:
            raise ValueError(f"--{key.replace('_', '-')} {value} differs from the checkpoint's "
                             f"{getattr(model.config, key)}; a resumed run keeps its model")
    saved_seed = resume.train_config.get("seed", TrainConfig.seed)
    if train_overrides.get("seed", saved_seed) != saved_seed:
        raise ValueError(f"--seed {train_overrides['seed']} differs from the checkpoint's {saved_seed}; a "
                         "resumed run continues the saved random state")
    config = TrainConfig.overridden(resume.train_config, **train_overrides)
    tokenizer = resume.tokenizer
    saved_hash, saved_chars = resume.info.get("text_sha256"), resume.info.get("text_chars")
    if saved_hash not in (None, text_sha256) or saved_chars not in (None, len(text)):
        what = "length" if saved_chars not in (None, len(text)) else "sha256"
        raise ValueError(f"{source} is not the text the checkpoint was trained on (its {what} differs from "
                         f"that of {resume.info.get('source', 'the saved text')})")
    if CharTokenizer.from_text(text) != tokenizer:
        raise ValueError(f"{source}: its vocabulary ({len(set(text))} characters) differs from the "
                         f"checkpoint's ({tokenizer.vocab_size})")
    check_run_sizes(config.batch_size, model.config.block_size, config.eval_iters)
    data = TextData.from_text(text, model.config.block_size, tokenizer=tokenizer, source=source)
    if resume.iteration >= config.max_iters:
        raise ValueError(f"the checkpoint is already at iteration {resume.iteration}; "
                         "pass a larger --max-iters")
    print(f"resuming {out / CHECKPOINT_NAME} at iteration {resume.iteration}", file=err)
    old = TrainConfig.overridden(resume.train_config)
    if config.lr_decay_iters is None and old.max_iters != config.max_iters:
        it = resume.iteration
        print(f"note: the learning rate now decays over {config.max_iters} iterations instead of "
              f"{old.max_iters}: {gpt_learning_rate(config, it):.3g} at iteration {it} (the shorter schedule "
              f"had {gpt_learning_rate(old, it):.3g}); see docs/reliability.md", file=err)
    return model, config, data, preset


def _resumed_preset(requested: str | None, resume: Checkpoint, overrides: dict[str, Any]) -> str:
    """The preset a resumed run reports; refuses a ``--preset`` whose sizes are not the checkpoint's model's."""
    model, saved_preset = resume.model, resume.info.get("preset")
    if requested is not None:
        # The preset's architecture with this command's size flags (--n-layer, --n-head, --n-embd); block
        # size, dropout and positions are flags of their own, checked by the caller.
        sizes = {key: overrides[key] for key in ("n_layer", "n_head", "n_embd") if key in overrides}
        expected = GPTConfig.preset(requested, model.config.vocab_size, **sizes)
        same = all(getattr(expected, key) == getattr(model.config, key) for key in ("n_layer", "n_head", "n_embd"))
        if (saved_preset is not None and saved_preset != requested) or not same:
            raise ValueError(f"--preset {requested} differs from the checkpoint's model "
                             f"({saved_preset or 'custom'}: n_layer={model.config.n_layer}, "
                             f"n_head={model.config.n_head}, n_embd={model.config.n_embd}); "
                             "a resumed run keeps its model")
    return str(saved_preset or "checkpoint's")


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
    what MFU is reported against; by default it is measured (:func:`measure_peak_flops`, in float32 on CPU at
    the fastest thread count with ``threads="auto"``, in ``config.dtype`` on CUDA). ``compile_backend`` is
    ``torch.compile``'s backend when ``config.compile``.

    Raises:
        RunDirectoryError: ``out_dir`` is unusable (a file, not writable, locked by another run, too little free
            space for two checkpoints: :func:`~typed_transformer.run_files.require_free_space`), or it holds a
            checkpoint and neither ``resume`` nor ``overwrite`` was given.
        TrainingDiverged: the loss, the gradient norm or the weights became non-finite; the last checkpoint
            (finite) is kept and nothing was saved after it.
        PeerFailed: another process of a ``torchrun`` run stopped (its message names the last checkpoint).
        ValueError: ``batch_size`` is not divisible by ``world_size * grad_accum``, or float16 on a CPU.
        OSError: a checkpoint or the plot could not be written (the previous checkpoint is intact).
    """
    out = Path(out_dir)
    rank, world = rank_and_world()
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
        if rank == 0:  # a full disk found now, not at the first save
            from ._memory import require_training_memory
            from .run_files import require_free_space

            count = sum(p.numel() for p in model.parameters())
            require_training_memory(count, allocated=count, advice="train a smaller model, or on a larger machine")
            evaluations = len(resume.history) if resume is not None else 0
            require_free_space(out, model, evaluations=evaluations + config.max_iters // config.eval_interval + 2)
        return Trainer(model, data, config, out, resume=resume, device=device, progress=progress, log=log,
                       info=info, on_step=on_step, peak_flops=peak_flops, compile_backend=compile_backend).run()


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




@shape_checked
class Trainer(StepLoop[TrainResult]):
    """The GPT's training loop (:func:`train` holds the run directory's lock around it): build it with
    ``train``'s arguments inside that lock, then :meth:`run` it once. The step path is
    :class:`~typed_transformer.step_loop.StepLoop`'s.

    Extension points (override in a subclass, or pass ``on_step`` to :func:`train`):

    - :meth:`after_step` runs after every optimizer step with the new iteration and the step's loss; it calls
      ``on_step`` and advances the progress bar. Per-step work that is not training (re-checking the thread
      count, logging) goes there.
    - :meth:`next_batch` draws the step's global batch and returns this process's rows ``(inputs, targets)``;
      :meth:`micro_loss` is the loss of one micro-batch (``self.loss_of``: the model's ``(x, y) -> loss``).
    - :meth:`evaluate_splits` gives the evaluation losses by split; :meth:`save` writes the checkpoint (after
      checking that the weights are finite) and the loss plot.
    """

    model: GPT
    config: TrainConfig
    keeps_thread_state = True
    __shape_checked__ = ("next_batch",)

    def __init__(self, model: GPT, data: TextData, config: TrainConfig, out: Path, *, resume: Checkpoint | None = None,
                 device: str = "cpu", progress: bool = True, log: TextIO | None = None,
                 info: dict[str, Any] | None = None, on_step: Callable[[int], None] | None = None,
                 peak_flops: float | None = None, compile_backend: str = "inductor") -> None:
        self.data, self.info = data, info
        self._plotted = -1  # len(history) when loss.png was last drawn
        super().__init__(model, config, out, resume=resume, device=device, progress=progress, log=log,
                         on_step=on_step, peak_flops=peak_flops, compile_backend=compile_backend)
        self.tokens_per_step = config.batch_size * self.block

    def prepare(self) -> None:
        self.block = self.model.config.block_size
        self.eval_batches = self._eval_batches()

    def make_optimizer(self) -> torch.optim.Optimizer:
        # fused: one kernel for every parameter's update (CPU and CUDA), the same update as torch's default
        # foreach path up to float rounding (tested) and several times faster on CPU at the baby preset
        # (benchmarks/main_job_profile.py prints both side by side).
        fused = True if self.device_type in ("cpu", "cuda") else None
        betas = (self.config.beta1, self.config.beta2)
        if self.config.optimizer == "muon":  # Muon on the hidden matrices, AdamW on the rest (typed_transformer.muon)
            return MuonAdamW(muon_groups(self.model, [self.model.lm_head], weight_decay=self.config.weight_decay,
                                         lr_scale=self.config.muon_lr / self.config.learning_rate,
                                         ns_steps=self.config.ns_steps),
                             lr=self.config.learning_rate, betas=betas, fused=fused)
        return torch.optim.AdamW(self.model.parameter_groups(self.config.weight_decay), lr=self.config.learning_rate,
                                 betas=betas, fused=fused)

    def make_loss(self) -> Callable[[Tensor, Tensor], Tensor]:
        return _checked_call(self.model, self.net)

    def peak(self, peak_flops: float | None) -> float | None:
        self.peaks: tuple[float, ...] = ()
        if self.main and peak_flops is None:
            peak_flops = self.measure_peak()
            self.peaks = (peak_flops,)
        return peak_flops

    def measure_peak(self) -> float:
        return measure_peak_flops(self.device, torch.float32 if self.device_type == "cpu" else self.amp_dtype,
                                  self.config.threads)[0]

    def learning_rate(self, iteration: int) -> float:
        return gpt_learning_rate(self.config, iteration)

    def _eval_batches(self) -> dict[str, list[tuple[Int[Tensor, "b t"], Int[Tensor, "b t"]]]]:
        """Fixed evaluation batches: the same windows at every evaluation and after a resume (rank 0 evaluates)."""
        generator = torch.Generator().manual_seed(self.config.seed + 1)
        batches: dict[str, list[tuple[Tensor, Tensor]]] = {}
        size, count = self.config.batch_size, self.config.eval_iters
        for split, ids in (("train", self.data.train), ("val", self.data.val)) if self.main else ():
            pairs = (get_batch(ids, size, self.block, generator) for _ in range(count))
            batches[split] = [(x.to(self.device), y.to(self.device)) for x, y in pairs]
        return batches

    def _restore(self, resume: Checkpoint) -> None:
        """Continue ``resume``: optimizer, batch sampling and dropout states, history and iteration."""
        if resume.optimizer_state is not None:
            self.optimizer.load_state_dict(resume.optimizer_state)
        if "batches" in resume.rng:
            self.batch_generator.set_state(resume.rng["batches"])
        if "torch" in resume.rng and self.main:
            torch.set_rng_state(resume.rng["torch"])
        elif not self.main:  # the checkpoint holds rank 0's dropout state; the others draw fresh masks
            torch.manual_seed(self.config.seed + self.rank + 7919 * resume.iteration)
        self.history = list(resume.history)
        self.start = resume.iteration
        self.thread_state = resume.info.get("thread_state")
        if (self.out / CHECKPOINT_NAME).exists():
            self.saved = (self.start, self.out / CHECKPOINT_NAME)

    def next_batch(self) -> tuple[Int[Tensor, "b t"], Int[Tensor, "b t"]]:
        """This process's rows of the step's global batch, drawn from the seeded batch generator."""
        x, y = get_batch(self.data.train, self.config.batch_size, self.block, self.batch_generator)
        if self.world > 1:
            rows = self.config.batch_size // self.world
            x, y = x[self.rank * rows:(self.rank + 1) * rows], y[self.rank * rows:(self.rank + 1) * rows]
        return x, y

    def progress_postfix(self, iteration: int, loss: float) -> dict[str, str]:
        if self.step_seconds <= 0:
            return {}
        speed = self.tokens_per_step * (iteration - self.start - 1) / self.step_seconds
        mfu = (f"{100 * flops_per_token(self.model) * speed / (self.world * self.peak_flops):.1f}%"
               if self.peak_flops else "?")
        return {"loss": f"{loss:.4f}", "tok_s": f"{speed:,.0f}", "mfu": mfu}

    def evaluate_splits(self) -> dict[str, float]:
        """The mean loss of each split's fixed evaluation batches."""
        return evaluate(self.model, self.eval_batches, autocast=self.autocast)

    def evaluation(self, iteration: int) -> None:
        """Rank 0: evaluate, stop on a non-finite loss, append to the history and print."""
        if not self.main:
            return
        losses = self.evaluate_splits()
        if not all(math.isfinite(v) for v in losses.values()):
            raise self.diverged(iteration, f"the evaluation loss is {losses}")
        self.history.append({"iter": iteration, **losses})
        self.say(f"iter {iteration:5d}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")

    def save(self, iteration: int) -> Path:
        """Check the weights, write the checkpoint and (after a new evaluation) the loss plot; returns the path."""
        bad = _non_finite_weight(self.model)
        if bad is not None:
            raise self.diverged(iteration, f"weight {bad} holds NaN or infinity")
        # Finite but exploded weights (a huge step) show as a non-finite loss: one batch decides before saving.
        probe = evaluate(self.model, {"val": self.eval_batches["val"][:1]}, autocast=self.autocast)["val"]
        if not math.isfinite(probe):
            raise self.diverged(iteration, f"the loss of the weights to be saved is {probe}")
        rng = {"batches": self.batch_generator.get_state(), "torch": torch.get_rng_state()}
        info: dict[str, Any] = {} if self.info is None else {
            **self.info, "threads": f"{torch.get_num_threads()} ({self.threads.source})"}
        if self.run_threads is not None:  # the thread schedule, for a resumed run to continue
            info["thread_state"] = self.run_threads.state()
        path = save_checkpoint(self.out / CHECKPOINT_NAME, self.model, self.data.tokenizer, iteration=iteration,
                               train_config=asdict(self.config), history=self.history, optimizer=self.optimizer,
                               rng=rng, info=info)
        self.saved = (iteration, path)
        if self._plotted != len(self.history):  # the curve changes only with a new evaluation
            plot_history(self.history, self.out / "loss.png")
            self._plotted = len(self.history)
        return path

    def _result(self, path: Path, stop: int | None) -> TrainResult:
        """The run's result: throughput over the timed steps, MFU and (rank 0, finished runs) the sample."""
        steps = self.iteration - self.start - 1  # timed steps: all but the first
        speed = (self.tokens_per_step * steps / self.step_seconds if steps > 0 and self.step_seconds > 0
                 else float("nan"))
        mfu = flops_per_token(self.model) * speed / (self.world * self.peak_flops) if self.peak_flops else float("nan")
        sample = ""
        if self.config.sample_tokens and stop is None and self.main:
            sample = sample_text(self.model, self.data.tokenizer, self.config.sample_tokens, seed=self.config.seed,
                                 device=self.device, autocast=self.autocast)
        result = TrainResult(self.model, self.history, self.iteration, stop is not None, path, sample, signal=stop,
                             losses=self.losses, tokens_per_second=speed, mfu=mfu, threads=torch.get_num_threads())
        return remeasure_peak(result, self.peaks[0], self.measure_peak) if self.peaks else result


def __getattr__(name: str) -> Any:
    """Old import paths: ``compile_for_generation`` moved to :mod:`~typed_transformer.generation`;
    ``learning_rate`` is :func:`gpt_learning_rate`."""
    if name == "learning_rate":
        warn_deprecated("typed_transformer.training.learning_rate is deprecated, use "
                        "typed_transformer.training.gpt_learning_rate")
        return gpt_learning_rate
    if name == "compile_for_generation":
        from . import generation

        warn_deprecated("typed_transformer.training.compile_for_generation is deprecated, use "
                        "typed_transformer.generation.compile_for_generation")
        return generation.compile_for_generation
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
