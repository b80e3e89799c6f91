"""The known causes (typed_transformer.audit.hf.known): each row matches every class it names (a row that matches
none of them any more fails here, a stale row), and a class's causes are the rows it matches, in the table's order."""

import pytest

from tests.toolkit.audit.hf.test_traits import _built
from typed_transformer.audit.hf.known import KNOWN_CAUSES, KnownCause, hf_causes

transformers = pytest.importorskip("transformers", reason="transformers is not installed (extra audit-test)")

EXAMPLES = [pytest.param(row, example, id=f"{row.name}-{example}") for row in KNOWN_CAUSES for example in row.examples]


def test_every_row_names_its_classes_and_a_name_of_its_own() -> None:
    assert all(row.examples for row in KNOWN_CAUSES)
    assert len({row.name for row in KNOWN_CAUSES}) == len(KNOWN_CAUSES)


@pytest.mark.parametrize(("row", "example"), EXAMPLES)
def test_a_known_cause_matches_each_of_its_example_classes(row: KnownCause, example: str) -> None:
    module = _built(example)
    assert row.found(module), f"{row.name} no longer matches {example}: a stale row"
    assert row.cause in hf_causes(module)


def test_a_plain_class_has_no_known_cause() -> None:
    assert hf_causes(_built("llama.LlamaAttention")) == []
