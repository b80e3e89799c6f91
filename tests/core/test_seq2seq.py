"""Seq2SeqTransformer: against nn.Transformer by hand, decoding, errors, and a real learning check."""

import math
import time
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from typed_transformer import ShapeError, TokenIdError, shape_checks, to_torch
from typed_transformer.seq2seq import Positions, Seq2SeqTransformer

PAD, BOS, EOS = 0, 1, 2


def randomize(module: nn.Module, seed: int = 1) -> None:
    """Random weights (std 0.5) and biases (std 0.1): with large random biases, every sequence decodes
    to the same repeated token, whatever the source."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in module.named_parameters():
            std = 0.1 if name.endswith("bias") else 0.5
            param.copy_(torch.randn(param.shape, generator=generator, dtype=param.dtype) * std)


def small_model(positions: Positions = "sinusoidal", **kwargs: object) -> Seq2SeqTransformer:
    torch.manual_seed(0)
    model = Seq2SeqTransformer(9, 11, PAD, PAD, d_model=8, nhead=2, num_encoder_layers=2, num_decoder_layers=2,
                               dim_feedforward=16, dropout=0.0, positional=positions, dtype=torch.float64,
                               **kwargs)  # type: ignore[arg-type]
    randomize(model)
    return model.eval()


SRC = torch.tensor([[3, 4, 5, 6, 7], [8, 3, 4, PAD, PAD]])
TRG = torch.tensor([[BOS, 5, 6, 7], [BOS, 9, PAD, PAD]])


@pytest.mark.parametrize("norm_first", [False, True])
def test_forward_is_embeddings_positions_and_nn_transformer(norm_first: bool) -> None:
    """An independent composition: our embeddings, the paper's sinusoids written out, torch's own
    nn.Transformer (from to_torch) with masks in torch's polarity, our output projection."""
    model = small_model(norm_first=norm_first)
    theirs = to_torch(model.transformer)

    def embed(tokens: Tensor, table: nn.Embedding) -> Tensor:
        pe = torch.zeros(tokens.shape[1], 8, dtype=torch.float64)
        for pos in range(tokens.shape[1]):
            for i in range(0, 8, 2):
                pe[pos, i] = math.sin(pos / 10000 ** (i / 8))
                pe[pos, i + 1] = math.cos(pos / 10000 ** (i / 8))
        out: Tensor = table(tokens) * math.sqrt(8) + pe
        return out

    t = TRG.shape[1]
    hidden = theirs(embed(SRC, model.src_embedding), embed(TRG, model.tgt_embedding),
                    tgt_mask=torch.ones(t, t, dtype=torch.bool).triu(1), src_key_padding_mask=SRC == PAD,
                    tgt_key_padding_mask=TRG == PAD, memory_key_padding_mask=SRC == PAD)
    want = model.output_projection(hidden)
    torch.testing.assert_close(model(SRC, TRG), want, rtol=1e-10, atol=1e-10)
    assert (model.transformer.encoder.norm is not None) == norm_first  # pre-LN needs a final norm


def test_decode_reuses_the_encoder_output() -> None:
    model = small_model()
    memory = model.encode(SRC)
    assert memory.shape == (2, 5, 8)
    torch.testing.assert_close(model.decode(TRG, memory, model.source_mask(SRC)), model(SRC, TRG), rtol=0, atol=0)
    assert model.source_mask(SRC).tolist() == [[True] * 5, [True, True, True, False, False]]


def reference_greedy(model: Seq2SeqTransformer, src: Tensor, max_new_tokens: int) -> list[list[int]]:
    """One sequence at a time, re-running the whole model on the prefix at every step."""
    results = []
    for row in src:
        tokens = [BOS]
        for _ in range(max_new_tokens):
            logits = model(row[None], torch.tensor([tokens]))[0, -1]
            logits[PAD] = float("-inf")
            tokens.append(int(logits.argmax()))
            if tokens[-1] == EOS:
                break
        results.append(tokens)
    return results


@pytest.mark.parametrize("positions", ["sinusoidal", "learned", "rope", "none"])
def test_greedy_decode_equals_rerunning_the_full_model_per_sequence(positions: Positions) -> None:
    model = small_model(positions, max_length=12)
    out = model.greedy_decode(SRC, bos_idx=BOS, eos_idx=EOS, max_new_tokens=10)
    for row, want in zip(out.tolist(), reference_greedy(model, SRC, 10), strict=True):
        assert row[: len(want)] == want
        assert all(token == PAD for token in row[len(want):])  # finished sequences are padded


def test_greedy_decode_stops_at_eos() -> None:
    model = small_model()
    with torch.no_grad():
        model.output_projection.bias[EOS] = 100.0  # eos certain at every step
    out = model.greedy_decode(SRC, bos_idx=BOS, eos_idx=EOS, max_new_tokens=10)
    assert out.tolist() == [[BOS, EOS], [BOS, EOS]]
    with torch.no_grad():
        model.output_projection.bias[EOS] = -100.0  # eos never: runs to max_new_tokens
        model.output_projection.bias[PAD] = 100.0  # padding is never generated, however likely
    out = model.greedy_decode(SRC, bos_idx=BOS, eos_idx=EOS, max_new_tokens=4)
    assert out.shape == (2, 5)
    assert not (out == PAD).any()
    assert not (out[:, 1:] == EOS).any()


def test_finished_sequences_are_padded_while_others_go_on() -> None:
    model = small_model()
    probe = model.greedy_decode(SRC, bos_idx=BOS, eos_idx=EOS, max_new_tokens=3)
    eos = int(probe[0, 1])  # the first token of sequence 0 becomes the end token
    assert eos not in probe[1, 1:].tolist()
    out = model.greedy_decode(SRC, bos_idx=BOS, eos_idx=eos, max_new_tokens=3)
    assert out[0].tolist() == [BOS, eos, PAD, PAD]
    assert out[1].tolist() == probe[1].tolist()
    tokens, _ = model.beam_search(SRC, bos_idx=BOS, eos_idx=eos, max_new_tokens=3, beam_size=1)
    assert torch.equal(tokens, out)


def test_beam_search_with_one_beam_is_greedy_and_scores_are_log_probabilities() -> None:
    model = small_model()
    greedy = model.greedy_decode(SRC, bos_idx=BOS, eos_idx=EOS, max_new_tokens=6)
    for beam_size in (1, 3):
        tokens, scores = model.beam_search(SRC, bos_idx=BOS, eos_idx=EOS, max_new_tokens=6, beam_size=beam_size)
        if beam_size == 1:
            assert torch.equal(tokens, greedy)
        log_probs = model(SRC, tokens[:, :-1]).log_softmax(dim=-1)
        picked = log_probs.gather(-1, tokens[:, 1:, None])[..., 0]
        want = picked.masked_fill(tokens[:, 1:] == PAD, 0.0).sum(dim=-1)
        torch.testing.assert_close(scores, want, rtol=1e-10, atol=1e-10)


# ----------------------------------------------------------------------------------------------------
# Errors
# ----------------------------------------------------------------------------------------------------


def test_token_ids_out_of_range_raise_a_clear_error_not_an_index_crash() -> None:
    model = small_model()
    with pytest.raises(TokenIdError) as info:
        model(torch.tensor([[3, 9]]), TRG[:1])
    assert (info.value.argument, info.value.token_id, info.value.vocab_size) == ("src", 9, 9)
    assert str(info.value) == ("Seq2SeqTransformer.encode: src holds token id 9, outside the vocabulary 0..8 "
                               "(src_vocab_size=9)")
    with pytest.raises(TokenIdError) as info:
        model(SRC, torch.tensor([[BOS, -1, 3, 3], [BOS, 3, 3, 3]]))
    assert (info.value.argument, info.value.token_id) == ("tgt", -1)


def test_lengths_beyond_max_length_and_wrong_widths_raise_shape_errors() -> None:
    model = small_model("learned", max_length=4)
    with pytest.raises(ShapeError) as info:
        model(SRC[:, :4], torch.tensor([[BOS, 3, 4, 5, 6]]).expand(2, 5))
    assert (info.value.argument, info.value.axis, info.value.actual, info.value.expected) == ("tgt", "t", 5, 4)
    assert "axis t is 5, longer than max_length=4" in str(info.value)
    with pytest.raises(ShapeError) as info:
        model.encode(SRC)
    assert (info.value.argument, info.value.axis) == ("src", "s")
    with pytest.raises(ShapeError) as info:
        model.decode(TRG, torch.zeros(2, 5, 6, dtype=torch.float64), model.source_mask(SRC))
    assert (info.value.argument, info.value.axis, info.value.expected) == ("memory", "d_model", 8)
    with pytest.raises(ShapeError) as info:
        model(SRC.float(), TRG)
    assert info.value.argument == "src"
    with pytest.raises(ShapeError) as info:
        model(SRC[:1], TRG)
    assert (info.value.argument, info.value.axis) == ("tgt", "b")
    with pytest.raises(ValueError, match=r"max_new_tokens \+ 1 = 5 tokens \(with bos\) exceed max_length=4"):
        model.greedy_decode(SRC[:, :4], bos_idx=BOS, eos_idx=EOS, max_new_tokens=4)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"positional": "learned"}, "positional='learned' needs max_length"),
        ({"positional": "alibi"}, "positional must be learned, sinusoidal, rope or none, got 'alibi'"),
        ({"src_pad_idx": 9}, r"src_pad_idx must be in \[0, 9\), got 9"),
        ({"tgt_vocab_size": 0}, "tgt_vocab_size must be a positive int, got 0"),
        ({"d_model": 10, "nhead": 4}, "d_model=10 is not divisible by nhead=4"),
    ],
)
def test_constructor_rejects_bad_arguments(kwargs: dict[str, object], message: str) -> None:
    arguments: dict[str, object] = {"src_vocab_size": 9, "tgt_vocab_size": 11, "src_pad_idx": 0, "tgt_pad_idx": 0,
                                    "d_model": 8, "nhead": 2, **kwargs}
    with pytest.raises(ValueError, match=message):
        Seq2SeqTransformer(**arguments)  # type: ignore[arg-type]


def test_decoding_arguments_are_checked() -> None:
    model = small_model()
    with pytest.raises(ValueError, match="bos_idx must be in"):
        model.greedy_decode(SRC, bos_idx=PAD, eos_idx=EOS, max_new_tokens=3)
    with pytest.raises(ValueError, match="eos_idx must be in"):
        model.beam_search(SRC, bos_idx=BOS, eos_idx=11, max_new_tokens=3)
    with pytest.raises(ValueError, match=r"beam_size must be in \[1, tgt_vocab_size - 1 = 10\], got 11"):
        model.beam_search(SRC, bos_idx=BOS, eos_idx=EOS, max_new_tokens=3, beam_size=11)


# ----------------------------------------------------------------------------------------------------
# A real learning check: reverse random sequences (the Annotated Transformer's copy task, reversed)
# ----------------------------------------------------------------------------------------------------

SYMBOLS = 10  # tokens 3..12; 0, 1, 2 are pad, bos, eos
VOCAB = 3 + SYMBOLS
MIN_LEN, MAX_LEN = 4, 8


def reverse_task(n: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Sources of 4..8 random symbols, right-padded; targets ``bos, reversed source, eos``, padded."""
    lengths = torch.randint(MIN_LEN, MAX_LEN + 1, (n, 1), generator=generator)
    symbols = torch.randint(3, VOCAB, (n, MAX_LEN), generator=generator)
    positions = torch.arange(MAX_LEN)
    real = positions < lengths
    src = symbols.masked_fill(~real, PAD)
    reversed_ = symbols.gather(1, (lengths - 1 - positions).clamp(min=0)).masked_fill(~real, PAD)
    trg = torch.cat([torch.full((n, 1), BOS), reversed_, torch.full((n, 1), PAD)], dim=1)
    trg = trg.scatter(1, lengths + 1, EOS)
    return src, trg


def test_reverse_task_examples() -> None:
    src, trg = reverse_task(2, torch.Generator().manual_seed(0))
    for s, t in zip(src.tolist(), trg.tolist(), strict=True):
        real = [x for x in s if x != PAD]
        assert t[: len(real) + 2] == [BOS, *real[::-1], EOS]
        assert all(x == PAD for x in t[len(real) + 2:])


def test_learns_to_reverse_sequences() -> None:
    """400 Adam steps on batches of 64 (shape checks off while training, on while decoding), then greedy
    decoding of 500 held-out sequences: at least 95% must be exactly right (measured: 99%)."""
    torch.manual_seed(0)
    model = Seq2SeqTransformer(VOCAB, VOCAB, PAD, PAD, d_model=32, nhead=4, num_encoder_layers=2,
                               num_decoder_layers=2, dim_feedforward=64, dropout=0.0, norm_first=True)
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3, betas=(0.9, 0.98), eps=1e-9)
    warmup = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 100))
    train_data = torch.Generator().manual_seed(1)
    start = time.perf_counter()
    model.train()
    with shape_checks(False):
        for _ in range(400):
            src, trg = reverse_task(64, train_data)
            logits = model(src, trg[:, :-1])
            loss = F.cross_entropy(logits.flatten(0, 1), trg[:, 1:].flatten(), ignore_index=PAD)
            optimizer.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]
            optimizer.step()
            warmup.step()
    model.eval()
    src, trg = reverse_task(500, torch.Generator().manual_seed(12345))  # held out: another stream
    out = model.greedy_decode(src, bos_idx=BOS, eos_idx=EOS, max_new_tokens=MAX_LEN + 1)
    padded = torch.full_like(trg, PAD)
    padded[:, : out.shape[1]] = out
    exact = (padded == trg).all(dim=1).float().mean().item()
    elapsed = time.perf_counter() - start
    print(f"reverse task: {exact:.1%} of 500 held-out sequences exactly right, final loss {loss.item():.4f}, "
          f"{elapsed:.1f} s")
    assert exact >= 0.95
    assert elapsed < 60


# ----------------------------------------------------------------------------------------------------
# Old spellings (trg -> tgt, positions -> positional, 'rotary' -> 'rope') keep working, with a warning
# ----------------------------------------------------------------------------------------------------


def _spelled(**kwargs: Any) -> Seq2SeqTransformer:
    torch.manual_seed(0)
    return Seq2SeqTransformer(9, src_pad_idx=PAD, d_model=8, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
                              dim_feedforward=16, dropout=0.0, **kwargs).eval()


def test_old_constructor_keywords_warn_and_build_the_same_model() -> None:
    with pytest.warns(DeprecationWarning, match="deprecated") as record:
        old = _spelled(trg_vocab_size=11, trg_pad_idx=PAD, positions="rotary")
    assert [str(w.message) for w in record] == [
        "Seq2SeqTransformer: the keyword trg_vocab_size= is deprecated, use tgt_vocab_size=",
        "Seq2SeqTransformer: the keyword trg_pad_idx= is deprecated, use tgt_pad_idx=",
        "Seq2SeqTransformer: the keyword positions= is deprecated, use positional=",
        "Seq2SeqTransformer: positional='rotary' is deprecated, use positional='rope' (GPTConfig's spelling)",
    ]
    assert all(w.filename == __file__ for w in record)  # attributed to the caller, not to the library
    new = _spelled(tgt_vocab_size=11, tgt_pad_idx=PAD, positional="rope")
    assert (old.tgt_vocab_size, old.tgt_pad_idx, old.positional) == (11, PAD, "rope")
    assert old.state_dict().keys() == new.state_dict().keys()
    assert all(torch.equal(a, b) for a, b in zip(old.state_dict().values(), new.state_dict().values(), strict=True))
    torch.testing.assert_close(old(SRC.long(), TRG.long()), new(SRC.long(), TRG.long()))


def test_old_method_keywords_warn_and_give_the_same_results() -> None:
    model = small_model()
    want = model(SRC, TRG)
    with pytest.warns(DeprecationWarning, match=r"^Seq2SeqTransformer\.forward: the keyword trg= is deprecated, "
                                                r"use tgt=$") as record:
        got = model(SRC, trg=TRG)  # type: ignore[call-arg]  # the deprecated keyword is not in the signature
    assert torch.equal(got, want)
    assert record[0].filename == __file__  # past nn.Module.__call__, to the caller's line
    memory, src_mask = model.encode(SRC), model.source_mask(SRC)
    with pytest.warns(DeprecationWarning, match=r"^Seq2SeqTransformer\.decode: the keyword trg= is deprecated"):
        got = model.decode(trg=TRG, memory=memory, src_mask=src_mask)  # type: ignore[call-arg]
    assert torch.equal(got, want)
    with pytest.warns(DeprecationWarning, match=r"^Seq2SeqTransformer\.target_mask: the keyword trg= is deprecated"):
        assert torch.equal(model.target_mask(trg=TRG), model.target_mask(TRG))  # type: ignore[call-arg]


def test_old_and_new_keyword_together_is_an_error() -> None:
    with pytest.raises(TypeError, match=r"^Seq2SeqTransformer\.forward: got both trg= and tgt= "
                                        r"\(trg is the deprecated name of tgt\)$"):
        small_model()(SRC, tgt=TRG, trg=TRG)  # type: ignore[call-arg]


def test_old_attribute_names_warn_and_read_the_new_ones() -> None:
    model = small_model()
    for old, new in (("trg_vocab_size", "tgt_vocab_size"), ("trg_pad_idx", "tgt_pad_idx"),
                     ("positions", "positional"), ("trg_embedding", "tgt_embedding")):
        with pytest.warns(DeprecationWarning, match=f"^Seq2SeqTransformer.{old} is deprecated, "
                                                    f"use Seq2SeqTransformer.{new}$"):
            assert getattr(model, old) is getattr(model, new)


def test_state_dicts_with_old_names_still_load() -> None:
    model, other = small_model(), small_model()
    randomize(other, seed=7)
    old_names = {key.replace("tgt_", "trg_"): value for key, value in other.state_dict().items()}
    assert "trg_embedding.weight" in old_names
    with pytest.warns(DeprecationWarning, match="trg_embedding.weight") as record:
        model.load_state_dict(old_names)
    assert record[0].filename == __file__
    assert torch.equal(model.tgt_embedding.weight, other.tgt_embedding.weight)
