"""The trait table (typed_transformer.audit.hf.traits): each trait recognises every class it names as an example
(a test per trait and example, generated from the table: a trait that stops recognising its class fails here, as a
stale skip does in array-api-tests), and a class's notes and limits are the fold of its traits."""

import importlib
from typing import Any

import pytest

from typed_transformer.audit.hf.notes import hf_limits, hf_notes
from typed_transformer.audit.hf.traits import SUBJECTS, TRAITS, Seen, Trait, add_trait, all_traits, traits_of

transformers = pytest.importorskip("transformers", reason="transformers is not installed (extra audit-test)")


def _built(example: str) -> Any:
    """The example class built as the sweep builds it (as many key/value heads as query heads where it needs them)."""
    from typed_transformer.audit.hf.build import hf_build
    from typed_transformer.audit.hf.recognise import hf_spec
    from typed_transformer.strategies import randomize_parameters

    model, name = example.split(".")
    cls = getattr(importlib.import_module(f"transformers.models.{model}.modeling_{model}"), name)
    try:
        module = randomize_parameters(hf_build(cls), 0)
        hf_spec(module)
    except Exception:
        config: Any = hf_build(cls).config
        module = randomize_parameters(hf_build(cls, {"num_key_value_heads": config.num_attention_heads}), 0)
    return module


EXAMPLES = [pytest.param(trait, example, id=f"{trait.name}-{example}") for trait in all_traits()
            for example in trait.examples]


def test_every_trait_names_the_classes_it_was_written_for() -> None:
    assert all(bool(t.examples) != bool(t.unmatched) for t in all_traits()), [
        t.name for t in all_traits() if bool(t.examples) == bool(t.unmatched)]
    assert len({t.name for t in TRAITS}) == len(TRAITS)
    assert {t.subject for t in TRAITS} <= set(SUBJECTS)


@pytest.mark.parametrize(("trait", "example"), EXAMPLES)
def test_a_trait_recognises_each_of_its_example_classes(trait: Trait, example: str) -> None:
    module = _built(example)
    assert trait.found(Seen(module)) is not None, f"{trait.name} no longer recognises {example}: a stale example"
    assert trait in [t for t, _ in traits_of(module)]


def test_a_class_without_a_trait_has_none_of_its_notes() -> None:
    """LlamaAttention is the plain shape: no trait that notes or limits anything recognises it."""
    module = _built("llama.LlamaAttention")
    assert hf_notes(module) == []
    assert hf_limits(module) == []
    found = [t.name for t, _ in traits_of(module)]
    assert "local blocks" not in found and "sliding chunks" not in found  # noqa: PT018


def test_the_notes_are_the_fold_of_the_traits_in_subject_order() -> None:
    """LongT5's local attention: its trait's note is its first, a trait registered later comes after it, and a
    trait's limit or own parameter reaches hf_limits."""
    module = _built("longt5.LongT5LocalAttention")
    before, limits_before = hf_notes(module), hf_limits(module)
    assert before
    assert before[0].startswith("LongT5's local attention built with local_radius")
    planted = add_trait(Trait("planted", lambda seen: seen.cls.__name__ == "LongT5LocalAttention", examples=(),
                              notes=lambda seen, found: ["planted note"],
                              limits=lambda seen, found: ["planted limit"]))
    try:
        assert hf_notes(module) == [*before, "planted note"]
        assert hf_limits(module) == ["planted limit", *limits_before]
        assert hf_notes(_built("llama.LlamaAttention")) == []
    finally:
        TRAITS.remove(planted)
    assert hf_notes(module) == before


def test_a_name_is_registered_once() -> None:
    with pytest.raises(ValueError, match="registered already"):
        add_trait(Trait(all_traits()[0].name, lambda seen: None, examples=()))
