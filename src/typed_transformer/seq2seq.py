"""Seq2SeqTransformer: tokens in, next-token logits out, around the encoder-decoder :class:`Transformer`.

    x_src = PE(E_src[src] * sqrt(d_model)),   x_tgt = PE(E_tgt[tgt] * sqrt(d_model))     ("Attention Is All
    memory = Encoder(x_src, source padding mask)                                          You Need", 3.4-3.5)
    logits = Decoder(x_tgt, memory, causal + target padding mask, source padding mask) W_out + b_out

Shapes: ``src (b, s)`` and ``tgt (b, t)`` integer token ids, ``logits (b, t, tgt_vocab_size)``. Padding masks
come from ``src_pad_idx``/``tgt_pad_idx`` (the from-scratch translation tutorial's model); the target side
is always causal. Positions
are the paper's sinusoids (default), learned (``max_length`` of them), rotary (inside every self-attention)
or none. Dropout is applied to the embedded inputs, as in the paper.

Training is teacher forcing: ``model(src, tgt[:, :-1])`` predicts ``tgt[:, 1:]``. :meth:`encode` and
:meth:`decode` are separate so that decoding runs the encoder once: :meth:`greedy_decode` and
:meth:`beam_search` start from a ``bos`` token and stop at ``eos``; positions after a finished sequence's
``eos`` hold ``tgt_pad_idx``, and the padding token is never generated.
"""

import math
from functools import partial
from typing import TYPE_CHECKING, Any, Literal

import torch
from einops import rearrange, repeat
from jaxtyping import Bool, Float, Int
from torch import Tensor, nn

from ._deprecation import deprecated_alias, renamed_keywords, warn_deprecated
from .attention import Backend
from .layers import Activation, Transformer
from .positions import SharedPositions, check_positional, position_modules
from .shapecheck import raise_shape_error, shape_checked
from .validation import check_parameter_dtype, check_positive_int, check_token_ids

__all__ = ["Positions", "Seq2SeqTransformer"]

Positions = Literal[SharedPositions, "none"]



@shape_checked
class Seq2SeqTransformer(nn.Module):
    """Encoder-decoder Transformer over token ids (the from-scratch translation tutorial's model,
    ``nn.Transformer`` inside).

    The other arguments are :class:`~typed_transformer.layers.Transformer`'s.

    Args:
        src_vocab_size: source vocabulary size; token ids must lie in ``[0, size)``.
        tgt_vocab_size: target vocabulary size; token ids must lie in ``[0, size)``.
        src_pad_idx: source padding id; those positions are masked as keys.
        tgt_pad_idx: target padding id; those positions are masked as keys.
        positional: ``"sinusoidal"``, ``"learned"`` (needs ``max_length``), ``"rope"`` (rotary, inside every
            self-attention) or ``"none"``.
        max_length: longest source or target sequence the model accepts (None: any, except for learned
            positions).
        final_norms: LayerNorm at the end of both stacks; default ``norm_first`` (pre-LN needs one,
            post-LN already ends in one).
    """

    __shape_checked__ = ("encode", "decode", "greedy_decode", "beam_search", "beam_hypotheses",
                         "source_mask", "target_mask")

    def __init__(
        self,
        src_vocab_size: int,
        tgt_vocab_size: int,
        src_pad_idx: int,
        tgt_pad_idx: int,
        *,
        d_model: int = 512,
        nhead: int = 8,
        num_encoder_layers: int = 6,
        num_decoder_layers: int = 6,
        dim_feedforward: int = 2048,
        dropout: float = 0.1,
        activation: Activation = "relu",
        layer_norm_eps: float = 1e-5,
        norm_first: bool = False,
        final_norms: bool | None = None,
        positional: Positions = "sinusoidal",
        max_length: int | None = None,
        backend: Backend = "sdpa",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        check_positive_int("Seq2SeqTransformer", "src_vocab_size", src_vocab_size)
        check_positive_int("Seq2SeqTransformer", "tgt_vocab_size", tgt_vocab_size)
        check_positive_int("Seq2SeqTransformer", "max_length", max_length, optional=True)
        for name, index, size in (("src_pad_idx", src_pad_idx, src_vocab_size),
                                  ("tgt_pad_idx", tgt_pad_idx, tgt_vocab_size)):
            if not 0 <= index < size:
                raise ValueError(f"Seq2SeqTransformer: {name} must be in [0, {size}), got {index}")
        if str(positional) == "rotary":
            warn_deprecated("Seq2SeqTransformer: positional='rotary' is deprecated, use positional='rope' "
                            "(GPTConfig's spelling)")
            positional = "rope"
        positions = partial(position_modules, "Seq2SeqTransformer", positional, Positions, d_model=d_model,
                            num_heads=nhead, max_length=max_length, device=device, dtype=dtype)
        check_positional("Seq2SeqTransformer", positional, Positions, d_model=d_model, num_heads=nhead,
                         max_length=max_length)
        check_parameter_dtype("Seq2SeqTransformer", dtype)
        factory: dict[str, Any] = {"device": device, "dtype": dtype}
        self.src_vocab_size = src_vocab_size
        self.tgt_vocab_size = tgt_vocab_size
        self.src_pad_idx = src_pad_idx
        self.tgt_pad_idx = tgt_pad_idx
        self.d_model = d_model
        self.max_length = max_length
        self.positional: Positions = positional

        self.src_embedding = nn.Embedding(src_vocab_size, d_model, **factory)
        self.tgt_embedding = nn.Embedding(tgt_vocab_size, d_model, **factory)
        # The source and the target each have their own learned table; the sinusoids are shared.
        source = positions()
        self.src_positions: nn.Module | None = source.embedding
        self.tgt_positions: nn.Module | None = positions().embedding if positional == "learned" else source.embedding
        rotary = source.rotary
        self.dropout = nn.Dropout(dropout)
        self.transformer = Transformer(
            d_model, nhead, num_encoder_layers, num_decoder_layers, dim_feedforward, dropout, activation=activation,
            layer_norm_eps=layer_norm_eps, norm_first=norm_first,
            final_norms=norm_first if final_norms is None else final_norms, rotary=rotary, backend=backend, **factory)
        self.output_projection = nn.Linear(d_model, tgt_vocab_size, **factory)
        # The Annotated Transformer's initialisation: xavier-uniform for every matrix, embeddings included
        # (with N(0, 1) embeddings the sqrt(d_model) scale would drown the positional encoding).
        for module in (self.src_embedding, self.tgt_embedding, self.output_projection):
            nn.init.xavier_uniform_(module.weight)
        self.register_load_state_dict_pre_hook(_load_old_names)  # type: ignore[no-untyped-call]  # (torch's stub)

    def extra_repr(self) -> str:
        return (f"src_vocab_size={self.src_vocab_size}, tgt_vocab_size={self.tgt_vocab_size}, "
                f"src_pad_idx={self.src_pad_idx}, tgt_pad_idx={self.tgt_pad_idx}, positional={self.positional!r}, "
                f"max_length={self.max_length}")

    # ------------------------------------------------------------------------------------------------
    # Masks and embeddings
    # ------------------------------------------------------------------------------------------------

    def source_mask(self, src: Int[Tensor, "b s"]) -> Bool[Tensor, "b s"]:
        """Key padding mask of the source: True = real token (``src != src_pad_idx``)."""
        return src != self.src_pad_idx

    def target_mask(self, tgt: Int[Tensor, "b t"]) -> Bool[Tensor, "b t"]:
        """Key padding mask of the target: True = real token (``tgt != tgt_pad_idx``)."""
        return tgt != self.tgt_pad_idx

    def _embed(self, tokens: Tensor, argument: str, method: str) -> Tensor:
        side = "src" if argument == "src" else "tgt"
        vocab_size = self.src_vocab_size if side == "src" else self.tgt_vocab_size
        check_token_ids(f"Seq2SeqTransformer.{method}", argument, tokens, vocab_size, bound_by=f"{side}_vocab_size")
        length = tokens.shape[1]
        if self.max_length is not None and length > self.max_length:
            axis = "s" if side == "src" else "t"
            raise_shape_error(getattr(type(self), method), argument,
                              f"axis {axis} is {length}, longer than max_length={self.max_length}",
                              axis=axis, actual=length, expected=self.max_length, bound_by="max_length")
        embedding = self.src_embedding if side == "src" else self.tgt_embedding
        positions = self.src_positions if side == "src" else self.tgt_positions
        x: Tensor = embedding(tokens) * math.sqrt(self.d_model)
        if positions is not None:
            x = positions(x)
        out: Tensor = self.dropout(x)
        return out

    # ------------------------------------------------------------------------------------------------
    # Forward: encode once, decode as often as needed
    # ------------------------------------------------------------------------------------------------

    def encode(self, src: Int[Tensor, "b s"]) -> Float[Tensor, "b s {self.d_model}"]:
        """The encoder output ``memory (b, s, d_model)``; padded source positions are masked as keys."""
        memory: Tensor = self.transformer.encoder(self._embed(src, "src", "encode"),
                                                  src_key_padding_mask=self.source_mask(src))
        return memory

    def decode(
        self,
        tgt: Int[Tensor, "b t"],
        memory: Float[Tensor, "b s {self.d_model}"],
        src_mask: Bool[Tensor, "b s"],
    ) -> Float[Tensor, "b t {self.tgt_vocab_size}"]:
        """Next-token logits at every target position, from ``memory = encode(src)`` and
        ``src_mask = source_mask(src)``. Position ``i`` sees target positions ``<= i`` only."""
        x = self.transformer.decoder(self._embed(tgt, "tgt", "decode"), memory,
                                     tgt_key_padding_mask=self.target_mask(tgt),
                                     memory_key_padding_mask=src_mask, tgt_is_causal=True)
        logits: Tensor = self.output_projection(x)
        return logits

    def forward(self, src: Int[Tensor, "b s"], tgt: Int[Tensor, "b t"]) -> Float[Tensor, "b t {self.tgt_vocab_size}"]:
        """Teacher forcing: ``logits[:, i]`` predicts ``tgt[:, i + 1]``."""
        return self.decode(tgt, self.encode(src), self.source_mask(src))

    if TYPE_CHECKING:  # calls type-check as forward (nn.Module.__call__ is untyped)
        __call__ = forward

    # ------------------------------------------------------------------------------------------------
    # Decoding
    # ------------------------------------------------------------------------------------------------

    def _check_decoding(self, bos_idx: int, eos_idx: int, max_new_tokens: int, method: str) -> None:
        for name, index in (("bos_idx", bos_idx), ("eos_idx", eos_idx)):
            if not 0 <= index < self.tgt_vocab_size or index == self.tgt_pad_idx:
                raise ValueError(f"{method}: {name} must be in [0, {self.tgt_vocab_size}) and differ from "
                                 f"tgt_pad_idx={self.tgt_pad_idx}, got {index}")
        if max_new_tokens < 0:
            raise ValueError(f"{method}: max_new_tokens must be non-negative, got {max_new_tokens}")
        if self.max_length is not None and max_new_tokens + 1 > self.max_length:
            raise ValueError(f"{method}: max_new_tokens + 1 = {max_new_tokens + 1} tokens (with bos) exceed "
                             f"max_length={self.max_length}")

    def _next_log_probs(self, tokens: Tensor, memory: Tensor, src_mask: Tensor) -> Tensor:
        """Log-probabilities of the next token ``(b, tgt_vocab_size)``, with padding impossible."""
        logits = self.decode(tokens, memory, src_mask)[:, -1]
        log_probs = logits.log_softmax(dim=-1)
        log_probs[:, self.tgt_pad_idx] = float("-inf")
        return log_probs

    def greedy_decode(self, src: Int[Tensor, "b s"], *, bos_idx: int, eos_idx: int,
                      max_new_tokens: int) -> Int[Tensor, "b n"]:
        """Most likely next token at every step, encoder run once; stops when every sequence has produced
        ``eos_idx`` or after ``max_new_tokens``. Returns ``(b, 1 + steps)`` ids starting with ``bos_idx``.
        Call ``eval()`` first unless dropout is wanted."""
        self._check_decoding(bos_idx, eos_idx, max_new_tokens, "greedy_decode")
        with torch.no_grad():
            memory, src_mask = self.encode(src), self.source_mask(src)
            tokens = torch.full((src.shape[0], 1), bos_idx, dtype=src.dtype, device=src.device)
            done = torch.zeros(src.shape[0], dtype=torch.bool, device=src.device)
            for _ in range(max_new_tokens):
                if done.all():
                    break
                next_token = self._next_log_probs(tokens, memory, src_mask).argmax(dim=-1)
                next_token = next_token.masked_fill(done, self.tgt_pad_idx)
                tokens = torch.cat([tokens, rearrange(next_token, "b -> b 1")], dim=1)
                done = done | (next_token == eos_idx)
        return tokens

    def beam_search(self, src: Int[Tensor, "b s"], *, bos_idx: int, eos_idx: int, max_new_tokens: int,
                    beam_size: int = 4) -> tuple[Int[Tensor, "b n"], Float[Tensor, " b"]]:
        """The most likely sequence among ``beam_size`` hypotheses kept at every step (no length penalty).

        A finished hypothesis (it produced ``eos_idx``) keeps its score and its place, continuing with
        padding at no cost. Returns the best sequence per source ``(b, 1 + steps)`` and its total
        log-probability ``(b,)``. ``beam_size=1`` is greedy decoding. :meth:`beam_hypotheses` returns all
        ``beam_size`` of them.
        """
        tokens, scores = self.beam_hypotheses(src, bos_idx=bos_idx, eos_idx=eos_idx, max_new_tokens=max_new_tokens,
                                              beam_size=beam_size)
        return tokens[:, 0], scores[:, 0]

    def beam_hypotheses(self, src: Int[Tensor, "b s"], *, bos_idx: int, eos_idx: int, max_new_tokens: int,
                        beam_size: int = 4) -> tuple[Int[Tensor, "b {beam_size} n"], Float[Tensor, "b {beam_size}"]]:
        """The ``beam_size`` hypotheses of :meth:`beam_search` at its last step, best first: sequences
        ``(b, beam_size, 1 + steps)`` and their total log-probabilities ``(b, beam_size)``, sorted in
        descending order (``-inf`` for a slot no hypothesis could fill, e.g. with ``max_new_tokens=0``)."""
        self._check_decoding(bos_idx, eos_idx, max_new_tokens, "beam_search")
        if not 1 <= beam_size < self.tgt_vocab_size:
            raise ValueError(f"beam_search: beam_size must be in [1, tgt_vocab_size - 1 = {self.tgt_vocab_size - 1}]"
                             f", got {beam_size}")
        b, k, vocab = src.shape[0], beam_size, self.tgt_vocab_size
        with torch.no_grad():
            memory = repeat(self.encode(src), "b s d -> (b k) s d", k=k)
            src_mask = repeat(self.source_mask(src), "b s -> (b k) s", k=k)
            tokens = torch.full((b * k, 1), bos_idx, dtype=src.dtype, device=src.device)
            # The k start hypotheses are the same sequence: only the first may expand at step one.
            first = torch.tensor([0.0] + [float("-inf")] * (k - 1), dtype=memory.dtype, device=src.device)
            scores = repeat(first, "k -> (b k)", b=b)
            done = torch.zeros(b * k, dtype=torch.bool, device=src.device)
            pad_only = torch.full((vocab,), float("-inf"), dtype=memory.dtype, device=src.device)
            pad_only[self.tgt_pad_idx] = 0.0
            offsets = rearrange(torch.arange(b, device=src.device) * k, "b -> b 1")
            for _ in range(max_new_tokens):
                if (done | (scores == float("-inf"))).all():
                    break
                log_probs = self._next_log_probs(tokens, memory, src_mask)
                log_probs = torch.where(rearrange(done, "bk -> bk 1"), pad_only, log_probs)
                candidates = rearrange(rearrange(scores, "bk -> bk 1") + log_probs, "(b k) v -> b (k v)", k=k)
                best, index = candidates.topk(k, dim=-1)
                rows = rearrange(index // vocab + offsets, "b k -> (b k)")
                next_token = rearrange(index % vocab, "b k -> (b k)")
                tokens = torch.cat([tokens[rows], rearrange(next_token, "bk -> bk 1")], dim=1)
                done = done[rows] | (next_token == eos_idx)
                scores = rearrange(best, "b k -> (b k)")
            ranked, order = rearrange(scores, "(b k) -> b k", k=k).sort(dim=-1, descending=True, stable=True)
        return tokens[order + offsets], ranked


def _load_old_names(module: nn.Module, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
    """State dicts saved before the trg -> tgt rename (``trg_embedding.weight``) still load, with a warning."""
    old = [key for key in state_dict if key.startswith(f"{prefix}trg_")]
    if old:
        warn_deprecated(f"Seq2SeqTransformer.load_state_dict: the names {', '.join(old)} are deprecated (trg_ is "
                        "now tgt_)")
    for key in old:
        state_dict[f"{prefix}tgt_{key.removeprefix(f'{prefix}trg_')}"] = state_dict.pop(key)


# Old spellings (docs/conventions.md#names): trg -> tgt (torch's, as in nn.Transformer), positions -> positional
# (GPTConfig's). They keep working with a DeprecationWarning.
renamed_keywords(Seq2SeqTransformer, "__init__", trg_vocab_size="tgt_vocab_size", trg_pad_idx="tgt_pad_idx",
                 positions="positional")
renamed_keywords(Seq2SeqTransformer, "forward", trg="tgt")
renamed_keywords(Seq2SeqTransformer, "decode", trg="tgt")
renamed_keywords(Seq2SeqTransformer, "target_mask", trg="tgt")
for _old, _new in (("trg_vocab_size", "tgt_vocab_size"), ("trg_pad_idx", "tgt_pad_idx"), ("positions", "positional"),
                   ("trg_embedding", "tgt_embedding"), ("trg_positions", "tgt_positions")):
    deprecated_alias(Seq2SeqTransformer, _old, _new)
