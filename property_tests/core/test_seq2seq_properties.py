"""Properties of the encoder-decoder's decoding: beam search of width 1 is greedy decoding; a beam's score is
the log-probability the full model (run again from scratch, no cached encoder output) gives its sequence;
outputs are ``bos``, tokens, at most one ``eos``, then padding, never longer than asked; the hypotheses kept
are distinct and sorted by score; a beam as wide as the
choices finds the most likely sequence exactly (checked by enumerating them), so it scores at least greedy's.

Models are small random float64 encoder-decoders over every positional encoding, pre- and post-LN, with
every parameter randomized; sources are right-padded random ids.
"""

import itertools
from dataclasses import dataclass

import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import Tensor

from tests.support.properties import assert_close
from typed_transformer.seq2seq import Positions, Seq2SeqTransformer
from typed_transformer.strategies import randomize_parameters, seeds

PAD, BOS, EOS = 0, 1, 2
CLOSE = {"atol": 1e-9, "rtol": 1e-9}
POSITIONALS: tuple[Positions, ...] = ("sinusoidal", "learned", "rope", "none")


@dataclass(frozen=True)
class Case:
    model: Seq2SeqTransformer
    src: Tensor
    max_new_tokens: int


@st.composite
def cases(draw: st.DrawFn, *, max_new: int = 6) -> Case:
    vocab = draw(st.integers(4, 8), label="vocab")
    nhead = draw(st.integers(1, 2), label="nhead")
    positional: Positions = draw(st.sampled_from(POSITIONALS), label="positional")
    head_dim = draw(st.sampled_from([2, 4]), label="head_dim")
    seed = draw(seeds(), label="seed")
    torch.manual_seed(seed)
    model = Seq2SeqTransformer(vocab, vocab, PAD, PAD, d_model=nhead * head_dim, nhead=nhead, num_encoder_layers=1,
                               num_decoder_layers=draw(st.integers(1, 2), label="decoder_layers"),
                               dim_feedforward=8, dropout=0.0, norm_first=draw(st.booleans(), label="norm_first"),
                               positional=positional, max_length=16, dtype=torch.float64)
    # std 0.3: large enough that decoding paths differ, small enough that not every step is near-certain.
    model = randomize_parameters(model, seed, std=draw(st.sampled_from([0.3, 1.0]), label="std")).eval()
    lengths = draw(st.lists(st.integers(1, 5), min_size=1, max_size=3), label="source lengths")
    generator = torch.Generator().manual_seed(seed + 1)
    src = torch.full((len(lengths), max(lengths)), PAD)
    for row, n in enumerate(lengths):
        src[row, :n] = torch.randint(3, vocab, (n,), generator=generator)
    return Case(model, src, draw(st.integers(1, max_new), label="max_new_tokens"))


def full_model_score(model: Seq2SeqTransformer, src: Tensor, tokens: Tensor) -> Tensor:
    """Sum of log p(token | source, earlier tokens) over the real tokens after ``bos``, from one teacher-forced
    pass of the whole model (the encoder run again), without the padding that follows ``eos``."""
    with torch.no_grad():
        log_probs: Tensor = model(src, tokens[:, :-1]).log_softmax(dim=-1)
    picked = log_probs.gather(-1, tokens[:, 1:, None])[..., 0]
    score: Tensor = picked.masked_fill(tokens[:, 1:] == PAD, 0.0).sum(dim=1)
    return score


def check_layout(tokens: Tensor, max_new_tokens: int) -> None:
    assert tokens.shape[1] <= 1 + max_new_tokens
    assert bool((tokens[:, 0] == BOS).all())
    for row in tokens.tolist():
        body = row[1:]
        end = body.index(EOS) + 1 if EOS in body else len(body)
        assert PAD not in body[:end], f"padding generated before the end: {row}"
        assert all(t == PAD for t in body[end:]), f"tokens after eos: {row}"


@given(case=cases())
def test_beam_of_one_is_greedy_decoding(case: Case) -> None:
    kwargs = {"bos_idx": BOS, "eos_idx": EOS, "max_new_tokens": case.max_new_tokens}
    greedy = case.model.greedy_decode(case.src, **kwargs)
    beam, score = case.model.beam_search(case.src, beam_size=1, **kwargs)
    assert torch.equal(beam, greedy)
    assert_close(score, full_model_score(case.model, case.src, greedy), CLOSE)


@given(case=cases(), beam_size=st.integers(2, 3))
def test_beam_scores_are_the_full_models_log_probabilities_and_outputs_are_well_formed(case: Case,
                                                                                         beam_size: int) -> None:
    kwargs = {"bos_idx": BOS, "eos_idx": EOS, "max_new_tokens": case.max_new_tokens}
    tokens, score = case.model.beam_search(case.src, beam_size=beam_size, **kwargs)
    check_layout(tokens, case.max_new_tokens)
    check_layout(case.model.greedy_decode(case.src, **kwargs), case.max_new_tokens)
    assert tokens.shape[0] == case.src.shape[0]
    assert_close(score, full_model_score(case.model, case.src, tokens), CLOSE)
    # Each row decoded alone gives the same sequence: the batch's padding and other rows change nothing.
    for row in range(case.src.shape[0]):
        real = int((case.src[row] != PAD).sum())
        alone, alone_score = case.model.beam_search(case.src[row:row + 1, :real], beam_size=beam_size, **kwargs)
        width = alone.shape[1]
        assert torch.equal(alone[0], tokens[row, :width])
        assert bool((tokens[row, width:] == PAD).all())
        assert_close(alone_score[0], score[row], {"atol": 1e-9, "rtol": 1e-9})


@given(case=cases(max_new=2))
def test_a_beam_as_wide_as_the_choices_finds_the_most_likely_sequence(case: Case) -> None:
    """With max_new_tokens <= 2 and one beam per non-padding token, nothing is ever pruned that could win:
    the result is the maximum over every sequence, enumerated here, and at least greedy decoding's score."""
    vocab = case.model.tgt_vocab_size
    kwargs = {"bos_idx": BOS, "eos_idx": EOS, "max_new_tokens": case.max_new_tokens}
    _, score = case.model.beam_search(case.src, beam_size=vocab - 1, **kwargs)
    greedy = case.model.greedy_decode(case.src, **kwargs)
    choices = [t for t in range(vocab) if t != PAD]
    for row in range(case.src.shape[0]):
        src = case.src[row:row + 1]
        best = -float("inf")
        for body in itertools.product(choices, repeat=case.max_new_tokens):
            if EOS in body[:-1]:  # a sequence ends at its first eos; the rest is padding
                body = (*body[: body.index(EOS) + 1], *[PAD] * (len(body) - body.index(EOS) - 1))
            tokens = torch.tensor([[BOS, *body]])
            best = max(best, float(full_model_score(case.model, src, tokens)[0]))
        assert abs(float(score[row]) - best) <= 1e-9 * max(1.0, abs(best))
        assert float(score[row]) >= float(full_model_score(case.model, src, greedy[row:row + 1])[0]) - 1e-9


@given(case=cases(), beam_size=st.integers(1, 3))
def test_beam_hypotheses_are_sorted_by_their_full_model_scores(case: Case, beam_size: int) -> None:
    kwargs = {"bos_idx": BOS, "eos_idx": EOS, "max_new_tokens": case.max_new_tokens}
    tokens, scores = case.model.beam_hypotheses(case.src, beam_size=beam_size, **kwargs)
    best, best_score = case.model.beam_search(case.src, beam_size=beam_size, **kwargs)
    assert tokens.shape[:2] == scores.shape == (case.src.shape[0], beam_size)
    assert torch.equal(tokens[:, 0], best)
    assert torch.equal(scores[:, 0], best_score)
    assert bool((scores[:, :-1] >= scores[:, 1:]).all()), f"not sorted: {scores}"
    for slot in range(beam_size):
        check_layout(tokens[:, slot], case.max_new_tokens)
        finite = scores[:, slot].isfinite()
        rescored = full_model_score(case.model, case.src, tokens[:, slot])
        assert_close(scores[finite, slot], rescored[finite], CLOSE)
    # Distinct hypotheses: no sequence is kept twice (ignoring slots no hypothesis filled).
    for row in range(case.src.shape[0]):
        kept = [tuple(t) for t, sc in zip(tokens[row].tolist(), scores[row].tolist(), strict=True) if sc > -1e300]
        assert len(kept) == len(set(kept))
