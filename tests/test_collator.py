"""EDMemMaskingCollator: masking rates, what may never be masked, label alignment, errors.

Also holds the tiny tokenizer / corpus builders that tests/test_pretraining.py imports, so that these tests do
not depend on the corpus code.
"""

from __future__ import annotations

import os
import random

import pytest
import torch

from edmem_hf.collator import IGNORE_INDEX, EDMemMaskingCollator
from edmem_hf.configuration_edmem import ENTITY_END_TOKEN, ENTITY_START_TOKEN

WORDS = (
    "the river city is near a north south old new large small famous king queen born in was "
    "capital of and with by on mountain lake island founded century village castle"
).split()
ENTITY_NAMES = (
    "Alpha City|Beta River|Gamma Lake|Delta Island|Epsilon Castle|Zeta Mountain|Eta Village|Theta King|Iota Queen|"
    "Kappa North|Lambda South|Mu Old"
).split("|")
TEMPLATES = [
    "{a} is near {b} .",
    "{a} was founded by {b} in the old century .",
    "the capital of {a} is {b} .",
    "{a} was born in {b} and lived on {c} .",
    "a famous castle is on {a} .",
]


def make_tokenizer():
    """A byte-level BPE tokenizer with the project's specials: <s>=0 <pad>=1 </s>=2 <unk>=3 <mask> <E_s> <E_e>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>", ENTITY_START_TOKEN, ENTITY_END_TOKEN]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    text = [" ".join(WORDS), " ".join(ENTITY_NAMES)] + [t.format(a="x", b="y", c="z") for t in TEMPLATES]
    tok.train_from_iterator(text * 5, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        pad_token="<pad>",
        eos_token="</s>",
        unk_token="<unk>",
        mask_token="<mask>",
        additional_special_tokens=[ENTITY_START_TOKEN, ENTITY_END_TOKEN],
    )
    assert [fast.convert_tokens_to_ids(t) for t in specials] == list(range(7))
    return fast


def make_passage(tokenizer, rng: random.Random, n_entities: int = len(ENTITY_NAMES), unlinked_prob: float = 0.1):
    """One passage in the corpus format: `<s>` ... `</s>`, markers around mentions, labels on `<E_s>`."""
    s_id = tokenizer.convert_tokens_to_ids(ENTITY_START_TOKEN)
    e_id = tokenizer.convert_tokens_to_ids(ENTITY_END_TOKEN)
    ids, labels = [tokenizer.bos_token_id], [IGNORE_INDEX]
    for _ in range(rng.randint(1, 3)):
        template = rng.choice(TEMPLATES)
        ents = rng.sample(range(n_entities), 3)
        pieces = template.replace("{", "|{").replace("}", "}|").split("|")
        slot = {"{a}": ents[0], "{b}": ents[1], "{c}": ents[2]}
        for piece in pieces:
            piece = piece.strip()
            if not piece:
                continue
            if piece in slot:
                ent = slot[piece]
                name_ids = tokenizer(" " + ENTITY_NAMES[ent % len(ENTITY_NAMES)], add_special_tokens=False)[
                    "input_ids"
                ]
                ids += [s_id] + name_ids + [e_id]
                labels += [IGNORE_INDEX if rng.random() < unlinked_prob else ent] + [IGNORE_INDEX] * (
                    len(name_ids) + 1
                )
            else:
                word_ids = tokenizer(" " + piece, add_special_tokens=False)["input_ids"]
                ids += word_ids
                labels += [IGNORE_INDEX] * len(word_ids)
    ids.append(tokenizer.eos_token_id)
    labels.append(IGNORE_INDEX)
    return ids, labels


def make_corpus(out_dir, tokenizer=None, n_train: int = 64, n_validation: int = 16, seed: int = 0) -> str:
    """A tiny corpus directory of the `edmem build-corpus` shape: passages/, entity_vocab.json, tokenizer/."""
    from datasets import Dataset, DatasetDict

    from edmem_hf.entity_vocab import EntityVocab

    tokenizer = tokenizer or make_tokenizer()
    rng = random.Random(seed)
    splits = {}
    for split, n in (("train", n_train), ("validation", n_validation)):
        rows = {"input_ids": [], "entity_labels": [], "doc_id": [], "passage_index": []}
        for i in range(n):
            ids, labels = make_passage(tokenizer, rng)
            rows["input_ids"].append(ids)
            rows["entity_labels"].append(labels)
            rows["doc_id"].append(i // 2)
            rows["passage_index"].append(i % 2)
        splits[split] = Dataset.from_dict(rows)
    out_dir = os.fspath(out_dir)
    DatasetDict(splits).save_to_disk(os.path.join(out_dir, "passages"))
    EntityVocab(ENTITY_NAMES).save(out_dir)
    tokenizer.save_pretrained(os.path.join(out_dir, "tokenizer"))
    return out_dir


@pytest.fixture(scope="module")
def tokenizer():
    return make_tokenizer()


def _examples(tokenizer, n, seed=0, with_index=False):
    rng = random.Random(seed)
    out = []
    for i in range(n):
        ids, labels = make_passage(tokenizer, rng, unlinked_prob=0.0)
        example = {"input_ids": ids, "entity_labels": labels}
        if with_index:
            example["example_index"] = i
        out.append(example)
    return out


def test_rates_and_never_masked(tokenizer):
    collator = EDMemMaskingCollator(
        tokenizer, random_mask_prob=0.3, mention_mask_prob=0.5, seed=1, return_salient_span_mask=True
    )
    batch = collator(_examples(tokenizer, 600))
    inp, lab = batch["input_ids"], batch["labels"]
    valid = batch["attention_mask"].bool()
    s_id, e_id = collator.entity_start_token_id, collator.entity_end_token_id
    special = torch.isin(lab, torch.tensor([0, 1, 2, 3, 4, s_id, e_id])) & valid
    # Markers and specials never masked; padding untouched.
    assert torch.equal(inp[special], lab[special])
    assert (inp[~valid] == tokenizer.pad_token_id).all()
    assert (lab[~valid] == IGNORE_INDEX).all()
    # Inside-mention tokens and outside tokens.
    depth = (lab == s_id).long().cumsum(1) - (lab == e_id).long().cumsum(1)
    inside = (depth == 1) & (lab != s_id) & valid
    outside = valid & ~inside & ~special
    masked = inp == collator.mask_token_id
    rtm = masked[outside].float().mean().item()
    assert abs(rtm - 0.3) < 0.02, rtm
    # A mention is span-masked with P_ssm; otherwise its tokens are masked at P_rtm each.
    starts = (lab == s_id).nonzero().tolist()
    whole, partial_tokens, partial_masked = 0, 0, 0
    ssm = batch["salient_span_mask"]
    for row, col in starts:
        end = col + 1
        while lab[row, end] != e_id:
            end += 1
        span = masked[row, col + 1 : end]
        if ssm[row, col]:
            whole += 1
            assert span.all()
        else:
            partial_tokens += span.numel()
            partial_masked += int(span.sum())
    assert abs(whole / len(starts) - 0.5) < 0.05
    assert abs(partial_masked / partial_tokens - 0.3) < 0.04
    assert not ssm[~(lab == s_id)].any()


def test_labels_alignment(tokenizer):
    examples = _examples(tokenizer, 8, seed=3)
    collator = EDMemMaskingCollator(tokenizer, seed=0)
    batch = collator(examples)
    assert set(batch) == {"input_ids", "attention_mask", "entity_labels", "labels", "decoder_entity_labels"}
    s_id = collator.entity_start_token_id
    for i, ex in enumerate(examples):
        n = len(ex["input_ids"])
        assert batch["labels"][i, :n].tolist() == ex["input_ids"]
        assert batch["entity_labels"][i, :n].tolist() == ex["entity_labels"]
        assert (batch["entity_labels"][i, n:] == IGNORE_INDEX).all()
    for key in ("entity_labels", "decoder_entity_labels"):
        on = batch[key] != IGNORE_INDEX
        assert on.any()
        assert (batch["input_ids"][on] == s_id).all()
        assert (batch["labels"][on] == s_id).all()
    assert batch["input_ids"].shape == batch["labels"].shape == batch["attention_mask"].shape


def test_rates_zero_and_one(tokenizer):
    examples = _examples(tokenizer, 20)
    none = EDMemMaskingCollator(tokenizer, random_mask_prob=0.0, mention_mask_prob=0.0)(examples)
    assert torch.equal(none["input_ids"].masked_fill(none["labels"] == IGNORE_INDEX, 1), none["input_ids"])
    assert torch.equal(none["input_ids"][none["attention_mask"].bool()], none["labels"][none["attention_mask"].bool()])
    spans = EDMemMaskingCollator(tokenizer, random_mask_prob=0.0, mention_mask_prob=1.0)(examples)
    lab, inp = spans["labels"], spans["input_ids"]
    s_id = tokenizer.convert_tokens_to_ids(ENTITY_START_TOKEN)
    e_id = tokenizer.convert_tokens_to_ids(ENTITY_END_TOKEN)
    depth = (lab == s_id).long().cumsum(1) - (lab == e_id).long().cumsum(1)
    inside = (depth == 1) & (lab != s_id) & (lab != IGNORE_INDEX)
    assert (inp[inside] == tokenizer.mask_token_id).all()
    assert torch.equal(inp[~inside & (lab != IGNORE_INDEX)], lab[~inside & (lab != IGNORE_INDEX)])


def test_reproducible_and_order_independent(tokenizer):
    examples = _examples(tokenizer, 12, with_index=True)
    a = EDMemMaskingCollator(tokenizer, seed=5)(examples)
    b = EDMemMaskingCollator(tokenizer, seed=5)(examples[:6])
    assert torch.equal(a["input_ids"][:6, : b["input_ids"].shape[1]], b["input_ids"])
    c = EDMemMaskingCollator(tokenizer, seed=6)(examples)
    assert not torch.equal(a["input_ids"], c["input_ids"])
    next_epoch = EDMemMaskingCollator(tokenizer, seed=5)([dict(e, epoch=1) for e in examples])
    assert not torch.equal(a["input_ids"], next_epoch["input_ids"])
    # Stateful generator: reproducible from the seed and from a saved state.
    plain = _examples(tokenizer, 12)
    x = EDMemMaskingCollator(tokenizer, seed=2)
    state = x.state_dict()
    first = x(plain)
    x.load_state_dict(state)
    assert torch.equal(first["input_ids"], x(plain)["input_ids"])
    g = EDMemMaskingCollator(tokenizer, generator=torch.Generator().manual_seed(0))
    state = g.state_dict()
    first = g(plain)
    g.load_state_dict(state)
    assert torch.equal(first["input_ids"], g(plain)["input_ids"])


def test_pad_to_multiple_and_tensors(tokenizer):
    ex = [
        {"input_ids": torch.tensor(e["input_ids"]), "entity_labels": e["entity_labels"]}
        for e in _examples(tokenizer, 3)
    ]
    batch = EDMemMaskingCollator(tokenizer, pad_to_multiple_of=16)(ex)
    assert batch["input_ids"].shape[1] % 16 == 0
    no_labels = EDMemMaskingCollator(tokenizer)([{"input_ids": ex[0]["input_ids"]}])
    assert (no_labels["entity_labels"] == IGNORE_INDEX).all()


def test_errors(tokenizer):
    collator = EDMemMaskingCollator(tokenizer)
    s_id = collator.entity_start_token_id
    e_id = collator.entity_end_token_id
    w = tokenizer(" river", add_special_tokens=False)["input_ids"][0]
    with pytest.raises(ValueError, match="unmatched"):
        collator([{"input_ids": [0, s_id, w, 2], "entity_labels": [-100, 3, -100, -100]}])
    with pytest.raises(ValueError, match="without a preceding"):
        collator([{"input_ids": [0, w, e_id, 2]}])
    with pytest.raises(ValueError, match="nested"):
        collator([{"input_ids": [0, s_id, s_id, w, e_id, e_id, 2]}])
    with pytest.raises(ValueError, match="not <E_s>"):
        collator([{"input_ids": [0, s_id, w, e_id, 2], "entity_labels": [-100, -100, 4, -100, -100]}])
    with pytest.raises(ValueError, match="entity_labels"):
        collator([{"input_ids": [0, w, 2], "entity_labels": [-100]}])
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        EDMemMaskingCollator(tokenizer, random_mask_prob=1.5)

    from transformers import PreTrainedTokenizerFast

    plain = PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend_tokenizer, pad_token="<pad>", unk_token="<unk>")
    with pytest.raises(ValueError, match="mask token"):
        EDMemMaskingCollator(plain)
    from tokenizers import Tokenizer, models, pre_tokenizers

    bare = Tokenizer(models.WordLevel({"<pad>": 0, "<unk>": 1, "<mask>": 2, "a": 3}, unk_token="<unk>"))
    bare.pre_tokenizer = pre_tokenizers.Whitespace()
    no_markers = PreTrainedTokenizerFast(
        tokenizer_object=bare, pad_token="<pad>", unk_token="<unk>", mask_token="<mask>"
    )
    with pytest.raises(ValueError, match="<E_s>"):
        EDMemMaskingCollator(no_markers)


def test_numbers_as_salient_spans(tokenizer):
    """`number_mask_prob`: a number outside a mention is masked whole or not at all (REALM's dates as salient
    spans); a number inside a mention is the mention's; at 0 the batch is the paper's, draw for draw."""
    s_id, e_id = tokenizer.convert_tokens_to_ids([ENTITY_START_TOKEN, ENTITY_END_TOKEN])

    def encode(text):
        return tokenizer(text, add_special_tokens=False).input_ids

    def digits(text):  # this tokenizer spells " 1920" as "Ġ", "1", "9", "2", "0": the number is the digits
        return [token for token in encode(text) if tokenizer.decode([token]).strip().isdigit()]

    ids = [0, *encode(" the king was born in"), *digits(" 1920"), *encode(" and"), *digits(" 31"), s_id,
           *encode(" Alpha"), *digits(" 1877"), e_id, *encode(" ."), 2]  # fmt: skip
    labels = [3 if token == s_id else IGNORE_INDEX for token in ids]
    year, other, inside = digits(" 1920"), digits(" 31"), digits(" 1877")
    assert len(year) > 1  # a year of several tokens: the span must cover all of them
    examples = [{"input_ids": ids, "entity_labels": labels, "example_index": i} for i in range(200)]
    collator = EDMemMaskingCollator(tokenizer, 0.0, 0.0, number_mask_prob=0.5)
    batch = collator(examples)
    begin = ids.index(year[0])
    masked = batch["input_ids"][:, begin : begin + len(year)] == tokenizer.mask_token_id
    assert (masked.all(dim=1) | ~masked.any(dim=1)).all()  # whole or nothing
    assert 60 < int(masked.all(dim=1).sum()) < 140  # about half the copies
    mention = ids.index(s_id)
    assert not (batch["input_ids"][:, mention : ids.index(e_id)] == tokenizer.mask_token_id).any()
    words = [i for i, token in enumerate(ids) if token not in (*year, *other, *inside, 0, 2, s_id, e_id)]
    assert not (batch["input_ids"][:, words] == tokenizer.mask_token_id).any()  # only numbers are masked
    assert torch.equal(batch["labels"][0, : len(ids)], torch.tensor(ids))
    everything = EDMemMaskingCollator(tokenizer, 0.0, 0.0, number_mask_prob=1.0)(examples[:1])["input_ids"][0]
    assert (everything[[ids.index(t) for t in (*year, *other)]] == tokenizer.mask_token_id).all()
    paper = EDMemMaskingCollator(tokenizer, 0.3, 0.5, seed=3)(examples)
    assert torch.equal(EDMemMaskingCollator(tokenizer, 0.3, 0.5, seed=3, number_mask_prob=0.0)(examples)["input_ids"],
                       paper["input_ids"])  # fmt: skip


def test_questions_pass_uncorrupted_beside_masked_passages(tokenizer):
    from edmem_hf.collator import QuestionsAndPassagesCollator
    from edmem_hf.task_features import EDMemSeq2SeqCollator, QAExample, encode_qa_example

    masking = EDMemMaskingCollator(tokenizer, random_mask_prob=0.5, mention_mask_prob=1.0, seed=3)
    mixed = QuestionsAndPassagesCollator(masking, EDMemSeq2SeqCollator(tokenizer.pad_token_id))
    passages = _examples(tokenizer, 3, with_index=True)
    question = {
        **encode_qa_example(QAExample("Where is Alpha City?", ["Beta River"], [(9, 19, 0)], 1), tokenizer),
        "example_index": 99,
    }
    batch = mixed([passages[0], question, passages[1], passages[2]])
    alone = masking(passages)
    width = alone["input_ids"].shape[1]
    assert batch["input_ids"].shape == (4, max(width, len(question["input_ids"])))
    # The passages: the masking collator's batch exactly (its draws are the passages' own), then padding.
    for name in ("input_ids", "attention_mask", "entity_labels", "labels", "decoder_entity_labels"):
        assert torch.equal(batch[name][:3, :width], alone[name]), name
    assert (batch["input_ids"][:3] == masking.mask_token_id).any()
    # The question: kept as encoded (no mask token), its answer the target, its entities where they were.
    n, m = len(question["input_ids"]), len(question["labels"])
    assert batch["input_ids"][3, :n].tolist() == question["input_ids"]
    assert masking.mask_token_id not in batch["input_ids"][3].tolist()
    assert batch["attention_mask"][3].tolist() == [1] * n + [0] * (batch["input_ids"].shape[1] - n)
    assert batch["labels"][3, :m].tolist() == question["labels"] and (batch["labels"][3, m:] == IGNORE_INDEX).all()
    assert batch["entity_labels"][3, :n].tolist() == question["entity_labels"]
    assert 0 in question["entity_labels"] and 1 in question["decoder_entity_labels"]
    assert batch["decoder_entity_labels"][3, :m].tolist() == question["decoder_entity_labels"]
    # Only questions: no passage to mask.
    assert mixed([question])["input_ids"][0].tolist() == question["input_ids"]


def test_masked_span_targets_hold_exactly_what_was_masked(tokenizer):
    common = dict(random_mask_prob=0.3, mention_mask_prob=0.5, seed=5)
    passage = EDMemMaskingCollator(tokenizer, **common)
    spans = EDMemMaskingCollator(tokenizer, decoder_target="masked_spans", return_salient_span_mask=True, **common)
    examples = _examples(tokenizer, 6, with_index=True)
    batch, reference = spans(examples), passage(examples)
    # The input is corrupted exactly as with the paper's target.
    for name in ("input_ids", "attention_mask", "entity_labels"):
        assert torch.equal(batch[name], reference[name]), name
    start, end = (tokenizer.convert_tokens_to_ids(t) for t in (ENTITY_START_TOKEN, ENTITY_END_TOKEN))
    mask, eos = tokenizer.mask_token_id, tokenizer.eos_token_id
    for row in range(len(examples)):
        original, corrupted = reference["labels"][row].tolist(), batch["input_ids"][row].tolist()
        labels = [t for t in batch["labels"][row].tolist() if t != IGNORE_INDEX]
        entities = batch["decoder_entity_labels"][row, : len(labels)].tolist()
        # Expected: each run of masked positions after a separator; a run that fills a mention inside its markers.
        expected, expected_entities, j = [], [], 0
        while j < len(corrupted):
            if corrupted[j] != mask:
                j += 1
                continue
            k = j
            while k < len(corrupted) and corrupted[k] == mask:
                k += 1
            whole = original[j - 1] == start and original[k] == end
            expected += [mask] + [start] * whole + original[j:k] + [end] * whole
            expected_entities += [IGNORE_INDEX] + [int(examples[row]["entity_labels"][j - 1])] * whole
            expected_entities += [IGNORE_INDEX] * (k - j + whole)
            j = k
        assert labels == expected + [eos] and entities == expected_entities + [IGNORE_INDEX]
        assert labels.count(mask) == sum(1 for j, t in enumerate(corrupted) if t == mask and corrupted[j - 1] != mask)
        scored = batch["scored_target"][row, : len(labels)].tolist()
        assert sum(scored) == corrupted.count(mask) and all(labels[i] not in (mask, start, end, eos) for i in
                                                             range(len(labels)) if scored[i])  # fmt: skip
    # Every salient-span-masked mention is in the target, its entity at its <E_s>.
    chosen = batch["decoder_salient_span_mask"]
    assert int(chosen.sum()) == int(batch["salient_span_mask"].sum()) > 0
    assert (batch["labels"][chosen] == start).all() and (batch["decoder_entity_labels"][chosen] != IGNORE_INDEX).all()
    with pytest.raises(ValueError, match="decoder_target"):
        EDMemMaskingCollator(tokenizer, decoder_target="spans")
