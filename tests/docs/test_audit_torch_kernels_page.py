"""docs/audit-torch-kernels.md (benchmarks/audit_torch_kernels.py) and docs/audit-gpu.md (benchmarks/audit_gpu.py)
show what their scripts write today: every kernel and every set of mods, with the conclusion each entry expects and
the mods' current code; the GPU page says it has not been run until a CUDA machine has filled it."""

import inspect
from pathlib import Path

import pytest
import torch

from benchmarks import audit_gpu
from benchmarks.audit_torch_kernels import BEGIN, END, MODS, Kernel, Mods, _header, kernels
from tests.support import mods

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs" / "audit-torch-kernels.md").read_text(encoding="utf-8")
BLOCK = PAGE.split(BEGIN, 1)[1].split(END, 1)[0]


def _row(name: str) -> list[str]:
    rows = [line for line in BLOCK.splitlines() if line.startswith(f"| {name} | ")]
    assert len(rows) == 1, f"docs/audit-torch-kernels.md: no row for {name} (run benchmarks/audit_torch_kernels.py)"
    return rows[0].split(" | ")


@pytest.mark.parametrize("kernel", kernels(), ids=lambda kernel: kernel.name)
def test_each_kernel_has_its_row_and_its_report(kernel: Kernel) -> None:
    said = _row(kernel.name)[2]
    assert said == ("absent" if kernel.cuda_only and said == "absent" else kernel.expect)
    section = BLOCK.split(f"\n### {kernel.name}: ", 1)[1].split("\n### ", 1)[0]
    if said != "absent":
        assert "```text\naudit of " in section
        assert "conventions PASS" in section


@pytest.mark.parametrize("entry", MODS, ids=lambda entry: entry.name)
def test_each_set_of_mods_has_its_row_its_code_and_its_report(entry: Mods) -> None:
    assert _row(entry.name)[2] == entry.expect
    section = BLOCK.split(f"\n### {entry.name}: ", 1)[1].split("\n### ", 1)[0]
    for key in ("score_mod", "mask_mod"):
        mod = entry.arguments.get(key)
        if mod is not None:
            assert inspect.getsource(mod).rstrip() in section, f"{entry.name}: the code of {mod.__name__} changed"
    assert "```text\naudit of flex_attention(" in section


def test_the_mods_modules_header_is_shown_as_it_is() -> None:
    assert f"```python\n{_header(mods)}\n```" in BLOCK


def test_each_planted_mod_fails_the_row_of_its_mod_with_the_cause_named() -> None:
    causes = {"window_off_by_one": "window: off by +1: the mod reads WINDOW = 4, but each query keeps 5 keys",
              "alibi_power_of_two_slopes_6": "2^(-8 i / 6) is the paper's rule for a power of two only",
              "softcap_before_scale": "softcap: the soft-cap runs before the scale"}
    for name, cause in causes.items():
        section = BLOCK.split(f"\n### {name}: ", 1)[1].split("\n### ", 1)[0]
        assert cause in section, name


def test_the_gpu_page_says_it_has_not_been_run_until_it_has() -> None:
    page = (ROOT / "docs" / "audit-gpu.md").read_text(encoding="utf-8")
    block = page.split(audit_gpu.BEGIN, 1)[1].split(audit_gpu.END, 1)[0].strip()
    ran = block.startswith("Generated on ")
    assert ran or block == "Not yet run: no CUDA device has been available."
    assert ("**This page has not been run on a GPU yet.**" in page) != ran


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA present: the script would run")
def test_the_gpu_script_without_cuda_says_so_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert audit_gpu.main([]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("audit_gpu.py: no CUDA device here; docs/audit-gpu.md keeps saying it has not been run")


def test_the_pages_triton_kernel_refuses_what_it_is_not_written_for() -> None:
    q = torch.zeros(1, 1, 2, 4)
    with pytest.raises(TypeError, match=r"triton_attention: float16 or bfloat16 only, got torch\.float32"):
        audit_gpu.triton_attention(q, q, q)
    half = q.half()
    with pytest.raises(ValueError, match="as many key/value heads as query heads"):
        audit_gpu.triton_attention(half, torch.zeros(1, 2, 2, 4).half(), torch.zeros(1, 2, 2, 4).half())


def test_both_scripts_are_in_regenerate_docs() -> None:
    script = (ROOT / "benchmarks" / "regenerate_docs.sh").read_text(encoding="utf-8")
    assert "$py benchmarks/audit_torch_kernels.py --jobs 2" in script
    assert "$py benchmarks/audit_gpu.py || [ $? -eq 2 ]" in script
