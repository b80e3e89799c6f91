"""Checkpoints: one safetensors file holding everything a run needs to continue, written atomically.

``checkpoint.safetensors`` holds tensors only (never pickle): the model weights under ``model.``, the
optimizer state under ``optim.``, the random-number states under ``rng.``. Everything else (model config,
tokenizer, training config, iteration, loss history) is JSON in the safetensors metadata header.

Writing goes to a temporary file in the same directory, flushed to disk, then renamed over the old
checkpoint (``os.replace`` is atomic), so an interrupted write leaves the previous checkpoint intact.
"""

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor

from .data import CharTokenizer
from .gpt import GPT, GPTConfig

__all__ = ["CHECKPOINT_NAME", "Checkpoint", "CheckpointError", "load_checkpoint", "save_checkpoint"]

CHECKPOINT_NAME = "checkpoint.safetensors"
FORMAT = "typed-transformer-gpt/1"


class CheckpointError(ValueError):
    """A checkpoint is missing, unreadable or not ours; the message is one line."""


@dataclass
class Checkpoint:
    """What a checkpoint holds, loaded back."""

    model: GPT
    tokenizer: CharTokenizer
    iteration: int = 0
    train_config: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, float]] = field(default_factory=list)
    optimizer_state: dict[str, Any] | None = None
    rng: dict[str, Tensor] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)


def _optimizer_tensors(state: dict[str, Any]) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """Split ``optimizer.state_dict()`` into tensors (for safetensors) and JSON-able rest."""
    tensors: dict[str, Tensor] = {}
    per_param: dict[str, dict[str, Any]] = {}
    for index, values in state["state"].items():
        entry: dict[str, Any] = {}
        for key, value in values.items():
            if isinstance(value, Tensor):
                tensors[f"optim.{index}.{key}"] = value.detach().contiguous().cpu()
            else:
                entry[key] = value
        per_param[str(index)] = entry
    return tensors, {"param_groups": state["param_groups"], "state": per_param}


def _optimizer_state(tensors: dict[str, Tensor], meta: dict[str, Any]) -> dict[str, Any]:
    state: dict[int, dict[str, Any]] = {int(i): dict(entry) for i, entry in meta["state"].items()}
    for name, value in tensors.items():
        if name.startswith("optim."):
            _, index, key = name.split(".", 2)
            state.setdefault(int(index), {})[key] = value
    # JSON has no tuples; AdamW's betas (and similar pairs) were tuples when saved.
    groups = [{k: tuple(v) if isinstance(v, list) and k != "params" else v for k, v in group.items()}
              for group in meta["param_groups"]]
    return {"state": state, "param_groups": groups}


def save_checkpoint(
    path: str | Path,
    model: GPT,
    tokenizer: CharTokenizer,
    *,
    iteration: int = 0,
    train_config: dict[str, Any] | None = None,
    history: list[dict[str, float]] | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    rng: dict[str, Tensor] | None = None,
    info: dict[str, Any] | None = None,
) -> Path:
    """Write the checkpoint file atomically; ``path`` is the file or the directory to put it in."""
    path = Path(path)
    if path.is_dir() or not path.suffix:
        path = path / CHECKPOINT_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, Tensor] = {}
    for name, value in model.state_dict().items():
        if model.config.tie_weights and name == "lm_head.weight":
            continue  # the same tensor as tok_emb.weight; safetensors refuses shared storage
        tensors[f"model.{name}"] = value.detach().contiguous().cpu()
    optimizer_meta = None
    if optimizer is not None:
        optim_tensors, optimizer_meta = _optimizer_tensors(optimizer.state_dict())
        tensors.update(optim_tensors)
    for name, value in (rng or {}).items():
        tensors[f"rng.{name}"] = value.contiguous().cpu()
    metadata = {
        "format": FORMAT,
        "model_config": json.dumps(model.config.to_dict()),
        "tokenizer": json.dumps({"chars": tokenizer.chars}),
        "iteration": str(iteration),
        "train_config": json.dumps(train_config or {}),
        "history": json.dumps(history or []),
        "optimizer": json.dumps(optimizer_meta),
        "info": json.dumps(info or {}),
    }
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(handle)
    try:
        save_file(tensors, temporary, metadata=metadata)
        with open(temporary, "rb") as stream:
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path


def load_checkpoint(path: str | Path, *, map_location: str | torch.device = "cpu") -> Checkpoint:
    """Read a checkpoint written by :func:`save_checkpoint`; ``path`` is the file or its directory."""
    path = Path(path)
    if path.is_dir():
        path = path / CHECKPOINT_NAME
    if not path.exists():
        raise CheckpointError(f"{path}: no such checkpoint")
    try:
        tensors = load_file(str(path), device=str(map_location))
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
    except (SafetensorError, OSError, ValueError, RuntimeError) as err:
        raise CheckpointError(f"{path}: not a readable checkpoint ({str(err).splitlines()[0]})") from None
    if metadata.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a typed-transformer GPT checkpoint (format {metadata.get('format')!r})")
    try:
        config = GPTConfig.from_dict(json.loads(metadata["model_config"]))
        tokenizer = CharTokenizer(json.loads(metadata["tokenizer"])["chars"])
        model = GPT(config)
        weights = {k.removeprefix("model."): v for k, v in tensors.items() if k.startswith("model.")}
        missing, unexpected = model.load_state_dict(weights, strict=False)
        if config.tie_weights:
            missing = [k for k in missing if k != "lm_head.weight"]
        if missing or unexpected:
            raise CheckpointError(f"{path}: weights do not fit the model (missing {missing[:3]}, "
                                  f"unexpected {unexpected[:3]})")
        optimizer_meta = json.loads(metadata["optimizer"])
        return Checkpoint(
            model=model.to(map_location),
            tokenizer=tokenizer,
            iteration=int(metadata["iteration"]),
            train_config=json.loads(metadata["train_config"]),
            history=json.loads(metadata["history"]),
            optimizer_state=_optimizer_state(tensors, optimizer_meta) if optimizer_meta else None,
            rng={k.removeprefix("rng."): v for k, v in tensors.items() if k.startswith("rng.")},
            info=json.loads(metadata.get("info", "{}")),
        )
    except CheckpointError:
        raise
    except (KeyError, ValueError, TypeError, RuntimeError) as err:
        reason = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        raise CheckpointError(f"{path}: corrupt checkpoint ({reason})") from None
