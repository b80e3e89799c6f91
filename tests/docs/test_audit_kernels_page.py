"""docs/audit-kernels.md and the audit-cost block of docs/audit.md, written by benchmarks/audit_kernel_gallery.py
and benchmarks/audit_cost.py, show what the scripts write today: every kernel of the gallery with its current
code and a report of the current format, the cost table with
quick, the default before and after issue 42, and thorough."""

import inspect
import re
from pathlib import Path

import pytest

from benchmarks.audit_kernel_gallery import BEGIN, END, ENTRIES, Entry

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs" / "audit-kernels.md").read_text(encoding="utf-8")
BLOCK = PAGE.split(BEGIN, 1)[1].split(END, 1)[0]
CLOSING = re.compile(r"^conventions (PASS|FAIL \(\d+ findings?\)); (float32|float16): \d+ passed(, \d+ failed)?; "
                     r"(float64|bfloat16): .*$")


def section(entry: Entry) -> str:
    name = entry.kernel.__name__
    parts = BLOCK.split(f"\n### {name}: ")
    assert len(parts) == 2, f"docs/audit-kernels.md: no section for {name} (run benchmarks/audit_kernel_gallery.py)"
    return parts[1].split("\n### ", 1)[0]


@pytest.mark.parametrize("entry", ENTRIES, ids=[entry.kernel.__name__ for entry in ENTRIES])
def test_each_kernel_is_on_the_page_with_its_code_and_a_report(entry: Entry) -> None:
    text = section(entry)
    name = entry.kernel.__name__
    assert text.startswith(f"{entry.title}\n")
    assert f"```python\n{inspect.getsource(entry.kernel).rstrip()}\n```" in text, f"{name}: the code changed"
    command = f"`typed-transformer audit tests.support.kernels:{name} --infer`"
    assert command in text
    assert f"exits {entry.code}:" in text
    report = text.split("```text\n", 1)[1].split("\n```", 1)[0].splitlines()
    assert report[0].startswith(f"audit of tests.support.kernels:{name} (seed 0, 20 examples per check and dtype, "
                                f"dtypes {entry.dtypes}, ")
    assert CLOSING.match(report[-1]), report[-1]
    assert ("failed" in report[-1]) == (entry.code == 1)


def test_the_generated_scripts_are_in_regenerate_docs() -> None:
    script = (ROOT / "benchmarks" / "regenerate_docs.sh").read_text(encoding="utf-8")
    assert "benchmarks/audit_kernel_gallery.py" in script
    assert "benchmarks/audit_cost.py" in script


def test_the_cost_block_compares_both_budgets_on_the_docs_example_and_a_hugging_face_class() -> None:
    from benchmarks.audit_cost import BEGIN as COST_BEGIN
    from benchmarks.audit_cost import END as COST_END

    page = (ROOT / "docs" / "audit.md").read_text(encoding="utf-8")
    block = page.split(COST_BEGIN, 1)[1].split(COST_END, 1)[0].strip().splitlines()
    assert block[0] == ("| audit of | budget quick (sizes 1..6) | default with the old lists (batches 5, 8, 9; "
                        "heads 5, 6, 8) | default (+ batches and heads 12, 16, the widest and longest examples) | "
                        "thorough (+ 512..4096 keys, 32 and 64 heads) | default / before | thorough / default |")
    budgets = block[:block.index("")]
    rows = [line for line in budgets[2:] if line.startswith("| ")]
    assert [row.split(" | ")[0] for row in rows] == ["| docs/audit.md's my_attention (conventions=\"infer\", "
                                                      "max_examples=10)",
                                                      "| LlamaAttention (hf_spec, conventions=\"infer\", "
                                                      "max_examples=10, float32)"]
    for row in rows:
        assert re.search(r"( \| \d+\.\d s \([^)]*\)){4} \| \d+\.\d\dx \| \d+\.\dx \|$", row), row
    isolation = block[len(budgets) + 1:]
    assert isolation[0] == ("| audit of `tests.support.kernels:paper_kernel` (conventions=\"infer\") | in process | "
                            "isolated (its own process) | isolated / in process |")
    assert [row.split(" | ")[0] for row in isolation[2:4]] == ["| budget quick (25 rows)", "| budget default (49 rows)"]
    for row in isolation[2:4]:
        assert re.search(r" \| \d+\.\d s \| \d+\.\d s \| \d+\.\d\dx \|$", row), row
    assert block[-1].endswith("made by `benchmarks/audit_cost.py`.")
