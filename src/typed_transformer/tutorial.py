"""Load the original tutorial's trained weights into :class:`~typed_transformer.GPT`.

The tutorial's character model (the ``seed`` preset; its printed module tree is in
``tests/app/test_seed_preset.py``) keeps one ``Linear`` per head for each of key, query and value, with no
bias, and concatenates the heads' outputs before its projection. This library has one fused ``in_proj``
whose output is ``[q | k | v]``, each ``(h d)`` with the heads in order, so the mapping stacks the heads::

    token_embedding_table -> tok_emb          position_embedding_table -> pos
    blocks.{i}.ln1 / ln2 -> blocks.{i}.ln_1 / ln_2
    blocks.{i}.sa.heads.{j}.query / key / value -> blocks.{i}.attn.in_proj (rows j*d..(j+1)*d of q, k, v)
    blocks.{i}.sa.proj -> blocks.{i}.attn.out_proj
    blocks.{i}.ffd.network.0 / 2 -> blocks.{i}.mlp.linear1 / linear2   (the lecture's ffwd.net.0 / 2 too)
    ln_f -> ln_f                               lm_head -> lm_head (untied, with its bias)

Each head's causal ``tril`` buffer is not a weight and is left out. The result is the ``seed`` preset at the
sizes the weights have (dropout 0.2 for further training, none on the embeddings, as the tutorial).
``GPT.from_tutorial_state_dict`` is :func:`gpt_from_tutorial_state_dict`, attached to the class here so that
the dependency points one way (as :mod:`typed_transformer.hf` does for GPT-2).
"""

import pickle
import re
import zipfile
from collections.abc import Mapping
from pathlib import Path

import torch
from jaxtyping import Shaped
from torch import Tensor

from .gpt import GPT, GPTConfig
from .shapecheck import typechecked

__all__ = ["gpt_from_tutorial_state_dict", "load_tutorial_weights"]

#: The feed-forward's names: the printed tree's ``ffd.network`` and the lecture code's ``ffwd.net``.
_FEED_FORWARD = ("ffd.network", "ffwd.net")


def _need(state: Mapping[str, Tensor], key: str, read: set[str]) -> Tensor:
    """``state[key]``, noted in ``read`` (the names the mapping used: the rest are reported as left over)."""
    read.add(key)
    try:
        return state[key]
    except KeyError:
        raise ValueError(f"from_tutorial_state_dict: no {key!r} in the state dict; is it the tutorial's "
                         "BigramLanguageModel?") from None


def _feed_forward(state: Mapping[str, Tensor]) -> str:
    for name in _FEED_FORWARD:
        if f"blocks.0.{name}.0.weight" in state:
            return name
    raise ValueError("from_tutorial_state_dict: no feed-forward weights (blocks.0.ffd.network.0.weight or "
                     "blocks.0.ffwd.net.0.weight)")


@typechecked
def gpt_from_tutorial_state_dict(state_dict: Mapping[str, Shaped[Tensor, "..."]]) -> GPT:
    """A :class:`GPT` (the ``seed`` preset at the weights' sizes) with the weights of the tutorial's
    ``BigramLanguageModel``: its ``state_dict()``, or one loaded with :func:`load_tutorial_weights`.

    Raises:
        ValueError: a state dict that is not the tutorial's model, with heads of unequal sizes, or whose
            weights do not fit (each missing or left-over name is reported).
    """
    state = dict(state_dict)
    read: set[str] = set()
    tok = _need(state, "token_embedding_table.weight", read)
    pos = _need(state, "position_embedding_table.weight", read)
    layers = sorted({int(m[1]) for key in state if (m := re.match(r"blocks\.(\d+)\.", key))})
    heads = sorted({int(m[1]) for key in state if (m := re.match(r"blocks\.0\.sa\.heads\.(\d+)\.", key))})
    if not layers or not heads:
        raise ValueError("from_tutorial_state_dict: no blocks.{i}.sa.heads.{j} weights; is it the tutorial's "
                         "BigramLanguageModel?")
    ffd = _feed_forward(state)
    qkv_bias = "blocks.0.sa.heads.0.query.bias" in state
    config = GPTConfig.preset("seed", tok.shape[0], n_layer=len(layers), n_head=len(heads), n_embd=tok.shape[1],
                              block_size=pos.shape[0], qkv_bias=qkv_bias)
    ours: dict[str, Tensor] = {"tok_emb.weight": tok, "pos.weight": pos}
    for name in ("ln_f.weight", "ln_f.bias", "lm_head.weight", "lm_head.bias"):
        ours[name] = _need(state, name, read)
    for i in layers:
        kinds = ("weight", "bias") if qkv_bias else ("weight",)
        for kind in kinds:  # [q | k | v], each the heads stacked in order
            ours[f"blocks.{i}.attn.in_proj.{kind}"] = torch.cat([
                _need(state, f"blocks.{i}.sa.heads.{j}.{part}.{kind}", read)
                for part in ("query", "key", "value") for j in heads])
        renames = {"ln1": "ln_1", "ln2": "ln_2", "sa.proj": "attn.out_proj", f"{ffd}.0": "mlp.linear1",
                   f"{ffd}.2": "mlp.linear2"}
        for theirs, mine in renames.items():
            for kind in ("weight", "bias"):
                ours[f"blocks.{i}.{mine}.{kind}"] = _need(state, f"blocks.{i}.{theirs}.{kind}", read)
    left = sorted(k for k in state if k not in read and not k.endswith(".tril"))  # tril: a buffer, not a weight
    model = GPT(config)
    try:
        with torch.no_grad():
            missing, unexpected = model.load_state_dict(ours, strict=False)
    except RuntimeError as err:  # a size mismatch: torch's message names the tensor and both shapes
        raise ValueError(f"from_tutorial_state_dict: weights do not fit ({str(err).splitlines()[-1].strip()})") \
            from None
    if missing or unexpected or left:
        raise ValueError(f"from_tutorial_state_dict: weights do not fit (missing {missing[:3]}, unexpected "
                         f"{(list(unexpected) + left)[:3]})")
    return model.to(tok.dtype)


def load_tutorial_weights(path: str | Path) -> GPT:
    """The tutorial's weights saved with ``torch.save(model.state_dict(), path)``, read with
    ``torch.load(..., weights_only=True)`` (no code in the file is run), as a :class:`GPT`.

    The model computes the final script's attention, each head's logits scaled by ``head_size**-0.5``: weights of
    the lecture's early variant, which scales by ``C**-0.5`` (the embedding width), load as well and give other
    logits (the files do not say which scale trained them). ``model(idx, all_positions=True)`` gives the logits at
    every position, as the tutorial's ``model(idx)`` does; ``model(idx)`` the last position's.

    Raises:
        ValueError: a file that does not exist or cannot be read, that is not a torch file, that holds a pickled
            model or other objects rather than a state dict (save ``model.state_dict()``), or whose weights are
            not the tutorial's model.
    """
    path = Path(path)
    if path.is_file() and not zipfile.is_zipfile(path):  # torch.save has written zip archives since torch 1.6
        raise ValueError(f"{path}: not a file saved by torch.save (not a zip archive)")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ValueError(f"{path}: is a directory, not a file saved by torch.save") from None
    except OSError as err:
        raise ValueError(f"{path}: cannot be read ({err.strerror or err})") from None
    except pickle.UnpicklingError as err:  # torch's message is a paragraph: keep the object it refused
        found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(err))
        refused = f" (it holds {found[1]})" if found else ""
        raise ValueError(f"{path}: not a plain state dict that weights_only=True can read{refused}; save "
                         "model.state_dict(), not the model") from None
    except (RuntimeError, EOFError, zipfile.BadZipFile) as err:
        raise ValueError(f"{path}: not a file saved by torch.save ({type(err).__name__})") from None
    if not isinstance(state, Mapping) or not all(isinstance(v, Tensor) for v in state.values()):
        raise ValueError(f"{path}: holds a {type(state).__name__}, not a state dict of tensors (save "
                         "model.state_dict())")
    for name, value in state.items():
        _check_saved_weight(path, str(name), value)
    return gpt_from_tutorial_state_dict(state)


def _check_saved_weight(path: Path, name: str, value: Tensor) -> None:
    """A weight as ``torch.save`` writes a trained model's: its own values (not a view that repeats a few of them:
    a stride-0 ``expand`` of 32 values can claim 10^8 rows and be copied into that many), floating point and
    finite, as the checkpoint loader requires."""
    if value.untyped_storage().nbytes() < value.numel() * value.element_size():
        raise ValueError(f"{path}: {name} {tuple(value.shape)} holds {value.untyped_storage().nbytes()} bytes for "
                         f"{value.numel()} values (a view that repeats its values, not saved weights)")
    if not value.is_floating_point():
        raise ValueError(f"{path}: {name} is {str(value.dtype).removeprefix('torch.')}, expected floating-point "
                         f"weights")
    if not bool(torch.isfinite(value).all()):
        raise ValueError(f"{path}: {name} holds non-finite values (NaN or infinity)")


# GPT.from_tutorial_state_dict, declared on the class, is this function (a static alias).
GPT.from_tutorial_state_dict = staticmethod(gpt_from_tutorial_state_dict)
