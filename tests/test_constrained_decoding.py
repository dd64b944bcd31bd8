"""EntityConstrainedLogitsProcessor with a tiny random BART: every generated span is an allowed name."""

import random

import pytest
import torch
from transformers import (
    BartConfig,
    BartForConditionalGeneration,
    LogitsProcessor,
    LogitsProcessorList,
    PreTrainedTokenizerFast,
)

from edmem_hf.entity_decoding import (
    EntityConstrainedLogitsProcessor,
    EntityTrie,
    MarkedSpan,
    marked_spans,
    marker_token_ids,
)
from edmem_hf.entity_trie import authors_spelling
from tiny_models import make_word_tokenizer, make_words


def make_tokenizer(markers: bool = True) -> PreTrainedTokenizerFast:
    return make_word_tokenizer(markers=markers, bart_template=True)


def make_bart(vocab_size: int, seed: int) -> BartForConditionalGeneration:
    torch.manual_seed(seed)
    config = BartConfig(
        vocab_size=vocab_size,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=64,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        decoder_start_token_id=2,
        forced_eos_token_id=None,
    )
    return BartForConditionalGeneration(config).eval()


class MarkerBias(LogitsProcessor):
    """Pushes a random model to open mentions (runs before the constraint, like a trained model would)."""

    def __init__(self, start_id: int, bias: float = 4.0):
        self.start_id, self.bias = start_id, bias

    def __call__(self, input_ids, scores):
        scores = scores.clone()
        scores[:, self.start_id] += self.bias
        return scores


class NoAllMinusInf(LogitsProcessor):
    """Runs after the constraint: asserts that no row was left with every score at -inf."""

    def __call__(self, input_ids, scores):
        assert torch.isfinite(scores).any(-1).all(), "a row has every token at -inf"
        return scores


DECODING = [
    dict(),
    dict(num_beams=4),
    dict(num_beams=4, num_return_sequences=2),
    dict(num_beams=3, use_cache=False),
    dict(do_sample=True, num_return_sequences=3),
    dict(do_sample=True, top_k=4, temperature=2.0),
]


@pytest.fixture(scope="module")
def tokenizer():
    return make_tokenizer()


@pytest.fixture(scope="module")
def names():
    rng = random.Random(5)
    words = make_words(80, seed=7)
    return sorted({" ".join(rng.sample(words, rng.randint(1, 2))) for _ in range(60)}) + ["Baro", "Barokita"]


@pytest.fixture(scope="module")
def inputs(tokenizer):
    return tokenizer(["Baro ki tamer", "lun mer senta dra polis anul", "x"], return_tensors="pt", padding=True)


def spans(sequence: list[int], start_id: int, end_id: int) -> list[tuple[list[int], bool]]:
    """(tokens after each start marker up to the end marker, closed?)"""
    return [(sequence[span.start + 1 : span.end], span.closed) for span in marked_spans(sequence, start_id, end_id)]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("kwargs", DECODING, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()) or "greedy")
def test_standalone_outputs_are_exactly_the_strings(tokenizer, names, inputs, seed, kwargs):
    model = make_bart(len(tokenizer), seed)
    processor = EntityConstrainedLogitsProcessor.from_strings(names, tokenizer, add_prefix_space=True)
    allowed = {tuple(tokenizer(" " + n, add_special_tokens=False).input_ids) for n in names}
    torch.manual_seed(seed)
    out = model.generate(
        **inputs, logits_processor=LogitsProcessorList([processor, NoAllMinusInf()]), max_new_tokens=20, **kwargs
    )
    for row in out.tolist():
        assert row[0] == 2 and 2 in row[1:], row
        body = row[1 : row.index(2, 1)]
        assert tuple(body) in allowed, tokenizer.decode(body)
        assert all(t == 1 for t in row[row.index(2, 1) + 1 :])  # only padding after </s>
    # The decoded strings are the names.
    decoded = tokenizer.batch_decode(out, skip_special_tokens=True)
    assert all(d.strip() in names for d in decoded)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("kwargs", DECODING, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()) or "greedy")
def test_marker_mode_with_per_row_candidates(tokenizer, names, inputs, seed, kwargs):
    start_id, end_id = marker_token_ids(tokenizer)
    model = make_bart(len(tokenizer), seed)
    trie = EntityTrie.build(names, tokenizer, end_token_id=end_id)
    gen = torch.Generator().manual_seed(seed)
    candidates = torch.stack([torch.randperm(len(names), generator=gen)[:4] for _ in range(3)])
    candidates[1, 2:] = -1  # padding
    candidates[2] = torch.tensor([len(names) - 1, len(names) - 2, -1, -1])  # "Barokita", "Baro": nested names
    scores = torch.rand(candidates.shape, generator=gen)
    group = kwargs.get("num_beams", 1) if kwargs.get("num_beams", 1) > 1 else kwargs.get("num_return_sequences", 1)
    processor = EntityConstrainedLogitsProcessor(
        trie, start_token_id=start_id, candidates=candidates, candidate_scores=scores, group_size=group
    )
    torch.manual_seed(seed)
    prompt = torch.tensor([[2, 0, start_id]] * 3)
    out = model.generate(
        **inputs,
        decoder_input_ids=prompt,
        logits_processor=LogitsProcessorList([MarkerBias(start_id), processor, NoAllMinusInf()]),
        max_new_tokens=24,
        **kwargs,
    )
    per_example = out.shape[0] // 3
    example_index = torch.arange(3).repeat_interleave(per_example)
    names_of = {e: {tuple(trie.sequence(int(c))[:-1]) for c in candidates[e] if c >= 0} for e in range(3)}
    n_closed = 0
    for row, e, mentions in zip(out.tolist(), example_index.tolist(), processor.mentions(out, example_index)):
        found = spans(row, start_id, end_id)
        assert len(found) == len(mentions) >= 1
        for (tokens, closed), mention in zip(found, mentions):
            assert mention.token_ids == tokens
            if closed:
                n_closed += 1
                assert tuple(tokens) in names_of[e], (e, tokenizer.decode(tokens))
                assert mention.entity_id in candidates[e].tolist()
                assert mention.candidate_ids == [c for c in candidates[e].tolist() if c >= 0]
                assert mention.candidate_scores == pytest.approx(scores[e][candidates[e] >= 0].tolist())
            else:  # cut by max_new_tokens: a prefix of a candidate name
                assert any(n[: len(tokens)] == tuple(tokens) for n in names_of[e])
        # No <E_e> outside a mention.
        assert row.count(end_id) == sum(closed for _, closed in found)
    assert n_closed > 0


def test_all_entities_mode_in_marker_mode(tokenizer, names, inputs):
    start_id, end_id = marker_token_ids(tokenizer)
    processor = EntityConstrainedLogitsProcessor.for_edmem(names, tokenizer)
    valid = {tuple(processor.trie.sequence(i)[:-1]) for i in range(len(names))}
    for seed in range(3):
        model = make_bart(len(tokenizer), seed)
        out = model.generate(
            **inputs,
            decoder_input_ids=torch.tensor([[2, 0, start_id]] * 3),
            logits_processor=LogitsProcessorList([MarkerBias(start_id, 6.0), processor, NoAllMinusInf()]),
            max_new_tokens=24,
            num_beams=3,
        )
        for row in out.tolist():
            for tokens, closed in spans(row, start_id, end_id):
                if closed:
                    assert tuple(tokens) in valid


def test_dynamic_candidates_follow_their_beam(tokenizer, names, inputs):
    """Candidates offered when a row generates <E_s> (as the EDMem model does) hold until the mention is closed,
    wherever beam search moves the row."""
    start_id, end_id = marker_token_ids(tokenizer)
    trie = EntityTrie.build(names, tokenizer, end_token_id=end_id)
    model = make_bart(len(tokenizer), 3)
    processor = EntityConstrainedLogitsProcessor(trie, start_token_id=start_id, group_size=4)
    gen = torch.Generator().manual_seed(0)

    def candidates_fn(input_ids):
        if not (input_ids[:, -1] == start_id).any():
            return None
        # "Entity linking head": candidates depend on the prefix, so that the check below can recompute them. Those
        # of the rows that open no mention are ignored.
        ids = torch.stack(
            [
                torch.randperm(len(names), generator=torch.Generator().manual_seed(hash(tuple(r)) % 2**31))[:3]
                for r in input_ids.tolist()
            ]
        )
        return ids, torch.rand(ids.shape, generator=gen)

    processor.candidates_fn = candidates_fn
    out = model.generate(
        **inputs,
        decoder_input_ids=torch.tensor([[2, 0, start_id]] * 3),
        logits_processor=LogitsProcessorList([MarkerBias(start_id, 5.0), processor, NoAllMinusInf()]),
        max_new_tokens=24,
        num_beams=4,
        num_return_sequences=4,
    )
    example_index = torch.arange(3).repeat_interleave(4)
    mentions = processor.mentions(out, example_index)
    n_closed = 0
    for row, row_mentions in zip(out.tolist(), mentions):
        for m in row_mentions:
            if m.start == len(row) - 1:  # opened by the very last token: the processor never saw it
                assert m.candidate_ids == []
                continue
            expected = torch.randperm(
                len(names), generator=torch.Generator().manual_seed(hash(tuple(row[: m.start + 1])) % 2**31)
            )[:3].tolist()
            assert m.candidate_ids == expected
            if m.end < len(row) and row[m.end] == end_id:
                n_closed += 1
                assert m.entity_id in expected
    assert n_closed > 0


def test_fallback_empty_candidates_forces_end(tokenizer, names):
    start_id, end_id = marker_token_ids(tokenizer)
    trie = EntityTrie.build(names, tokenizer, end_token_id=end_id)
    processor = EntityConstrainedLogitsProcessor(
        trie, start_token_id=start_id, candidates=torch.tensor([[-1, -1], [0, -1]])
    )
    ids = torch.tensor([[2, 0, start_id], [2, 0, start_id]])
    scores = processor(ids, torch.randn(2, len(tokenizer)))
    assert torch.isfinite(scores).any(-1).all()
    assert torch.isfinite(scores[0]).nonzero().flatten().tolist() == [end_id]  # empty set: close the mention
    assert torch.isfinite(scores[1]).nonzero().flatten().tolist() == [trie.sequence(0)[0]]
    # A prefix that left the trie (e.g. forced by another processor): only <E_e>.
    processor.reset()
    ids = torch.tensor([[2, 0, start_id, 4], [2, 0, 7, 8]])
    scores = processor(ids, torch.randn(2, len(tokenizer)))
    assert torch.isfinite(scores[0]).nonzero().flatten().tolist() == [end_id]
    assert torch.isinf(scores[1, end_id]) and torch.isfinite(scores[1]).sum() == len(tokenizer) - 1  # outside
    # Every allowed token already at -inf (another processor decided): the row is left as it came.
    processor.reset()
    incoming = torch.full((2, len(tokenizer)), float("-inf"))
    incoming[:, 2] = 0.0
    scores = processor(torch.tensor([[2, 0, start_id]] * 2), incoming)
    assert torch.equal(scores, incoming)


@pytest.mark.parametrize("dense_threshold", [5, None], ids=["dense-root", "sparse"])
def test_processor_matches_on_hand_computed_masks(tokenizer, names, dense_threshold):
    start_id, end_id = marker_token_ids(tokenizer)
    trie = EntityTrie.build(names, tokenizer, end_token_id=end_id)
    processor = EntityConstrainedLogitsProcessor(trie, start_token_id=start_id, dense_threshold=dense_threshold)
    seqs = [trie.sequence(i) for i in range(len(names))]
    rng = random.Random(0)
    for step in range(20):
        rows = []
        for _ in range(6):
            seq = rng.choice(seqs)
            depth = 0 if step == 0 else rng.randint(0, len(seq) - 1)  # step 0: every row at the (dense) root
            rows.append([2, 0, 7, start_id] + seq[:depth])
        width = max(map(len, rows))
        # Same length for all rows: prepend filler tokens to shorter rows (outside any mention).
        ids = torch.tensor([[9] * (width - len(r)) + r for r in rows])
        processor.reset()
        scores = torch.randn(len(rows), len(tokenizer))
        out = processor(ids, scores)
        for r, row in enumerate(rows):
            prefix = row[row.index(start_id) + 1 :]
            expected = {s[len(prefix)] for s in seqs if s[: len(prefix)] == prefix}
            allowed = torch.isfinite(out[r])
            assert set(allowed.nonzero().flatten().tolist()) == expected
            assert torch.equal(out[r][allowed], scores[r][allowed])  # allowed scores pass unchanged


def test_each_row_is_placed_by_its_own_tokens(tokenizer, names):
    """Beam search moves, drops and copies rows between calls: within one generation, each row's allowed tokens
    are those its own tokens call for (GENRE's rule, computed here by hand), whatever the rows did before."""
    start_id, end_id = marker_token_ids(tokenizer)
    trie = EntityTrie.build(names, tokenizer, end_token_id=end_id)
    vocab = len(tokenizer)
    processor = EntityConstrainedLogitsProcessor(trie, start_token_id=start_id)

    def state(row: list[int]) -> tuple[str, set[int]]:
        if start_id not in row:
            return "outside", set(range(vocab)) - {end_id}
        prefix = row[len(row) - row[::-1].index(start_id) :]
        if end_id in prefix:
            return "outside", set(range(vocab)) - {end_id}
        following = set(trie.allowed_next_tokens(prefix))
        return ("in a name", following) if following else ("dead", {end_id})  # left the trie: only the end token

    def allowed(row: list[int]) -> set[int]:
        return state(row)[1]

    rng = random.Random(3)
    rows = [[2, 0]] * 6
    states = set()
    for step in range(14):
        out = processor(torch.tensor(rows), torch.randn(len(rows), vocab))
        for row, scores in zip(rows, out):
            name, expected = state(row)
            assert set(torch.isfinite(scores).nonzero().flatten().tolist()) == expected, (step, row)
            states.add(name)

        # The next rows: any rows of this call (beam search's choice), each with a start marker, an allowed token
        # or (another processor forced it) any token.
        def next_token(row: list[int]) -> int:
            draw = rng.random()
            return start_id if draw < 0.2 else rng.choice(sorted(allowed(row)) if draw < 0.9 else range(vocab))

        rows = [row + [next_token(row)] for row in (rows[rng.randrange(len(rows))] for _ in rows)]
    assert states == {"outside", "dead", "in a name"}


def test_a_processor_reused_for_another_generation_starts_afresh(tokenizer, names):
    """Position mode: the span starts where each generation's prompt ends, also when the next generation's prompt
    is exactly one token longer than the previous generation's last call (its rows do not begin with that
    generation's prompt)."""
    processor = EntityConstrainedLogitsProcessor.from_strings(names, tokenizer, add_prefix_space=True)
    trie, vocab = processor.trie, len(tokenizer)
    root = set(trie.allowed_next_tokens([]))
    first = trie.sequence(0)
    processor(torch.tensor([[2, 7, 8]]), torch.zeros(1, vocab))
    out = processor(torch.tensor([[2, 7, 8, first[0]]]), torch.zeros(1, vocab))
    assert set(torch.isfinite(out[0]).nonzero().flatten().tolist()) == set(trie.allowed_next_tokens(first[:1]))
    out = processor(torch.tensor([[2, 9, 9, 9, 9]]), torch.zeros(1, vocab))  # another generation's prompt
    assert set(torch.isfinite(out[0]).nonzero().flatten().tolist()) == root
    out = processor(torch.tensor([[2, 9, 9, 9, 9, first[0]]]), torch.zeros(1, vocab))
    assert set(torch.isfinite(out[0]).nonzero().flatten().tolist()) == set(trie.allowed_next_tokens(first[:1]))


def test_same_as_prefix_allowed_tokens_fn_with_dict_trie(tokenizer, names, inputs):
    """GENRE's recipe (nested-dict trie + prefix_allowed_tokens_fn) and ours agree on greedy and beam search."""
    sequences = [[0] + tokenizer(" " + n, add_special_tokens=False).input_ids + [2] for n in names]
    trie_dict: dict = {}
    for seq in sequences:
        node = trie_dict
        for tok in seq:
            node = node.setdefault(tok, {})

    def prefix_allowed_tokens_fn(batch_id, sent):
        node = trie_dict
        for tok in sent.tolist()[1:]:
            node = node.get(tok, {})
        return list(node.keys()) or [2]  # after </s> (finished rows): anything, say </s>

    processor = EntityConstrainedLogitsProcessor.from_strings(
        names, tokenizer, add_prefix_space=True, add_special_tokens=True
    )
    assert processor.trie.sequence(0) == sequences[0]
    for seed in range(3):
        model = make_bart(len(tokenizer), seed)
        for kwargs in (dict(), dict(num_beams=4)):
            theirs = model.generate(
                **inputs, prefix_allowed_tokens_fn=prefix_allowed_tokens_fn, max_new_tokens=20, **kwargs
            )
            ours = model.generate(
                **inputs, logits_processor=LogitsProcessorList([processor]), max_new_tokens=20, **kwargs
            )
            assert torch.equal(ours, theirs), kwargs


def test_bad_input(tokenizer, names):
    start_id, end_id = marker_token_ids(tokenizer)
    trie = EntityTrie.build(names, tokenizer, end_token_id=end_id)
    with pytest.raises(ValueError, match="unknown entity id"):
        EntityConstrainedLogitsProcessor(trie, start_token_id=start_id, candidates=torch.tensor([[0, len(names)]]))
    processor = EntityConstrainedLogitsProcessor(trie, start_token_id=start_id)
    with pytest.raises(ValueError, match="unknown entity id"):
        processor.set_candidates(torch.tensor([[-5]]))
    with pytest.raises(ValueError, match="empty"):
        EntityConstrainedLogitsProcessor.from_strings([], tokenizer)
    with pytest.raises(ValueError, match="no <E_s> token"):
        EntityConstrainedLogitsProcessor.for_edmem(names, make_tokenizer(markers=False))
    with pytest.raises(ValueError, match="must differ"):
        EntityConstrainedLogitsProcessor(trie, start_token_id=end_id)
    with pytest.raises(ValueError, match=r"must end with the end token 2; entity \d+ ends with \d+"):
        EntityConstrainedLogitsProcessor(trie, start_token_id=start_id, end_token_id=2)
    bad_rows = EntityConstrainedLogitsProcessor(trie, start_token_id=start_id, candidates=torch.tensor([[0], [1]]))
    with pytest.raises(ValueError, match="do not divide"):
        bad_rows(torch.tensor([[2, start_id]] * 3), torch.zeros(3, len(tokenizer)))


def test_tokenizer_padding_state_does_not_leak_into_names(names):
    tokenizer = make_tokenizer()
    tokenizer.backend_tokenizer.enable_padding(pad_id=1, pad_token="<pad>", length=40)  # left by earlier calls
    tokenizer.backend_tokenizer.enable_truncation(max_length=2)
    trie = EntityTrie.build(names, tokenizer, end_token_id=2)
    expected = make_tokenizer()(" " + names[0], add_special_tokens=False).input_ids + [2]
    assert trie.sequence(0) == expected
    assert tokenizer.backend_tokenizer.padding["length"] == 40  # restored
    assert tokenizer.backend_tokenizer.truncation["max_length"] == 2


def test_set_candidates_for_some_rows(tokenizer, names):
    """Dynamic entity linking: the model offers candidates to the mentions that rows just opened with <E_s>; a
    row's mention keeps them wherever beam search moves the row, and mentions() reports them."""
    start_id, end_id = marker_token_ids(tokenizer)
    trie = EntityTrie.build(names, tokenizer, end_token_id=end_id)
    processor = EntityConstrainedLogitsProcessor(trie, start_token_id=start_id)
    vocab = len(tokenizer)
    first = processor(torch.tensor([[2, 0, 7], [2, 0, 7]]), torch.zeros(2, vocab))  # one example, two beams
    assert torch.isfinite(first).sum(-1).tolist() == [vocab - 1] * 2  # outside: all but <E_e>
    # Step 2: row 1 generated <E_s>; "the model" links it to entities 3 and 4 (row 0's offer is ignored: it opens
    # no mention).
    processor.set_candidates(torch.tensor([[3, 4], [5, 6]]), torch.tensor([[0.9, 0.1], [0.5, 0.5]]), rows=[1, 0])
    out = processor(torch.tensor([[2, 0, 7, 9], [2, 0, 7, start_id]]), torch.zeros(2, vocab))
    assert torch.isfinite(out[0]).sum() == vocab - 1
    expected = {trie.sequence(3)[0], trie.sequence(4)[0]}
    assert set(torch.isfinite(out[1]).nonzero().flatten().tolist()) == expected
    # Step 3: the rows swap places (beam reordering): the candidates follow their row's mention.
    tok = trie.sequence(3)[0]
    sequences = torch.tensor([[2, 0, 7, start_id, tok], [2, 0, 7, 9, 9]])
    out = processor(sequences, torch.zeros(2, vocab))
    expected = {s[1] for s in (trie.sequence(3), trie.sequence(4)) if s[:1] == [tok]}
    assert set(torch.isfinite(out[0]).nonzero().flatten().tolist()) == expected
    assert torch.isfinite(out[1]).sum() == vocab - 1
    (mention,), () = processor.mentions(sequences)
    assert (mention.candidate_ids, mention.candidate_scores) == ([3, 4], pytest.approx([0.9, 0.1]))


S, E = 90, 91  # a start and an end marker


@pytest.mark.parametrize(
    "sequence, expected",
    [
        ([5, S, 7, 8, E, 9], [(1, 4, True)]),
        ([S, 3, E, S, 4, E], [(0, 2, True), (3, 5, True)]),
        ([S, E], [(0, 1, True)]),  # an empty span is closed
        ([S, 7, 8], [(0, 3, False)]),  # unclosed: runs to the end of the sequence
        ([5, 6, S], [(2, 3, False)]),
        ([S, 7, S, 8, E], [(0, 2, False), (2, 4, True)]),  # nested: the second <E_s> cuts the first span short
        ([S, S, E], [(0, 1, False), (1, 2, True)]),
        ([7, E, S, 8, E, E], [(2, 4, True)]),  # an <E_e> outside a span opens and closes nothing
        ([E, 7], []),
        ([], []),
    ],
)
def test_marked_spans(sequence, expected):
    assert marked_spans(sequence, S, E) == [MarkedSpan(*span) for span in expected]


def test_marked_spans_stop_at_the_stop_tokens():
    """A mention cut off by the end of generation ends at EOS / padding: neither is part of its tokens."""
    eos, pad = 2, 1
    assert marked_spans([S, 7, eos, pad], S, E, stop_token_ids={eos, pad}) == [MarkedSpan(0, 2, False)]
    assert marked_spans([S, 7, pad], S, E, stop_token_ids={eos, pad}) == [MarkedSpan(0, 2, False)]
    assert marked_spans([S, 7, E, eos], S, E, stop_token_ids={eos}) == [MarkedSpan(0, 2, True)]
    assert marked_spans([S, 7, eos, pad], S, E) == [MarkedSpan(0, 4, False)]  # without stop tokens: to the end
    # Position mode, where EOS is the end token: a stop token equal to it still closes the span.
    assert marked_spans([0, 5, eos, pad], None, eos, starts=[0], stop_token_ids={eos, pad}) == [MarkedSpan(0, 2, True)]


def test_marked_spans_from_given_openings():
    """Position mode: no start marker; each span opens at a given position and runs to the end token."""
    assert marked_spans([0, 5, 6, E, 7], None, E, starts=[0]) == [MarkedSpan(0, 3, True)]
    assert marked_spans([0, 5, 6], None, E, starts=[1]) == [MarkedSpan(1, 3, False)]
    with pytest.raises(ValueError, match="needs start_token_id"):
        marked_spans([0, E], None, E)


def test_mentions_report_the_marked_spans(tokenizer, names):
    """`processor.mentions` reads spans as `marked_spans` does and names the closed ones that spell an entity."""
    start_id, end_id = marker_token_ids(tokenizer)
    trie = EntityTrie.build(names, tokenizer, end_token_id=end_id)
    processor = EntityConstrainedLogitsProcessor(trie, start_token_id=start_id)
    name = trie.sequence(3)  # ends with <E_e>
    sequence = [2, start_id, 9, start_id, *name, 7, end_id, start_id, name[0]]
    (found,) = processor.mentions(torch.tensor([sequence]))
    assert [(m.start, m.end) for m in found] == [s[:2] for s in marked_spans(sequence, start_id, end_id)]
    assert [(m.token_ids, m.entity_id) for m in found] == [([9], -1), (name[:-1], 3), ([name[0]], -1)]
    eos = tokenizer.eos_token_id
    (cut_off,) = processor.mentions(torch.tensor([[*sequence, eos, eos]]), stop_token_ids={eos})
    assert cut_off[-1].token_ids == [name[0]] and cut_off[-1].end == len(sequence)


def test_authors_spelling_shares_a_path_and_names_the_candidate(tokenizer):
    """`normalize="authors"`: lower-cased names without a trailing parenthetical, as the authors' QA tries spell
    them; entities spelled alike share one path, decoding allows it for any of them, the report names the
    candidate."""
    assert authors_spelling("Baro (band)") == "baro" and authors_spelling("Baro Kita") == "baro kita"
    names = ["Baro", "Baro (band)", "Kita"]
    start_id, end_id = marker_token_ids(tokenizer)
    trie = EntityTrie.build(names, tokenizer, end_token_id=end_id, normalize="authors")
    spelled = tokenizer(" baro", add_special_tokens=False).input_ids + [end_id]
    assert trie.lookup_all(spelled) == [0, 1] and trie.lookup(spelled) in (0, 1)
    assert trie.lookup_all(tokenizer(" Baro", add_special_tokens=False).input_ids + [end_id]) == []
    cased = EntityTrie.build(names, tokenizer, end_token_id=end_id)
    assert cased.lookup_all(spelled) == [] and cased.num_nodes != trie.num_nodes
    # Only "Baro (band)" is on offer: its spelling "baro" is allowed and the report names entity 1.
    processor = EntityConstrainedLogitsProcessor(trie, start_token_id=start_id, candidates=torch.tensor([[1]]))
    sequence = [start_id, *spelled]
    scores = torch.zeros(1, len(tokenizer))
    for step in range(1, len(sequence)):
        allowed = processor(torch.tensor([sequence[:step]]), scores.clone())
        assert allowed[0, sequence[step]] == 0, step
    (found,) = processor.mentions(torch.tensor([sequence]), [0])
    assert [(m.token_ids, m.entity_id) for m in found] == [(spelled[:-1], 1)]
    with pytest.raises(ValueError, match="normalize must be one of"):
        EntityTrie.build(names, tokenizer, end_token_id=end_id, normalize="lower")
    with pytest.raises(ValueError, match="name 1 is empty"):
        EntityTrie.build(["Baro", "(band)"], tokenizer, end_token_id=end_id, normalize="authors")
