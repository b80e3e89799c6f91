"""The shared argument rules (typed_transformer.validation), and that each model uses the one rule."""

from collections.abc import Callable

import pytest
import torch

from typed_transformer import GPT, GPTConfig, Seq2SeqTransformer, TokenIdError
from typed_transformer.data import CharTokenizer
from typed_transformer.validation import check_positive_int, check_token_ids


@pytest.mark.parametrize(
    ("ids", "ignore_index", "bad"),
    [([0, 4], False, None), ([5], False, 5), ([-1, 2], False, -1), ([-1, 2], True, None), ([-2, 9], True, -2),
     ([], False, None), ([3, 7, 1], False, 7)],
)
def test_token_ids_in_range_pass_and_the_first_offender_is_named(ids: list[int], ignore_index: bool,
                                                                  bad: int | None) -> None:
    for given in (ids, torch.tensor(ids, dtype=torch.long)):
        if bad is None:
            check_token_ids("owner", "ids", given, 5, ignore_index=ignore_index)
            continue
        with pytest.raises(TokenIdError) as info:
            check_token_ids("owner", "ids", given, 5, ignore_index=ignore_index)
        assert (info.value.owner, info.value.argument, info.value.token_id, info.value.vocab_size) == (
            "owner", "ids", bad, 5)
        ignored = " (or -1, ignored)" if ignore_index else ""
        assert str(info.value) == f"owner: ids holds token id {bad}, outside the vocabulary 0..4{ignored}"


def test_token_id_error_is_a_value_error_that_can_name_the_setting() -> None:
    message = r"^o: src holds token id 9, outside the vocabulary 0\.\.8 \(src_vocab_size=9\)$"
    with pytest.raises(ValueError, match=message):
        check_token_ids("o", "src", torch.tensor([[1, 9]]), 9, bound_by="src_vocab_size")


def test_the_gpt_the_encoder_decoder_and_the_tokenizer_raise_the_same_error() -> None:
    """One rule, one error type, one message form, wherever token ids come in."""
    gpt = GPT(GPTConfig(vocab_size=5, block_size=4, n_layer=1, n_head=1, n_embd=8))
    seq2seq = Seq2SeqTransformer(5, 5, 0, 0, d_model=8, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
                                 dim_feedforward=8)
    calls: dict[str, Callable[[], object]] = {
        "GPT.forward: idx": lambda: gpt(torch.tensor([[1, 5]])),
        "GPT.forward: targets": lambda: gpt(torch.tensor([[1, 2]]), torch.tensor([[1, 5]])),
        "GPT.attention_weights: idx": lambda: gpt.attention_weights(torch.tensor([[1, 5]])),
        "Seq2SeqTransformer.encode: src": lambda: seq2seq(torch.tensor([[1, 5]]), torch.tensor([[1, 2]])),
        "Seq2SeqTransformer.decode: tgt": lambda: seq2seq(torch.tensor([[1, 2]]), torch.tensor([[1, 5]])),
        "CharTokenizer.decode: ids": lambda: CharTokenizer("abcde").decode([1, 5]),
    }
    for where, call in calls.items():
        with pytest.raises(TokenIdError) as info:
            call()
        assert str(info.value).startswith(f"{where} holds token id 5, outside the vocabulary 0..4"), where


@pytest.mark.parametrize("value", [0, -3, True, False, 2.0, "4", None])
def test_positive_int_refuses_what_is_not_a_positive_int(value: object) -> None:
    with pytest.raises(ValueError, match="must be a positive int") as info:
        check_positive_int("Owner", "size", value)
    assert str(info.value) == f"Owner: size must be a positive int, got {value!r}"


def test_positive_int_accepts_positive_ints_and_optional_none() -> None:
    check_positive_int("Owner", "size", 1)
    check_positive_int("Owner", "size", 10**12)
    check_positive_int("Owner", "size", None, optional=True)
    with pytest.raises(ValueError, match=r"^size must be None or a positive int, got 0$"):
        check_positive_int(None, "size", 0, optional=True)
