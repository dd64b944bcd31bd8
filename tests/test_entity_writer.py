"""The writer of entity rows (`EDMemConfig.entity_row_writer`): the memory reading written rows beside the table
equals the dense formula over the table with those rows copied in; with the option off nothing changes; the writer
is saved, loaded and shipped as Hub code."""

from __future__ import annotations

import json

import pytest
import torch
from huggingface_hub.errors import StrictDataclassClassValidationError
from transformers import AutoModelForSeq2SeqLM

from edmem_hf import EDMemForConditionalGeneration, EntityVocab
from edmem_hf.entity_attention import WrittenRows, dense_entity_attention, entity_attention
from edmem_hf.entity_writer import writer_input_ids
from edmem_hf.research.entity_growth import add_entities, memory_queries, writer_inputs
from edmem_hf.research.writer_batches import TrainingRowsToWrite, TrainingWrittenRows, packed
from tiny_models import (
    BOS,
    EE,
    EOS,
    ES,
    PAD,
    make_word_tokenizer,
    make_words,
    run_without_the_package,
    saved_model_and_unknown_people,
    tiny_batch,
    tiny_config,
    tiny_model,
)

# Two writer inputs `<s> <E_s> name <E_e> passage </s>` over the tiny vocabulary, the second padded.
WRITER_INPUTS = torch.tensor([[BOS, ES, 10, 11, EE, 12, 13, 14, EOS], [BOS, ES, 15, EE, 16, 17, EOS, PAD, PAD]])
WRITTEN_IDS = torch.tensor([7, 30])  # entity 7 is labelled in the input of tiny_batch, 30 in its target


def writer_fields() -> dict[str, torch.Tensor]:
    mask = (WRITER_INPUTS != PAD).long()
    return {"written_entity_ids": WRITTEN_IDS, "writer_input_ids": WRITER_INPUTS, "writer_attention_mask": mask}


def to_write(**fields) -> dict[str, TrainingRowsToWrite]:
    """The model's `rows_to_write` from a training batch's writer fields (`writer_batches.packed`)."""
    return packed(fields)


# --- the memory's maths ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("with_mask", [False, True])
def test_written_rows_read_beside_the_table_equal_the_dense_formula(with_mask):
    """Read, log-partition, NLL (golds with and without a written row) and gradients of queries, table and written
    rows: the chunked pass over the table plus the dense pass over the written rows equal the dense formula over
    the table with the written rows copied over their ids."""
    torch.manual_seed(0)
    num_mentions, num_entities, dim = 9, 53, 12
    queries = torch.randn(num_mentions, dim, dtype=torch.float64, requires_grad=True)
    table = torch.randn(num_entities, dim, dtype=torch.float64, requires_grad=True)
    ids = torch.tensor([3, 17, 40, 41])
    rows = torch.randn(len(ids), dim, dtype=torch.float64, requires_grad=True)
    mask = torch.rand(num_entities) > 0.3 if with_mask else None
    if mask is not None:
        mask[[3, 17, 5]] = True
        mask[[40, 41, 22]] = False  # a written row is read even where its table row is hidden; 22 has none
    gold = torch.tensor([3, 17, 40, 5, 8, 3, 22, -100, 17])
    upstream = torch.randn(num_mentions, dim, dtype=torch.float64)
    written = WrittenRows(ids, rows)

    def run(fast: bool):
        queries.grad = table.grad = rows.grad = None
        if fast:
            read, lse, nll, _, _ = entity_attention(
                queries, table, labels=gold, entity_mask=mask, chunk_size=10, written_rows=written
            )
        else:
            read, lse = dense_entity_attention(queries, table, mask, written)
            full = table.index_copy(0, ids, rows)
            shown = mask.index_fill(0, ids, True) if mask is not None else torch.ones(num_entities, dtype=torch.bool)
            labelled = (gold >= 0) & shown[gold.clamp_min(0)]
            nll = lse.double()[labelled] - (queries[labelled] * full[gold[labelled]]).sum(-1)
        ((read * upstream).sum() + nll.sum()).backward()
        return read.detach(), lse.detach().double(), nll.detach().double(), queries.grad, table.grad, rows.grad

    fast, dense = run(True), run(False)
    shown = mask.index_fill(0, ids, True) if mask is not None else torch.ones(num_entities, dtype=torch.bool)
    # a gold whose table row is hidden and who has no written row (22) is no one's: no loss
    assert fast[2].numel() == int(((gold >= 0) & shown[gold.clamp_min(0)]).sum()) == 8 - (mask is not None)
    for name, a, b in zip(("read", "lse", "nll", "d queries", "d table", "d rows"), fast, dense):
        assert torch.allclose(a, b, atol=1e-4), name
    assert fast[4][ids].abs().max() == 0  # the replaced table rows are not read
    assert fast[5].abs().max() > 0


def test_written_rows_in_the_top_k_read_and_report():
    """At inference (top-k read) the written rows compete with the table's rows as if copied into it."""
    torch.manual_seed(1)
    queries, table = torch.randn(6, 8), torch.randn(40, 8)
    ids, rows = torch.tensor([2, 9, 33]), torch.randn(3, 8) * 3  # long rows: they win top-k places
    mask = torch.ones(40, dtype=torch.bool)
    mask[[5, 9, 33]] = False  # 9 and 33: hidden table rows, shown written ones
    result = entity_attention(queries, table, entity_mask=mask, top_k=5, chunk_size=7, return_top_k=5,
                              written_rows=WrittenRows(ids, rows))  # fmt: skip
    full = table.index_copy(0, ids, rows)
    scores = (queries @ full.t()).masked_fill(~mask.index_fill(0, ids, True), float("-inf"))
    expected_scores, expected_ids = scores.topk(5, dim=1)
    assert torch.equal(result.top_ids, expected_ids)
    assert torch.allclose(result.top_scores, expected_scores, atol=1e-5)
    assert set(result.top_ids.flatten().tolist()) >= {2, 9, 33} and 5 not in result.top_ids
    weights = torch.softmax(expected_scores, dim=-1)
    assert torch.allclose(result.read, torch.einsum("mk,mkd->md", weights, full[expected_ids]), atol=1e-5)


def test_an_entity_of_several_written_rows_reads_each_and_is_scored_by_all():
    """An id given several times in `WrittenRows` (a row a passage): the attention spreads over each of its rows as
    over table rows, the replaced table row is not read, and the gold's score is the log-sum-exp of its rows', in
    the full read (read, log-partition, NLL, gradients against the dense formula) and in the top-k read."""
    torch.manual_seed(3)
    queries = torch.randn(7, 10, dtype=torch.float64, requires_grad=True)
    table = torch.randn(31, 10, dtype=torch.float64, requires_grad=True)
    ids = torch.tensor([4, 4, 4, 9, 20, 20])
    rows = torch.randn(len(ids), 10, dtype=torch.float64, requires_grad=True)
    gold = torch.tensor([4, 9, 20, 5, -100, 4, 20])
    written = WrittenRows(ids, rows)
    upstream = torch.randn(7, 10, dtype=torch.float64)

    def run(fast: bool):
        queries.grad = table.grad = rows.grad = None
        if fast:
            read, lse, nll, _, _ = entity_attention(queries, table, labels=gold, chunk_size=8, written_rows=written)
        else:
            read, lse = dense_entity_attention(queries, table, written_rows=written)
            scores = torch.cat([queries @ table.t(), queries @ rows.t()], dim=1)  # table columns, then written rows
            owner = torch.cat([torch.arange(31), ids])
            replaced = torch.isin(torch.arange(31), ids)
            gold_columns = (owner[None] == gold[:, None]) & ~torch.cat([replaced, torch.zeros(6, dtype=torch.bool)])
            labelled = gold >= 0
            nll = lse.double()[labelled] - scores.masked_fill(~gold_columns, float("-inf")).logsumexp(-1)[labelled]
        ((read * upstream).sum() + nll.sum()).backward()
        return read.detach(), lse.detach().double(), nll.detach().double(), queries.grad, table.grad, rows.grad

    fast, dense = run(True), run(False)
    for name, a, b in zip(("read", "lse", "nll", "d queries", "d table", "d rows"), fast, dense):
        assert torch.allclose(a, b, atol=1e-6), name
    assert fast[4][ids].abs().max() == 0 and (fast[5].abs().sum(-1) > 0).all()  # every written row is read
    # top-k: each row competes on its own, an entity may hold several places
    with torch.no_grad():
        result = entity_attention(queries, table, top_k=6, return_top_k=6, chunk_size=8, written_rows=written)
        columns = torch.cat([table.index_fill(0, ids, 0.0), rows])
        scores = (queries @ columns.t()).masked_fill(
            torch.cat([torch.isin(torch.arange(31), ids), torch.zeros(6, dtype=torch.bool)]), float("-inf")
        )
        best, where = scores.topk(6, dim=1)
        assert torch.allclose(result.top_scores.double(), best, atol=1e-6)
        assert torch.equal(result.top_ids, torch.cat([torch.arange(31), ids])[where])
        expected = torch.einsum("mk,mkd->md", torch.softmax(best, dim=-1), columns[where])
        assert torch.allclose(result.read, expected, atol=1e-6)


def test_gold_rows_narrow_a_gold_entity_s_score_to_the_rows_that_answer():
    """`gold_rows` (the rows whose passage names what a query's passage hides): a query whose gold entity has rows
    among them is scored by those alone, one whose gold has none there by all of its rows; the log-partition and the
    read do not change; gradients reach the chosen rows."""
    torch.manual_seed(5)
    queries = torch.randn(5, 8, dtype=torch.float64)
    table = torch.randn(12, 8, dtype=torch.float64)
    ids = torch.tensor([3, 3, 3, 7, 7])
    rows = torch.randn(5, 8, dtype=torch.float64, requires_grad=True)
    gold = torch.tensor([3, 3, 7, 7, 2])
    gold_rows = torch.tensor(
        [
            [0, 1, 0, 0, 0],  # query 0: entity 3's second row
            [0, 1, 1, 1, 0],  # query 1: entity 3's second and third (entity 7's row is not its gold)
            [1, 1, 1, 0, 0],  # query 2: none of entity 7's rows: all of them
            [0, 0, 0, 0, 1],  # query 3: entity 7's second
            [1, 1, 1, 1, 1],
        ],
        dtype=torch.bool,
    )  # query 4: a table entity
    written = WrittenRows(ids, rows)
    plain = entity_attention(queries, table, labels=gold, chunk_size=4, written_rows=written)
    narrowed = entity_attention(queries, table, labels=gold, chunk_size=4, written_rows=written, gold_rows=gold_rows)
    scores = queries @ rows.t()
    expected_gold = torch.stack([scores[0, 1], scores[1, 1:3].logsumexp(0), scores[2, 3:].logsumexp(0), scores[3, 4],
                                 queries[4] @ table[2]])  # fmt: skip
    assert torch.allclose(narrowed.nll.double(), narrowed.log_partition.double() - expected_gold, atol=1e-6)
    assert torch.allclose(narrowed.read, plain.read) and torch.allclose(narrowed.log_partition, plain.log_partition)
    assert (
        torch.allclose(narrowed.nll[[2, 4]], plain.nll[[2, 4]])
        and (narrowed.nll[[0, 1, 3]] > plain.nll[[0, 1, 3]]).all()
    )
    narrowed.nll.sum().backward()
    assert (rows.grad.abs().sum(-1) > 0).all()
    every = torch.ones_like(gold_rows)  # every row answers: the entity's rows all count, as without gold_rows
    assert torch.allclose(entity_attention(queries, table, labels=gold, written_rows=written, gold_rows=every).nll,
                          plain.nll)  # fmt: skip


# --- the model -------------------------------------------------------------------------------------------------


def test_mean_row_probability_gives_an_entity_the_mean_of_its_rows_probabilities():
    """`WrittenRows(mean_probability=True)`: each row's score less log(rows of its entity). Fast equals dense (read,
    log-partition, NLL with a gold among the answering rows, gradients; top-k ids, scores and read), both equal
    the hand formula, and an entity whose row is given three times reads and scores as if given once, where
    without the option the copies triple its probability."""
    torch.manual_seed(6)
    queries = torch.randn(6, 8, dtype=torch.float64, requires_grad=True)
    table = torch.randn(25, 8, dtype=torch.float64, requires_grad=True)
    ids = torch.tensor([4, 4, 4, 9, 20, 20])
    rows = torch.randn(len(ids), 8, dtype=torch.float64, requires_grad=True)
    gold = torch.tensor([4, 9, 20, 5, 4, -100])
    gold_rows = torch.zeros(6, 6, dtype=torch.bool)
    gold_rows[0, 1] = True  # query 0: entity 4's second row alone
    written = WrittenRows(ids, rows, mean_probability=True)
    assert torch.allclose(written.row_score_offsets(), -torch.tensor([3.0, 3, 3, 1, 2, 2]).log())
    upstream = torch.randn(6, 8, dtype=torch.float64)

    def run(fast: bool):
        queries.grad = table.grad = rows.grad = None
        if fast:
            read, lse, nll, _, _ = entity_attention(
                queries, table, labels=gold, chunk_size=7, written_rows=written, gold_rows=gold_rows
            )
        else:
            read, lse = dense_entity_attention(queries, table, written_rows=written)
            offsets = -torch.tensor([3.0, 3, 3, 1, 2, 2], dtype=torch.float64).log()
            table_scores = (queries @ table.t()).masked_fill(torch.isin(torch.arange(25), ids), float("-inf"))
            row_scores = queries @ rows.t() + offsets
            assert torch.allclose(lse.double(), torch.cat([table_scores, row_scores], 1).logsumexp(-1))
            own = ids[None] == gold[:, None]
            own[0] = gold_rows[0]
            gold_scores = torch.where(
                own.any(-1), row_scores.masked_fill(~own, float("-inf")).logsumexp(-1),
                table_scores.gather(1, gold.clamp_min(0)[:, None])[:, 0],
            )  # fmt: skip
            nll = (lse.double() - gold_scores)[gold >= 0]
        ((read * upstream).sum() + nll.sum()).backward()
        return read.detach(), lse.detach().double(), nll.detach().double(), queries.grad, table.grad, rows.grad

    fast, dense = run(True), run(False)
    for name, a, b in zip(("read", "lse", "nll", "d queries", "d table", "d rows"), fast, dense):
        assert torch.allclose(a, b, atol=1e-6), name
    with torch.no_grad():
        result = entity_attention(queries, table, top_k=5, return_top_k=5, chunk_size=7, written_rows=written)
        columns = torch.cat([table, rows])
        offsets = torch.cat([torch.zeros(25, dtype=torch.float64), written.row_score_offsets().double()])
        hidden = torch.cat([torch.isin(torch.arange(25), ids), torch.zeros(6, dtype=torch.bool)])
        best, where = (queries @ columns.t() + offsets).masked_fill(hidden, float("-inf")).topk(5, dim=1)
        assert torch.equal(result.top_ids, torch.cat([torch.arange(25), ids])[where])
        assert torch.allclose(result.top_scores.double(), best, atol=1e-6)
        expected = torch.einsum("mk,mkd->md", torch.softmax(best, dim=-1), columns[where])
        assert torch.allclose(result.read, expected, atol=1e-6)

        # an entity's row given three times: with the option, as if once; without it, not
        once = torch.tensor([4, 9]), rows[[0, 3]]
        thrice = torch.tensor([4, 4, 4, 9]), rows[[0, 0, 0, 3]]
        labels = torch.tensor([4, 9, 5, 4, 9, 20])

        def attend(given, mean):
            out = entity_attention(
                queries, table, labels=labels, written_rows=WrittenRows(*given, mean_probability=mean)
            )
            return out.read, out.nll

        for a, b in zip(attend(once, True), attend(thrice, True)):
            assert torch.allclose(a, b, atol=1e-9)
        assert not torch.allclose(attend(once, False)[1], attend(thrice, False)[1], atol=1e-3)


def test_with_the_option_off_the_model_is_unchanged():
    """Off (the default): no writer and no new weight; on, a model reads exactly what the same weights read off,
    until written rows are passed, and an empty set of written rows changes nothing either."""
    off = tiny_model(seed=3)
    assert off.entity_writer is None and not any("writer" in key for key in off.state_dict())
    on = tiny_model(seed=3, entity_row_writer=True)
    missing, unexpected = on.load_state_dict(off.state_dict(), strict=False)
    assert not unexpected and missing and all(key.startswith("entity_writer.") for key in missing)
    batch = tiny_batch()
    empty = {"written_entity_ids": torch.zeros(0, dtype=torch.long),
             "writer_input_ids": torch.zeros(0, 4, dtype=torch.long)}  # fmt: skip
    for train in (True, False):
        off.train(train), on.train(train)
        expected = off(**batch, output_attended_entities=True)
        for model, extra in ((on, {}), (on, empty), (off, empty)):
            out = model(**batch, output_attended_entities=True, **(to_write(**extra) if extra else {}))
            for field in ("logits", "loss", "lm_loss", "entity_loss"):
                assert torch.equal(getattr(out, field), getattr(expected, field)), field
            for access in ("encoder_attended_entities", "decoder_attended_entities", "linked_entities"):
                assert torch.equal(getattr(out, access).top_entity_scores, getattr(expected, access).top_entity_scores)
    # and the written rows, when given, are what the memory reads
    on.train()
    with_rows = on(**batch, **to_write(**writer_fields()))
    assert not torch.equal(with_rows.logits, expected.logits)


def test_a_handed_row_is_the_encoder_memorys_read_at_its_mention():
    """`WrittenRows.read_at`: at the mentions it names, the encoder's memory reads the written row itself, as a memory
    whose only visible row is that one would; elsewhere it searches as before; the decoder's memory never."""
    torch.manual_seed(2)
    model = tiny_model(seed=2, entity_row_writer=True).train()
    memory = model.model.encoder.memory
    batch = tiny_batch()
    hidden = torch.randn(*batch["input_ids"].shape, model.config.d_model)
    mentions = batch["input_ids"] == ES
    table = model.model.entity_embeddings.weight.detach()
    ids, rows = torch.tensor([7, 12]), torch.randn(2, table.shape[1])
    read_at = torch.full_like(batch["input_ids"], -100)
    read_at[0, 7] = 12  # the second mention of row 0, labelled 12
    handed, _ = memory(hidden, mentions, table, written_rows=TrainingWrittenRows(ids, rows, False, read_at))
    searched, _ = memory(hidden, mentions, table, written_rows=WrittenRows(ids, rows))
    only = torch.zeros(table.shape[0], dtype=torch.bool)
    only[12] = True
    alone, _ = memory(hidden, mentions, table.index_copy(0, torch.tensor([12]), rows[1:]), entity_mask=only)
    assert torch.allclose(handed[0, 7], alone[0, 7], atol=1e-6) and not torch.allclose(handed[0, 7], searched[0, 7])
    others = torch.ones_like(mentions)
    others[0, 7] = False
    assert torch.equal(handed[others], searched[others])
    # an entity of several written rows hands the query's attention over its rows alone
    several = TrainingWrittenRows(torch.tensor([7, 12, 12]), torch.randn(3, table.shape[1]), False, read_at)
    handed, _ = memory(hidden, mentions, table, written_rows=several)
    both = table.index_copy(0, torch.tensor([12, 13]), several.rows[1:])
    only[13] = True
    alone, _ = memory(hidden, mentions, both, entity_mask=only)
    assert torch.allclose(handed[0, 7], alone[0, 7], atol=1e-6)
    # through the model: the handed read reaches the writer's gradient; an entity without a written row is refused
    fields = {**writer_fields(), "written_read_entity_ids": torch.full_like(batch["input_ids"], -100)}
    fields["written_read_entity_ids"][0, 2] = 7
    out = model(**batch, **to_write(**fields))
    assert not torch.equal(out.logits, model(**batch, **to_write(**writer_fields())).logits)
    fields["written_read_entity_ids"][0, 7] = 12
    with pytest.raises(ValueError, match="no written row"):
        model(**batch, **to_write(**fields))


def test_written_rows_train_the_writer_and_replace_the_table_rows():
    model = tiny_model(seed=4, entity_row_writer=True).train()
    out = model(**tiny_batch(), **to_write(**writer_fields()))
    out.loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.entity_writer.parameters())
    table_grad = model.model.entity_embeddings.weight.grad
    assert table_grad[WRITTEN_IDS].abs().max() == 0 and table_grad.abs().max() > 0


def handed_at_7(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """`written_read_entity_ids` handing entity 7's written rows to its mention in `tiny_batch`'s first input."""
    handed = torch.full_like(batch["input_ids"], -100)
    handed[0, 2] = 7
    return handed


def test_rows_that_answer_are_the_gold_of_their_examples_mentions_in_the_model():
    """`written_rows_answering` (batch, K): with a row a text, each example's mentions of an entity with several rows
    take those it marks as their gold; marking every row changes nothing, marking one raises the linking loss; a
    pooled model has one row an entity and ignores it; a wrong shape is refused."""
    fields = {**writer_fields(), "written_entity_ids": torch.tensor([7, 7])}
    batch = tiny_batch()
    apart = tiny_model(seed=4, entity_row_writer=True, writer_pools_texts=False).eval()
    every = torch.ones(batch["input_ids"].shape[0], 2, dtype=torch.bool)
    one = every.clone()
    one[:, 1] = False
    with torch.no_grad():
        plain = apart(**batch, **to_write(**fields))
        assert torch.equal(apart(**batch, **to_write(**fields, written_rows_answering=every)).loss, plain.loss)
        narrowed = apart(**batch, **to_write(**fields, written_rows_answering=one))
        assert narrowed.entity_loss > plain.entity_loss and torch.equal(narrowed.logits, plain.logits)
        pooled = tiny_model(seed=4, entity_row_writer=True).eval()
        assert torch.equal(
            pooled(**batch, **to_write(**fields, written_rows_answering=one)).loss,
            pooled(**batch, **to_write(**fields)).loss,
        )
    # read_answering_rows: those mentions read the marked rows alone (entity 7's first row), not the memory's mix
    with torch.no_grad():
        read = apart(**batch, **to_write(**fields, written_rows_answering=one, read_answering_rows=True))
    assert torch.allclose(read.entity_loss, narrowed.entity_loss, atol=1e-3)  # the gold is unchanged
    memory, mentions = apart.model.encoder.memory, batch["input_ids"] == ES
    hidden = torch.randn(*batch["input_ids"].shape, apart.config.d_model)
    rows = torch.randn(2, apart.config.entity_embed_dim)
    table = apart.model.entity_embeddings.weight.detach()
    with torch.no_grad():
        given, _ = memory(hidden, mentions, table, batch["entity_labels"],
                          written_rows=TrainingWrittenRows(torch.tensor([7, 7]), rows, False, None, one, True))  # fmt: skip
        first, _ = memory(hidden, mentions, table, batch["entity_labels"],
                          written_rows=TrainingWrittenRows(torch.tensor([7]), rows[:1], False, handed_at_7(batch)))  # fmt: skip
        mixed, _ = memory(hidden, mentions, table, batch["entity_labels"],
                          written_rows=TrainingWrittenRows(torch.tensor([7, 7]), rows, False, None, one))  # fmt: skip
    assert torch.allclose(given[0, 2], first[0, 2]) and not torch.allclose(given[0, 2], mixed[0, 2])
    with pytest.raises(ValueError, match="read_answering reads the rows of answering"):
        apart(**batch, **to_write(**fields, read_answering_rows=True))
    with pytest.raises(ValueError, match="needs a column for each of the 2 entity_ids"):
        apart(**batch, **to_write(**fields, written_rows_answering=every[:, :1]))


def test_bad_written_entity_fields_raise():
    model = tiny_model(entity_row_writer=True)
    fields = writer_fields()
    with pytest.raises(ValueError, match=r"must be ids in 0\.\.39"):
        model(**tiny_batch(), **to_write(**{**fields, "written_entity_ids": torch.tensor([7, 400])}))
    with pytest.raises(ValueError, match="one row per entity"):
        model(**tiny_batch(), **to_write(written_entity_ids=torch.tensor([7]), writer_input_ids=WRITER_INPUTS))
    with pytest.raises(ValueError, match="has no <E_s>"):
        model.write_entity_rows(torch.tensor([[BOS, 10, 11, EOS]]))
    with pytest.raises(ValueError, match="no entity row writer"):
        tiny_model().write_entity_rows(WRITER_INPUTS)
    with pytest.raises(StrictDataclassClassValidationError, match="entity_row_writer is built on the full EDMem"):
        tiny_config(variant="encmem", entity_row_writer=True)


def test_writer_input_drops_the_passage_markers_and_keeps_the_first_mention():
    config = tiny_config()
    passage = [BOS, 20, 21, 22, 23, 24, 25, ES, 30, 31, EE, 26, 27, 28, EOS]
    assert writer_input_ids([30, 31], passage, config, 40, BOS) == [BOS, ES, 30, 31, EE, 20, 21, 22, 23, 24, 25, 30,
                                                                     31, 26, 27, 28, EOS]  # fmt: skip
    short = writer_input_ids([30, 31], passage, config, 11, BOS)
    assert len(short) == 11 and short[:5] == [BOS, ES, 30, 31, EE] and short[-1] == EOS
    assert short[5:10] == [24, 25, 30, 31, 26]  # cut around the passage's first mention
    with pytest.raises(ValueError, match="cannot hold the name"):
        writer_input_ids([30, 31, 32], passage, config, 5, BOS)


# --- saving ----------------------------------------------------------------------------------------------------


def test_the_writer_is_saved_loaded_and_runs_as_hub_code_without_the_package(tmp_path):
    model = tiny_model(seed=5, entity_row_writer=True).eval()
    with torch.no_grad():
        for parameter in model.entity_writer.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.1)
    folder = tmp_path / "edmem-writer"
    model.save_pretrained(folder)
    assert (folder / "entity_writer.py").exists()
    assert json.loads((folder / "config.json").read_text())["entity_row_writer"] is True
    loaded, info = AutoModelForSeq2SeqLM.from_pretrained(folder, output_loading_info=True)
    assert isinstance(loaded, EDMemForConditionalGeneration) and not any(info.values())
    expected = model.write_entity_rows(WRITER_INPUTS, writer_fields()["writer_attention_mask"])
    assert torch.equal(loaded.eval().write_entity_rows(WRITER_INPUTS, writer_fields()["writer_attention_mask"]),
                       expected)  # fmt: skip
    script = f"""
        import json
        import torch
        from transformers import AutoModelForSeq2SeqLM
        model, info = AutoModelForSeq2SeqLM.from_pretrained({str(folder)!r}, trust_remote_code=True,
                                                            output_loading_info=True)
        ids = torch.tensor({WRITER_INPUTS.tolist()})
        print(type(model).__module__, sorted(key for keys in info.values() for key in keys))
        print(json.dumps(model.eval().write_entity_rows(ids, (ids != {PAD}).long()).tolist()))
        """
    header, rows = run_without_the_package(script, tmp_path).stdout.strip().splitlines()[-2:]
    assert header.startswith("transformers_modules") and header.endswith("[]")
    assert torch.allclose(torch.tensor(json.loads(rows)), expected, atol=1e-6)


# --- growth with the writer ------------------------------------------------------------------------------------


def test_add_entities_writes_each_row_as_the_mean_of_its_texts_rows():
    """Batched and padded (texts sorted by length, several entities a batch), each new row is the mean of the rows
    the writer makes of `<s> <E_s> name <E_e> text </s>` for each of its texts, one at a time and unpadded."""
    tokenizer = make_word_tokenizer(bart_template=True)
    words = make_words(400)
    start, end = tokenizer.convert_tokens_to_ids(["<E_s>", "<E_e>"])
    model = tiny_model(seed=6, vocab_size=len(tokenizer), entity_vocab_size=5, entity_start_token_id=start,
                       entity_end_token_id=end, entity_row_writer=True).eval()  # fmt: skip
    model.entity_vocab = EntityVocab(words[:5])
    names = [f"{words[10]} {words[11]}", words[12], words[13]]
    texts = [[" ".join(words[20:30]), f"{words[31]} <E_s> {names[0]} <E_e> {words[32]}"], [words[40]],
             [" ".join(words[50:53]), " ".join(words[53:70]), words[71]]]  # fmt: skip
    table = model.model.entity_embeddings.weight.detach().clone()
    ids = add_entities(model, names, texts, tokenizer, batch_size=2)  # the writer: the default of a writer model
    assert ids == [5, 6, 7]
    grown = model.model.entity_embeddings.weight.detach()
    assert torch.equal(grown[:5], table)
    for i, (name, own) in enumerate(zip(names, texts)):
        rows = []
        for text in own:
            passage = [t for t in tokenizer(text, add_special_tokens=False).input_ids if t not in (start, end)]
            marked = tokenizer(f"<E_s> {name} <E_e>", add_special_tokens=False).input_ids
            rows.append(model.write_entity_rows(torch.tensor([[tokenizer.bos_token_id, *marked, *passage, EOS]])))
        torch.testing.assert_close(grown[5 + i], torch.cat(rows).mean(0), atol=1e-5, rtol=1e-5)
    mean_query = tiny_model(seed=6, vocab_size=len(tokenizer), entity_vocab_size=5, entity_start_token_id=start,
                            entity_end_token_id=end, entity_row_writer=True).eval()  # fmt: skip
    mean_query.entity_vocab = EntityVocab(words[:5])
    add_entities(mean_query, names[1:2], [[f"<E_s> {names[1]} <E_e> {words[40]}"]], tokenizer, estimator="mean_query")
    expected = memory_queries(mean_query, [[f"<E_s> {names[1]} <E_e> {words[40]}"]], tokenizer)[0]
    assert torch.allclose(torch.nn.functional.cosine_similarity(mean_query.model.entity_embeddings.weight[5],
                                                                expected, dim=0), torch.tensor(1.0))  # fmt: skip
    with pytest.raises(ValueError, match="no writer of entity rows"):
        add_entities(tiny_model(vocab_size=len(tokenizer)), ["x y"], [["x y"]], tokenizer, estimator="writer")


def test_rows_kept_apart_are_read_as_a_batch_s_written_rows_and_saved_with_the_model(tmp_path):
    """`add_entities` on a model trained with a row a passage (`writer_pools_texts=False`) keeps the row of each text
    beside the table (`config.written_entity_rows`), each read as a row of its entity: the model's outputs are those
    of the same model reading the same texts as a batch's written rows; the table row is their mean; they are saved,
    loaded and hidden with their entity; a model that never kept any has no new weight."""
    tokenizer = make_word_tokenizer(bart_template=True)
    words = make_words(400)
    start, end = tokenizer.convert_tokens_to_ids(["<E_s>", "<E_e>"])
    shape = dict(vocab_size=len(tokenizer), entity_vocab_size=5, entity_start_token_id=start, entity_end_token_id=end,
                 entity_row_writer=True, writer_pools_texts=False)  # fmt: skip
    model = tiny_model(seed=7, **shape).eval()
    assert not any("written_row" in key for key in model.state_dict())
    model.entity_vocab = EntityVocab(words[:5])
    names = [f"{words[10]} {words[11]}", words[12]]
    texts = [[" ".join(words[20:30]), " ".join(words[30:33]), words[34]], [" ".join(words[40:45])]]
    plain = tiny_model(seed=7, **shape).eval()
    plain.entity_vocab = EntityVocab(words[:5])
    add_entities(plain, names, texts, tokenizer, rows_apart=False)
    assert plain.config.written_entity_rows == 0
    assert add_entities(model, names, texts, tokenizer) == [5, 6]  # apart: the model was trained to read rows so
    table = model.model.entity_embeddings
    assert model.config.written_entity_rows == 4 and table.written_row_entity_ids.tolist() == [5, 5, 5, 6]
    torch.testing.assert_close(table.weight[5:], plain.model.entity_embeddings.weight[5:], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(table.written_rows[:3].mean(0), table.weight[5], atol=1e-5, rtol=1e-5)
    # the kept rows are read as the same texts given to the model as a batch's written rows
    inputs = [ids for own in writer_inputs(model, names, texts, tokenizer) for ids in own]
    width = max(map(len, inputs))
    batch_rows = {
        "written_entity_ids": torch.tensor([5, 5, 5, 6]),
        "writer_input_ids": torch.tensor([ids + [PAD] * (width - len(ids)) for ids in inputs]),
        "writer_attention_mask": torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids in inputs]),
    }
    question = tokenizer(
        [f"{words[50]} <E_s> {names[0]} <E_e> {words[51]} <E_s> {names[1]} <E_e>"], return_tensors="pt"
    )
    target = tokenizer([f"<E_s> {names[0]} <E_e> {words[52]}"], return_tensors="pt").input_ids
    fields = dict(**question, labels=target, output_attended_entities=True)
    kept = model(**fields)
    as_batch = plain(**fields, **to_write(**batch_rows))
    torch.testing.assert_close(kept.logits, as_batch.logits, atol=1e-5, rtol=1e-5)
    assert torch.equal(
        kept.encoder_attended_entities.top_entity_ids, as_batch.encoder_attended_entities.top_entity_ids
    )
    assert not torch.allclose(kept.logits, plain(**fields).logits, atol=1e-4)  # the mean row reads otherwise
    # a batch's written rows of an entity stand in for all of its rows, the kept ones too
    first_texts = {key: value[[0, 3]] for key, value in batch_rows.items()}
    torch.testing.assert_close(
        model(**fields, **to_write(**first_texts)).logits, plain(**fields, **to_write(**first_texts)).logits
    )
    # saved and loaded with the model
    model.save_pretrained(tmp_path / "grown")
    loaded = EDMemForConditionalGeneration.from_pretrained(tmp_path / "grown").eval()
    assert loaded.config.written_entity_rows == 4
    assert torch.equal(loaded.model.entity_embeddings.written_rows, table.written_rows)
    assert torch.equal(loaded(**fields).logits, kept.logits)
    script = f"""
        import torch
        from transformers import AutoModelForSeq2SeqLM
        model = AutoModelForSeq2SeqLM.from_pretrained({str(tmp_path / "grown")!r}, trust_remote_code=True).eval()
        print(type(model).__module__, float(model(input_ids=torch.tensor({question.input_ids.tolist()}),
                                                  labels=torch.tensor({target.tolist()})).logits.sum()))
        """
    module, total = run_without_the_package(script, tmp_path).stdout.strip().splitlines()[-1].split()
    assert module.startswith("transformers_modules") and float(total) == pytest.approx(kept.logits.sum().item(), 1e-5)
    # hidden with their entity: no access finds entity 5 any more
    mask = torch.ones(7, dtype=torch.bool)
    mask[5] = False
    loaded.set_entity_mask(mask)
    hidden = loaded(**fields)

    def found(access) -> set[int]:  # the entities read with a finite score: a hidden one, if listed, has -inf
        return set(access.top_entity_ids[access.top_entity_scores > float("-inf")].tolist())

    assert 5 not in found(hidden.encoder_attended_entities) and 5 in found(kept.encoder_attended_entities)
    with pytest.raises(ValueError, match="rows_apart keeps the writer's row of each text"):
        add_entities(model, [words[90]], [[words[91]]], tokenizer, estimator="mean_query", rows_apart=True)


def test_with_mean_row_probability_an_entity_s_copies_of_a_row_count_once():
    """`writer_mean_row_probability`: a batch's written rows and the rows kept beside the table score an entity by
    the mean of its rows' probabilities, so that an entity written three times from the same text reads, links and
    scores as if written once (without it the copies change the outputs); it needs the writer."""
    tokenizer = make_word_tokenizer(bart_template=True)
    words = make_words(200)
    start, end = tokenizer.convert_tokens_to_ids(["<E_s>", "<E_e>"])
    shape = dict(vocab_size=len(tokenizer), entity_vocab_size=5, entity_start_token_id=start, entity_end_token_id=end,
                 entity_row_writer=True, writer_pools_texts=False)  # fmt: skip
    names, text = [f"{words[10]} {words[11]}", words[12]], " ".join(words[20:26])
    question = tokenizer(
        [f"{words[50]} <E_s> {names[0]} <E_e> {words[51]} <E_s> {names[1]} <E_e>"], return_tensors="pt"
    )
    target = tokenizer([f"<E_s> {names[0]} <E_e> {words[52]}"], return_tensors="pt").input_ids
    labels = torch.tensor([[-100] * question.input_ids.shape[1]])
    labels[question.input_ids == start] = torch.tensor([5, 6])
    fields = dict(**question, labels=target, entity_labels=labels, output_attended_entities=True)

    def outputs(mean: bool, copies: int):
        """The grown model's outputs with entity 5 kept as `copies` rows of one text, and a batch writing entity 1
        from `copies` copies of another."""
        model = tiny_model(seed=3, **shape, writer_mean_row_probability=mean).eval()
        model.entity_vocab = EntityVocab(words[:5])
        inputs = writer_inputs(model, [words[1]], [[" ".join(words[40:44])] * copies], tokenizer)[0]
        batch = {"written_entity_ids": torch.tensor([1] * copies), "writer_input_ids": torch.tensor(inputs),
                 "writer_attention_mask": torch.ones(copies, len(inputs[0]), dtype=torch.long)}  # fmt: skip
        with torch.no_grad():
            written_alone = model(**question, labels=target, **to_write(**batch))  # no kept rows yet
        add_entities(model, names, [[text] * copies, [words[30]]], tokenizer)
        assert model.config.written_entity_rows == copies + 1
        with torch.no_grad():
            kept, written = model(**fields), model(**fields, **to_write(**batch))
        return [written_alone.logits, kept.logits, kept.loss, written.logits, written.loss]

    for once, thrice in zip(outputs(True, 1), outputs(True, 3)):
        torch.testing.assert_close(once, thrice, atol=1e-5, rtol=1e-5)
    plain_once, plain_thrice = outputs(False, 1), outputs(False, 3)
    for differs in (0, 2, 4):
        assert not torch.allclose(plain_once[differs], plain_thrice[differs], atol=1e-4)
    with pytest.raises(StrictDataclassClassValidationError, match="writer_mean_row_probability .* needs entity_row_w"):
        tiny_config(writer_mean_row_probability=True)


def test_edmem_add_entities_writes_with_the_models_writer(tmp_path, capsys):
    from edmem_hf.cli import main
    from edmem_hf.dump import iter_parsed_pages
    from edmem_hf.research.entity_growth import writer_inputs, written_rows
    from edmem_hf.research.new_entity_text import new_entity_passages, own_page_sentences

    tokenizer = make_word_tokenizer(bart_template=True)
    model, people, known, dump = saved_model_and_unknown_people(tokenizer, tmp_path, entity_row_writer=True)
    assert (
        main(["add-entities", "--model", str(tmp_path / "model"), "--dump", dump, "--out", str(tmp_path / "grown")])
        == 0
    )
    assert f"added 3 entities (ids {len(known)}..{len(known) + 2})" in capsys.readouterr().out
    grown = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "grown").eval()
    assert grown.entity_writer is not None and grown.entity_vocab.names == known + sorted(people)
    names = sorted(people)
    # by default the writer writes from each sentence of the person's own page, not from the text around mentions
    pages = list(iter_parsed_pages(dump))
    sentences, (passages, _) = own_page_sentences(pages, names), new_entity_passages(pages, known)
    assert sorted(sentences) == names and all(len(sentences[n]) > 1 for n in names)
    assert all(text.endswith(".") and "<E_s>" not in text for n in names for text in sentences[n])
    assert all(sentences[n] != passages[n] for n in names)
    expected = written_rows(model.eval(), writer_inputs(model, names, [sentences[n] for n in names], tokenizer))
    torch.testing.assert_close(grown.model.entity_embeddings.weight.detach()[len(known) :], expected)
    around = ["add-entities", "--model", str(tmp_path / "model"), "--dump", dump, "--out", str(tmp_path / "around"),
              "--texts", "passages"]  # fmt: skip
    assert main(around) == 0
    from_passages = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "around").model.entity_embeddings.weight.detach()
    expected = written_rows(model, writer_inputs(model, names, [passages[n] for n in names], tokenizer))
    torch.testing.assert_close(from_passages[len(known) :], expected)
    mean_query = ["add-entities", "--model", str(tmp_path / "model"), "--dump", dump, "--out", str(tmp_path / "mq"),
                  "--estimator", "mean_query", "--texts", "own_sentences"]  # fmt: skip
    assert main(mean_query) == 1
    assert "--texts own_sentences is the writer's" in capsys.readouterr().err
    plain = tmp_path / "plain"
    saved_model_and_unknown_people(tokenizer, plain)
    failed = ["add-entities", "--model", str(plain / "model"), "--dump", dump, "--out", str(plain / "grown"),
              "--estimator", "writer"]  # fmt: skip
    with pytest.raises(ValueError, match="no writer of entity rows"):
        main(failed)
    # --rows_apart keeps the row of each passage beside the table
    apart = ["add-entities", "--model", str(tmp_path / "model"), "--dump", dump, "--out", str(tmp_path / "apart"),
             "--rows_apart"]  # fmt: skip
    assert main(apart) == 0
    kept = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "apart").model.entity_embeddings
    assert kept.written_row_entity_ids.tolist() == [
        len(known) + i for i, name in enumerate(names) for _ in sentences[name]
    ]


def test_the_writer_s_row_is_made_of_the_state_at_e_s_and_an_attention_pool_over_the_tokens():
    """The writer's row, computed by hand from its parts: the state at `<E_s>` (not `<s>`, not the mean of the
    states) beside each head's attention pooling over the unpadded tokens (issue 66: a writer reading `<s>`, or
    pooling by the mean, passed every test but one by accident)."""
    model = tiny_model(seed=6, entity_row_writer=True).eval()
    writer = model.entity_writer
    torch.manual_seed(0)
    hidden = torch.randn(2, WRITER_INPUTS.shape[1], model.config.d_model)
    mask = (WRITER_INPUTS != PAD).long()
    with torch.no_grad():
        row = writer(hidden, WRITER_INPUTS, mask)
        heads, width = writer.num_heads, writer.head_dim
        keys = writer.pool_keys(hidden).view(2, -1, heads, width)
        values = writer.pool_values(hidden).view(2, -1, heads, width)
        expected = []
        for k in range(2):
            at_name = hidden[k, (WRITER_INPUTS[k] == ES).nonzero()[0, 0]]
            assert (WRITER_INPUTS[k] == ES).nonzero()[0, 0] != 0  # `<s>` comes first: a different state
            pooled = []
            for h in range(heads):
                shown = mask[k].bool()
                weights = torch.softmax(keys[k, shown, h] @ writer.pool_queries[h] / width**0.5, dim=0)
                pooled.append(weights @ values[k, shown, h])
            both = torch.cat([at_name, torch.cat(pooled)])
            expected.append(writer.row_proj(writer.layer_norm(both)))
    torch.testing.assert_close(row, torch.stack(expected), atol=1e-5, rtol=1e-5)
    # the padding is not pooled: changing the padded states changes nothing, changing the <E_s> state does
    padded = hidden.clone()
    padded[1, mask[1] == 0] += 5.0
    moved = hidden.clone()
    moved[0, 1] += 5.0
    with torch.no_grad():
        torch.testing.assert_close(writer(padded, WRITER_INPUTS, mask), row)
        assert not torch.allclose(writer(moved, WRITER_INPUTS, mask)[0], row[0])


def test_texts_read_a_few_at_a_time_by_length_make_the_one_pass_rows_and_gradients():
    """`write_entity_rows` reads its texts in groups of similar length, each cut after its longest text (the fast
    path training takes): rows and gradients equal those of one pass over the whole padded batch, in the texts'
    order, with right padding and with a text padded on the left."""
    model = tiny_model(seed=8, entity_row_writer=True, dropout=0.0)
    generator = torch.Generator().manual_seed(0)
    lengths = [3, 9, 4, 15, 6, 6, 12, 5, 20, 7, 3]
    width = max(lengths) + 4
    ids = torch.full((len(lengths), width), PAD)
    for k, length in enumerate(lengths):
        words = torch.randint(10, 30, (length,), generator=generator)
        ids[k, : length + 4] = torch.tensor([BOS, ES, *words.tolist(), EE, EOS])
    left = int(torch.tensor(lengths).argmin())  # one text padded on the left instead
    ids[left] = torch.cat([ids[left][ids[left] == PAD], ids[left][ids[left] != PAD]])
    mask = (ids != PAD).long()

    def rows_and_gradients(texts_per_pass: int | None) -> tuple[torch.Tensor, list[torch.Tensor]]:
        model.zero_grad()
        rows = model.write_entity_rows(ids, mask, texts_per_pass=texts_per_pass)
        (rows * torch.linspace(-1, 1, rows.numel()).view_as(rows)).sum().backward()
        return rows.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]

    one_pass, one_pass_gradients = rows_and_gradients(None)
    for texts_per_pass in (4, 32):
        rows, gradients = rows_and_gradients(texts_per_pass)
        torch.testing.assert_close(rows, one_pass, atol=1e-5, rtol=1e-5)
        assert len(gradients) == len(one_pass_gradients) > 0
        for grouped, whole in zip(gradients, one_pass_gradients):
            torch.testing.assert_close(grouped, whole, atol=1e-5, rtol=1e-4)
    assert not torch.allclose(rows[0], rows[1])  # the rows are the texts' own, in their order
