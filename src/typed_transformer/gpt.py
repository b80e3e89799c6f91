"""A decoder-only, character-level GPT (the original tutorial's; nanoGPT's ``model.py`` as the style anchor).

    x_0 = Dropout(E[idx] + P)     token embedding plus positions (learned, sinusoidal; or none here and
                                  RoPE or ALiBi's bias inside attention); dropout rate embd_dropout
    x_l = x_{l-1} + Attn(LN(x_{l-1}))         pre-LN blocks with causal self-attention
    x_l = x_l + MLP(LN(x_l))                  MLP(x) = W_2 act(W_1 x), width 4 * n_embd (FeedForward; GELU or ReLU)
    logits = LN_f(x_L) E^T                    output head tied to the token embedding (by default)

Shapes: ``idx (b, t)`` token ids, ``logits (b, t, vocab_size)`` (only the last position when no targets are
given, as nanoGPT does when generating). Attention is :class:`~typed_transformer.MultiHeadAttention`, so the
model has grouped-query heads (``n_kv_heads``), a KV cache, RoPE and ALiBi with the same code as everything else.
"""

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from einops import rearrange
from jaxtyping import Float, Int
from torch import Tensor, nn

from .layers import FeedForward
from .multihead import KVCache, MultiHeadAttention
from .positions import (
    ALiBiPositionalBias,
    LearnedPositionalEmbedding,
    RotaryEmbedding,
    SharedPositions,
    check_positional,
    position_modules,
)
from .shapecheck import raise_shape_error, shape_checked, typechecked
from .validation import check_positive_int, check_token_ids

__all__ = ["GPT", "PRESETS", "GPTConfig"]

Positional = Literal[SharedPositions, "alibi"]
Activation = Literal["gelu", "gelu_tanh", "relu"]
_SIZE = "model size (on top of the preset)"  # the --help section of the size flags


@dataclass(frozen=True)
class GPTConfig:
    """Sizes and options of a :class:`GPT`.

    ``n_kv_heads`` (default ``n_head``) must divide ``n_head``; ``n_head`` must divide ``n_embd``.
    ``activation="gelu_tanh"`` is GPT-2's ``gelu_new``; ``"relu"`` is the original tutorial's feed-forward.

    Biases: ``bias`` switches those of the layer norms, the attention's output projection and the feed-forward;
    ``qkv_bias`` those of the query/key/value projections (default: as ``bias``); ``lm_head_bias`` the output
    head's (default none, as in nanoGPT and GPT-2). The original tutorial's model has ``bias=True,
    qkv_bias=False, lm_head_bias=True`` and an untied head (the ``seed`` preset).

    Raises:
        ValueError: a size that is not a positive ``int``, a bias switch or ``tie_weights`` that is not a ``bool``
            (``"false"`` would read as true), ``dropout`` outside ``[0, 1)``, ``layer_norm_eps`` not positive and
            finite, an unknown ``positional`` or ``activation``, or sizes that do not divide.
    """

    # The metadata are the command line's flags (typed_transformer._options): help text and the ranges that keep a
    # typo from asking for an allocation that takes the machine down.
    vocab_size: int
    block_size: int = field(default=64, metadata={"help": "context length (default: the preset's)", "range": (1, 8192)})
    n_layer: int = field(default=4, metadata={"help": "transformer blocks", "range": (1, 1024), "group": _SIZE})
    n_head: int = field(default=4, metadata={"help": "must divide --n-embd", "range": (1, 65536), "group": _SIZE})
    n_kv_heads: int | None = field(default=None, metadata={
        "help": "key/value heads (grouped-query attention; must divide --n-head)", "range": (1, 65536),
        "group": _SIZE})
    n_embd: int = field(default=128, metadata={"help": "model width", "range": (1, 65536), "group": _SIZE})
    dropout: float = field(default=0.0, metadata={"help": "default: the preset's", "interval": "[0, 1)"})
    embd_dropout: float | None = field(default=None, metadata={  # None: as dropout
        "help": "dropout on the token and position embeddings (default: as --dropout, as nanoGPT; 0 in the seed "
                "preset, whose printed model has none)", "interval": "[0, 1)"})
    bias: bool = field(default=False, metadata={
        "help": "biases in the layer norms, attention output projections and feed-forward layers (default: no, "
                "or the preset's)", "group": _SIZE})
    qkv_bias: bool | None = field(default=None, metadata={  # None: as bias
        "help": "biases in the query/key/value projections (default: as --bias, or the preset's)", "group": _SIZE})
    lm_head_bias: bool = field(default=False, metadata={
        "help": "a bias in the output head (default: no, or the preset's)", "group": _SIZE})
    positional: Positional = field(default="learned", metadata={"help": "position encoding (default learned)"})
    activation: Activation = field(default="gelu", metadata={
        "help": "feed-forward activation (default gelu, or the preset's)", "group": _SIZE})
    tie_weights: bool = field(default=True, metadata={
        "help": "share the output head's weight with the token embedding (default: yes, or the preset's)",
        "group": _SIZE})
    layer_norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            check_positive_int("GPTConfig", name, getattr(self, name))
        if self.n_embd % self.n_head != 0:
            raise ValueError(f"GPTConfig: n_embd={self.n_embd} is not divisible by n_head={self.n_head}")
        check_positive_int("GPTConfig", "n_kv_heads", self.n_kv_heads, optional=True)
        if self.n_head % self.kv_heads != 0:
            raise ValueError(f"GPTConfig: n_kv_heads={self.n_kv_heads} must divide n_head={self.n_head}")
        if self.qkv_bias is not None and not isinstance(self.qkv_bias, bool):
            raise ValueError(f"GPTConfig: qkv_bias must be None, True or False, got {self.qkv_bias!r}")
        for name in ("bias", "lm_head_bias", "tie_weights"):
            if not isinstance(getattr(self, name), bool):  # bool("false") is True: refuse strings and numbers
                raise ValueError(f"GPTConfig: {name} must be True or False, got {getattr(self, name)!r}")
        for name in ("dropout", "embd_dropout"):
            rate = getattr(self, name)
            if rate is None and name == "embd_dropout":
                continue
            if not isinstance(rate, int | float) or isinstance(rate, bool) or not 0.0 <= rate < 1.0:
                raise ValueError(f"GPTConfig: {name} must be in [0, 1), got {rate!r}")
        eps = self.layer_norm_eps
        if not isinstance(eps, int | float) or isinstance(eps, bool) or not (eps > 0 and math.isfinite(eps)):
            raise ValueError(f"GPTConfig: layer_norm_eps must be a positive finite number, got {eps!r}")
        if self.activation not in ("gelu", "gelu_tanh", "relu"):
            raise ValueError(f"GPTConfig: activation must be gelu, gelu_tanh or relu, got {self.activation!r}")
        check_positional("GPTConfig", self.positional, Positional, d_model=self.n_embd, num_heads=self.n_head,
                         max_length=self.block_size)

    @property
    def kv_heads(self) -> int:
        return self.n_head if self.n_kv_heads is None else self.n_kv_heads

    @property
    def embedding_dropout(self) -> float:
        """The dropout rate on the embeddings (``embd_dropout``, else ``dropout``)."""
        return self.dropout if self.embd_dropout is None else self.embd_dropout

    @property
    def qkv_has_bias(self) -> bool:
        """Whether the query/key/value projections have biases (``qkv_bias``, else ``bias``)."""
        return self.bias if self.qkv_bias is None else self.qkv_bias

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "GPTConfig":
        known = set(cls.__dataclass_fields__)
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"GPTConfig: unknown fields {sorted(unknown)}")
        return cls(**data)

    @classmethod
    def preset(cls, name: str, vocab_size: int, **overrides: Any) -> "GPTConfig":
        """A named preset (see :data:`PRESETS`) with ``vocab_size`` and any field overridden."""
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
        return cls(vocab_size=vocab_size, **{**PRESETS[name], **overrides})


#: ``baby``: nanoGPT's CPU shakespeare_char config (4 layers, 4 heads, 128 wide, block 64, no dropout).
#: ``seed``: the original tutorial's model as it prints it (6 layers, 6 heads, 384 wide, block 256, dropout
#: 0.2 on the attention weights and both residual branches and none on the embeddings, a ReLU feed-forward, no
#: biases on the key/query/value projections but biases everywhere else, an untied ``lm_head`` with a bias):
#: 10,788,929 parameters with the position table for 65 characters.
PRESETS: dict[str, dict[str, Any]] = {
    "baby": {"n_layer": 4, "n_head": 4, "n_embd": 128, "block_size": 64, "dropout": 0.0},
    "seed": {"n_layer": 6, "n_head": 6, "n_embd": 384, "block_size": 256, "dropout": 0.2, "embd_dropout": 0.0,
             "activation": "relu", "bias": True, "qkv_bias": False, "lm_head_bias": True, "tie_weights": False},
}


@shape_checked
class Block(nn.Module):
    """Pre-LN block: ``x + dropout(attn(ln_1(x)))``, then ``x + dropout(mlp(ln_2(x)))``; causal self-attention.

    The MLP is the stack's :class:`~typed_transformer.layers.FeedForward` (``linear2(GELU(linear1(x)))``, width
    ``4 n_embd``) with no dropout inside, so dropout sits where nanoGPT has it: on each residual branch.
    """

    __same_dtype__ = ("x",)  # inputs that must have the parameters' dtype (shapecheck)

    def __init__(self, config: GPTConfig, rotary: RotaryEmbedding | None) -> None:
        super().__init__()
        self.n_embd = config.n_embd
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_eps, bias=config.bias)
        self.attn = MultiHeadAttention(config.n_embd, config.n_head, num_kv_heads=config.kv_heads,
                                       dropout=config.dropout, bias=config.qkv_has_bias, rotary=rotary)
        if config.qkv_has_bias != config.bias:  # MultiHeadAttention has one switch for both projections
            self.attn.out_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.ln_2 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_eps, bias=config.bias)
        self.mlp = FeedForward(config.n_embd, 4 * config.n_embd, dropout=0.0, activation=config.activation,
                               bias=config.bias)
        self.mlp_dropout = nn.Dropout(config.dropout)

    def forward(self, x: Float[Tensor, "b t {self.n_embd}"], kv_cache: KVCache | None = None, *,
                attn_bias: Float[Tensor, "#b #h t s"] | None = None) -> Float[Tensor, "b t {self.n_embd}"]:
        attended, _ = self.attn(self.ln_1(x), is_causal=True, kv_cache=kv_cache, attn_bias=attn_bias)
        x = x + self.resid_dropout(attended)
        out: Tensor = x + self.mlp_dropout(self.mlp(self.ln_2(x)))
        return out

    if TYPE_CHECKING:  # calls type-check as forward (nn.Module.__call__ is untyped)
        __call__ = forward


@shape_checked
class GPT(nn.Module):
    """Decoder-only language model; see the module docstring for the equations.

    ``forward(idx, targets=None)`` returns ``(logits, loss)``: with targets, logits for every position and the
    mean cross-entropy (targets of -1 are ignored); without, logits of the last position only (pass
    ``all_positions=True`` for all of them) and ``None``.
    """

    __shape_checked__ = ("generate", "attention_weights")

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.vocab_size = config.vocab_size
        self.tok_emb = nn.Embedding(config.vocab_size, config.n_embd)
        positions = position_modules("GPTConfig", config.positional, Positional, d_model=config.n_embd,
                                     num_heads=config.n_head, max_length=config.block_size)
        self.pos: nn.Module | None = positions.embedding
        self.alibi: ALiBiPositionalBias | None = positions.alibi
        rotary = positions.rotary
        self.drop = nn.Dropout(config.embedding_dropout)
        self.blocks = nn.ModuleList(Block(config, rotary) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd, eps=config.layer_norm_eps, bias=config.bias)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=config.lm_head_bias)
        if config.tie_weights:
            self.lm_head.weight = self.tok_emb.weight
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """GPT-2's initialisation: N(0, 0.02) weights, zero biases, and N(0, 0.02 / sqrt(2 n_layer)) for the
        projections that write into the residual stream (so the residual's variance does not grow with depth)."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=0.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding | LearnedPositionalEmbedding):
                nn.init.normal_(module.weight, std=0.02)
        residual_std = 0.02 / math.sqrt(2 * self.config.n_layer)
        for block in self.blocks:
            assert isinstance(block, Block)
            nn.init.normal_(block.attn.out_proj.weight, std=residual_std)
            nn.init.normal_(block.mlp.linear2.weight, std=residual_std)

    def num_parameters(self, *, non_embedding: bool = True) -> int:
        """Parameter count; by default without the position table (nanoGPT's convention)."""
        total = sum(p.numel() for p in self.parameters())
        if non_embedding and isinstance(self.pos, LearnedPositionalEmbedding):
            total -= self.pos.weight.numel()
        return total

    def forward(
        self,
        idx: Int[Tensor, "b t"],
        targets: Int[Tensor, "b t"] | None = None,
        *,
        kv_caches: list[KVCache] | None = None,
        all_positions: bool = False,
    ) -> tuple[Float[Tensor, "b _ {self.vocab_size}"], Float[Tensor, ""] | None]:
        """Logits (and the loss with ``targets``); with ``kv_caches`` (one per layer) ``idx`` holds only the new
        positions, placed after the cached ones.

        The loss is the mean cross-entropy over the positions whose target is not -1 (ignored).

        Raises:
            ShapeError: ``idx`` longer than ``block_size`` (after the cached positions), or ``targets`` with no
                position (batch or length 0), where torch's mean would silently be NaN.
            ValueError: ids outside the vocabulary, or ``targets`` all -1 (no position to average over).
        """
        t = idx.shape[1]
        offset = 0 if not kv_caches else kv_caches[0].length
        if kv_caches is not None and len(kv_caches) != len(self.blocks):
            raise ValueError(f"GPT.forward: kv_caches has {len(kv_caches)} caches for {len(self.blocks)} layers")
        if offset + t > self.config.block_size:
            cached = f" after {offset} cached positions" if offset else ""
            limit = self.config.block_size
            raise_shape_error(GPT.forward, "idx", f"axis t is {t}{cached}, more than block_size={limit}", axis="t",
                              actual=offset + t, expected=limit)
        # Out-of-range ids would otherwise surface as an index error deep inside embedding or loss.
        check_token_ids("GPT.forward", "idx", idx, self.vocab_size)
        if targets is not None:
            check_token_ids("GPT.forward", "targets", targets, self.vocab_size, ignore_index=True)
            if not torch.compiler.is_compiling():
                _check_loss_targets(targets)
        x = self._embed(idx, offset)
        bias = self._attn_bias(t, offset + t, x.dtype)
        for i, block in enumerate(self.blocks):
            x = block(x, kv_caches[i] if kv_caches is not None else None, attn_bias=bias)
        x = self.ln_f(x)
        if targets is None:
            logits = self.lm_head(x if all_positions else x[:, -1:])
            return logits, None
        logits = self.lm_head(x)
        loss = F.cross_entropy(rearrange(logits, "b t v -> (b t) v"), rearrange(targets, "b t -> (b t)"),
                               ignore_index=-1)
        return logits, loss

    if TYPE_CHECKING:  # calls type-check as forward (nn.Module.__call__ is untyped)
        __call__ = forward

    def _attn_bias(self, t: int, s: int, dtype: torch.dtype) -> Tensor | None:
        """ALiBi's bias ``(1, n_head, t, s)`` for ``t`` new positions after ``s - t`` cached ones, or None."""
        return None if self.alibi is None else self.alibi(t, s, dtype=dtype)

    def _embed(self, idx: Tensor, offset: int) -> Tensor:
        x = self.tok_emb(idx)
        if self.pos is not None:
            x = self.pos(x, offset)
        out: Tensor = self.drop(x)
        return out

    def attention_weights(self, idx: Int[Tensor, "b t"]) -> Float[Tensor, "l b h t t"]:
        """Every layer's attention weights over ``idx``, per head: ``weights[l, b, h, i, j]`` is what query
        position ``i`` takes from key position ``j`` in layer ``l``; zero above the diagonal (causal).

        For pictures (:func:`typed_transformer.plot_attention`), not for speed: each layer's attention runs a
        second time on the reference path to return its weights. Call ``eval()`` first unless dropout is wanted.

        Raises:
            ShapeError: ``idx`` is longer than ``block_size``.
            ValueError: ``idx`` holds ids outside the vocabulary.
        """
        name = "typed_transformer.gpt.GPT.attention_weights"
        if idx.shape[1] > self.config.block_size:
            raise_shape_error(name, "idx", f"axis t is {idx.shape[1]}, more than block_size={self.config.block_size}",
                              axis="t", actual=idx.shape[1], expected=self.config.block_size)
        check_token_ids("GPT.attention_weights", "idx", idx, self.vocab_size)
        maps = []
        with torch.no_grad():
            x = self._embed(idx, 0)
            bias = self._attn_bias(idx.shape[1], idx.shape[1], x.dtype)
            for block in self.blocks:
                assert isinstance(block, Block)
                _, weights = block.attn(block.ln_1(x), is_causal=True, need_weights=True, average_attn_weights=False,
                                        attn_bias=bias)
                assert weights is not None  # need_weights=True
                maps.append(weights)
                x = block(x, attn_bias=bias)
        return torch.stack(maps)

    from_hf_gpt2: ClassVar[Callable[..., "GPT"]]
    """``GPT.from_hf_gpt2(model_or_state_dict, *, n_head=None)``: load Hugging Face GPT-2 weights. An alias of
    :func:`typed_transformer.hf.gpt_from_hf_gpt2`, attached to the class by that module, which imports this one
    (this module never imports it; ``import typed_transformer`` loads both)."""

    from_tutorial_state_dict: ClassVar[Callable[..., "GPT"]]
    """``GPT.from_tutorial_state_dict(state_dict)``: load the original tutorial's trained weights (its six
    per-head key/query/value ``Linear``s per block fused into ``in_proj``). An alias of
    :func:`typed_transformer.tutorial.gpt_from_tutorial_state_dict`, attached to the class by that module."""

    def new_caches(self) -> list[KVCache]:
        """One empty :class:`KVCache` per layer, each with room for ``block_size`` positions."""
        return [KVCache(self.config.block_size) for _ in self.blocks]

    @torch.no_grad()
    def generate(
        self,
        idx: Int[Tensor, "b t"],
        max_new_tokens: int,
        *,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        greedy: bool = False,
        generator: torch.Generator | Sequence[torch.Generator] | None = None,
        use_cache: bool = True,
        lengths: Int[Tensor, " b"] | None = None,
    ) -> Int[Tensor, "b t+{max_new_tokens}"]:
        """Append ``max_new_tokens`` sampled tokens to ``idx``.

        Each step conditions on the last ``block_size`` tokens (nanoGPT's crop). With ``use_cache`` (default)
        a per-layer KV cache makes each step a one-token forward pass while the context fits in
        ``block_size``; once it no longer fits, the cropped window is recomputed, since cached keys of the
        dropped first position would otherwise still influence the window. Cached and uncached generation
        therefore give the same logits.

        Sampling: logits / ``temperature``, then the ``top_k`` largest, then the smallest set whose
        probability reaches ``top_p``; ``greedy`` takes the argmax instead. ``generator`` makes it reproducible;
        a sequence of ``b`` generators gives each row its own (row ``i`` then draws exactly what generating it
        alone with ``generator=generators[i]`` draws).

        Prompts of different lengths: ``idx`` left-padded (any ids in the padding) and ``lengths[i]`` the number
        of real tokens of row ``i`` (its last ``lengths[i]`` positions). Each row is generated as if it were
        alone: its positions start at 0 at its first real token and no padding is ever attended to. The rows
        run aligned at their first real token, the longer prompts fed one token per step (through the cache)
        while the shorter ones already sample, so no attention mask is needed and a row's logits are those of
        the row alone. The result keeps ``idx`` (padding included) and appends ``max_new_tokens`` per row.

        Shape checks: the arguments are checked at this call; the forward passes it makes are the library
        calling itself and are checked again only in strict mode (see :mod:`typed_transformer.shapecheck`).

        Raises:
            ShapeError: ``idx`` of the wrong shape, or with no positions (an empty prompt).
            ValueError: nonsensical sampling settings (see :func:`check_sampling`), token ids outside the
                vocabulary, or logits that hold NaN or infinity (the message says whether a weight does).
        """
        check_sampling(max_new_tokens, temperature, top_k, top_p, greedy)
        if idx.shape[1] == 0:
            raise_shape_error("typed_transformer.gpt.GPT.generate", "idx",
                              "axis t is 0: generation needs a prompt of at least one token", axis="t", actual=0)
        settings: dict[str, Any] = {"temperature": temperature, "top_k": top_k, "top_p": top_p, "greedy": greedy,
                                    "generator": generator, "use_cache": use_cache}
        try:
            if lengths is not None or (generator is not None and not isinstance(generator, torch.Generator)):
                return self._generate_rows(idx, lengths, max_new_tokens, **settings)
            caches = self.new_caches() if use_cache else None
            logits, _ = self(idx[:, -self.config.block_size:], kv_caches=caches)
            return self._decode(idx, logits, caches, max_new_tokens, **settings)
        except _NonFiniteLogits:
            raise ValueError(f"GPT.generate: the model's logits hold NaN or infinity, so no token can be drawn: "
                             f"{self._why_not_finite()}") from None

    def _why_not_finite(self) -> str:
        """Why this model's output is not finite: a named weight, or overflow with finite weights."""
        for name, value in (*self.named_parameters(), *self.named_buffers()):
            if value.is_floating_point() and not bool(torch.isfinite(value).all()):
                return f"its weight {name} holds NaN or infinity"
        return ("its weights are finite but so large that the activations overflow (weights that exploded in a "
                "training run that diverged)")

    def _decode(self, idx: Tensor, logits: Tensor, caches: list[KVCache] | None, max_new_tokens: int,
                **settings: Any) -> Tensor:
        return torch.cat([idx, *self._decode_steps(idx, logits, caches, max_new_tokens, **settings)], dim=1)

    def stream(self, idx: Int[Tensor, "1 t"], max_new_tokens: int, *, temperature: float = 1.0,
               top_k: int | None = None, top_p: float | None = None, greedy: bool = False,
               generator: torch.Generator | None = None) -> Iterator[Int[Tensor, "1 1"]]:
        """:meth:`generate` one token at a time: yields each sampled token as soon as it is drawn (the same
        tokens :meth:`generate` appends with the same arguments), for a caller that shows text as it comes."""
        check_sampling(max_new_tokens, temperature, top_k, top_p, greedy)
        if idx.shape[1] == 0:
            raise_shape_error("typed_transformer.gpt.GPT.stream", "idx",
                              "axis t is 0: generation needs a prompt of at least one token", axis="t", actual=0)
        if max_new_tokens == 0:
            return
        caches = self.new_caches()
        try:
            logits, _ = self(idx[:, -self.config.block_size:], kv_caches=caches)
            yield from self._decode_steps(idx, logits, caches, max_new_tokens, temperature=temperature, top_k=top_k,
                                          top_p=top_p, greedy=greedy, generator=generator, use_cache=True)
        except _NonFiniteLogits:
            raise ValueError(f"GPT.stream: the model's logits hold NaN or infinity, so no token can be drawn: "
                             f"{self._why_not_finite()}") from None

    def _decode_steps(self, idx: Tensor, logits: Tensor, caches: list[KVCache] | None, max_new_tokens: int, *,
                      temperature: float, top_k: int | None, top_p: float | None, greedy: bool,
                      generator: torch.Generator | None, use_cache: bool) -> Iterator[Tensor]:
        """Each sampled token ``(b, 1)`` of :meth:`generate`'s one-generator path, as it is drawn."""
        block = self.config.block_size
        for step in range(max_new_tokens):
            next_id = sample(logits[:, -1], temperature=temperature, top_k=top_k, top_p=top_p, greedy=greedy,
                             generator=generator)
            idx = torch.cat([idx, next_id], dim=1)
            yield next_id
            if step == max_new_tokens - 1:
                break
            if caches is not None and caches[0].length < block:
                logits, _ = self(next_id, kv_caches=caches)
            else:
                caches = self.new_caches() if use_cache else None
                logits, _ = self(idx[:, -block:], kv_caches=caches)

    def _generate_rows(self, idx: Tensor, lengths: Tensor | None, max_new_tokens: int, *, temperature: float,
                       top_k: int | None, top_p: float | None, greedy: bool,
                       generator: torch.Generator | Sequence[torch.Generator] | None, use_cache: bool) -> Tensor:
        """:meth:`generate` for left-padded prompts (``lengths``) or one generator per row."""
        b, t = idx.shape
        name = "typed_transformer.gpt.GPT.generate"
        if lengths is None:
            lengths = torch.full((b,), t, dtype=torch.long)
        sizes = [int(n) for n in lengths.tolist()]
        if any(not 1 <= n <= t for n in sizes):
            bad = next(n for n in sizes if not 1 <= n <= t)
            raise ValueError(f"GPT.generate: lengths holds {bad}; every prompt needs 1 to t={t} tokens")
        generators: list[torch.Generator] | None = None
        if generator is not None and not isinstance(generator, torch.Generator):
            generators = list(generator)
            if len(generators) != b:
                raise_shape_error(name, "generator", f"holds {len(generators)} generators for {b} rows", axis="b",
                                  actual=len(generators), expected=b)
        block = self.config.block_size
        # Row i aligned at its first real token: aligned[i, :sizes[i]] is its prompt.
        aligned = torch.stack([torch.roll(row, n - t) for row, n in zip(idx, sizes, strict=True)])
        shortest, longest = min(sizes), max(sizes)
        prompt_len = torch.tensor(sizes, device=idx.device)
        context = aligned[:, :shortest]
        produced = torch.zeros(b, dtype=torch.long, device=idx.device)
        new = torch.zeros(b, max_new_tokens, dtype=idx.dtype, device=idx.device)
        caches = self.new_caches() if use_cache else None
        logits, _ = self(context[:, -block:], kv_caches=caches)
        steps = longest - shortest + max_new_tokens
        for step in range(steps):
            position = context.shape[1]
            in_prompt = prompt_len > position
            sampling = ~in_prompt & (produced < max_new_tokens)
            next_id = aligned[:, min(position, t - 1)].clone()
            next_id[~in_prompt] = 0  # rows done with max_new_tokens keep feeding a valid id; never returned
            rows = [i for i, draws in enumerate(sampling.tolist()) if draws]
            if rows and generators is not None and not greedy:
                for i in rows:
                    next_id[i] = sample(logits[i:i + 1, -1], temperature=temperature, top_k=top_k, top_p=top_p,
                                        generator=generators[i])[0, 0]
            elif rows:
                drawn = sample(logits[rows, -1], temperature=temperature, top_k=top_k, top_p=top_p, greedy=greedy,
                               generator=generator if isinstance(generator, torch.Generator) else None)
                next_id[rows] = drawn[:, 0]
            new[rows, produced[rows]] = next_id[rows]
            produced += sampling.long()
            context = torch.cat([context, rearrange(next_id, "b -> b 1")], dim=1)
            if step == steps - 1:
                break
            if caches is not None and caches[0].length < block:
                logits, _ = self(rearrange(next_id, "b -> b 1"), kv_caches=caches)
            else:
                caches = self.new_caches() if use_cache else None
                logits, _ = self(context[:, -block:], kv_caches=caches)
        return torch.cat([idx, new], dim=1)

    def parameter_groups(self, weight_decay: float) -> list[dict[str, Any]]:
        """AdamW groups: decay on matrices (dim >= 2), none on biases, norms and other vectors."""
        params = {id(p): p for p in self.parameters() if p.requires_grad}  # tied weights once
        decay = [p for p in params.values() if p.dim() >= 2]
        no_decay = [p for p in params.values() if p.dim() < 2]
        return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def _check_loss_targets(targets: Tensor) -> None:
    """The mean cross-entropy is defined only over at least one position whose target is not -1 (ignored);
    torch returns NaN for none, silently."""
    b, t = targets.shape
    if b == 0 or t == 0:
        axis = "b" if b == 0 else "t"
        raise_shape_error("typed_transformer.gpt.GPT.forward", "targets",
                          f"axis {axis} is 0: the loss needs at least one position", axis=axis, actual=0)
    if not bool((targets != -1).any()):
        raise ValueError("GPT.forward: targets are all -1 (ignored): the mean loss over no position is undefined; "
                         "give at least one target id")


class _NonFiniteLogits(ValueError):
    """Logits with NaN or infinity given to :func:`sample` (:meth:`GPT.generate` says why in its own words)."""


def _drawable(logits: Tensor) -> Tensor:
    """Per row: no NaN, no +inf, and some entry above -inf (-inf alone is a token that cannot be drawn)."""
    return (logits < math.inf).all(dim=-1) & (logits.amax(dim=-1) > -math.inf)


def _check_finite_logits(logits: Tensor) -> None:
    drawable = _drawable(logits)
    if not bool(drawable.all()):
        row = int((~drawable).nonzero()[0, 0])
        raise _NonFiniteLogits(f"sample: logits row {row} holds NaN or +inf, or only -inf: no token can be drawn "
                               f"from it")


def check_sampling(max_new_tokens: int, temperature: float, top_k: int | None, top_p: float | None,
                   greedy: bool) -> None:
    """Raise ValueError for sampling settings that make no sense."""
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if not greedy and not (temperature > 0 and math.isfinite(temperature)):
        raise ValueError(f"temperature must be a positive number, got {temperature}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")


def sample(
    logits: Float[Tensor, "b v"],
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    greedy: bool = False,
    generator: torch.Generator | None = None,
) -> Int[Tensor, "b 1"]:
    """Draw one token per row from ``softmax(logits / temperature)`` restricted by top-k and top-p.

    Any positive temperature works: when ``logits / temperature`` overflows (temperatures far below the
    logits' spread, 1e-300 say), the logits are shifted by their maximum first, which leaves the softmax
    unchanged and gives its limit, the argmax (tied maxima share the draw).

    Raises:
        ValueError: a row of ``logits`` holds NaN or +inf, or only -inf (nothing can be drawn from it; torch's
            ``multinomial`` would fail without saying why, and the argmax of a NaN row is an arbitrary token).
            -inf beside finite logits is a token that is never drawn.
    """
    if greedy:
        _check_finite_logits(logits)
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits.float()
    scaled = logits / temperature
    if not bool(_drawable(scaled).all()):  # one check; the logits themselves only on this rare path
        _check_finite_logits(logits)
        # In float64, where any positive Python float is non-zero: 0 at the maximum, -inf or below elsewhere.
        shifted = (logits - logits.amax(dim=-1, keepdim=True)).double() / temperature
        scaled = shifted.softmax(dim=-1).float().log()  # the same distribution, finite at the maximum
    logits = scaled
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        # Drop a token when the tokens ranked above it already reach top_p (the first always stays).
        drop_sorted = probs.cumsum(dim=-1) - probs >= top_p
        drop_sorted[:, 0] = False  # also when top_p is below float32's resolution (1e-300 compares as 0)
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    probs = logits.softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator)


sample = typechecked(sample)
