"""Training, evaluating and decoding the encoder-decoder :class:`~typed_transformer.seq2seq.Seq2SeqTransformer`
(``typed-transformer train-seq2seq`` and ``translate``).

Training is teacher forcing with cross-entropy over the target tokens (padding ignored), Adam with the
paper's betas (0.9, 0.98), a linear warmup and a cosine decay. Batches come from ``(seed, iteration)`` alone, so a
resumed run draws exactly the batches the uninterrupted run would have drawn. Evaluation greedy-decodes the held-out
pairs and reports *token accuracy* (target positions, ``eos`` included, where the output has the right token)
and *exact match* (outputs equal to the target). Checkpoints are safetensors files written atomically with
the same sha256 integrity field as the GPT's; a run directory is locked while a run uses it; a NaN or
infinite loss stops the run (exit 1) keeping the last finite checkpoint; the first Ctrl-C or SIGTERM saves
and stops.
"""

import hashlib
import json
import math
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, TextIO

import torch
import torch.nn.functional as F
from jaxtyping import Int
from torch import Tensor

from .checkpoint import CheckpointError, check_optimizer_state, check_tensor_names, checked_model
from .data import DataError
from .muon import MuonAdamW, muon_groups
from .run_files import (
    CHECKPOINT_NAME,
    content_digest,
    require_free_space,
    run_directory,
    write_atomically,
    write_text_atomically,
)
from .seq2seq import Seq2SeqTransformer
from .seq2seq_data import (
    BOS,
    EOS,
    MAX_PAIR_LENGTH,
    PAD,
    SYMBOLS,
    TASKS,
    Pair,
    PairVocab,
    encode_pairs,
    make_pairs,
    read_pairs,
    split_pairs,
)
from .shapecheck import shape_checked, shape_checks
from .step_loop import StepLoop, TrainingDiverged
from .validation import check_positive_int

__all__ = ["Seq2SeqCheckpoint", "Seq2SeqConfig", "Seq2SeqResult", "Seq2SeqTrainer", "evaluate_pairs", "load_seq2seq",
           "train_seq2seq", "translate"]

FORMAT = "typed-transformer-seq2seq/1"
_EVAL_SEED = 0x5EED  # the held-out stream of a synthetic task: another stream than the training batches'


@dataclass(frozen=True)
class Seq2SeqConfig:
    """A seq2seq run. ``task`` (synthetic) or ``data`` (a pairs file) gives the data; the defaults reverse
    sequences of 1-10 digits."""

    # Fields with "help" are train-seq2seq's flags (typed_transformer._options), with their ranges.
    task: str | None = field(default="reverse", metadata={
        "help": "synthetic task generated on the fly (default reverse); ignored with --data", "choices": TASKS})
    data: str | None = field(default=None, metadata={
        "help": "a UTF-8 file of source<TAB>target lines (character level)"})
    vocab: int = field(default=10, metadata={"help": "task symbols: the first N of 0-9a-z (10)", "range": (2, 36)})
    min_len: int = field(default=1, metadata={
        "help": "shortest task sequence (1; add: digits)", "range": (1, MAX_PAIR_LENGTH)})
    max_len: int = field(default=10, metadata={
        "help": "longest task sequence (10; add: digits)", "range": (1, MAX_PAIR_LENGTH)})
    held_out: float = field(default=0.1, metadata={"help": "fraction of --data held out (0.1)", "interval": "(0, 1]"})
    eval_pairs: int = field(default=500, metadata={"help": "held-out task pairs (500)", "range": (1, 100_000)})
    d_model: int = field(default=64, metadata={"help": "model width (64)", "range": (1, 65536)})
    nhead: int = field(default=4, metadata={"help": "attention heads (4)", "range": (1, 1024)})
    layers: int = field(default=2, metadata={"help": "encoder and decoder layers each (2)", "range": (1, 1024)})
    dim_feedforward: int = field(default=256, metadata={"help": "feed-forward width (256)", "range": (1, 65536)})
    dropout: float = field(default=0.0, metadata={"help": "dropout (0)", "interval": "[0, 1)"})
    norm_first: bool = field(default=True, metadata={
        "flag": "post_norm", "store": False,
        "help": "the paper's post-LN layers (default: pre-LN, which trains faster at this size)"})
    batch_size: int = field(default=64, metadata={"help": "pairs per step (64)", "range": (1, 4096)})
    max_iters: int = field(default=1500, metadata={"help": "training steps (1500)", "range": (0, 10**9)})
    learning_rate: float = field(default=2e-3, metadata={
        "help": "Adam's peak learning rate (2e-3)", "interval": "(0, 1]", "noun": "a learning rate"})
    warmup_iters: int = field(default=100, metadata={"help": "linear warmup steps (100)", "range": (0, 10**9)})
    optimizer: Literal["adam", "muon"] = field(default="adam", metadata={
        "help": "adam, or muon: Muon on the hidden matrices and Adam on the rest (adam)"})
    muon_lr: float = field(default=0.02, metadata={
        "help": "Muon's peak learning rate, on the schedule of --learning-rate (0.02)", "interval": "(0, 1]",
        "noun": "a learning rate"})
    eval_interval: int = field(default=250, metadata={
        "help": "evaluate and save every N steps (250)", "range": (1, 10**9)})
    seed: int = field(default=1337, metadata={
        "help": "data, initialisation and dropout seed (1337)", "range": (0, 2**32 - 1)})

    def __post_init__(self) -> None:
        if (self.task is None) == (self.data is None):
            raise ValueError("give a synthetic task or a pairs file, not both" if self.task else
                             "give a synthetic task (--task) or a pairs file (--data)")
        if self.task is not None and self.task not in TASKS:
            raise ValueError(f"--task {self.task!r}: choose {', '.join(TASKS)}")
        if not 1 <= self.min_len <= self.max_len:
            raise ValueError(f"--min-len {self.min_len} and --max-len {self.max_len}: need 1 <= min <= max")
        if self.d_model % self.nhead:
            raise ValueError(f"--d-model {self.d_model} is not divisible by --nhead {self.nhead}")
        positive = ("vocab", "eval_pairs", "d_model", "nhead", "layers", "dim_feedforward", "batch_size",
                    "eval_interval")
        for name in positive:
            check_positive_int(None, f"--{name.replace('_', '-')}", getattr(self, name))
        if self.max_iters < 0 or self.warmup_iters < 0:
            raise ValueError("--max-iters and --warmup-iters must be non-negative")
        if not 0 <= self.dropout < 1 or not 0 < self.held_out < 1:
            raise ValueError("--dropout must be in [0, 1) and --held-out in (0, 1)")
        if not 0 < self.learning_rate <= 1:
            raise ValueError(f"--learning-rate must be in (0, 1], got {self.learning_rate}")
        if self.optimizer not in ("adam", "muon"):
            raise ValueError(f"--optimizer must be adam or muon, got {self.optimizer!r}")
        if not 0 < self.muon_lr <= 1:
            raise ValueError(f"--muon-lr must be in (0, 1], got {self.muon_lr}")

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "Seq2SeqConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown setting {unknown[0]!r}")
        return cls(**values)


@dataclass
class Seq2SeqCheckpoint:
    """A trained model with its vocabulary, run settings, iteration, evaluation history and optimizer state."""

    model: Seq2SeqTransformer
    vocab: PairVocab
    config: Seq2SeqConfig
    iteration: int = 0
    history: list[dict[str, float]] = field(default_factory=list)
    optimizer_state: dict[str, Any] | None = None
    #: sha256 of the pairs of ``--data`` (None for a synthetic task, and in checkpoints written before it was kept)
    data_sha256: str | None = None
    #: The thread tuner's schedule (``RunThreads.state()``) of a ``threads="auto"`` run, for a resumed run to continue
    thread_state: dict[str, Any] | None = None


@dataclass
class Seq2SeqResult:
    model: Seq2SeqTransformer
    vocab: PairVocab
    history: list[dict[str, float]]
    iteration: int
    checkpoint: Path
    seconds: float
    signal: int | None = None  # the signal that stopped the run early, if one did


# ---------------------------------------------------------------------------------------------------
# Data and model
# ---------------------------------------------------------------------------------------------------


def _data(config: Seq2SeqConfig) -> tuple[PairVocab, list[Pair], list[Pair], str | None]:
    """Vocabulary, training pairs (empty for a task: its batches are generated), held-out pairs and the sha256
    of ``--data``'s pairs (None for a task)."""
    if config.data is not None:
        pairs = read_pairs(config.data)
        train, held = split_pairs(pairs, config.held_out, config.seed)
        return PairVocab.from_pairs(train + held), train, held, _pairs_sha256(pairs)
    assert config.task is not None
    held = make_pairs(config.task, config.eval_pairs, min_len=config.min_len, max_len=config.max_len,
                      vocab=config.vocab, seed=config.seed ^ _EVAL_SEED)
    alphabet = "0123456789+" if config.task == "add" else SYMBOLS[:config.vocab]
    return PairVocab("".join(sorted(alphabet))), [], held, None


#: the settings of the synthetic tasks alone: a run on --data has none of them
_TASK_FIELDS = ("task", "vocab", "min_len", "max_len", "eval_pairs")


def describe_config(config: Seq2SeqConfig) -> str:
    """The config as a run prints it: a run on ``--data`` without the synthetic task's settings, which it does not
    use (its vocabulary and lengths are the file's)."""
    if config.data is None:
        return repr(config)
    shown = ", ".join(f"{f.name}={getattr(config, f.name)!r}" for f in fields(config) if f.name not in _TASK_FIELDS)
    return f"Seq2SeqConfig({shown})"


def _pairs_sha256(pairs: list[Pair]) -> str:
    """The hash of the pairs a run trains on (the file's lines as read: blank lines and line endings aside)."""
    return hashlib.sha256(json.dumps(pairs, ensure_ascii=False).encode("utf-8")).hexdigest()


def _batch(config: Seq2SeqConfig, train: list[Pair], iteration: int) -> list[Pair]:
    seed = config.seed * 1_000_003 + iteration
    if config.task is not None:
        return make_pairs(config.task, config.batch_size, min_len=config.min_len, max_len=config.max_len,
                          vocab=config.vocab, seed=seed)
    return random.Random(seed).choices(train, k=config.batch_size)


def build_model(config: Seq2SeqConfig, vocab: PairVocab) -> Seq2SeqTransformer:
    return Seq2SeqTransformer(vocab.size, vocab.size, PAD, PAD, d_model=config.d_model, nhead=config.nhead,
                              num_encoder_layers=config.layers, num_decoder_layers=config.layers,
                              dim_feedforward=config.dim_feedforward, dropout=config.dropout,
                              norm_first=config.norm_first)


# ---------------------------------------------------------------------------------------------------
# Decoding and evaluation
# ---------------------------------------------------------------------------------------------------


def translate(model: Seq2SeqTransformer, vocab: PairVocab, sources: list[str], *, beam: int = 1,
              max_new_tokens: int | None = None, batch_size: int = 500) -> list[str]:
    """Decode each source: greedy (``beam=1``) or beam search; at most ``max_new_tokens`` tokens (default:
    twice the longest source plus 10)."""
    model.eval()
    out: list[str] = []
    device = _device_of(model)
    for start in range(0, len(sources), batch_size):
        chunk = sources[start:start + batch_size]
        src, _ = encode_pairs(vocab, [(s, s) for s in chunk])
        src = src.to(device)
        limit = max_new_tokens if max_new_tokens is not None else 2 * src.shape[1] + 10
        if beam == 1:
            ids = model.greedy_decode(src, bos_idx=BOS, eos_idx=EOS, max_new_tokens=limit)
        else:
            ids, _ = model.beam_search(src, bos_idx=BOS, eos_idx=EOS, max_new_tokens=limit, beam_size=beam)
        out.extend(vocab.decode(row[1:]) for row in ids.cpu())
    return out


def _device_of(model: torch.nn.Module) -> torch.device:
    """Where ``model``'s parameters are (the CPU for a model without any)."""
    return next((p.device for p in model.parameters()), torch.device("cpu"))


def evaluate_pairs(model: Seq2SeqTransformer, vocab: PairVocab, pairs: list[Pair]) -> dict[str, float]:
    """Greedy decoding of ``pairs``: ``token_accuracy`` over target positions (``eos`` included) and
    ``exact_match``, both fractions."""
    was_training = model.training
    src, tgt = encode_pairs(vocab, pairs)
    model.eval()
    ids = model.greedy_decode(src.to(_device_of(model)), bos_idx=BOS, eos_idx=EOS,
                              max_new_tokens=tgt.shape[1] - 1).cpu()
    model.train(was_training)
    got = torch.full_like(tgt, PAD)
    got[:, :ids.shape[1]] = ids
    real = tgt[:, 1:] != PAD
    right = (got[:, 1:] == tgt[:, 1:]) & real
    return {"token_accuracy": right.sum().item() / real.sum().item(),
            "exact_match": (right == real).all(dim=1).float().mean().item()}


# ---------------------------------------------------------------------------------------------------
# Checkpoints
# ---------------------------------------------------------------------------------------------------


def save_seq2seq(path: Path, model: Seq2SeqTransformer, vocab: PairVocab, config: Seq2SeqConfig, *,
                 iteration: int, history: list[dict[str, float]], optimizer: torch.optim.Optimizer | None,
                 data_sha256: str | None = None, thread_state: dict[str, Any] | None = None) -> Path:
    """Write the checkpoint atomically (the file or the directory to put it in)."""
    if path.is_dir() or not path.suffix:
        path = path / CHECKPOINT_NAME
    tensors = {f"model.{k}": v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    optimizer_meta: dict[str, Any] | None = None
    if optimizer is not None:
        state = optimizer.state_dict()
        optimizer_meta = {"param_groups": state["param_groups"], "state": {}}
        for index, values in state["state"].items():
            optimizer_meta["state"][str(index)] = sorted(values)
            for key, value in values.items():
                tensors[f"optim.{index}.{key}"] = torch.as_tensor(value).detach().contiguous().cpu()
    metadata = {"format": FORMAT, "config": json.dumps(asdict(config)), "vocab": json.dumps(vocab.chars),
                "iteration": str(iteration), "history": json.dumps(history), "optimizer": json.dumps(optimizer_meta)}
    if data_sha256 is not None:
        metadata["data_sha256"] = data_sha256
    if thread_state is not None:
        metadata["thread_state"] = json.dumps(thread_state)
    metadata["sha256"] = content_digest(tensors, metadata)
    write_atomically(path, tensors, metadata)
    return path


def load_seq2seq(path: str | Path) -> Seq2SeqCheckpoint:
    """Read and verify a checkpoint of :func:`train_seq2seq`.

    Raises:
        CheckpointError: missing, unreadable, not a seq2seq checkpoint, failing the integrity check, or with a
            field out of range (one line naming the path).
    """
    from safetensors import SafetensorError, safe_open

    path = Path(path)
    if path.is_dir():
        path = path / CHECKPOINT_NAME
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint")
    try:
        with safe_open(str(path), framework="pt", device="cpu") as handle:
            metadata = handle.metadata() or {}
            tensors = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118
    except (SafetensorError, OSError, ValueError, RuntimeError) as err:
        raise CheckpointError(f"{path}: not a readable checkpoint ({str(err).splitlines()[0]})") from None
    if metadata.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a typed-transformer seq2seq checkpoint (format "
                              f"{metadata.get('format')!r})")
    if content_digest(tensors, metadata) != metadata.get("sha256"):
        raise CheckpointError(f"{path}: corrupt checkpoint (integrity check failed: the tensors or metadata were "
                              "modified or damaged after it was written)")
    try:
        config = Seq2SeqConfig.from_dict(json.loads(metadata["config"]))
        vocab = PairVocab(json.loads(metadata["vocab"]))
        check_tensor_names(tensors, ("model", "optim"))  # the GPT loader's rule: a tensor nothing reads is refused
        weights = {k.removeprefix("model."): v for k, v in tensors.items() if k.startswith("model.")}
        model = checked_model(lambda: build_model(config, vocab), weights, path)  # names, shapes, dtypes, finite
        assert isinstance(model, Seq2SeqTransformer)
        meta = json.loads(metadata["optimizer"])
        optimizer_state = None if meta is None else {
            "param_groups": meta["param_groups"],
            "state": {int(i): {key: tensors[f"optim.{i}.{key}"] for key in keys} for i, keys in meta["state"].items()}}
        listed = {f"optim.{i}.{key}" for i, keys in ({} if meta is None else meta["state"]).items() for key in keys}
        unlisted = sorted(k for k in tensors if k.startswith("optim.") and k not in listed)
        if unlisted:
            raise ValueError(f"unexpected tensor {unlisted[0]}")
        if optimizer_state is not None:
            check_optimizer_state(optimizer_state, list(model.parameters()) if config.optimizer == "adam" else
                                  [p for group in _muon_groups(model, config) for p in group["params"]],
                                  torch.optim.Adam)
        data_sha256 = metadata.get("data_sha256")
        thread_state = json.loads(metadata["thread_state"]) if "thread_state" in metadata else None
        if thread_state is not None and not isinstance(thread_state, dict):
            raise ValueError(f"thread_state must be a dict, got {type(thread_state).__name__}")
        return Seq2SeqCheckpoint(model, vocab, config, int(metadata["iteration"]), json.loads(metadata["history"]),
                                 optimizer_state, data_sha256, thread_state)
    except CheckpointError:
        raise
    except (KeyError, TypeError, ValueError, RuntimeError) as err:
        raise CheckpointError(f"{path}: invalid checkpoint ({str(err).splitlines()[0] or type(err).__name__})"
                              ) from None


# ---------------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------------


def _muon_groups(model: Seq2SeqTransformer, config: Seq2SeqConfig) -> list[dict[str, Any]]:
    """:class:`~typed_transformer.muon.MuonAdamW`'s groups: Muon on the hidden matrices, Adam (no decay) on the
    embeddings, the output projection, the norms and the biases."""
    return muon_groups(model, [model.output_projection], weight_decay=0.0,
                       lr_scale=config.muon_lr / config.learning_rate)


def seq2seq_learning_rate(config: Seq2SeqConfig, iteration: int) -> float:
    """The encoder-decoder's learning rate at ``iteration``: a linear warmup to ``learning_rate`` over
    ``warmup_iters``, then a cosine decay to a tenth of the peak at ``max_iters``, held there after."""
    if iteration < config.warmup_iters:
        return config.learning_rate * (iteration + 1) / config.warmup_iters
    progress = (iteration - config.warmup_iters) / max(1, config.max_iters - config.warmup_iters)
    return config.learning_rate * (0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, progress))))


def _resumed(config: Seq2SeqConfig, out: Path, data_sha256: str | None) -> Seq2SeqCheckpoint:
    if not (out / CHECKPOINT_NAME).exists():
        raise CheckpointError(f"--resume: no checkpoint in {out} to continue")
    checkpoint = load_seq2seq(out)
    saved = asdict(checkpoint.config)
    changed = [k for k, v in asdict(config).items() if k not in ("max_iters", "eval_interval") and saved[k] != v]
    if changed:
        raise ValueError(f"--resume: --{changed[0].replace('_', '-')} is {getattr(config, changed[0])!r} but the "
                         f"checkpoint was trained with {saved[changed[0]]!r}")
    if checkpoint.data_sha256 not in (None, data_sha256):
        raise DataError(f"--resume: {config.data} is not the data the checkpoint was trained on (the sha256 of its "
                        "pairs differs: the file was edited)")
    return checkpoint


def train_seq2seq(config: Seq2SeqConfig, out: str | Path, *, resume: bool = False, log: TextIO | None = None,
                  progress: bool = False, on_step: Callable[[int], None] | None = None,
                  threads: int | str | None = None, device: str = "cpu") -> Seq2SeqResult:
    """Train per ``config`` into ``out`` (``out/checkpoint.safetensors``, ``out/config.json``), evaluating
    every ``eval_interval`` iterations and at the end; with ``resume``, go on from ``out``'s checkpoint.
    ``on_step(iteration)`` runs after each step; ``threads``: a count, or ``"auto"`` (timed on the steps,
    :mod:`~typed_transformer.threads`); None leaves torch's count alone; ``device``: where the model trains
    (``"cpu"``, ``"cuda"``: the checkpoint is saved from the CPU either way).

    Raises:
        DataError, ValueError: unusable data or settings. CheckpointError: a bad checkpoint to resume.
        RunDirectoryError: ``out`` unusable or locked. TrainingDiverged: the loss became NaN or infinite.
    """
    import sys

    stream = log if log is not None else sys.stderr  # progress on stderr, as train's (docs/training.md)
    out = Path(out)
    with run_directory(out):
        vocab, train, held, data_sha256 = _data(config)
        previous = _resumed(config, out, data_sha256) if resume else None
        if previous is not None and previous.vocab != vocab:
            raise DataError(f"--resume: the data's characters {vocab.chars!r} are not the checkpoint's "
                            f"{previous.vocab.chars!r}")
        torch.manual_seed(config.seed)
        model = previous.model if previous is not None else build_model(config, vocab)
        evaluations = (len(previous.history) if previous is not None else 0) + config.max_iters // config.eval_interval
        require_free_space(out, model, evaluations=evaluations + 2)  # a full disk found now, not at the first save
        write_text_atomically(out / "config.json", json.dumps(asdict(config), indent=2) + "\n")
        print(f"config: {describe_config(config)} (saved in {out / 'config.json'})", file=stream, flush=True)
        print(f"seq2seq: {sum(p.numel() for p in model.parameters()):,} parameters, vocabulary {vocab.size} "
              f"({vocab.chars!r} + pad, bos, eos), {len(held)} held-out pairs"
              + (f", resuming at iteration {previous.iteration}" if previous is not None and previous.iteration
                 else ""), file=stream, flush=True)
        loop = _LoopSettings(config.max_iters, config.batch_size, config.seed, config.eval_interval,
                             torch.get_num_threads() if threads is None else threads)
        trainer = Seq2SeqTrainer(model, loop, out, config=config, vocab=vocab, pairs=train, held=held,
                                 resume=previous, progress=progress, log=stream, on_step=on_step,
                                 data_sha256=data_sha256, device=device)
        with shape_checks(False):
            return trainer.run()


@dataclass(frozen=True)
class _LoopSettings:
    """What the step loop reads (:class:`~typed_transformer.step_loop.LoopSettings`): a seq2seq step is one batch
    in float32, unclipped, saved after each evaluation."""

    max_iters: int
    batch_size: int
    seed: int
    eval_interval: int
    threads: int | str
    grad_accum: int = 1
    grad_clip: float = 0.0
    dtype: str = "float32"
    compile: bool = False
    checkpoint_interval: int = 0  # not read: Seq2SeqTrainer.before_step saves after each evaluation


@shape_checked
class Seq2SeqTrainer(StepLoop[Seq2SeqResult]):
    """The encoder-decoder's training: :class:`~typed_transformer.step_loop.StepLoop`'s step path with teacher
    forcing (cross-entropy over the target tokens, padding ignored), Adam with the paper's betas, the warmup +
    cosine :func:`seq2seq_learning_rate`, batches and dropout drawn from ``(seed, iteration)``, and an evaluation
    (greedy decoding of the held-out pairs) and a checkpoint every ``eval_interval`` steps. One process."""

    desc = "train-seq2seq"
    keeps_thread_state = True  # a resumed threads="auto" run changes counts where the uninterrupted run does
    __shape_checked__ = ("next_batch",)
    model: Seq2SeqTransformer

    def __init__(self, model: Seq2SeqTransformer, loop: _LoopSettings, out: Path, *, config: Seq2SeqConfig,
                 vocab: PairVocab, pairs: list[Pair], held: list[Pair], resume: Seq2SeqCheckpoint | None = None,
                 progress: bool = False, log: TextIO | None = None,
                 on_step: Callable[[int], None] | None = None, data_sha256: str | None = None,
                 device: str = "cpu") -> None:
        self.settings, self.vocab, self.pairs, self.held = config, vocab, pairs, held
        self.data_sha256 = data_sha256
        self.began = time.perf_counter()
        super().__init__(model, loop, out, resume=resume, progress=progress, log=log, on_step=on_step,
                         device=device)

    def make_optimizer(self) -> torch.optim.Optimizer:
        if self.settings.optimizer == "muon":  # Muon on the hidden matrices, Adam on the rest (typed_transformer.muon)
            return MuonAdamW(_muon_groups(self.model, self.settings), lr=self.settings.learning_rate,
                             betas=(0.9, 0.98), eps=1e-9)
        return torch.optim.Adam(self.model.parameters(), lr=self.settings.learning_rate, betas=(0.9, 0.98), eps=1e-9)

    def make_loss(self) -> Callable[[Tensor, Tensor], Tensor]:
        def loss_of(src: Tensor, tgt: Tensor) -> Tensor:
            logits = self.net(src, tgt[:, :-1])
            return F.cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten(), ignore_index=PAD)

        return loss_of

    def learning_rate(self, iteration: int) -> float:
        return seq2seq_learning_rate(self.settings, iteration)

    def next_batch(self) -> tuple[Int[Tensor, "b s"], Int[Tensor, "b t"]]:
        """A batch of pairs: sources ``(b, s)``, targets ``bos ... eos`` ``(b, t)``, padded."""
        torch.manual_seed(self.settings.seed * 1_000_003 + self.iteration)  # dropout: the same after a resume
        return encode_pairs(self.vocab, _batch(self.settings, self.pairs, self.iteration))

    def _restore(self, resume: Seq2SeqCheckpoint) -> None:
        if resume.optimizer_state is not None:
            self.optimizer.load_state_dict(resume.optimizer_state)
        self.history, self.start = list(resume.history), resume.iteration
        self.thread_state = resume.thread_state

    def run(self) -> Seq2SeqResult:
        self.began = time.perf_counter()
        return super().run()

    def _loop(self, interrupt: Any) -> int | None:
        stop = super()._loop(interrupt)
        if stop is not None and self.iteration % self.config.eval_interval == 0 and self.iteration > self.start:
            # stopped where an evaluation is due: made now (its loss is the last step's), as the uninterrupted run
            # makes it; the resumed run starts after it
            self.evaluation(self.iteration)
        return stop

    def before_step(self, iteration: int) -> None:
        if iteration % self.config.eval_interval == 0 and iteration > self.start:
            self.evaluation(iteration)
            self.save(iteration)

    def evaluation(self, iteration: int) -> None:
        if self.history and self.history[-1]["iter"] == iteration:
            return
        scores = evaluate_pairs(self.model, self.vocab, self.held)
        loss = self.losses[-1] if self.losses else float("nan")
        self.history.append({"iter": iteration, "loss": loss, **scores})
        self.say(f"iter {iteration:5d}: loss {loss:.4f}, held-out token accuracy {scores['token_accuracy']:.1%}, "
                 f"exact match {scores['exact_match']:.1%} ({time.perf_counter() - self.began:.1f} s)")

    def save(self, iteration: int) -> Path:
        path = save_seq2seq(self.out, self.model, self.vocab, self.settings, iteration=iteration,
                            history=self.history, optimizer=self.optimizer, data_sha256=self.data_sha256,
                            thread_state=None if self.run_threads is None else self.run_threads.state())
        self.saved = (iteration, path)
        return path

    def diverged(self, iteration: int, what: str) -> TrainingDiverged:
        kept = self.out / CHECKPOINT_NAME
        return TrainingDiverged(f"{what.replace('training loss', 'loss')} at iteration {iteration}; the last finite "
                                f"checkpoint is kept ({kept if kept.exists() else 'none yet'})", iteration,
                                kept if kept.exists() else None)

    def _result(self, path: Path, stop: int | None) -> Seq2SeqResult:
        return Seq2SeqResult(self.model.eval(), self.vocab, self.history, self.iteration, path,
                             time.perf_counter() - self.began, stop)


def held_out_sample(config: Seq2SeqConfig, count: int = 3) -> list[Pair]:
    """The first ``count`` held-out pairs of ``config`` (for showing examples after a run)."""
    return _data(config)[2][:count]



# ---------------------------------------------------------------------------------------------------
# The two commands (the command line parses the flags and maps the errors to one line and an exit code)
# ---------------------------------------------------------------------------------------------------


def train_command(args: Any) -> int:
    """``typed-transformer train-seq2seq``: flags named as :class:`Seq2SeqConfig`'s fields."""
    import signal
    import sys

    from ._options import values_of

    settings = values_of(args, Seq2SeqConfig)
    if "data" in settings:  # --task is ignored with --data
        settings["task"] = None
    config = Seq2SeqConfig(**settings)
    out = Path(args.out)
    if not args.resume and not args.overwrite and (out / CHECKPOINT_NAME).exists():
        raise ValueError(f"{out / CHECKPOINT_NAME} exists: continue that run with --resume or replace it with "
                         "--overwrite")
    result = train_seq2seq(config, out, resume=args.resume, progress=not args.no_progress and sys.stderr.isatty(),
                           log=sys.stderr, threads=args.threads, device=args.device)
    if result.signal is not None:
        name = "Ctrl-C" if result.signal == signal.SIGINT else signal.Signals(result.signal).name
        print(f"interrupted ({name}) at iteration {result.iteration}; saved {result.checkpoint} "
              "(continue with --resume)", file=sys.stderr)
        return 128 + result.signal
    last = result.history[-1] if result.history else {}
    print(f"done: iteration {result.iteration} in {result.seconds:.1f} s, held-out exact match "
          f"{last.get('exact_match', float('nan')):.1%}, token accuracy {last.get('token_accuracy', float('nan')):.1%}"
          f"; checkpoint {result.checkpoint}")
    examples = held_out_sample(config)
    sources = [s for s, _ in examples]
    for (source, target), got in zip(examples, translate(result.model, result.vocab, sources), strict=True):
        print(f"  {source!r} -> {got!r} ({'right' if got == target else f'expected {target!r}'})")
    return 0


def _stdin_lines(stdin: TextIO | None) -> list[tuple[str, str]]:
    """The non-blank lines of stdin as ``("stdin line N", line)``, each without its ``\n`` or ``\r\n``; a line
    that is not UTF-8 is named with its byte and line number, a closed stdin (``<&-``) is nothing to translate."""
    if stdin is None:
        raise ValueError("nothing to translate: give --text or lines on stdin (stdin is closed)")
    buffer = getattr(stdin, "buffer", None)
    try:
        data = buffer.read() if buffer is not None else stdin.read().encode("utf-8", "surrogateescape")
    except (OSError, ValueError) as err:  # a closed descriptor behind sys.stdin
        raise ValueError(f"nothing to translate: stdin cannot be read ({err})") from None
    lines = []
    for number, raw in enumerate(data.split(b"\n"), 1):
        try:
            line = raw.removesuffix(b"\r").decode("utf-8")
        except UnicodeDecodeError as err:
            raise ValueError(f"stdin line {number} is not UTF-8 (byte 0x{raw[err.start]:02x} at byte "
                             f"{err.start + 1} of the line)") from None
        if line.strip(" \t"):
            lines.append((f"stdin line {number}", line))
    return lines


def translate_command(args: Any) -> int:
    """``typed-transformer translate``: each ``--text`` (or each line of stdin) decoded, one line each."""
    import sys

    checkpoint = load_seq2seq(args.checkpoint)
    checkpoint.model.to(args.device)
    sources = [(f"--text {i}", text) for i, text in enumerate(args.text or [], 1)] or _stdin_lines(sys.stdin)
    if not sources:
        raise ValueError("nothing to translate: give --text or lines on stdin")
    texts = [text for _, text in sources]
    if "" in texts:
        raise ValueError(f"--text is empty (text {texts.index('') + 1})")
    for where, text in sources:  # refused before any attention runs over it
        if len(text) > MAX_PAIR_LENGTH:
            raise ValueError(f"{where} has {len(text):,} characters; at most {MAX_PAIR_LENGTH} (the longest sequence "
                             "train-seq2seq trains on)")
    if not 1 <= args.beam < checkpoint.vocab.size:
        raise ValueError(f"--beam must be in [1, {checkpoint.vocab.size - 1}] for this vocabulary, got {args.beam}")
    for line in translate(checkpoint.model, checkpoint.vocab, texts, beam=args.beam,
                          max_new_tokens=args.max_new_tokens):
        print(line)
    return 0
