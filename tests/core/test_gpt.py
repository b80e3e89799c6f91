"""The character-level GPT: configuration, presets, an independent reference forward pass, initialisation,
weight tying, generation and the errors for bad inputs."""

import math
import re
from typing import Any

import jaxtyping
import pytest
import torch
from torch import Tensor

from tests.support.properties import exactly
from typed_transformer import ShapeError, TokenIdError
from typed_transformer.gpt import GPT, PRESETS, Block, GPTConfig, sample
from typed_transformer.multihead import KVCache

FORWARD = "typed_transformer.gpt.GPT.forward"


def tiny(**overrides: Any) -> GPTConfig:
    fields: dict[str, Any] = {"vocab_size": 11, "block_size": 8, "n_layer": 2, "n_head": 2, "n_embd": 8}
    return GPTConfig(**{**fields, **overrides})


def randomized(config: GPTConfig, seed: int = 0, std: float = 0.3) -> GPT:
    """A float64 model whose every parameter (biases and norms too) is std * N(0, 1)."""
    torch.manual_seed(seed)
    model = GPT(config).double().eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn(param.shape, generator=generator, dtype=torch.float64) * std)
    return model


def tokens(b: int, t: int, vocab: int, seed: int = 0) -> Tensor:
    return torch.randint(vocab, (b, t), generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------------------------------------------
# An independent forward pass, written from the equations (no typed_transformer code is called)
# ---------------------------------------------------------------------------------------------------


def ref_layer_norm(x: Tensor, weight: Tensor, bias: Tensor | None, eps: float) -> Tensor:
    mean = x.mean(dim=-1, keepdim=True)
    var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)
    out = (x - mean) / torch.sqrt(var + eps) * weight
    return out if bias is None else out + bias


def ref_linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    out = x @ weight.T
    return out if bias is None else out + bias


def ref_gelu(x: Tensor, tanh: bool) -> Tensor:
    if tanh:
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def ref_rotate(x: Tensor) -> Tensor:
    """Split-half RoPE on ``(b, h, t, d)``: pair ``(x_i, x_{i+d/2})`` turns by ``pos * 10000^(-2i/d)``."""
    t, d = x.shape[2], x.shape[3]
    half = d // 2
    out = torch.empty_like(x)
    for pos in range(t):
        for i in range(half):
            angle = pos * 10000.0 ** (-2.0 * i / d)
            c, s = math.cos(angle), math.sin(angle)
            a, b = x[:, :, pos, i], x[:, :, pos, i + half]
            out[:, :, pos, i] = a * c - b * s
            out[:, :, pos, i + half] = a * s + b * c
    return out


def reference_logits(model: GPT, idx: Tensor) -> Tensor:
    """All-position logits of ``model`` on ``idx`` computed from its parameters and the GPT equations."""
    cfg = model.config
    p = dict(model.named_parameters())
    b, t = idx.shape
    d, h, g = cfg.n_embd, cfg.n_head, cfg.kv_heads
    hd = d // h
    x = p["tok_emb.weight"][idx]
    if cfg.positional == "learned":
        x = x + p["pos.weight"][:t]
    elif cfg.positional == "sinusoidal":
        pe = torch.zeros(t, d, dtype=x.dtype)
        for pos in range(t):
            for i in range(0, d, 2):
                pe[pos, i] = math.sin(pos / 10000.0 ** (i / d))
                if i + 1 < d:
                    pe[pos, i + 1] = math.cos(pos / 10000.0 ** (i / d))
        x = x + pe
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    for layer in range(cfg.n_layer):
        pre = f"blocks.{layer}."

        def get(name: str, pre: str = pre) -> Tensor | None:
            return p.get(pre + name)

        ln1_w = get("ln_1.weight")
        assert ln1_w is not None
        a = ref_layer_norm(x, ln1_w, get("ln_1.bias"), cfg.layer_norm_eps)
        in_w = get("attn.in_proj.weight")
        assert in_w is not None
        qkv = ref_linear(a, in_w, get("attn.in_proj.bias"))
        q, k, v = torch.split(qkv, [d, g * hd, g * hd], dim=-1)
        q = q.reshape(b, t, h, hd).transpose(1, 2)
        k = k.reshape(b, t, g, hd).transpose(1, 2).repeat_interleave(h // g, dim=1)
        v = v.reshape(b, t, g, hd).transpose(1, 2).repeat_interleave(h // g, dim=1)
        if cfg.positional == "rope":
            q, k = ref_rotate(q), ref_rotate(k)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
        scores = scores.masked_fill(~causal, float("-inf"))
        att = torch.exp(scores - scores.amax(dim=-1, keepdim=True))
        att = att / att.sum(dim=-1, keepdim=True)
        heads = (att @ v).transpose(1, 2).reshape(b, t, d)
        out_w = get("attn.out_proj.weight")
        assert out_w is not None
        x = x + ref_linear(heads, out_w, get("attn.out_proj.bias"))
        ln2_w = get("ln_2.weight")
        fc_w, proj_w = get("mlp.linear1.weight"), get("mlp.linear2.weight")
        assert ln2_w is not None
        assert fc_w is not None
        assert proj_w is not None
        m = ref_layer_norm(x, ln2_w, get("ln_2.bias"), cfg.layer_norm_eps)
        m = ref_gelu(ref_linear(m, fc_w, get("mlp.linear1.bias")), cfg.activation == "gelu_tanh")
        x = x + ref_linear(m, proj_w, get("mlp.linear2.bias"))
    x = ref_layer_norm(x, p["ln_f.weight"], p.get("ln_f.bias"), cfg.layer_norm_eps)
    head = p["tok_emb.weight"] if cfg.tie_weights else p["lm_head.weight"]
    return x @ head.T


def reference_loss(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean negative log-likelihood over the targets that are not -1."""
    log_probs = logits - torch.logsumexp(logits, dim=-1, keepdim=True)
    total, count = torch.zeros((), dtype=logits.dtype), 0
    for i in range(targets.shape[0]):
        for j in range(targets.shape[1]):
            target = int(targets[i, j])
            if target != -1:
                total = total - log_probs[i, j, target]
                count += 1
    return total / count


# ---------------------------------------------------------------------------------------------------
# Configuration and presets
# ---------------------------------------------------------------------------------------------------


def test_presets_are_nanogpts_baby_and_seed_003() -> None:
    baby = GPTConfig.preset("baby", 65)
    assert (baby.n_layer, baby.n_head, baby.n_embd, baby.block_size, baby.dropout) == (4, 4, 128, 64, 0.0)
    seed = GPTConfig.preset("seed", 65)
    assert (seed.n_layer, seed.n_head, seed.n_embd, seed.block_size, seed.dropout) == (6, 6, 384, 256, 0.2)
    assert baby.vocab_size == seed.vocab_size == 65
    assert set(PRESETS) == {"baby", "seed"}
    overridden = GPTConfig.preset("baby", 10, block_size=8, positional="rope")
    assert (overridden.block_size, overridden.positional, overridden.n_embd) == (8, "rope", 128)


def test_baby_non_embedding_parameter_count_is_nanogpts_figure() -> None:
    model = GPT(GPTConfig.preset("baby", 65))
    assert model.num_parameters() == 795_904
    assert model.num_parameters(non_embedding=False) == 795_904 + 64 * 128  # plus the position table


def test_parameter_count_formula_for_the_seed_preset() -> None:
    # Per layer 12 d^2 (attention 4 d^2, MLP 8 d^2), the biases of the output projection (d) and the MLP (4 d + d),
    # two LayerNorms with biases (4 d); then the final LayerNorm (2 d), the token embedding and the untied head
    # with its bias (the original tutorial's model; tests/app/test_seed_preset.py compares it with its printout).
    d, layers, vocab = 384, 6, 65
    expected = layers * (12 * d * d + 10 * d) + 2 * d + vocab * d + (d * vocab + vocab)
    model = GPT(GPTConfig.preset("seed", vocab))
    assert model.num_parameters() == expected == 10_690_625


def test_config_round_trips_through_a_dict() -> None:
    config = tiny(n_kv_heads=1, positional="rope", bias=True, activation="gelu_tanh", qkv_bias=False,
                  lm_head_bias=True, tie_weights=False)
    assert GPTConfig.from_dict(config.to_dict()) == config


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        ({"vocab_size": 0}, "vocab_size must be a positive int"),
        ({"block_size": -1}, "block_size must be a positive int"),
        ({"block_size": True}, "block_size must be a positive int"),
        ({"n_layer": 0}, "n_layer must be a positive int"),
        ({"n_head": 0}, "n_head must be a positive int"),
        ({"n_embd": 2.5}, "n_embd must be a positive int"),
        ({"n_embd": 9, "n_head": 2}, "n_embd=9 is not divisible by n_head=2"),
        ({"n_head": 4, "n_kv_heads": 3}, "n_kv_heads=3 must divide n_head=4"),
        ({"n_kv_heads": 0}, "n_kv_heads must be None or a positive int, got 0"),
        ({"dropout": 1.0}, "dropout must be in [0, 1)"),
        ({"dropout": -0.1}, "dropout must be in [0, 1)"),
        ({"positional": "xpos"}, "positional must be learned, sinusoidal, rope or alibi"),
        ({"activation": "swish"}, "activation must be gelu, gelu_tanh or relu"),
        ({"qkv_bias": "false"}, "qkv_bias must be None, True or False"),
        ({"lm_head_bias": 1}, "lm_head_bias must be True or False"),
        ({"positional": "rope", "n_embd": 6, "n_head": 2}, "rope needs an even head size, got 3"),
    ],
)
def test_config_validation_raises_value_error(overrides: dict[str, Any], words: str) -> None:
    with pytest.raises(ValueError, match="GPTConfig") as info:
        tiny(**overrides)
    assert info.type is ValueError
    assert words in str(info.value)


def test_unknown_preset_and_unknown_fields() -> None:
    with pytest.raises(ValueError, match="unknown preset 'huge'; choose one of baby, seed"):
        GPTConfig.preset("huge", 10)
    with pytest.raises(ValueError, match=r"unknown fields \['n_ctx'\]"):
        GPTConfig.from_dict({**tiny().to_dict(), "n_ctx": 8})


# ---------------------------------------------------------------------------------------------------
# The forward pass against the reference
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"positional": "sinusoidal", "bias": True},
        {"positional": "rope", "n_head": 4, "n_kv_heads": 2, "n_embd": 16},
        {"activation": "gelu_tanh", "tie_weights": False, "n_kv_heads": 1},
        {"positional": "rope", "bias": True, "tie_weights": False, "n_layer": 1, "n_head": 1},
    ],
)
def test_forward_matches_the_reference_equations(overrides: dict[str, Any]) -> None:
    model = randomized(tiny(**overrides))
    idx, targets = tokens(3, 7, 11, seed=1), tokens(3, 7, 11, seed=2)
    targets[0, 2] = targets[2, 6] = -1
    expected = reference_logits(model, idx)
    logits, loss = model(idx, targets)
    torch.testing.assert_close(logits, expected, rtol=1e-10, atol=1e-10)
    assert loss is not None
    torch.testing.assert_close(loss, reference_loss(expected, targets), rtol=1e-10, atol=1e-10)
    all_logits, no_loss = model(idx, all_positions=True)
    assert no_loss is None
    torch.testing.assert_close(all_logits, expected, rtol=1e-10, atol=1e-10)


def test_without_targets_only_the_last_position_is_returned() -> None:
    model = randomized(tiny())
    idx = tokens(2, 5, 11)
    logits, loss = model(idx)
    assert loss is None
    assert logits.shape == (2, 1, 11)
    torch.testing.assert_close(logits, reference_logits(model, idx)[:, -1:], rtol=1e-10, atol=1e-10)


def test_blocks_are_pre_ln_the_residual_stream_is_not_normalised() -> None:
    # Pre-LN: with the attention and MLP output projections zeroed, the block adds nothing and the final
    # LayerNorm sees E[idx] itself; a post-LN block would have passed it through its own (random) ln_1/ln_2.
    model = randomized(tiny(positional="rope", n_layer=1))
    block = model.blocks[0]
    assert isinstance(block, Block)
    with torch.no_grad():
        block.attn.out_proj.weight.zero_()
        block.mlp.linear2.weight.zero_()
    idx = tokens(1, 6, 11)
    logits, _ = model(idx, all_positions=True)
    emb = model.tok_emb.weight[idx]
    expected = ref_layer_norm(emb, model.ln_f.weight, None, 1e-5) @ model.tok_emb.weight.T
    torch.testing.assert_close(logits, expected, rtol=1e-10, atol=1e-10)


def test_weight_tying_shares_one_tensor_and_survives_a_step() -> None:
    model = GPT(tiny())
    assert model.lm_head.weight is model.tok_emb.weight
    names = [name for name, _ in model.named_parameters(remove_duplicate=False)]
    assert "lm_head.weight" in names
    assert "tok_emb.weight" in names
    assert sum(p.numel() for p in model.parameters()) == model.num_parameters(non_embedding=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    idx = tokens(2, 8, 11)
    _, loss = model(idx, idx)
    assert loss is not None
    loss.backward()  # type: ignore[no-untyped-call]  # torch's Tensor.backward has no annotations
    optimizer.step()
    assert model.lm_head.weight is model.tok_emb.weight
    untied = GPT(tiny(tie_weights=False))
    assert untied.lm_head.weight is not untied.tok_emb.weight
    assert untied.num_parameters() == model.num_parameters() + 11 * 8


def test_gpt2_initialisation_with_scaled_residual_projections() -> None:
    torch.manual_seed(0)
    n_layer = 3
    model = GPT(GPTConfig(vocab_size=2000, block_size=256, n_layer=n_layer, n_head=6, n_embd=384, bias=True))
    blocks = [block for block in model.blocks if isinstance(block, Block)]
    assert len(blocks) == n_layer
    residual = torch.cat([torch.cat([block.attn.out_proj.weight.flatten(), block.mlp.linear2.weight.flatten()])
                          for block in blocks]).detach()
    expected = 0.02 / math.sqrt(2 * n_layer)
    assert residual.std().item() == pytest.approx(expected, rel=0.02)
    assert abs(residual.mean().item()) < expected / 50
    # Normal, not uniform: the kurtosis of a normal distribution is 3 (uniform: 1.8).
    kurtosis = ((residual - residual.mean()) ** 4).mean() / residual.var() ** 2
    assert kurtosis.item() == pytest.approx(3.0, abs=0.1)
    for block in blocks:
        assert block.attn.in_proj is not None
        for weight in (block.attn.in_proj.weight, block.mlp.linear1.weight):
            assert weight.std().item() == pytest.approx(0.02, rel=0.02)
        for bias in (block.attn.in_proj.bias, block.attn.out_proj.bias, block.mlp.linear1.bias, block.mlp.linear2.bias,
                     block.ln_1.bias, block.ln_2.bias):
            assert bias is not None
            assert bool((bias == 0).all())
        assert bool((block.ln_1.weight == 1).all())
        assert bool((block.ln_2.weight == 1).all())
    assert model.tok_emb.weight.std().item() == pytest.approx(0.02, rel=0.02)
    assert model.pos is not None
    assert model.pos.weight.std().item() == pytest.approx(0.02, rel=0.02)  # type: ignore[operator]
    assert model.lm_head.weight is model.tok_emb.weight


# ---------------------------------------------------------------------------------------------------
# Generation and sampling
# ---------------------------------------------------------------------------------------------------


def test_generate_appends_tokens_and_keeps_the_prompt() -> None:
    model = randomized(tiny(block_size=4))
    idx = tokens(2, 3, 11)
    out = model.generate(idx, 9, generator=torch.Generator().manual_seed(0))
    assert out.shape == (2, 12)
    assert torch.equal(out[:, :3], idx)
    assert int(out.min()) >= 0
    assert int(out.max()) < 11
    assert torch.equal(model.generate(idx, 0), idx)


@pytest.mark.parametrize("positional", ["learned", "sinusoidal", "rope"])
def test_greedy_generation_equals_the_nanogpt_loop_past_block_size(positional: str) -> None:
    model = randomized(tiny(block_size=4, positional=positional))
    idx = tokens(2, 2, 11, seed=3)
    expected = idx.clone()
    for _ in range(9):
        logits = reference_logits(model, expected[:, -4:])[:, -1]
        expected = torch.cat([expected, logits.argmax(dim=-1, keepdim=True)], dim=1)
    for use_cache in (True, False):
        assert torch.equal(model.generate(idx, 9, greedy=True, use_cache=use_cache), expected)


def test_a_prompt_longer_than_block_size_is_cropped() -> None:
    model = randomized(tiny(block_size=4))
    long = tokens(1, 10, 11, seed=4)
    out = model.generate(long, 3, greedy=True)
    assert torch.equal(out[:, :10], long)
    assert torch.equal(out[:, 10:], model.generate(long[:, -4:], 3, greedy=True)[:, 4:])


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"max_new_tokens": -1}, "max_new_tokens must be >= 0, got -1"),
        ({"temperature": 0.0}, "temperature must be a positive number, got 0.0"),
        ({"temperature": -1.0}, "temperature must be a positive number, got -1.0"),
        ({"temperature": math.inf}, "temperature must be a positive number, got inf"),
        ({"temperature": math.nan}, "temperature must be a positive number, got nan"),
        ({"top_k": 0}, "top_k must be >= 1, got 0"),
        ({"top_p": 0.0}, "top_p must be in (0, 1], got 0.0"),
        ({"top_p": 1.5}, "top_p must be in (0, 1], got 1.5"),
    ],
)
def test_bad_sampling_settings_raise_value_error(kwargs: dict[str, Any], words: str) -> None:
    model = GPT(tiny())
    arguments: dict[str, Any] = {"max_new_tokens": 2, **kwargs}
    max_new_tokens = arguments.pop("max_new_tokens")
    with pytest.raises(ValueError, match=re.escape(words)) as info:
        model.generate(tokens(1, 2, 11), max_new_tokens, **arguments)
    assert info.type is ValueError
    assert str(info.value) == words


def test_greedy_needs_no_temperature() -> None:
    model = randomized(tiny())
    idx = tokens(1, 3, 11)
    assert torch.equal(model.generate(idx, 2, greedy=True, temperature=0.0), model.generate(idx, 2, greedy=True))


def test_sample_greedy_top_k_1_and_tiny_top_p_are_the_argmax() -> None:
    logits = torch.randn(16, 30, generator=torch.Generator().manual_seed(0))
    argmax = logits.argmax(dim=-1, keepdim=True)
    generator = torch.Generator().manual_seed(1)
    assert torch.equal(sample(logits, greedy=True), argmax)
    assert torch.equal(sample(logits, top_k=1, generator=generator), argmax)
    assert torch.equal(sample(logits, top_p=1e-6, generator=generator), argmax)


def test_sample_follows_the_softmax_distribution() -> None:
    # Logits (log 4, 0): probabilities (0.8, 0.2) at temperature 1 and softmax((log 4, 0) / 2) = (2/3, 1/3) at 2.
    logits = torch.tensor([[math.log(4.0), 0.0]]).expand(20000, 2)
    generator = torch.Generator().manual_seed(0)
    first = (sample(logits, generator=generator) == 0).double().mean().item()
    assert first == pytest.approx(0.8, abs=0.015)
    first_hot = (sample(logits, temperature=2.0, generator=generator) == 0).double().mean().item()
    assert first_hot == pytest.approx(2.0 / 3.0, abs=0.015)


# ---------------------------------------------------------------------------------------------------
# Errors: shapes, dtypes, lengths, vocabulary
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("idx", "targets", "argument", "axis", "reason"),
    [
        (torch.zeros(5, dtype=torch.long), None, "idx", None, "has 1 axes (5,), expected 2 'b t'"),
        (torch.zeros(1, 2, 5, dtype=torch.long), None, "idx", None, "has 3 axes (1, 2, 5), expected 2 'b t'"),
        (torch.zeros(2, 5), None, "idx", None, "dtype is float32, expected a signed integer dtype"),
        (torch.zeros(2, 5, dtype=torch.long), torch.zeros(2, 4, dtype=torch.long), "targets", "t",
         "axis t is 4, expected 5 (bound by idx)"),
        (torch.zeros(2, 5, dtype=torch.long), torch.zeros(3, 5, dtype=torch.long), "targets", "b",
         "axis b is 3, expected 2 (bound by idx)"),
        (torch.zeros(2, 5, dtype=torch.long), torch.zeros(2, 5), "targets", None,
         "dtype is float32, expected a signed integer dtype"),
        (torch.zeros(2, 9, dtype=torch.long), None, "idx", "t", "axis t is 9, more than block_size=8"),
    ],
)
def test_bad_idx_and_targets_are_shape_errors(idx: Tensor, targets: Tensor | None, argument: str, axis: str | None,
                                              reason: str) -> None:
    model = GPT(tiny())
    with pytest.raises(ShapeError) as info:
        model(idx, targets)
    err = info.value
    assert isinstance(err, jaxtyping.TypeCheckError)
    assert (err.function, err.argument, err.axis, err.reason) == (FORWARD, argument, axis, reason)


def test_too_long_idx_reports_sizes() -> None:
    with pytest.raises(ShapeError) as info:
        GPT(tiny())(torch.zeros(1, 9, dtype=torch.long))
    assert (info.value.actual, info.value.expected) == (9, 8)


def test_positions_beyond_block_size_after_the_cache_are_a_shape_error() -> None:
    model = randomized(tiny(block_size=4))
    caches = model.new_caches()
    model(tokens(1, 3, 11), kv_caches=caches)
    model(tokens(1, 1, 11), kv_caches=caches)
    assert caches[0].length == 4
    with pytest.raises(ShapeError) as info:
        model(tokens(1, 1, 11), kv_caches=caches)
    assert info.value.reason == "axis t is 1 after 4 cached positions, more than block_size=4"
    assert (info.value.argument, info.value.axis, info.value.actual, info.value.expected) == ("idx", "t", 5, 4)


def test_generate_checks_the_shape_of_idx() -> None:
    with pytest.raises(ShapeError) as info:
        GPT(tiny()).generate(torch.zeros(3, dtype=torch.long), 2)
    assert (info.value.function, info.value.argument) == ("typed_transformer.gpt.GPT.generate", "idx")


@pytest.mark.parametrize("bad", [11, 100, -1])
def test_token_ids_outside_the_vocabulary_are_a_value_error(bad: int) -> None:
    idx = torch.zeros(2, 4, dtype=torch.long)
    idx[1, 2] = bad
    with pytest.raises(ValueError, match="outside the vocabulary") as info:
        GPT(tiny())(idx)
    assert info.type is TokenIdError  # a ValueError, raised for token ids wherever they come in
    assert str(info.value) == f"GPT.forward: idx holds token id {bad}, outside the vocabulary 0..10"


@pytest.mark.parametrize("bad", [11, -2])
def test_target_ids_outside_the_vocabulary_are_a_value_error(bad: int) -> None:
    # -1 is the ignore index; any other id outside 0..vocab_size-1 must not end in an IndexError.
    idx = torch.zeros(2, 4, dtype=torch.long)
    targets = torch.zeros(2, 4, dtype=torch.long)
    targets[0, 1] = bad
    with pytest.raises(ValueError, match="outside the vocabulary") as info:
        GPT(tiny())(idx, targets)
    assert info.type is TokenIdError
    assert "targets" in str(info.value)
    assert str(bad) in str(info.value)


def test_wrong_number_of_kv_caches() -> None:
    model = GPT(tiny())
    with pytest.raises(ValueError, match="kv_caches has 1 caches for 2 layers"):
        model(tokens(1, 2, 11), kv_caches=[KVCache()])


@pytest.mark.parametrize("use_cache", [True, False])
@pytest.mark.parametrize("setting", [{"top_k": 1}, {"top_p": 1e-6}, {"temperature": 1e-4}])
def test_every_generated_token_is_sampled_with_the_given_settings(setting: dict[str, Any], use_cache: bool) -> None:
    """Settings that make sampling greedy must make all 9 tokens greedy, not just the first: the later steps
    (cached, then past block_size) get the same temperature, top-k and top-p."""
    model = randomized(tiny(block_size=4))
    idx = tokens(2, 3, 11, seed=5)
    greedy = model.generate(idx, 9, greedy=True, use_cache=use_cache)
    sampled = model.generate(idx, 9, generator=torch.Generator().manual_seed(0), use_cache=use_cache, **setting)
    assert torch.equal(sampled, greedy)
    # and plain sampling does leave the greedy path here, so the equality above says something
    plain = model.generate(idx, 9, generator=torch.Generator().manual_seed(0), use_cache=use_cache)
    assert not torch.equal(plain[:, 4:], greedy[:, 4:])


def test_top_p_of_one_keeps_every_token() -> None:
    model = randomized(tiny())
    idx = tokens(2, 3, 11)
    assert torch.equal(model.generate(idx, 6, top_p=1.0, generator=torch.Generator().manual_seed(3)),
                       model.generate(idx, 6, generator=torch.Generator().manual_seed(3)))


def test_top_p_keeps_the_smallest_set_that_reaches_it() -> None:
    """Probabilities exactly (1/2, 1/2, 0, 0): the first token in sorted order reaches top_p = 1/2 on its own,
    so the second is dropped although the mass before it equals top_p exactly."""
    logits = torch.tensor([[0.0, 0.0, -math.inf, -math.inf]]).expand(200, 4)
    drawn = sample(logits, top_p=0.5, generator=torch.Generator().manual_seed(0))
    assert len(set(drawn[:, 0].tolist())) == 1
    assert drawn[0, 0].item() in (0, 1)
    both = sample(logits, top_p=0.75, generator=torch.Generator().manual_seed(0))
    assert set(both[:, 0].tolist()) == {0, 1}


def test_parameter_groups_decay_matrices_only_and_count_tied_weights_once() -> None:
    model = GPT(tiny(bias=True))
    decay, no_decay = model.parameter_groups(0.25)
    assert (decay["weight_decay"], no_decay["weight_decay"]) == (0.25, 0.0)
    named = {id(p): name for name, p in model.named_parameters()}  # tied weights appear once
    decay_names = sorted(named[id(p)] for p in decay["params"])
    no_decay_names = sorted(named[id(p)] for p in no_decay["params"])
    assert decay_names == sorted(name for name, p in model.named_parameters() if p.dim() >= 2)
    assert no_decay_names == sorted(name for name, p in model.named_parameters() if p.dim() < 2)
    assert "tok_emb.weight" in decay_names
    assert "lm_head.weight" not in decay_names  # the same tensor as tok_emb.weight
    assert {n.rsplit(".", 1)[-1] for n in no_decay_names} == {"weight", "bias"}  # norms' weights, all biases
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))
    frozen = GPT(tiny())
    frozen.ln_f.weight.requires_grad_(False)
    assert all(p is not frozen.ln_f.weight for group in frozen.parameter_groups(0.1) for p in group["params"])


def test_config_options_reach_every_module() -> None:
    config = tiny(dropout=0.25, layer_norm_eps=1e-3, positional="rope", bias=True)
    model = GPT(config)
    norms = [m for m in model.modules() if isinstance(m, torch.nn.LayerNorm)]
    assert len(norms) == 2 * config.n_layer + 1
    assert {n.eps for n in norms} == {1e-3}
    for block in model.blocks:
        assert isinstance(block, Block)
        assert block.attn.dropout == 0.25
        assert (block.resid_dropout.p, block.mlp_dropout.p, block.mlp.dropout.p) == (0.25, 0.25, 0.0)
        assert block.attn.rotary is not None
        assert type(block.attn.rotary.head_dim) is int
        assert block.attn.rotary.head_dim == 4
    assert model.drop.p == 0.25
    assert model.lm_head.bias is None  # tied to the embedding: no bias, whatever config.bias says


def test_rope_needs_an_even_head_size() -> None:
    with pytest.raises(ValueError, match=r"^GPTConfig: rope needs an even head size, got 3$"):
        tiny(n_embd=6, n_head=2, positional="rope")


@pytest.mark.parametrize("bad", [11, -1])
def test_a_single_token_is_checked_too(bad: int) -> None:
    with pytest.raises(ValueError, match=f"^GPT.forward: idx holds token id {bad}, outside the vocabulary 0..10$"):
        GPT(tiny())(torch.full((1, 1), bad))


@pytest.mark.parametrize("bad", [11, -1])
def test_attention_weights_checks_ids_with_the_same_rule(bad: int) -> None:
    with pytest.raises(ValueError, match=exactly(
            f"GPT.attention_weights: idx holds token id {bad}, outside the vocabulary 0..10")):
        GPT(tiny()).attention_weights(torch.tensor([[0, bad, 1]]))


def test_bad_target_ids_name_the_ignore_index() -> None:
    targets = torch.full((1, 1), 11)
    with pytest.raises(ValueError, match=exactly("GPT.forward: targets holds token id 11, outside the vocabulary "
                                                "0..10 (or -1, ignored)")):
        GPT(tiny())(torch.zeros(1, 1, dtype=torch.long), targets)
    loss = GPT(tiny())(torch.zeros(1, 2, dtype=torch.long), torch.tensor([[-1, 3]]))[1]
    assert loss is not None
    assert torch.isfinite(loss)


def test_alibi_gpt_trains_and_generates_with_the_kv_cache() -> None:
    torch.manual_seed(0)
    model = GPT(tiny(positional="alibi", n_head=3, n_embd=12, block_size=8))
    assert model.pos is None
    assert model.alibi is not None
    assert not any("alibi" in name for name in model.state_dict())  # the slopes are not saved
    data = torch.randint(0, model.vocab_size, (4, 9), generator=torch.Generator().manual_seed(1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(30):
        _, loss = model(data[:, :-1], data[:, 1:])
        assert loss is not None
        losses.append(loss.item())
        optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]  # torch's Tensor.backward has no annotations
        optimizer.step()
    assert losses[-1] < 0.5 * losses[0]
    model.eval()
    prompt = data[:1, :3]
    cached = model.generate(prompt, 12, greedy=True)  # runs past block_size: cache, then recomputed windows
    uncached = model.generate(prompt, 12, greedy=True, use_cache=False)
    assert torch.equal(cached, uncached)
    weights = model.attention_weights(data[:1, :5])
    assert weights.shape == (2, 1, 3, 5, 5)
    assert torch.all(weights.triu(diagonal=1) == 0)


# ---------------------------------------------------------------------------------------------------
# Padded batches (prompts of different lengths)
# ---------------------------------------------------------------------------------------------------


def left_padded(prompts: list[Tensor], pad: int) -> tuple[Tensor, Tensor]:
    width = max(len(p) for p in prompts)
    rows = [torch.cat([torch.full((width - len(p),), pad, dtype=torch.long), p]) for p in prompts]
    return torch.stack(rows), torch.tensor([len(p) for p in prompts])


@pytest.mark.parametrize("use_cache", [True, False])
@pytest.mark.parametrize("greedy", [True, False])
def test_a_padded_batch_generates_each_prompt_as_if_alone(use_cache: bool, greedy: bool) -> None:
    model = randomized(tiny(block_size=4, positional="rope"))
    prompts = [tokens(1, n, 11, seed=n)[0] for n in (1, 6, 3)]  # 6 > block_size: cropped as alone
    for pad in (0, 7):  # the padding ids change nothing
        idx, lengths = left_padded(prompts, pad)
        out = model.generate(idx, 7, lengths=lengths, greedy=greedy, use_cache=use_cache,
                             generator=[torch.Generator().manual_seed(10 + i) for i in range(3)])
        assert torch.equal(out[:, :6], idx)
        for i, prompt in enumerate(prompts):
            alone = model.generate(prompt[None], 7, greedy=greedy, use_cache=use_cache,
                                   generator=torch.Generator().manual_seed(10 + i))
            assert torch.equal(out[i, 6:], alone[0, len(prompt):])


def test_one_generator_per_row_without_lengths_draws_each_row_as_alone() -> None:
    model = randomized(tiny())
    idx = tokens(2, 3, 11, seed=5)
    out = model.generate(idx, 5, generator=[torch.Generator().manual_seed(s) for s in (1, 2)])
    for i, s in enumerate((1, 2)):
        assert torch.equal(out[i], model.generate(idx[i:i + 1], 5, generator=torch.Generator().manual_seed(s))[0])


def test_padded_generation_rejects_bad_lengths_and_generator_counts() -> None:
    model = randomized(tiny())
    idx = tokens(2, 3, 11)
    for bad in ([0, 3], [2, 4]):
        with pytest.raises(ValueError, match=r"lengths holds .*1 to t=3"):
            model.generate(idx, 2, lengths=torch.tensor(bad))
    with pytest.raises(jaxtyping.TypeCheckError):
        model.generate(idx, 2, lengths=torch.tensor([1, 2, 3]))
    with pytest.raises(ShapeError, match="3 generators for 2 rows"):
        model.generate(idx, 2, generator=[torch.Generator() for _ in range(3)])
