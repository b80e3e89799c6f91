"""The settings of a training run: :class:`TrainConfig` (optimisation, evaluation, checkpoints, precision), the
model presets' own training settings and the autocast dtypes.

This module sits below :mod:`~typed_transformer.checkpoint` and :mod:`~typed_transformer.training`: a checkpoint
validates the run settings it stores against :class:`TrainConfig` without importing the training loop.
"""

import math
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from ._options import THREADS_HELP, parse_threads
from .validation import check_positive_int

__all__ = ["DEFAULT_PRESET", "DTYPES", "MAX_ITERS", "MAX_SEED", "MAX_TOKENS", "PRESET_TRAINING",
           "PRESET_TRAINING_BY_OPTIMIZER", "TrainConfig", "describe_presets"]

#: Bounds of the command line's counts (docs/reliability.md).
MAX_ITERS = 10**9
MAX_TOKENS = 1_000_000
MAX_SEED = 2**32 - 1
_SCALE = "scale and speed"  # the --help section of the flags about speed and scale

#: The ``dtype`` choices: the forward passes' autocast dtype (float32: no autocast).
DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

#: Training settings of a model preset where they differ from :class:`TrainConfig`'s defaults (nanoGPT's).
#: ``baby``: Muon on the hidden matrices over 1200 iterations, evaluated every 100: 30 warm-up iterations, the
#: cosine decay over the first 800 and the last 400 at the minimum rate (it reaches nanoGPT's final val loss in
#: about 550 iterations where AdamW needs about 1200, and ends lower: docs/lab/time-to-quality.md), and the peak
#: learning rate 3e-3 (min 3e-4) instead of nanoGPT's 1e-3 for the AdamW half. Over 2000 iterations of AdamW on
#: Tiny Shakespeare, two seeds each, the full-split validation loss was 1.908 at 1e-3, 1.821 at 2e-3, 1.789 at
#: 3e-3 and 1.784 at 5e-3; 3e-3 is the smallest rate within noise of the best (docs/lab/lr-sweep.md).
PRESET_TRAINING: dict[str, dict[str, Any]] = {
    "baby": {"learning_rate": 3e-3, "min_lr": 3e-4, "optimizer": "muon", "max_iters": 1200, "lr_decay_iters": 800,
             "warmup_iters": 30, "eval_interval": 100},
    "seed": {},
}
#: A preset's settings for the optimizer it does not choose itself, over :data:`PRESET_TRAINING`'s: the baby
#: preset with ``--optimizer adamw`` is nanoGPT's run (2000 iterations, 100 warm-up, the decay over all of them,
#: evaluated every 250).
PRESET_TRAINING_BY_OPTIMIZER: dict[str, dict[str, dict[str, Any]]] = {
    "baby": {"adamw": {"max_iters": 2000, "lr_decay_iters": None, "warmup_iters": 100, "eval_interval": 250}},
}
#: The preset a run gets when it names none.
DEFAULT_PRESET = "baby"

def describe_presets() -> str:
    """The presets in a line (``--preset``'s help): each one's model sizes (:data:`~typed_transformer.gpt.PRESETS`)
    and training settings (:data:`PRESET_TRAINING`, :data:`PRESET_TRAINING_BY_OPTIMIZER`); what a preset does
    not set is the flag's default."""
    from .gpt import PRESETS

    def setting(key: str, value: Any) -> str:
        return f"{key} {value:g}" if isinstance(value, float) and not isinstance(value, bool) else f"{key} {value}"

    def one(name: str) -> str:
        settings = {**PRESETS[name], **PRESET_TRAINING.get(name, {})}
        default = " (default)" if name == DEFAULT_PRESET else ""
        other = [f"with --optimizer {optimizer}: " + " and ".join(setting(k, v) for k, v in changed.items())
                 for optimizer, changed in PRESET_TRAINING_BY_OPTIMIZER.get(name, {}).items()]
        return f"{name}{default}: " + ", ".join([setting(k, v) for k, v in settings.items()] + other)

    return "; ".join(one(name) for name in PRESETS) + "; other settings: the flags' defaults"


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation settings; the defaults are nanoGPT's CPU "baby GPT" run (:meth:`for_preset` adds a
    model preset's own settings: the command line's ``train`` starts from those)."""

    # Fields with "help" are the train command's flags (typed_transformer._options); the ranges keep a typo from
    # asking for an allocation that takes the machine down or an evaluation that never ends.
    max_iters: int = field(default=2000, metadata={"help": "optimizer steps (default 2000, or the preset's)",
                                                   "range": (1, MAX_ITERS)})
    batch_size: int = field(default=12, metadata={"help": "default 12", "range": (1, 4096)})
    learning_rate: float = field(default=1e-3, metadata={
        "flag": "lr", "help": "peak learning rate, decaying to a tenth (default 1e-3, or the preset's)",
        "interval": "(0, 1]", "noun": "a learning rate"})
    min_lr: float = 1e-4
    warmup_iters: int = 100
    lr_decay_iters: int | None = None  # default: max_iters
    weight_decay: float = 0.1
    #: The optimizer: AdamW on every parameter, or Muon on the hidden matrices and AdamW on the rest
    #: (typed_transformer.muon; docs/training.md).
    optimizer: Literal["adamw", "muon"] = field(default="adamw", metadata={
        "help": "adamw, or muon: Muon on the hidden matrices and AdamW on the rest (default adamw, or the "
                "preset's)"})
    muon_lr: float = field(default=0.02, metadata={
        "help": "Muon's peak learning rate, on the schedule of --lr (default 0.02; with --optimizer muon)",
        "interval": "(0, 1]", "noun": "a learning rate"})
    ns_steps: int = field(default=5, metadata={
        "help": "Muon's Newton-Schulz steps per update (default 5)", "range": (1, 100)})
    beta1: float = 0.9
    beta2: float = 0.99
    grad_clip: float = 1.0
    eval_interval: int = field(default=250, metadata={
        "help": "iterations between evaluations (default 250, or the preset's; checkpoints: --checkpoint-interval)",
        "range": (1, MAX_ITERS)})
    eval_iters: int = field(default=20, metadata={"help": "batches per evaluation (default 20)", "range": (1, 1000)})
    checkpoint_interval: int = field(default=250, metadata={
        "help": "iterations between checkpoints (default 250; one is also written at the end)",
        "range": (1, MAX_ITERS)})
    seed: int = field(default=1337, metadata={"help": "default 1337", "range": (0, MAX_SEED)})
    sample_tokens: int = field(default=300, metadata={
        "help": "characters to sample at the end (default 300)", "range": (0, MAX_TOKENS)})
    #: Micro-batches per optimizer step in each process; batch_size is the global batch.
    grad_accum: int = field(default=1, metadata={
        "help": "micro-batches per optimizer step; --batch-size is the global batch (default 1)", "range": (1, 4096),
        "group": _SCALE})
    #: Autocast dtype of the forward passes (DTYPES).
    dtype: Literal["float32", "bfloat16", "float16"] = field(default="float32", metadata={
        "help": "autocast dtype (default float32; float16 needs CUDA)", "group": _SCALE})
    compile: bool = field(default=False, metadata={"help": "torch.compile the training steps (default: no)",
                                                   "group": _SCALE})
    #: Intra-op threads: "auto" (timed on the first steps, re-checked on drift; typed_transformer.threads) or a
    #: count. "auto" leaves a count the user set (OMP_NUM_THREADS, torch.set_num_threads) alone.
    threads: int | str = field(default="auto", metadata={"help": THREADS_HELP, "parse": parse_threads,
                                                          "group": _SCALE})

    @classmethod
    def for_preset(cls, preset: str, **overrides: Any) -> "TrainConfig":
        """The defaults with the preset's own settings (:data:`PRESET_TRAINING`, and
        :data:`PRESET_TRAINING_BY_OPTIMIZER` for the optimizer the run uses), then ``overrides`` (see
        :meth:`overridden`). A preset's ``lr_decay_iters`` and ``warmup_iters`` go with its ``max_iters``: an
        overridden ``max_iters`` scales each one not overridden by the same factor (at least 1: the baby preset's
        decay over the first two thirds of any length, its warm-up over the first 2.5%), so that a shorter run
        still warms up, then decays to its minimum."""
        if preset not in PRESET_TRAINING:
            raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESET_TRAINING)}")
        settings = PRESET_TRAINING[preset]
        optimizer = overrides.get("optimizer", settings.get("optimizer", cls.optimizer))
        settings = {**settings, **PRESET_TRAINING_BY_OPTIMIZER.get(preset, {}).get(optimizer, {})}
        length = settings.get("max_iters", cls.max_iters)
        if isinstance(overrides.get("max_iters"), int):  # the schedule goes with the length
            factor = overrides["max_iters"] / length
            scaled = {name: max(1, round(settings[name] * factor)) for name in ("lr_decay_iters", "warmup_iters")
                      if settings.get(name) is not None and name not in overrides}
            settings = {**settings, **scaled}
        return cls.overridden(settings, **overrides)

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
            check_positive_int(None, name, getattr(self, name))
        for name in ("learning_rate", "min_lr", "weight_decay", "beta1", "beta2", "grad_clip", "muon_lr"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
        for name in ("warmup_iters", "seed", "sample_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"{name} must be an integer, got {value!r}")
        check_positive_int(None, "lr_decay_iters", self.lr_decay_iters, optional=True)
        if not 0 <= self.beta1 < 1 or not 0 <= self.beta2 < 1:
            raise ValueError(f"beta1 and beta2 must be in [0, 1), got {self.beta1}, {self.beta2}")
        if not (self.learning_rate > 0 and self.min_lr >= 0 and self.min_lr <= self.learning_rate):
            raise ValueError(f"need 0 <= min_lr <= learning_rate and learning_rate > 0, got "
                             f"learning_rate={self.learning_rate}, min_lr={self.min_lr}")
        if self.warmup_iters < 0 or self.sample_tokens < 0 or self.grad_clip < 0 or self.weight_decay < 0:
            raise ValueError("warmup_iters, sample_tokens, grad_clip and weight_decay must be >= 0")
        if self.optimizer not in ("adamw", "muon"):
            raise ValueError(f"optimizer must be adamw or muon, got {self.optimizer!r}")
        if not 0 < self.muon_lr <= 1:
            raise ValueError(f"muon_lr must be in (0, 1], got {self.muon_lr}")
        check_positive_int(None, "ns_steps", self.ns_steps)
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if not isinstance(self.compile, bool):
            raise ValueError(f"compile must be True or False, got {self.compile!r}")
        if self.threads != "auto" and (not isinstance(self.threads, int) or isinstance(self.threads, bool)
                                       or self.threads < 1):
            raise ValueError(f"threads must be 'auto' or a positive integer, got {self.threads!r}")
        if self.batch_size % self.grad_accum != 0:
            raise ValueError(f"batch_size={self.batch_size} is not divisible by grad_accum={self.grad_accum}: "
                             "the global batch is split into equal micro-batches")
