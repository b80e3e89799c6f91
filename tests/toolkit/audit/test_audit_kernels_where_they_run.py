"""Kernels audited where they run (issue 42): a half-only kernel and one that needs dv = d are inferred and audited
with zero configuration, each refusal listed under "not tested" with the probe that decided it; torch's own CPU
flash backend passes but for its top-left causal alignment (an undeclared difference)."""

import math
import warnings

import pytest
import torch
from torch import Tensor

from tests.support import kernels
from typed_transformer.audit import audit_attention, infer_conventions
from typed_transformer.cli import main

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # torch's "Flash attention kernel not used because"


def test_the_cpu_flash_backend_passes_at_zero_configuration_but_for_its_top_left_alignment() -> None:
    """Before: the scale probe's dv = 4 with d = 2 was refused ("No available kernel"), inference stopped, every
    check FAILed as "candidate raised" and gradients FAILed at 1.5e4 under the default bottom-right alignment."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = audit_attention(kernels.sdpa_flash, conventions="infer", seed=0, max_examples=6, budget="ci")
    assert report.failed == [], report.table()
    assert report.undeclared == ["causal_alignment"]
    assert not report.passed  # exit status 3 on the command line, until declared
    assert "dv != d (equal_head_sizes=True)" in report.untested
    inferred = "\n".join(report.inferred)
    assert "equal_head_sizes = True: h=1, t=3, s=4, d=4: dv=3 raised RuntimeError: No available kernel." in inferred
    declared = audit_attention(kernels.sdpa_flash, conventions="infer", known={"causal_alignment": "top-left"},
                               seed=0, max_examples=4, budget="quick", dtypes=[torch.float32])
    assert declared.passed, declared.table()


def test_a_half_only_kernel_is_inferred_and_audited_in_its_own_dtypes() -> None:
    inference = infer_conventions(kernels.half_only)
    assert inference.findings == []
    assert inference.evidence["probe_dtype"].value == "float16"
    assert "float64 with dv=3 raised TypeError: only float16 and bfloat16" in inference.evidence["probe_dtype"].seen
    assert inference.conventions.scale is None  # 1/sqrt(d), estimated from float16 outputs
    assert inference.conventions.causal_alignment == "bottom-right"
    report = audit_attention(kernels.half_only, conventions="infer", seed=0, max_examples=6, budget="ci")
    assert report.dtypes == ["float16", "bfloat16"]
    assert report.passed, report.table()
    assert any(note.startswith("float32 (the candidate refused it: only float16") for note in report.untested)
    assert any(note.startswith("float64 (the candidate refused it: only float16") for note in report.untested)


def test_a_half_only_kernels_planted_causal_bug_is_caught() -> None:
    report = audit_attention(kernels.half_only_causal_off_by_one, conventions="infer", seed=0, max_examples=6,
                             budget="ci")
    assert report.status("conventions") == "FAIL"
    assert "causal_alignment: is_causal=True at t=s=3 matches neither" in report["conventions"].message
    rows = {(r.name, r.dtype): r.status for r in report.results}
    assert rows["causality", "float16"] == rows["causality", "bfloat16"] == "FAIL"
    assert rows["reference", "float16"] == rows["masking", "bfloat16"] == "PASS"  # the bug is causal only


def _half_only_unit_scale(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                          is_causal: bool = False) -> Tensor:
    if q.dtype not in (torch.float16, torch.bfloat16):
        raise TypeError("half only")
    return kernels.no_scale(q, k, v, attn_mask=attn_mask, is_causal=is_causal)


def test_a_constant_scale_estimated_in_half_precision_is_snapped_to_the_exact_constant() -> None:
    inference = infer_conventions(_half_only_unit_scale)
    assert inference.conventions.scale == 1.0
    assert [d.field for d in inference.differences] == ["scale"]
    assert math.isclose(inference.conventions.scale, 1.0, rel_tol=0, abs_tol=0)


def _refuses_everything(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                        is_causal: bool = False) -> Tensor:
    raise NotImplementedError("not built for this machine")


def test_a_candidate_that_refuses_every_dtype_is_one_finding() -> None:
    inference = infer_conventions(_refuses_everything)
    assert [f.field for f in inference.findings] == ["reference"]
    message = inference.findings[0].message
    assert "refused in every dtype" in message
    assert "bfloat16 with dv=4 raised NotImplementedError: not built for this machine" in message


def test_the_command_line_audits_the_half_only_kernel_in_float16_and_bfloat16(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", "tests.support.kernels:half_only", "--infer", "--budget", "quick", "--checks",
                 "reference,causality"]) == 0
    out = capsys.readouterr().out
    assert "dtypes float16, bfloat16" in out.splitlines()[0]
    assert "probe_dtype = 'float16'" in out


def test_a_half_only_kernel_of_multiples_of_8_is_inferred_and_audited_inside_its_head_sizes() -> None:
    """Before: the plainest call (d = 4) was refused in every dtype, one finding, and the audit stopped there."""
    inference = infer_conventions(kernels.half_multiple_of_8)
    assert inference.findings == []
    assert inference.conventions.head_size_multiple == 8
    assert inference.conventions.head_sizes == (1, 8)  # d = 16 answers too: 8 and 16 are drawn
    assert inference.evidence["head_size_multiple"].seen == (
        "h=1, t=3, s=4: every smaller head size is refused in every dtype (d=4: bfloat16 with dv=4 raised "
        "RuntimeError: head sizes must be multiples of 8 (got d=4, dv=4)); d=8 answers (only multiples of 8 are "
        "drawn)")
    assert inference.evidence["probe_dtype"].value == "float16"
    assert inference.conventions.scale is None  # 1/sqrt(d), estimated at d = 16 and 32
    report = audit_attention(kernels.half_multiple_of_8, conventions="infer", seed=0, max_examples=6, budget="ci")
    assert report.passed, report.table()
    assert report.dtypes == ["float16", "bfloat16"]
    assert "head sizes that are not a multiple of 8 (head_size_multiple=8)" in report.untested
    assert "head_size_multiple = 8: h=1, t=3, s=4: every smaller head size" in report.table()


def test_every_example_drawn_for_a_multiple_keeps_it_in_d_and_dv() -> None:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from typed_transformer.audit import Conventions
    from typed_transformer.audit.core.checks import draw_example
    from typed_transformer.audit.core.functions import FunctionAdapter
    from typed_transformer.audit.core.running import BUDGETS, Deep, Run

    adapter = FunctionAdapter(kernels.half_multiple_of_8, Conventions(head_size_multiple=8), "half_multiple_of_8")
    seen: set[tuple[int, int]] = set()

    deeps: list[Deep | None] = [None, "sizes"]

    @settings(max_examples=60, database=None, deadline=None)
    @given(data=st.data(), deep=st.sampled_from(deeps))
    def draw(data: st.DataObject, deep: Deep | None) -> None:
        run = Run(adapter, torch.float16, 2.0, budget=BUDGETS["default"], deep=deep)
        example = draw_example(run, data)
        assert example.d % 8 == 0, example
        assert example.dv % 8 == 0, example
        seen.add((example.d, example.dv))

    draw()
    assert {8, 16} <= {d for d, _ in seen}  # the small examples' two sizes
    assert any(d >= 64 for d, _ in seen)  # and the budget's deep head sizes (64, 80, 96, 128, 256)


def test_a_planted_bug_past_the_first_head_tile_is_caught_in_a_kernel_of_multiples_of_8() -> None:
    report = audit_attention(kernels.half_multiple_of_8_first_dims_only, conventions="infer", seed=0,
                             max_examples=6, budget="ci")
    assert report.status("conventions") == "FAIL"
    assert "is no softmax-weighted mean of the values" in report["conventions"].message
    assert report.status("reference") == "FAIL"
    assert report["reference"].counterexample is not None
    assert report["reference"].counterexample["d"] == 16  # shrunk to the least head size that shows it


def test_a_kernel_compiled_for_one_head_size_is_audited_at_that_size_only() -> None:
    inference = infer_conventions(kernels.only_head_size_16)
    assert inference.findings == []
    conv = inference.conventions
    assert (conv.head_size_multiple, conv.head_sizes, conv.equal_head_sizes) == (16, (16, 16), True)
    assert inference.evidence["head_sizes"].seen.startswith("h=1, t=3, s=4, d=32 raised ValueError: compiled for "
                                                             "head size 16 only")
    assert inference.evidence["scale"].seen.startswith("logit scale 0.25 at d=16, the one head size it takes,")
    report = audit_attention(kernels.only_head_size_16, conventions="infer", seed=0, max_examples=4,
                             budget="quick", dtypes=[torch.float64])
    assert report.passed, report.table()
    assert {"head sizes outside 16..16 (head_sizes)", "dv != d (equal_head_sizes=True)",
            "head sizes that are not a multiple of 16 (head_size_multiple=16)"} <= set(report.untested)


def test_head_size_multiple_is_a_declaration_with_a_flag() -> None:
    from typed_transformer.audit import Conventions

    assert "head_size_multiple" not in repr(Conventions())  # the pages' repros read as before
    assert "head_size_multiple=8" in repr(Conventions(head_size_multiple=8))
    assert eval(repr(Conventions(head_size_multiple=8)), {"Conventions": Conventions}) == Conventions(
        head_size_multiple=8)
    with pytest.raises(ValueError, match="head_size_multiple must be a positive integer; got 0"):
        Conventions(head_size_multiple=0)
    assert Conventions(head_size_multiple=8).head_size(4) == 8
    assert Conventions(head_size_multiple=3, even_head_size=True).head_multiple == 6
    declared = audit_attention(kernels.half_multiple_of_8, conventions=Conventions(head_size_multiple=8), seed=0,
                               max_examples=3, budget="quick", checks=["reference"])
    assert declared.passed, declared.table()
    refused = audit_attention(kernels.half_multiple_of_8, conventions=Conventions(), seed=0, max_examples=3,
                              budget="quick", checks=["reference"])
    assert refused.status("reference") == "FAIL"  # undeclared, every d = 4 call raises


def test_the_command_line_takes_head_size_multiple(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", "tests.support.kernels:half_multiple_of_8", "--head-size-multiple", "8", "--budget",
                 "quick", "--checks", "reference"]) == 0
    out = capsys.readouterr().out
    assert "head sizes that are not a multiple of 8 (head_size_multiple=8)" in out


def test_a_kernel_of_at_most_64_keys_is_audited_up_to_its_maximum() -> None:
    """Before: the deep examples past 64 keys raised, and every check that drew one FAILed as "candidate raised"."""
    inference = infer_conventions(kernels.at_most_64_keys)
    assert inference.findings == []
    assert inference.conventions.max_length == 64
    assert inference.evidence["max_length"].seen == (
        "h=1, t=s=129 (the longest the audit draws) raised ValueError: sequences of at most 64 are supported (got "
        "t=129, s=129); t=s=64 answers and 65 raises (lengths up to 64 are drawn)")
    assert infer_conventions(kernels.at_most_64_keys, budget="quick").conventions.max_length is None  # never drawn
    report = audit_attention(kernels.at_most_64_keys, conventions="infer", seed=0, max_examples=6, budget="ci",
                             dtypes=[torch.float32])
    assert report.passed, report.table()
    assert "query and key lengths past 64 (max_length=64)" in report.untested


def test_a_wrong_output_at_a_long_length_is_no_maximum() -> None:
    """Only a raise is a refusal: a kernel wrong past 16 keys is for the checks (it FAILs them), not a constraint."""
    assert infer_conventions(kernels.tiled_16_no_rescale).conventions.max_length is None
    assert infer_conventions(kernels.tiled_attention).conventions.max_length is None


def test_max_length_is_a_declaration_with_a_flag(capsys: pytest.CaptureFixture[str]) -> None:
    from typed_transformer.audit import Conventions

    assert "max_length" not in repr(Conventions())
    with pytest.raises(ValueError, match="max_length must be a positive integer or None; got 0"):
        Conventions(max_length=0)
    assert main(["audit", "tests.support.kernels:at_most_64_keys", "--max-length", "64", "--budget", "ci",
                 "--checks", "reference", "--dtypes", "float32"]) == 0
    assert "query and key lengths past 64 (max_length=64)" in capsys.readouterr().out
    assert main(["audit", "tests.support.kernels:at_most_64_keys", "--budget", "ci", "--checks", "reference",
                 "--dtypes", "float32"]) == 1  # undeclared: the deep examples at 65 keys raise


def test_a_kernel_of_whole_blocks_of_16_is_inferred_and_audited_on_whole_blocks() -> None:
    """Before: the plainest call (t=3, s=4) was refused at every head size in every dtype: one finding, and the
    audit stopped there."""
    inference = infer_conventions(kernels.blocks_of_16)
    assert inference.findings == []
    assert inference.conventions.length_multiple == 16
    assert inference.evidence["length_multiple"].seen == (
        "h=1, t=3, s=4: every head size is refused in every dtype (float64 with dv=4 raised ValueError: sequence "
        "lengths must be multiples of 16 (got t=3, s=4)), in blocks of 8 too; t=48, s=64 (each position repeated 16 "
        "times) answers (only multiples of 16 are drawn; the probes below count positions of 16)")
    # every later field is decided on whole blocks, as on any other kernel
    assert inference.conventions.causal_alignment == "bottom-right"
    assert inference.conventions.scale is None
    assert inference.conventions.fully_masked == "zero"
    assert inference.conventions.supports_gqa
    assert inference.conventions.grouping == "g r"
    report = audit_attention(kernels.blocks_of_16, conventions="infer", seed=0, max_examples=6, budget="ci",
                             dtypes=[torch.float32])
    assert report.passed, report.table()
    assert "query and key lengths that are not a multiple of 16 (length_multiple=16)" in report.untested


def test_a_tiled_kernels_missing_rescale_is_caught_on_whole_blocks() -> None:
    report = audit_attention(kernels.blocks_of_16_no_rescale, conventions="infer", seed=0, max_examples=6,
                             budget="ci", dtypes=[torch.float32])
    assert report.status("conventions") == "FAIL"
    assert "is no softmax-weighted mean of the values" in report["conventions"].message
    assert report.status("reference") == "FAIL"
    assert report["reference"].counterexample is not None
    assert report["reference"].counterexample["s"] % 16 == 0
    assert report["reference"].counterexample["s"] > 16  # one block of keys is right; the second rescales


def test_a_half_only_kernel_of_multiples_of_8_and_blocks_of_64_passes_at_zero_configuration() -> None:
    inference = infer_conventions(kernels.half_blocks_of_64)
    assert inference.findings == []
    conv = inference.conventions
    assert (conv.length_multiple, conv.head_size_multiple, inference.evidence["probe_dtype"].value) == (
        64, 8, "float16")
    # the refusal quoted is the one at the dtype and head size that answer: the length's, not the dtype's
    assert inference.evidence["length_multiple"].seen.startswith(
        "h=1, t=3, s=4: every head size is refused in every dtype (float16 with d=8, dv=8 raised ValueError: "
        "sequence lengths must be multiples of 64 (got t=3, s=4)), in blocks of 8, 16, 32 too; t=192, s=256")
    report = audit_attention(kernels.half_blocks_of_64, conventions="infer", seed=0, max_examples=4, budget="quick",
                             dtypes=[torch.float16])
    assert report.passed, report.table()


def _blocks_of_16_up_to_64(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                           is_causal: bool = False) -> Tensor:
    if max(q.shape[-2], k.shape[-2]) > 64:
        raise ValueError("at most 64")
    return kernels.blocks_of_16(q, k, v, attn_mask=attn_mask, is_causal=is_causal)


def test_a_maximum_length_is_found_in_whole_blocks() -> None:
    inference = infer_conventions(_blocks_of_16_up_to_64)
    assert (inference.conventions.length_multiple, inference.conventions.max_length) == (16, 64)
    assert inference.evidence["max_length"].seen == (
        "h=1, t=s=144 (the longest the audit draws) raised ValueError: at most 64; t=s=64 answers and 80 raises "
        "(lengths up to 64 are drawn)")


def test_a_repeated_probe_keeps_what_each_position_computes_under_either_alignment() -> None:
    """The probes of a kernel of whole blocks repeat every position; the last query of each block must compute what
    its position computes without the repeats, with a mask, with a causal mask aligned either way, with t < s and
    t > s (rows without a key included). Checked against torch's SDPA (top-left) and ours (bottom-right)."""
    import torch.nn.functional as F

    from typed_transformer import scaled_dot_product_attention as ours
    from typed_transformer.audit.core.examples import Example

    for t, s in ((3, 4), (4, 2), (1, 3), (3, 3)):
        keep = torch.rand(1, 2, t, s, generator=torch.Generator().manual_seed(t * s)) > 0.3
        keep[..., 0] = True
        for is_causal in (False, True):
            for mask in (None, keep):
                plain = Example(b=1, h=2, g=2, t=t, s=s, d=4, dv=3, seed=7, dtype="float64",
                                keep=None if mask is None else mask.tolist(), is_causal=is_causal)
                repeated = Example(**{**plain.__dict__, "repeat": 16})
                assert repeated.inputs()[0].shape == (1, 2, 16 * t, 4)
                for attention in (ours, F.scaled_dot_product_attention):
                    if attention is F.scaled_dot_product_attention and is_causal and mask is not None:
                        continue  # torch refuses both
                    want = attention(*plain.inputs(), attn_mask=plain.mask(), is_causal=is_causal)
                    got = attention(*repeated.inputs(), attn_mask=repeated.mask(), is_causal=is_causal)[..., 15::16, :]
                    rows = want.isfinite()  # torch's rows without a key are NaN
                    torch.testing.assert_close(got[rows], want[rows], rtol=1e-12, atol=1e-12)


def test_length_multiple_is_a_declaration_with_a_flag(capsys: pytest.CaptureFixture[str]) -> None:
    from typed_transformer.audit import Conventions

    assert "length_multiple" not in repr(Conventions())  # the pages' repros read as before
    assert eval(repr(Conventions(length_multiple=16)), {"Conventions": Conventions}) == Conventions(
        length_multiple=16)
    with pytest.raises(ValueError, match="length_multiple must be a positive integer; got 0"):
        Conventions(length_multiple=0)
    with pytest.raises(ValueError, match="max_length=8 is shorter than one block of length_multiple=16"):
        Conventions(length_multiple=16, max_length=8)
    blocks = Conventions(length_multiple=16).blocks
    assert [blocks(t, s) for t, s in ((1, 1), (3, 4), (4, 3), (17, 16), (1, 129))] == [
        (16, 16), (16, 32), (32, 16), (32, 16), (16, 144)]
    assert Conventions(length_multiple=16, max_length=40).blocks(3, 100) == (16, 32)  # its last whole block
    assert Conventions().blocks(3, 4) == (3, 4)
    assert main(["audit", "tests.support.kernels:blocks_of_16", "--length-multiple", "16", "--budget", "quick",
                 "--checks", "reference,causality", "--dtypes", "float32"]) == 0
    assert "query and key lengths that are not a multiple of 16 (length_multiple=16)" in capsys.readouterr().out
    assert main(["audit", "tests.support.kernels:blocks_of_16", "--budget", "quick", "--checks", "reference",
                 "--dtypes", "float32"]) == 1  # undeclared: every call raises


def test_every_example_drawn_on_whole_blocks_keeps_them_and_the_order_of_t_and_s() -> None:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from typed_transformer.audit import Conventions
    from typed_transformer.audit.core.checks import draw_example
    from typed_transformer.audit.core.functions import FunctionAdapter
    from typed_transformer.audit.core.running import BUDGETS, Deep, Run

    adapter = FunctionAdapter(kernels.blocks_of_16, Conventions(length_multiple=16), "blocks_of_16")
    orders: set[str] = set()
    deeps: list[Deep | None] = [None, "lengths", "sizes"]

    @settings(max_examples=80, database=None, deadline=None)
    @given(data=st.data(), deep=st.sampled_from(deeps), single=st.booleans())
    def draw(data: st.DataObject, deep: Deep | None, single: bool) -> None:
        run = Run(adapter, torch.float32, 2.0, budget=BUDGETS["default"], deep=deep)
        example = draw_example(run, data, mask="keep", single_query=single)
        assert example.t % 16 == 0, example
        assert example.s % 16 == 0, example
        assert torch.tensor(example.keep).shape[-2:] == (example.t, example.s)
        orders.add("<" if example.t < example.s else ">" if example.t > example.s else "=")

    draw()
    assert orders == {"<", ">", "="}


def test_the_repro_of_a_repeated_probe_repeats_its_positions(capsys: pytest.CaptureFixture[str]) -> None:
    """Each decision's repro calls the candidate as the probe did: on every position repeated, mask included."""
    inference = infer_conventions(kernels.blocks_of_16)
    repro = inference.evidence["mask_polarity"].repro
    assert "q, k, v = (x.repeat_interleave(16, dim=-2) for x in (q, k, v))  # each position 16 times" in repro
    assert "keep = keep.repeat_interleave(16, dim=-2).repeat_interleave(16, dim=-1)" in repro
    exec(compile(repro, "<repro>", "exec"), {})
    printed = capsys.readouterr().out.split()
    assert printed[:2] == ["max", "error"]
    assert float(printed[2]) < 1e-12  # the candidate took the repeated call, and it is right
