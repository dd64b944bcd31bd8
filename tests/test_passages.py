"""Windowing of marked documents into passages (`edmem_hf.passages`)."""

import numpy as np
import pytest

from edmem_hf.marked_tokenization import MarkedTokens
from edmem_hf.passages import PassageSettings, window_passages

BOS, EOS, E_S, E_E = 0, 2, 5, 6


def _document(ids, labels, spans) -> MarkedTokens:
    return MarkedTokens(
        np.array(ids, dtype=np.int32), np.array(labels, dtype=np.int64), np.array(spans, dtype=np.int64).reshape(-1, 3)
    )


def _passages(ids, labels, spans, settings) -> list[dict]:
    """`window_passages`' arrays as one dict a passage."""
    windows = window_passages(_document(ids, labels, spans), settings, BOS, EOS)
    ends = np.cumsum(windows.lengths).tolist()
    out_ids, out_labels = windows.ids.tolist(), windows.labels.tolist()
    return [
        {
            "input_ids": out_ids[end - length : end],
            "entity_labels": out_labels[end - length : end],
            "passage_index": index,
            "num_link_mentions": counts[0],
            "num_heuristic_mentions": counts[1],
            "num_labeled_mentions": counts[2],
        }
        for index, end, length, counts in zip(
            windows.passage_index.tolist(), ends, windows.lengths.tolist(), windows.counts.tolist()
        )
    ]


def _doc(n, mentions=()):
    """A synthetic token stream 100..100+n with the given (start, end) mentions already marked."""
    ids = list(range(100, 100 + n))
    labels = [-100] * n
    spans = []
    for s, e in mentions:
        ids[s], ids[e] = E_S, E_E
        labels[s] = 42
        spans.append((s, e, False))
    return ids, labels, spans


def test_passage_settings_are_checked():
    with pytest.raises(ValueError, match="too short"):
        PassageSettings(passage_length=4)
    with pytest.raises(ValueError, match="passage_overlap"):
        PassageSettings(passage_length=12, passage_overlap=10)


def test_windows_length_overlap_and_top_up():
    settings = PassageSettings(passage_length=12, passage_overlap=3)  # 10 content tokens, stride 7
    ids, labels, spans = _doc(23)
    passages = _passages(ids, labels, spans, settings)
    contents = [p["input_ids"][1:-1] for p in passages]
    assert all(p["input_ids"][0] == BOS and p["input_ids"][-1] == EOS and len(p["input_ids"]) == 12 for p in passages)
    assert contents[0] == ids[0:10] and contents[1] == ids[7:17]
    assert contents[0][-3:] == contents[1][:3]  # overlap
    assert contents[2] == ids[14:23] + ids[0:1]  # last one topped up from the start of the same document
    assert [p["passage_index"] for p in passages] == [0, 1, 2]
    short = _passages(*_doc(4), settings)
    assert [p["input_ids"] for p in short] == [[BOS] + ids[:4] + [EOS]]
    assert _passages([], [], [], settings) == []


def test_mention_cut_by_boundary_is_unmarked():
    settings = PassageSettings(passage_length=12, passage_overlap=3)
    ids, labels, spans = _doc(17, mentions=[(2, 4), (8, 11)])  # second mention crosses the first boundary (10)
    first, second = _passages(ids, labels, spans, settings)
    assert first["input_ids"].count(E_S) == 1 and first["input_ids"].count(E_E) == 1
    assert first["entity_labels"].count(42) == 1 and first["num_link_mentions"] == 1
    assert len(first["input_ids"]) == 11  # the cut mention's <E_s> is dropped, its words stay
    assert 108 not in first["input_ids"] and 109 in first["input_ids"]
    assert second["input_ids"][1:6] == [107, E_S, 109, 110, E_E]  # whole in the second window: marked there
    assert second["input_ids"].count(E_S) == 1 and second["entity_labels"].count(42) == 1
    assert [first["passage_index"], second["passage_index"]] == [0, 1]
    for passage in (first, second):
        assert len(passage["input_ids"]) == len(passage["entity_labels"])
        for token, label in zip(passage["input_ids"], passage["entity_labels"]):
            assert label == -100 or token == E_S


def _reference_windows(ids, labels, spans, settings, bos, eos):
    """Windowing written out token list by token list (the specification `window_passages` is held to)."""
    content = settings.passage_length - 2
    stride = content - settings.passage_overlap
    n = len(ids)
    ranges_per_window = []
    start = 0
    while n:
        end = start + content
        if end >= n:
            ranges_per_window.append([(start, n)] + ([(0, end - n)] if end > n and n > content else []))
            break
        ranges_per_window.append([(start, end)])
        start += stride
    passages = []
    for index, ranges in enumerate(ranges_per_window):
        out_ids, out_labels, counts = [bos], [-100], [0, 0, 0]
        for low, high in ranges:
            drop = set()
            for e_s, e_e, heuristic in spans:
                inside = [p for p in (e_s, e_e) if low <= p < high]
                if len(inside) == 2:
                    counts[1 if heuristic else 0] += 1
                    counts[2] += labels[e_s] != -100
                else:
                    drop.update(inside)
            kept = [p for p in range(low, high) if p not in drop]
            out_ids += [ids[p] for p in kept]
            out_labels += [labels[p] for p in kept]
        passages.append(
            {
                "input_ids": out_ids + [eos],
                "entity_labels": out_labels + [-100],
                "passage_index": index,
                "num_link_mentions": counts[0],
                "num_heuristic_mentions": counts[1],
                "num_labeled_mentions": counts[2],
            }
        )
    return passages


def test_windows_match_the_token_by_token_reference():
    """`window_passages` (all windows of a document at once, as arrays) against the reference, on random
    documents: lengths around the window size, mentions cut by boundaries and by the top-up, short mentions."""
    import random

    rng = random.Random(3)
    for trial in range(1500):
        settings = PassageSettings(passage_length=rng.randint(8, 20), passage_overlap=0)
        settings = PassageSettings(settings.passage_length, rng.randint(0, settings.passage_length - 3))
        n = rng.choice([0, 1, rng.randint(2, 60), settings.passage_length - 2, settings.passage_length - 1])
        ids, labels, spans = [100 + i for i in range(n)], [-100] * n, []
        position = 0
        while n and position < n - 1:  # mentions as marker pairs in order, not overlapping
            e_s = rng.randint(position, n - 1)
            e_e = rng.randint(e_s + 1, min(n - 1, e_s + rng.randint(1, 6))) if e_s < n - 1 else None
            if e_e is None:
                break
            ids[e_s], ids[e_e] = E_S, E_E
            labels[e_s] = rng.choice([-100, 7, 8])
            spans.append((e_s, e_e, rng.random() < 0.5))
            position = e_e + 1
        got = _passages(ids, labels, spans, settings)
        assert got == _reference_windows(ids, labels, spans, settings, BOS, EOS), (trial, n, spans, settings)
