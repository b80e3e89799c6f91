"""Properties of the character-level GPT: KV-cached decoding equals recomputation (also past block_size),
reproducible sampling, top-k/top-p never leave their allowed set, causality, and the input errors.

Models are small random float64 configurations over every positional encoding and grouped-query head
count, with every parameter randomized (biases and norms included) so that nothing hides behind zeros.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from jaxtyping import TypeCheckError
from torch import Tensor

from tests.support.properties import EXACTISH, assert_close
from typed_transformer import ShapeError, TokenIdError
from typed_transformer.gpt import GPT, GPTConfig, sample
from typed_transformer.positions import ALiBiPositionalBias, alibi_slopes
from typed_transformer.strategies import randomize_parameters, seeds

FORWARD = "typed_transformer.gpt.GPT.forward"
POSITIONALS: tuple[Literal["learned", "sinusoidal", "rope", "alibi"], ...] = ("learned", "sinusoidal", "rope", "alibi")
ACTIVATIONS: tuple[Literal["gelu", "gelu_tanh"], ...] = ("gelu", "gelu_tanh")


@st.composite
def gpt_configs(draw: st.DrawFn, *, max_block: int = 5) -> GPTConfig:
    """Small GPTs: 1-2 layers, 1-4 query heads with a dividing number of key/value heads, head size 1-4
    (even for RoPE), block size 1..max_block, vocabulary 2-12, any positional encoding."""
    positional = draw(st.sampled_from(POSITIONALS), label="positional")
    n_head = draw(st.integers(1, 4), label="n_head")
    kv_heads = draw(st.sampled_from([g for g in range(1, n_head + 1) if n_head % g == 0][::-1]), label="n_kv_heads")
    head_dim = draw(st.sampled_from([2, 4]) if positional == "rope" else st.integers(1, 4), label="head_dim")
    return GPTConfig(
        vocab_size=draw(st.integers(2, 12), label="vocab_size"),
        block_size=draw(st.integers(1, max_block), label="block_size"),
        n_layer=draw(st.integers(1, 2), label="n_layer"),
        n_head=n_head,
        n_kv_heads=kv_heads,
        n_embd=n_head * head_dim,
        bias=draw(st.booleans(), label="bias"),
        positional=positional,
        activation=draw(st.sampled_from(ACTIVATIONS), label="activation"),
        tie_weights=draw(st.booleans(), label="tie_weights"),
    )


@dataclass(frozen=True)
class Case:
    model: GPT
    tokens: Tensor  # (b, length) token ids, length > block_size: decoding runs past the context
    prompt: int  # length of the prompt, 1..block_size

    @property
    def block(self) -> int:
        return self.model.config.block_size


@st.composite
def cases(draw: st.DrawFn) -> Case:
    config = draw(gpt_configs())
    seed = draw(seeds(), label="seed")
    model = randomize_parameters(GPT(config).double().eval(), seed, std=0.5)
    b = draw(st.integers(1, 2), label="b")
    prompt = draw(st.integers(1, config.block_size), label="prompt")
    length = config.block_size + draw(st.integers(1, 5), label="past_block")
    ids = torch.randint(config.vocab_size, (b, length), generator=torch.Generator().manual_seed(seed + 1))
    return Case(model=model, tokens=ids, prompt=prompt)


# ----------------------------------------------------------------------------------------------------
# KV cache against recomputation
# ----------------------------------------------------------------------------------------------------


def cached_step_logits(model: GPT, ids: Tensor, prompt: int) -> list[Tensor]:
    """Next-token logits after each prefix ``ids[:, :n]`` (n = prompt..len), decoded with KV caches: the
    prompt in one pass, then one token per step while the context fits; once the caches hold block_size
    positions, fresh caches are filled from the last block_size tokens."""
    block = model.config.block_size
    caches = model.new_caches()
    logits, _ = model(ids[:, :prompt], kv_caches=caches)
    steps = [logits[:, -1]]
    for n in range(prompt + 1, ids.shape[1] + 1):
        if caches[0].length < block:
            logits, _ = model(ids[:, n - 1 : n], kv_caches=caches)
        else:
            caches = model.new_caches()
            logits, _ = model(ids[:, max(0, n - block) : n], kv_caches=caches)
        assert all(cache.length <= block for cache in caches)
        steps.append(logits[:, -1])
    return steps


def recomputed_step_logits(model: GPT, ids: Tensor, prompt: int) -> list[Tensor]:
    """The same logits from a full pass over the (cropped to block_size) prefix at every step, no cache."""
    block = model.config.block_size
    steps = []
    for n in range(prompt, ids.shape[1] + 1):
        logits, _ = model(ids[:, max(0, n - block) : n])
        steps.append(logits[:, -1])
    return steps


@given(case=cases())
def test_cached_decoding_gives_the_logits_of_recomputation(case: Case) -> None:
    with torch.no_grad():
        cached = cached_step_logits(case.model, case.tokens, case.prompt)
        full = recomputed_step_logits(case.model, case.tokens, case.prompt)
    assert len(cached) == len(full) == case.tokens.shape[1] - case.prompt + 1
    for step, (a, b) in enumerate(zip(cached, full, strict=True)):
        assert_close(a, b, EXACTISH, msg=lambda m, s=step: f"step {s}: {m}")


def record_step_logits(model: GPT) -> tuple[list[Tensor], Callable[[], None]]:
    """Record the last-position logits of every forward call of ``model``; returns (record, remove)."""
    record: list[Tensor] = []

    def hook(module: torch.nn.Module, args: object, output: tuple[Tensor, Tensor | None]) -> None:
        record.append(output[0][:, -1].clone())

    handle = model.register_forward_hook(hook)
    return record, handle.remove


@st.composite
def sampling_settings(draw: st.DrawFn) -> dict[str, object]:
    greedy = draw(st.booleans(), label="greedy")
    if greedy:
        return {"greedy": True}
    return {
        "temperature": draw(st.sampled_from([1.0, 0.5, 2.0]), label="temperature"),
        "top_k": draw(st.none() | st.integers(1, 6), label="top_k"),
        "top_p": draw(st.none() | st.floats(0.05, 1.0), label="top_p"),
    }


@given(case=cases(), settings=sampling_settings(), sample_seed=seeds())
def test_generate_with_and_without_cache_agree_token_for_token(case: Case, settings: dict[str, object],
                                                               sample_seed: int) -> None:
    prompt = case.tokens[:, : case.prompt]
    new = case.tokens.shape[1] - case.prompt
    outputs, step_logits = [], []
    for use_cache in (True, False):
        record, remove = record_step_logits(case.model)
        generator = torch.Generator().manual_seed(sample_seed)
        try:
            outputs.append(case.model.generate(prompt, new, generator=generator, use_cache=use_cache,
                                               **settings))  # type: ignore[arg-type]
        finally:
            remove()
        step_logits.append(record)
    cached, uncached = outputs
    assert cached.shape == (prompt.shape[0], case.tokens.shape[1])
    assert torch.equal(cached[:, : case.prompt], prompt)
    assert torch.equal(cached, uncached)
    assert len(step_logits[0]) == len(step_logits[1]) == new
    for a, b in zip(*step_logits, strict=True):
        assert_close(a, b, EXACTISH)
    # Both equal a plain loop over the generated text: recompute each step's logits from scratch.
    with torch.no_grad():
        reference = recomputed_step_logits(case.model, cached, case.prompt)[:-1]
    for step, (a, b) in enumerate(zip(step_logits[0], reference, strict=True)):
        assert_close(a, b, EXACTISH, msg=lambda m, s=step: f"step {s}: {m}")
        if settings.get("greedy"):
            assert torch.equal(cached[:, case.prompt + step], b.argmax(dim=-1))


@given(case=cases(), settings=sampling_settings(), sample_seed=seeds())
def test_sampling_with_a_fixed_generator_is_reproducible(case: Case, settings: dict[str, object],
                                                         sample_seed: int) -> None:
    prompt = case.tokens[:, : case.prompt]
    runs = [case.model.float().generate(prompt, 6, generator=torch.Generator().manual_seed(sample_seed),
                                        **settings)  # type: ignore[arg-type]
            for _ in range(2)]
    assert torch.equal(runs[0], runs[1])
    assert int(runs[0].min()) >= 0
    assert int(runs[0].max()) < case.model.config.vocab_size


# ----------------------------------------------------------------------------------------------------
# sample(): top-k and top-p
# ----------------------------------------------------------------------------------------------------


def allowed_tokens(logits: Tensor, temperature: float, top_k: int | None, top_p: float | None) -> Tensor:
    """Boolean ``(b, v)``: the tokens top-k then top-p may emit, from their definitions. ``logits`` are the
    float32 values sample() works with; the top-p prefix is computed in float64 with a 1e-6 allowance, so
    a rounding difference at the boundary can only enlarge the allowed set."""
    scaled = logits.float() / temperature
    allowed = torch.ones_like(scaled, dtype=torch.bool)
    for row in range(scaled.shape[0]):
        values = scaled[row].tolist()
        if top_k is not None and top_k < len(values):
            kth = sorted(values, reverse=True)[top_k - 1]
            for j, value in enumerate(values):
                allowed[row, j] = value >= kth
        if top_p is not None and top_p < 1.0:
            kept = [j for j in range(len(values)) if allowed[row, j]]
            probs = torch.tensor([values[j] for j in kept], dtype=torch.float64).softmax(dim=0).tolist()
            order = sorted(range(len(kept)), key=lambda i: -probs[i])
            mass, prefix = 0.0, []
            for i in order:
                prefix.append(kept[i])
                mass += probs[i]
                if mass >= top_p + 1e-6:
                    break
            allowed[row] = False
            allowed[row, prefix] = True
    return allowed


@given(
    b=st.integers(1, 3),
    v=st.integers(1, 20),
    scale=st.sampled_from([0.1, 1.0, 5.0]),
    temperature=st.sampled_from([0.3, 1.0, 2.5]),
    top_k=st.none() | st.integers(1, 22),
    top_p=st.none() | st.floats(0.01, 1.0),
    seed=seeds(),
)
def test_top_k_and_top_p_never_emit_a_token_outside_the_allowed_set(
    b: int, v: int, scale: float, temperature: float, top_k: int | None, top_p: float | None, seed: int
) -> None:
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, v, generator=generator, dtype=torch.float64) * scale
    allowed = allowed_tokens(logits, temperature, top_k, top_p)
    repeats = 200
    drawn = sample(logits.repeat_interleave(repeats, dim=0), temperature=temperature, top_k=top_k, top_p=top_p,
                   generator=generator)
    assert drawn.shape == (b * repeats, 1)
    rows = torch.arange(b).repeat_interleave(repeats)
    outside = ~allowed[rows, drawn[:, 0]]
    assert not bool(outside.any()), f"emitted {drawn[outside, 0].tolist()}, allowed {allowed.tolist()}"
    # The most likely token is always allowed and, with 200 draws, a token of >= 10% mass shows up.
    assert bool(allowed[torch.arange(b), logits.argmax(dim=-1)].all())
    restricted = (logits.float() / temperature).masked_fill(~allowed, float("-inf")).double().softmax(dim=-1)
    for row in range(b):
        seen = set(drawn[rows == row, 0].tolist())
        likely = {j for j in range(v) if restricted[row, j] >= 0.1}
        assert likely <= seen


# ----------------------------------------------------------------------------------------------------
# Causality
# ----------------------------------------------------------------------------------------------------


@given(config=gpt_configs(max_block=7), seed=seeds(), data=st.data())
def test_changing_future_tokens_does_not_change_past_logits(config: GPTConfig, seed: int,
                                                            data: st.DataObject) -> None:
    model = randomize_parameters(GPT(config).double().eval(), seed, std=0.5)
    t = data.draw(st.integers(1, config.block_size), label="t")
    keep = data.draw(st.integers(1, t), label="keep")  # positions 0..keep-1 stay, the rest may change
    generator = torch.Generator().manual_seed(seed + 1)
    ids = torch.randint(config.vocab_size, (2, t), generator=generator)
    changed = ids.clone()
    changed[:, keep:] = (ids[:, keep:] + torch.randint(1, config.vocab_size, (2, t - keep),
                                                       generator=generator)) % config.vocab_size
    with torch.no_grad():
        before, _ = model(ids, all_positions=True)
        after, _ = model(changed, all_positions=True)
    assert before.shape == (2, t, config.vocab_size)
    assert_close(after[:, :keep], before[:, :keep], EXACTISH)
    # The first changed position sees a different token, so its logits move (with n_embd <= 2 the final
    # LayerNorm leaves too few values: for n_embd = 1 its output is always 0).
    if keep < t and config.n_embd >= 3:
        assert not torch.allclose(after[:, keep], before[:, keep], rtol=1e-9, atol=1e-9)


# ----------------------------------------------------------------------------------------------------
# Input errors
# ----------------------------------------------------------------------------------------------------


def assert_forward_shape_error(call: Callable[[], object], argument: str, axis: str | None = None,
                               actual: int | None = None, expected: int | None = None) -> None:
    with pytest.raises(ShapeError) as info:
        call()
    err = info.value
    assert isinstance(err, TypeCheckError)
    assert (err.function, err.argument, err.axis) == (FORWARD, argument, axis)
    if actual is not None:
        assert (err.actual, err.expected) == (actual, expected)


@given(config=gpt_configs(), b=st.integers(1, 3), data=st.data())
def test_bad_idx_and_targets_raise_shape_errors(config: GPTConfig, b: int, data: st.DataObject) -> None:
    model = GPT(config)
    block = config.block_size
    t = data.draw(st.integers(1, block), label="t")
    idx = torch.zeros(b, t, dtype=torch.long)
    assert_forward_shape_error(lambda: model(idx[0]), "idx")
    assert_forward_shape_error(lambda: model(idx[None]), "idx")
    assert_forward_shape_error(lambda: model(idx.double()), "idx")
    too_long = data.draw(st.integers(block + 1, block + 4), label="too_long")
    assert_forward_shape_error(lambda: model(torch.zeros(b, too_long, dtype=torch.long)), "idx", "t",
                               actual=too_long, expected=block)
    other_t = data.draw(st.integers(1, block + 3).filter(lambda n: n != t), label="other_t")
    assert_forward_shape_error(lambda: model(idx, torch.zeros(b, other_t, dtype=torch.long)), "targets", "t",
                               actual=other_t, expected=t)
    other_b = data.draw(st.integers(1, 4).filter(lambda n: n != b), label="other_b")
    assert_forward_shape_error(lambda: model(idx, torch.zeros(other_b, t, dtype=torch.long)), "targets", "b",
                               actual=other_b, expected=b)
    assert_forward_shape_error(lambda: model(idx, torch.zeros(b, t)), "targets")
    assert_forward_shape_error(lambda: model(idx, idx[:, :, None]), "targets")


@given(config=gpt_configs(), data=st.data())
def test_token_ids_outside_the_vocabulary_are_value_errors(config: GPTConfig, data: st.DataObject) -> None:
    model = GPT(config)
    t = data.draw(st.integers(1, config.block_size), label="t")
    idx = torch.zeros(2, t, dtype=torch.long)
    bad = data.draw(st.integers(config.vocab_size, config.vocab_size + 100) | st.integers(-100, -1), label="bad")
    idx[data.draw(st.integers(0, 1), label="row"), data.draw(st.integers(0, t - 1), label="col")] = bad
    with pytest.raises(ValueError, match="outside the vocabulary") as info:
        model(idx)
    assert info.type is TokenIdError
    assert str(info.value) == (f"GPT.forward: idx holds token id {bad}, "
                               f"outside the vocabulary 0..{config.vocab_size - 1}")


@given(n_head=st.integers(1, 12), t=st.integers(1, 6), cached=st.integers(0, 6), shift=st.integers(0, 6))
def test_alibi_bias_depends_only_on_the_distance(n_head: int, t: int, cached: int, shift: int) -> None:
    """bias[h, i, j] is a function of (h, pos(i) - pos(j)): the same query/key distance gives the same bias
    whatever the cache length, -m_h * distance for keys up to the query (what the causal mask lets through),
    with geometric slopes in (0, 1)."""
    alibi = ALiBiPositionalBias(n_head)
    s = cached + t
    bias = alibi(t, s, dtype=torch.float64)[0]
    slopes = alibi_slopes(n_head)
    assert torch.all((slopes > 0) & (slopes < 1))
    query_pos = torch.arange(cached, s)[:, None]
    key_pos = torch.arange(s)[None, :]
    distance = (query_pos - key_pos).double()
    causal = distance >= 0
    expected = -slopes[:, None, None] * distance.abs()
    assert torch.equal(bias, expected)  # float64 asked for, float64 computed: exact
    torch.testing.assert_close(alibi(t, s)[0], expected.float(), rtol=2**-23, atol=0)  # default float32
    assert torch.all(bias[:, causal] <= 0)
    # Shifting every position by the same amount (a longer cache) leaves the bias of each distance unchanged.
    shifted = alibi(t, s + shift, dtype=torch.float64)[0, :, :, shift:]
    assert torch.equal(shifted, bias)


# ----------------------------------------------------------------------------------------------------
# Padded batches: every row generates what it generates alone
# ----------------------------------------------------------------------------------------------------


@st.composite
def padded_batches(draw: st.DrawFn) -> tuple[GPT, Tensor, Tensor, int]:
    """A random float64 GPT, 1-3 left-padded prompts of random lengths 1..block_size+3 (random padding ids,
    so that attending to padding would show) and a number of new tokens that crosses block_size."""
    config = draw(gpt_configs())
    seed = draw(seeds(), label="seed")
    model = randomize_parameters(GPT(config).double().eval(), seed, std=0.5)
    sizes = draw(st.lists(st.integers(1, config.block_size + 3), min_size=1, max_size=3), label="lengths")
    ids = torch.randint(config.vocab_size, (len(sizes), max(sizes)), generator=torch.Generator().manual_seed(seed))
    new = draw(st.integers(1, config.block_size + 3), label="max_new_tokens")
    return model, ids, torch.tensor(sizes), new


@given(batch=padded_batches(), settings=sampling_settings(), sample_seed=seeds(), use_cache=st.booleans())
def test_each_row_of_a_padded_batch_generates_what_it_generates_alone(
        batch: tuple[GPT, Tensor, Tensor, int], settings: dict[str, object], sample_seed: int,
        use_cache: bool) -> None:
    model, ids, lengths, new = batch
    generators = [torch.Generator().manual_seed(sample_seed + i) for i in range(ids.shape[0])]
    out = model.generate(ids, new, lengths=lengths, generator=generators, use_cache=use_cache,
                         **settings)  # type: ignore[arg-type]
    assert out.shape == (ids.shape[0], ids.shape[1] + new)
    assert torch.equal(out[:, : ids.shape[1]], ids)
    for i, n in enumerate(lengths.tolist()):
        alone = model.generate(ids[i : i + 1, ids.shape[1] - n :], new, use_cache=use_cache,
                               generator=torch.Generator().manual_seed(sample_seed + i),
                               **settings)  # type: ignore[arg-type]
        assert torch.equal(out[i, ids.shape[1] :], alone[0, n:]), f"row {i} (length {n})"
