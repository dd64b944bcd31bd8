"""EDMem's generate(entity_decoding=...): free, static and dynamic entity linking."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import GenerationConfig

from edmem_hf import EDMemConfig, EDMemForConditionalGeneration, EntityVocab
from edmem_hf.entity_decoding import marked_spans
from edmem_hf.modeling_edmem import MODEL_WITH_HEADS
from edmem_hf.tokenization import train_tokenizer
from tiny_models import run_without_the_package

NAMES = [
    "Paris",
    "Paris Hilton",
    "France",
    "Berlin",
    "Bern",
    "Germany",
    "Rome",
    "Romania",
    "Italy",
    "Ada Lovelace",
    "Alan Turing",
    "Marie Curie",
]


@pytest.fixture(scope="module")
def tokenizer():
    texts = [f"{a} and {b} met in {c}." for a in NAMES for b in NAMES[:4] for c in NAMES[4:8]]
    return train_tokenizer(texts, vocab_size=320, min_frequency=1)


def make_model(tokenizer, seed: int, variant: str = "edmem", **overrides) -> EDMemForConditionalGeneration:
    torch.manual_seed(seed)
    start, end = tokenizer.convert_tokens_to_ids(["<E_s>", "<E_e>"])
    settings = dict(
        vocab_size=len(tokenizer),
        d_model=32,
        encoder_lower_layers=1,
        encoder_upper_layers=1,
        decoder_lower_layers=1,
        decoder_upper_layers=1,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        max_position_embeddings=64,
        entity_vocab_size=len(NAMES),
        entity_embed_dim=16,
        memory_top_k=4,
        entity_start_token_id=start,
        entity_end_token_id=end,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.eos_token_id,
        forced_eos_token_id=tokenizer.eos_token_id,
        variant=variant,
        init_std=0.3,  # large enough weights that the entity-linking head's choice depends on the input
    )
    settings.update(overrides)
    model = MODEL_WITH_HEADS[variant](EDMemConfig(**settings))
    model.entity_vocab = EntityVocab(NAMES)
    model.eval()
    with torch.no_grad():  # a random model that opens many mentions
        model.final_logits_bias[0, start] = 12.0
        model.final_logits_bias[0, tokenizer.eos_token_id] = -12.0
    return model


def questions(tokenizer):
    texts = ["Where is <E_s> Paris <E_e>?", "Who was <E_s> Alan Turing <E_e> and <E_s> Rome <E_e>", "Tell me more."]
    return tokenizer(texts, return_tensors="pt", padding=True)


def spans(sequence: list[int], start: int, end: int) -> list[tuple[int, list[int]]]:
    """(position of <E_s>, tokens up to <E_e>) for every closed mention."""
    return [
        (span.start, sequence[span.start + 1 : span.end]) for span in marked_spans(sequence, start, end) if span.closed
    ]


def name_tokens(tokenizer, entity_id: int) -> list[int]:
    return tokenizer(" " + NAMES[entity_id], add_special_tokens=False).input_ids


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("num_beams", [1, 3])
def test_static_mentions_spell_one_of_the_linked_candidates(tokenizer, seed, num_beams):
    model = make_model(tokenizer, seed)
    batch = questions(tokenizer)
    k = 3
    linked, _ = model.link_entities(batch.input_ids, batch.attention_mask, top_k=k)
    out = model.generate(
        **batch,
        entity_decoding="static",
        entity_candidates=k,
        tokenizer=tokenizer,
        max_new_tokens=20,
        num_beams=num_beams,
    )
    start, end = model.config.entity_start_token_id, model.config.entity_end_token_id
    seen = 0
    for row, seq in enumerate(out.tolist()):
        allowed = [name_tokens(tokenizer, e) for e in linked[row].tolist()]
        for _, tokens in spans(seq, start, end):
            assert tokens in allowed, (row, tokenizer.decode(tokens), [NAMES[e] for e in linked[row]])
            seen += 1
    assert seen > 0, "the random model must open mentions for the test to mean something"


def head_top_k(model, batch, sequences: torch.Tensor, k: int) -> dict[tuple[int, int], list[int]]:
    """The entity-linking head's top-k at every `<E_s>` of `sequences`, keyed by (row, position), from one
    teacher-forced pass over them (the returned rows of each example follow each other, as generate() returns them)."""
    repeat = sequences.shape[0] // batch.input_ids.shape[0]
    with torch.no_grad():
        forced = model(
            input_ids=batch.input_ids.repeat_interleave(repeat, dim=0),
            attention_mask=batch.attention_mask.repeat_interleave(repeat, dim=0),
            decoder_input_ids=sequences,
            entity_linking_top_k=k,
            use_cache=False,
        )
    linked = forced.linked_entities
    return {tuple(pos): ids for pos, ids in zip(linked.positions.tolist(), linked.top_entity_ids.tolist())}


def check_dynamic_mentions(model, tokenizer, batch, out, k: int) -> int:
    """Every mention of a dynamic generation was offered the head's top-k at its own `<E_s>` and every closed one
    spells one of them. Returns the number of closed mentions."""
    expected = head_top_k(model, batch, out.sequences, k)
    start, end = model.config.entity_start_token_id, model.config.entity_end_token_id
    closed = 0
    for row, seq in enumerate(out.sequences.tolist()):
        reported = {m.start: m for m in out.entity_mentions[row]}
        assert sorted(reported) == [i for i, token in enumerate(seq) if token == start]
        for pos, mention in reported.items():
            assert [c[0] for c in mention.candidates] == expected[(row, pos)], (row, pos)
            assert not {model.config.eos_token_id, model.config.pad_token_id} & set(mention.token_ids), (row, pos)
            assert all(isinstance(name, str) and isinstance(score, float) for _, name, score in mention.candidates)
        for pos, tokens in spans(seq, start, end):
            allowed = [name_tokens(tokenizer, e) for e in expected[(row, pos)]]
            assert tokens in allowed, (row, pos, tokenizer.decode(tokens))
            mention = reported[pos]
            assert mention.entity_name == NAMES[mention.entity_id] and mention.entity_id in expected[(row, pos)]
            closed += 1
    return closed


DYNAMIC_SEARCH = {
    "greedy": dict(),
    "beams": dict(num_beams=4),
    "beams_without_cache": dict(num_beams=4, use_cache=False),
    "sampling": dict(do_sample=True, num_return_sequences=3),
}


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("search", DYNAMIC_SEARCH)
def test_dynamic_mentions_spell_the_head_top_k_at_their_own_position(tokenizer, seed, search):
    model = make_model(tokenizer, seed)
    batch = questions(tokenizer)
    torch.manual_seed(seed)
    out = model.generate(
        **batch,
        entity_decoding="dynamic",
        entity_candidates=2,
        tokenizer=tokenizer,
        max_new_tokens=24,
        return_dict_in_generate=True,
        **DYNAMIC_SEARCH[search],
    )
    assert check_dynamic_mentions(model, tokenizer, batch, out, k=2) > 0, "no mention was generated"


def test_generate_sets_nothing_that_forward_reads(tokenizer):
    """Dynamic decoding reaches the processor through generate's own kwargs: the model's attributes and its forward
    are the same before, during (a forward inside a logits processor) and after generation."""
    model = make_model(tokenizer, seed=2)
    batch = questions(tokenizer)
    model.entity_trie(tokenizer)

    def model_attributes():
        return {k: v for k, v in vars(model).items() if not k.startswith(("_modules", "_parameters", "_buffers"))}

    attributes = model_attributes()
    probe = torch.tensor([[model.config.decoder_start_token_id, model.config.entity_start_token_id]] * 3)
    reference = model(**batch, decoder_input_ids=probe, output_attended_entities=True)
    during = []

    class ForwardInsideGenerate:
        def __call__(self, input_ids, scores):
            if not during:
                assert model_attributes() == attributes  # generate set nothing on the model
                during.append(model(**batch, decoder_input_ids=probe, output_attended_entities=True))
            return scores

    model.generate(
        **batch,
        entity_decoding="dynamic",
        entity_candidates=2,
        max_new_tokens=6,
        logits_processor=[ForwardInsideGenerate()],
    )
    after = model(**batch, decoder_input_ids=probe, output_attended_entities=True)
    for out in (during[0], after):
        assert torch.equal(out.logits, reference.logits)
        assert torch.equal(out.linked_entities.top_entity_ids, reference.linked_entities.top_entity_ids)
    assert model_attributes() == attributes


def test_dynamic_decoding_returns_the_encoder_outputs_asked_for(tokenizer):
    """Dynamic decoding runs the encoder before generate() (so that its hand-over kwarg meets no encoder call): the
    encoder's hidden states come back as generate() returns them in free decoding."""
    model = make_model(tokenizer, seed=0)
    batch = questions(tokenizer)
    kwargs = dict(max_new_tokens=4, return_dict_in_generate=True, output_hidden_states=True)
    expected = model.generate(**batch, **kwargs).encoder_hidden_states
    returned = model.generate(**batch, entity_decoding="dynamic", tokenizer=tokenizer, **kwargs).encoder_hidden_states
    assert expected and len(returned) == len(expected)
    assert all(torch.equal(a, b) for a, b in zip(expected, returned))


CACHE_SETTINGS = {
    "static_greedy": dict(entity_decoding="static"),
    "static_beams": dict(entity_decoding="static", num_beams=3),
    "static_sampling": dict(entity_decoding="static", do_sample=True, num_return_sequences=3),
    "dynamic_greedy": dict(entity_decoding="dynamic"),
    "dynamic_beams": dict(entity_decoding="dynamic", num_beams=3),
    "dynamic_sampling": dict(entity_decoding="dynamic", do_sample=True, num_return_sequences=3),
}


@pytest.mark.parametrize("setting", CACHE_SETTINGS)
def test_cache_and_no_cache_generate_the_same(tokenizer, setting):
    """The key/value cache (and the static pass's reused cross-attention cache) changes nothing in what is
    generated, mentions included; sampling draws from the same seed."""
    model = make_model(tokenizer, seed=1)
    batch = questions(tokenizer)
    kwargs = dict(entity_candidates=2, tokenizer=tokenizer, max_new_tokens=16, **CACHE_SETTINGS[setting])
    torch.manual_seed(0)
    cached = model.generate(**batch, use_cache=True, **kwargs)
    torch.manual_seed(0)
    uncached = model.generate(**batch, use_cache=False, **kwargs)
    assert torch.equal(cached, uncached)
    start, end = model.config.entity_start_token_id, model.config.entity_end_token_id
    assert sum(len(spans(seq, start, end)) for seq in cached.tolist()) > 0, "no mention was generated"


def test_sampling_and_num_return_sequences(tokenizer):
    model = make_model(tokenizer, seed=2)
    batch = questions(tokenizer)
    torch.manual_seed(0)
    out = model.generate(
        **batch,
        entity_decoding="static",
        entity_candidates=2,
        tokenizer=tokenizer,
        do_sample=True,
        num_return_sequences=3,
        max_new_tokens=16,
        return_dict_in_generate=True,
    )
    assert out.sequences.shape[0] == 9 and len(out.entity_mentions) == 9
    linked, _ = model.link_entities(batch.input_ids, batch.attention_mask, top_k=2)
    assert len({tuple(row) for row in linked.tolist()}) > 1, "the examples must be linked to different entities"
    closed = 0
    for i, mentions in enumerate(out.entity_mentions):
        offered = linked[i // 3].tolist()
        assert mentions, f"sequence {i} has no mention"
        for mention in mentions:
            assert [c[0] for c in mention.candidates] == offered
            if (
                mention.end < out.sequences.shape[1]
                and out.sequences[i, mention.end] == model.config.entity_end_token_id
            ):
                assert mention.entity_id in offered and mention.token_ids == name_tokens(tokenizer, mention.entity_id)
                closed += 1
    assert closed > 0


def test_free_decoding_reports_attended_entities(tokenizer):
    model = make_model(tokenizer, seed=3)
    batch = questions(tokenizer)
    free = model.generate(**batch, max_new_tokens=12)
    out = model.generate(**batch, max_new_tokens=12, return_dict_in_generate=True, tokenizer=tokenizer)
    assert torch.equal(free, out.sequences)
    mentions = [(row, m) for row, found in enumerate(out.entity_mentions) for m in found]
    assert len({row for row, _ in mentions}) == 3 and len(mentions) >= 6  # mentions in every row
    offered = {tuple(c[0] for c in m.candidates) for _, m in mentions}
    assert len(offered) >= 3  # varied: the memory attends to other entities at other mentions
    for row, mention in mentions:
        # what the decoder memory attended to at this <E_s>, read again from the prefix that opened the span
        prefix = out.sequences[row : row + 1, : mention.start + 1]
        with torch.no_grad():
            read = model(input_ids=batch.input_ids[row : row + 1], attention_mask=batch.attention_mask[row : row + 1],
                         decoder_input_ids=prefix, output_attended_entities=True).decoder_attended_entities  # fmt: skip
        at = read.positions[:, 1].tolist().index(mention.start)
        assert [c[0] for c in mention.candidates] == read.top_entity_ids[at].tolist()
        torch.testing.assert_close(torch.tensor([c[2] for c in mention.candidates]), read.top_entity_scores[at])
        assert [c[1] for c in mention.candidates] == [NAMES[i] for i in read.top_entity_ids[at].tolist()]
        assert len(mention.candidates) == model.config.memory_top_k


def test_default_mode_comes_from_the_generation_config_and_is_saved(tokenizer, tmp_path):
    model = make_model(tokenizer, seed=4)
    assert model.generation_config.entity_decoding == "free"
    model.generation_config = GenerationConfig(
        **{k: v for k, v in model.generation_config.to_dict().items() if k != "transformers_version"}
        | {"entity_decoding": "static", "entity_candidates": 1}
    )
    model.save_pretrained(tmp_path)
    loaded = EDMemForConditionalGeneration.from_pretrained(tmp_path)
    assert loaded.generation_config.entity_decoding == "static" and loaded.generation_config.entity_candidates == 1
    batch = questions(tokenizer)
    out = loaded.generate(**batch, tokenizer=tokenizer, max_new_tokens=12)
    linked, _ = loaded.link_entities(batch.input_ids, batch.attention_mask, top_k=1)
    start, end = loaded.config.entity_start_token_id, loaded.config.entity_end_token_id
    seen = 0
    for row, seq in enumerate(out.tolist()):
        for _, tokens in spans(seq, start, end):
            assert tokens == name_tokens(tokenizer, int(linked[row, 0]))
            seen += 1
    assert seen > 0, "no mention was generated"


def test_training_fields_are_dropped_before_generation(tokenizer):
    model = make_model(tokenizer, seed=5)
    inputs = questions(tokenizer)
    labels = tokenizer(["<E_s> Paris <E_e>"] * 3, return_tensors="pt").input_ids
    training_batch = dict(inputs)
    training_batch["labels"] = labels
    training_batch["entity_labels"] = torch.where(inputs.input_ids == model.config.entity_start_token_id, 0, -100)
    training_batch["decoder_entity_labels"] = torch.where(labels == model.config.entity_start_token_id, 0, -100)
    kwargs = dict(entity_decoding="dynamic", entity_candidates=2, tokenizer=tokenizer, max_new_tokens=16)
    out = model.generate(**training_batch, **kwargs)
    assert torch.equal(out, model.generate(**inputs, **kwargs))
    start, end = model.config.entity_start_token_id, model.config.entity_end_token_id
    assert sum(len(spans(seq, start, end)) for seq in out.tolist()) > 0, "no mention was generated"


def test_bad_entity_decoding_arguments(tokenizer):
    model = make_model(tokenizer, seed=6)
    batch = questions(tokenizer)
    with pytest.raises(ValueError, match="entity_decoding must be one of"):
        model.generate(**batch, entity_decoding="constrained", max_new_tokens=2)
    with pytest.raises(ValueError, match="entity_candidates must be a positive integer"):
        model.generate(**batch, entity_decoding="static", entity_candidates=0, tokenizer=tokenizer)
    fresh = make_model(tokenizer, seed=6)
    with pytest.raises(ValueError, match="pass tokenizer"):
        fresh.generate(**batch, entity_decoding="dynamic", max_new_tokens=2)
    encdec = make_model(tokenizer, seed=6, variant="encdec")
    with pytest.raises(ValueError, match="needs the full EDMem"):
        encdec.generate(**batch, entity_decoding="static", tokenizer=tokenizer, max_new_tokens=2)


def test_seq2seq_trainer_predict_with_generate_in_dynamic_mode(tokenizer, tmp_path):
    from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments

    model = make_model(tokenizer, seed=7)
    model.generation_config.entity_decoding = "dynamic"  # also settable per call; read at generate() time
    batch = questions(tokenizer)
    labels = tokenizer(["<E_s> France <E_e>", "<E_s> Italy <E_e>", "no"], return_tensors="pt", padding=True).input_ids
    labels = labels.masked_fill(labels == tokenizer.pad_token_id, -100)
    start = model.config.entity_start_token_id
    rows = [
        {
            "input_ids": batch.input_ids[i],
            "attention_mask": batch.attention_mask[i],
            "labels": labels[i],
            "entity_labels": torch.where(batch.input_ids[i] == start, 0, -100),
            "decoder_entity_labels": torch.where(labels[i] == start, 2, -100),
        }
        for i in range(3)
    ]
    args = Seq2SeqTrainingArguments(
        output_dir=str(tmp_path),
        per_device_eval_batch_size=3,
        predict_with_generate=True,
        generation_max_length=12,
        report_to=[],
        use_cpu=True,
    )
    trainer = Seq2SeqTrainer(model=model, args=args, eval_dataset=rows, processing_class=tokenizer)
    model.set_entity_trie(None)
    model.entity_trie(tokenizer)  # the trie is kept on the model: generate() needs no tokenizer argument
    prediction = trainer.predict(rows)
    sequences = torch.as_tensor(prediction.predictions)
    assert sequences.shape[0] == 3
    sequences = sequences.masked_fill(sequences < 0, tokenizer.pad_token_id)  # the Trainer pads with -100
    k = model.generation_config.entity_candidates
    expected = head_top_k(model, batch, sequences, k)
    end = model.config.entity_end_token_id
    seen = 0
    for row, seq in enumerate(sequences.tolist()):
        for pos, tokens in spans(seq, start, end):
            assert tokens in [name_tokens(tokenizer, e) for e in expected[(row, pos)]], (row, pos)
            seen += 1
    assert seen > 0, "no mention was generated"


def test_remote_code_runs_static_decoding_without_the_package(tokenizer, tmp_path):
    """A saved model and tokenizer, loaded with trust_remote_code in a fresh interpreter where `edmem_hf` cannot be
    imported, generate with entity_decoding="static" exactly what the package's model generates."""
    model = make_model(tokenizer, seed=1)
    save_dir = tmp_path / "edmem-static"
    model.save_pretrained(save_dir)
    tokenizer.save_pretrained(save_dir)
    texts = ["Where is <E_s> Paris <E_e>?", "Who was <E_s> Alan Turing <E_e> and <E_s> Rome <E_e>", "Tell me more."]
    settings = dict(entity_decoding="static", entity_candidates=3, max_new_tokens=16, num_beams=2)
    expected = model.generate(**tokenizer(texts, return_tensors="pt", padding=True), tokenizer=tokenizer, **settings)
    start, end = model.config.entity_start_token_id, model.config.entity_end_token_id
    assert any(spans(seq, start, end) for seq in expected.tolist()), "the model must generate mentions"
    script = f"""
        import json
        from transformers import AutoModelForSeq2SeqLM, AutoTokenizer
        model = AutoModelForSeq2SeqLM.from_pretrained({str(save_dir)!r}, trust_remote_code=True).eval()
        tokenizer = AutoTokenizer.from_pretrained({str(save_dir)!r}, trust_remote_code=True)
        batch = tokenizer({texts!r}, return_tensors="pt", padding=True)
        out = model.generate(**batch, tokenizer=tokenizer, **{settings!r})
        print(type(model).__module__)
        print(json.dumps(out.tolist()))
        """
    result = run_without_the_package(script, tmp_path)
    module, sequences = result.stdout.strip().splitlines()[-2:]
    assert module.startswith("transformers_modules")
    assert json.loads(sequences) == expected.tolist()


def test_static_linking_with_the_question_in_the_decoder(tokenizer):
    """The paper's static setting: the decoder reads `question[:-1] + [<E_s>, EOS]` and the head is read at that
    `<E_s>`; batched rows (right-padded decoder inputs) link as each row alone."""
    model = make_model(tokenizer, seed=2)
    batch = questions(tokenizer)
    start, eos = model.config.entity_start_token_id, model.config.eos_token_id
    ids, scores = model.link_entities(batch.input_ids, batch.attention_mask, top_k=3, decoder_input="question")
    for row in range(batch.input_ids.shape[0]):
        question = batch.input_ids[row][batch.attention_mask[row].bool()][None]
        decoder_input_ids = torch.cat([question[:, :-1], torch.tensor([[start, eos]])], dim=1)
        with torch.no_grad():
            out = model(input_ids=question, decoder_input_ids=decoder_input_ids, entity_linking_top_k=3)
        placeholder = out.linked_entities.positions.tolist().index([0, decoder_input_ids.shape[1] - 2])
        assert ids[row].tolist() == out.linked_entities.top_entity_ids[placeholder].tolist()
        torch.testing.assert_close(scores[row], out.linked_entities.top_entity_scores[placeholder])
    _, our_scores = model.link_entities(batch.input_ids, batch.attention_mask, top_k=3)
    assert not torch.allclose(our_scores, scores)  # the two readings differ (the start token sees no question)
    with pytest.raises(ValueError, match="decoder_input must be one of"):
        model.link_entities(batch.input_ids, batch.attention_mask, decoder_input="answer")


def test_static_decoding_with_a_separate_entity_linker(tokenizer, tmp_path):
    """`entity_linker=`: the candidates come from another model's head (the authors' separately fine-tuned
    linker), read with the question in its decoder; mentions spell those candidates."""
    model, linker = make_model(tokenizer, seed=0), make_model(tokenizer, seed=5)
    batch = questions(tokenizer)
    k = 2
    linked, _ = linker.link_entities(batch.input_ids, batch.attention_mask, top_k=k, decoder_input="question")
    assert not torch.equal(linked, model.link_entities(batch.input_ids, batch.attention_mask, top_k=k)[0])
    settings = dict(entity_decoding="static", entity_candidates=k, tokenizer=tokenizer, max_new_tokens=16)
    out = model.generate(
        **batch, **settings, entity_linker=linker, static_linking_input="question", return_dict_in_generate=True
    )
    closed = 0
    for row, mentions in enumerate(out.entity_mentions):
        for mention in mentions:
            assert [c[0] for c in mention.candidates] == linked[row].tolist()
            if mention.entity_id >= 0:
                assert mention.entity_id in linked[row].tolist()
                closed += 1
    assert closed > 0, "the model must generate mentions"
    with pytest.raises(ValueError, match="apply to entity_decoding='static' only"):
        model.generate(**batch, entity_decoding="dynamic", tokenizer=tokenizer, entity_linker=linker)
    # the paper's reading as the saved default: a generation config that carries it, through save and load
    model.generation_config.static_linking_input = "question"
    model.save_pretrained(tmp_path)
    reloaded = type(model).from_pretrained(tmp_path)
    assert reloaded.generation_config.static_linking_input == "question"
    again = reloaded.generate(**batch, **settings, entity_linker=linker, return_dict_in_generate=True)
    assert torch.equal(again.sequences, out.sequences)
    assert all(
        [c[0] for c in mention.candidates] == linked[row].tolist()
        for row, mentions in enumerate(again.entity_mentions)
        for mention in mentions
    )
    other = make_model(tokenizer, seed=5)
    other.config.entity_vocab_size = len(NAMES) - 1  # a linker over another entity table
    with pytest.raises(ValueError, match="must share one entity table"):
        model.generate(**batch, **settings, entity_linker=other)
