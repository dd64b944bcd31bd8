"""`row_fitting.fit_new_entities`: new rows trained alone on the pre-training objective, every other weight
frozen; deterministic under a seed; bad input named."""

from __future__ import annotations

import pytest
import torch

from edmem_hf.research.entity_growth import add_entities
from edmem_hf.research.row_fitting import fit_new_entities
from tiny_models import saved_model_and_unknown_people, tiny_model_with_entities


@pytest.fixture
def setup():
    torch.manual_seed(0)
    model, tokenizer, names, words = tiny_model_with_entities(20)
    new = [f"{words[100]} {words[101]}", words[102]]
    passages = [
        [f"{words[60]} <E_s> {new[0]} <E_e> {words[61]} {words[70]}", f"<E_s> {new[0]} <E_e> {words[62]} {words[63]}"],
        [f"{words[64]} {words[65]} <E_s> {new[1]} <E_e> {words[71]}"],
    ]
    negatives = {names[3]: [f"{words[66]} <E_s> {names[3]} <E_e> {words[67]}"],
                 names[4]: [f"<E_s> {names[4]} <E_e> {words[68]} {words[69]}"]}  # fmt: skip
    return model, tokenizer, new, passages, negatives


def _state(model):
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


def test_only_the_new_rows_change(setup):
    model, tokenizer, new, passages, negatives = setup
    before = _state(model)
    trained_table = model.get_encoder().entity_embeddings.weight.detach().clone()
    trained = model.config.entity_vocab_size
    was_training = model.training
    ids = fit_new_entities(model, new, passages, tokenizer, negatives, steps=5, learning_rate=0.05, seed=0)
    assert ids == [trained, trained + 1] and model.training == was_training
    table = model.get_encoder().entity_embeddings.weight
    # the trained rows and every other weight are bit-identical
    assert torch.equal(table[:trained], trained_table)
    for name, tensor in model.state_dict().items():
        if "entity_embeddings" not in name:
            assert torch.equal(tensor, before[name]), name
    assert all(p.requires_grad for p in model.parameters())  # left as it was
    # the new rows moved away from where add_entities put them
    reference, _, _, _ = tiny_model_with_entities(20)
    reference.load_state_dict(before)
    add_entities(reference, new, passages, tokenizer)
    start = reference.get_encoder().entity_embeddings.weight[trained:]
    assert not torch.allclose(table[trained:], start)
    assert model.entity_vocab.names[trained:] == new


def test_the_fit_lowers_the_pretraining_loss_of_the_new_passages(setup):
    model, tokenizer, new, passages, _ = setup
    from edmem_hf.collator import EDMemMaskingCollator
    from edmem_hf.research.row_fitting import _labelled_passage

    grown, _, _, _ = tiny_model_with_entities(20)
    grown.load_state_dict(model.state_dict())
    ids = add_entities(grown, new, passages, tokenizer)
    examples = [{**_labelled_passage(text, i, tokenizer, grown.config.entity_start_token_id, 64), "example_index": n}
                for n, (i, texts) in enumerate(zip(ids, passages)) for text in texts]  # fmt: skip
    batch = EDMemMaskingCollator(tokenizer, seed=1)(examples)

    def loss(m):
        with torch.no_grad():
            return m.train()(**batch).loss.item()

    before = loss(grown)
    fit_new_entities(model, new, passages, tokenizer, steps=30, learning_rate=0.05, seed=0)
    assert loss(model) < before


def test_the_fit_is_deterministic_under_a_seed(setup):
    model, tokenizer, new, passages, negatives = setup
    state = _state(model)
    rows = []
    for seed in (0, 0, 1):
        model.load_state_dict(state)
        grown, _, _, _ = tiny_model_with_entities(20)
        grown.load_state_dict(state)
        fit_new_entities(grown, new, passages, tokenizer, negatives, steps=4, learning_rate=0.05, seed=seed)
        rows.append(grown.get_encoder().entity_embeddings.weight[-2:].detach().clone())
    assert torch.equal(rows[0], rows[1]) and not torch.equal(rows[0], rows[2])


def test_initial_rows_may_be_given(setup):
    """`rows=` is where the fit starts: the result is `fit_rows` run from those rows, not from the mean queries."""
    from edmem_hf.research.row_fitting import _labelled_passage, fit_rows

    model, tokenizer, new, passages, _ = setup
    state = _state(model)
    rows = torch.randn(2, model.config.entity_embed_dim, generator=torch.Generator().manual_seed(3))
    ids = fit_new_entities(model, new, passages, tokenizer, rows=rows, steps=3, learning_rate=0.05, seed=2)
    fitted = model.get_encoder().entity_embeddings.weight[ids].detach()

    def fit_from(start):
        grown, _, _, _ = tiny_model_with_entities(20)
        grown.load_state_dict(state)
        if start is None:
            add_entities(grown, new, passages, tokenizer)
        else:
            add_entities(grown, new, rows=start)
        examples = [_labelled_passage(text, i, tokenizer, grown.config.entity_start_token_id, 64)
                    for i, texts in zip(ids, passages) for text in texts]  # fmt: skip
        fit_rows(grown, ids, examples, [], tokenizer, steps=3, learning_rate=0.05, seed=2)
        return grown.get_encoder().entity_embeddings.weight[ids].detach()

    assert torch.equal(fitted, fit_from(rows))
    assert not torch.allclose(fitted, fit_from(None))  # from the mean queries it ends elsewhere
    assert not torch.allclose(fitted, rows)  # and the fit moved them


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(steps=0), "steps=0"),
        (dict(learning_rate=-1.0), "learning_rate=-1.0"),
        (dict(passages_cut=True), "2 names but 1 passage lists"),
        (dict(negatives={"Nobody Known": ["<E_s> Nobody Known <E_e> x"]}), "'Nobody Known' is not in"),
        (dict(no_marker=True), "no marked mention of"),
        (dict(known_name=True), "already in the vocabulary"),
    ],
)
def test_bad_input_is_named(setup, change, message):
    model, tokenizer, new, passages, _ = setup
    kwargs = {key: value for key, value in change.items() if key in ("steps", "learning_rate", "negatives")}
    if change.get("passages_cut"):
        passages = passages[:1]
    if change.get("no_marker"):
        passages = [[text.replace("<E_s>", "").replace("<E_e>", "") for text in texts] for texts in passages]
    if change.get("known_name"):
        new = [model.entity_vocab.names[0], new[1]]
    size = model.config.entity_vocab_size
    with pytest.raises(ValueError, match=message):
        fit_new_entities(model, new, passages, tokenizer, **kwargs)
    assert model.config.entity_vocab_size == size  # nothing added


def test_edmem_add_entities_fits_the_rows_when_asked(setup, tmp_path, capsys):
    from transformers import AutoModelForSeq2SeqLM

    from edmem_hf.cli import main

    _, tokenizer, _, _, _ = setup
    model, people, known, dump = saved_model_and_unknown_people(tokenizer, tmp_path)
    args = ["add-entities", "--model", str(tmp_path / "model"), "--dump", dump]
    assert main(args + ["--out", str(tmp_path / "fitted"), "--estimator", "fitted", "--fit_steps", "3"]) == 0
    assert main(args + ["--out", str(tmp_path / "mean")]) == 0  # the default: the mean query, no gradient step
    assert f"added 3 entities (ids {len(known)}..{len(known) + 2})" in capsys.readouterr().out
    fitted = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "fitted")
    mean = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "mean")
    assert fitted.entity_vocab.names == mean.entity_vocab.names == known + sorted(people)
    fitted_table, mean_table = fitted.model.entity_embeddings.weight, mean.model.entity_embeddings.weight
    assert torch.equal(fitted_table[: len(known)], mean_table[: len(known)])  # trained rows as they were
    assert not torch.allclose(fitted_table[len(known) :], mean_table[len(known) :])  # the fit moved the new ones


def _labelled(tokenizer, text: str, labels: list[int]) -> dict:
    """A pre-training example: `text`'s tokens, `labels[i]` at its i-th `<E_s>` (every mention labelled)."""
    ids = tokenizer(text).input_ids
    start = tokenizer.convert_tokens_to_ids("<E_s>")
    marks = iter(labels)
    return {"input_ids": ids, "entity_labels": [next(marks) if token == start else -100 for token in ids]}


def test_fit_rows_on_pretraining_examples_moves_the_new_rows_only(setup):
    from edmem_hf.research.row_fitting import fit_rows

    model, tokenizer, new, passages, negatives = setup
    names = model.entity_vocab.names
    trained = _state(model)
    ids = add_entities(model, new, passages, tokenizer)
    start = model.get_encoder().entity_embeddings.weight.detach().clone()
    before = _state(model)
    # a passage about a new entity that also mentions a trained one, both labelled, as build-corpus marks them
    about_new = [_labelled(tokenizer, f"<E_s> {new[0]} <E_e> lives in <E_s> {names[5]} <E_e>", [ids[0], 5]),
                 _labelled(tokenizer, f"<E_s> {new[1]} <E_e> met <E_s> {names[6]} <E_e>", [ids[1], 6])]  # fmt: skip
    others = [_labelled(tokenizer, f"<E_s> {names[3]} <E_e> and <E_s> {names[4]} <E_e>", [3, 4])]
    fit_rows(model, ids, about_new, others, tokenizer, steps=4, learning_rate=0.05, seed=1)
    table = model.get_encoder().entity_embeddings.weight
    assert torch.equal(table[: ids[0]], start[: ids[0]]) and not torch.allclose(table[ids[0] :], start[ids[0] :])
    for name, tensor in model.state_dict().items():
        if "entity_embeddings" not in name:
            assert torch.equal(tensor, before[name]), name
    # deterministic under the seed
    again, _, _, _ = tiny_model_with_entities(20)
    again.load_state_dict(trained)
    add_entities(again, new, rows=start[ids[0] :])
    fit_rows(again, ids, about_new, others, tokenizer, steps=4, learning_rate=0.05, seed=1)
    assert torch.equal(again.get_encoder().entity_embeddings.weight, table)


def test_fit_rows_names_bad_input(setup):
    from edmem_hf.research.row_fitting import fit_rows

    model, tokenizer, new, passages, _ = setup
    ids = add_entities(model, new, passages, tokenizer)
    example = _labelled(tokenizer, f"<E_s> {new[0]} <E_e> x", [ids[0]])
    with pytest.raises(ValueError, match="must be the table's last rows"):
        fit_rows(model, [0], [example], [], tokenizer, steps=1)
    with pytest.raises(ValueError, match="no example passage about the new entities"):
        fit_rows(model, ids, [], [example], tokenizer, steps=1)
    with pytest.raises(ValueError, match="steps=0"):
        fit_rows(model, ids, [example], [], tokenizer, steps=0)
