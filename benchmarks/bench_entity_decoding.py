"""Benchmark of entity-constrained decoding: our vectorised processor vs `prefix_allowed_tokens_fn` + dict trie.

Standalone section (`bench_standalone`): a plain BART (4+4 layers, d_model 256, random weights) with a byte-level
BPE trained here on the Wikipedia sample of `../shared/data`, batch 32, 16 new tokens, greedy and 5 beams. The
decoder is prompted with `</s> <s> <E_s>` and the logit bias of `<E_s>` is raised, so that the model opens a new
mention as soon as one is closed: constraints are active for most steps (the output states the fraction), and
`min_new_tokens=16` makes every run generate the same number of steps. Entity names: the 10K most linked
targets of the sample (real names) and 1M synthetic names (1-4 words of the sample's vocabulary).

Times are the minimum over interleaved repeats after a warm-up, measured by default as CPU time of the main thread
with one torch thread (`--clock cpu --threads 1`), which stays meaningful on a shared, loaded machine; use
`--clock wall --threads 2` for wall-clock times. RESULT keys: `ours_*`/`prefix_fn_*` = constrained time / free
time; `ours_proc_*` = 1 + (time inside our processor) / free time; `added_time_ratio_vs_prefix_fn` = the largest,
over the four settings, of (time inside our processor) / (time inside `PrefixConstrainedLogitsProcessor`);
`trie_build_s_1m` (wall clock, tokenisation included), `trie_mb_1m` (array bytes), `trie_build_peak_mb_1m`
(tracemalloc peak of a second build), `constrained_frac_*` (rows x steps inside a mention).

EDMem section (`bench_edmem`): `EDMemForConditionalGeneration.generate(entity_decoding="free"|"static"|"dynamic",
entity_candidates=5)` with an EDMem of d_model 256, 2+2 encoder and 2+2 decoder layers, memory top-100, random
weights, the same tokenizer, inputs, batch (32) and 16 new tokens, greedy and 5 beams, with 10K entities (real link
targets) and 1M (synthetic names) in a `(N, 256)` float32 table. A random model repeats one token, so a
`MentionShaper` processor, the same in every mode and timed out of the results, gives it a mention rhythm: a mention
opens 1-7 tokens (mean `--gap`, 4) after the last one closed, at a different step for each example; free decoding
closes its mentions after 1..2L-1 tokens (mean L), L being the mean mention length of the constrained mode it is
compared with (`free@L`), so that both read the memory at about the same rate. The output states, for every run,
the mentions per sequence, the fraction of generated tokens inside mentions and the memory / entity-linking-head queries and
table searches. RESULT keys: `edmem_{static,dynamic}_{greedy,beam5}_{10k,1m}` = time / time of its `free@L`;
`edmem_mentions_*` and `edmem_memory_queries_*` for the 1M runs (`free_for_static`, `free_for_dynamic` are the free
runs). At 1M the EDMem runs are repeated with an `EntityIndex` (`generate(entity_index=True)`, the default
setting), side by side with the exact ones, over a `clustered_table` (rows around 1000 random centres, as a
trained table's; the exact search's cost does not depend on the rows): `edmem_{static,dynamic}_{greedy,beam5}_1m_index`
= indexed time / indexed `free@L` time, `index_build_s_1m` (wall clock), `index_mb_1m` (its arrays),
`index_recall_at_100_1m` (200 queries aimed at entities), `index_recall_random_model_1m` (the random model's own
queries, aimed at nothing: the worst case). `--no-index` skips them. `--sections standalone,edmem` picks the
sections. The script ends with one `RESULT key=value ...` line.

    python benchmarks/bench_entity_decoding.py [--quick] [--sections edmem]
"""

from __future__ import annotations

import argparse
import bz2
import collections
import gc
import os
import random
import re
import resource
import sys
import tempfile
import time
import tracemalloc

import numpy as np
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    BartConfig,
    BartForConditionalGeneration,
    LogitsProcessor,
    LogitsProcessorList,
    PrefixConstrainedLogitsProcessor,
    PreTrainedTokenizerFast,
)

from edmem_hf import EDMemConfig, EDMemForConditionalGeneration, EntityVocab
from edmem_hf.entity_decoding import EntityConstrainedLogitsProcessor, EntityTrie, marked_spans, marker_token_ids

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WIKI = os.path.join(ROOT, "..", "shared", "data", "wikipedia", "enwiki-pages-articles-sample-206.xml.bz2")


# --- data ----------------------------------------------------------------------------------------------------


def load_wiki(path: str = WIKI) -> tuple[str, list[str]]:
    """Wikitext of the sample and its link targets, most linked first."""
    text = bz2.open(path, "rt", encoding="utf-8").read()
    links = collections.Counter(
        m.strip() for m in re.findall(r"\[\[([^\]|#]+)", text) if ":" not in m and m.strip() and "\n" not in m
    )
    return text, [name for name, _ in links.most_common()]


def train_tokenizer(text: str, vocab_size: int = 12000) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>", "<E_s>", "<E_e>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    lines = [line for line in text.split("\n") if line.strip()]
    tok.train_from_iterator(lines, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        mask_token="<mask>",
        additional_special_tokens=["<E_s>", "<E_e>"],
    )


def synthetic_names(text: str, real: list[str], n: int, seed: int = 0) -> list[str]:
    """`n` unique names: the real ones, then 1-4 capitalised words of the text (the real length distribution)."""
    rng = random.Random(seed)
    words = sorted({w for w in re.findall(r"[A-Z][a-z]{2,}", text)})
    counts = [len(name.split()) for name in real] or [2]
    names = dict.fromkeys(real[:n])
    while len(names) < n:
        for _ in range(n - len(names)):
            names[" ".join(rng.choices(words, k=min(4, rng.choice(counts))))] = None
    return list(names)[:n]


# --- GENRE-style reference -----------------------------------------------------------------------------------


class DictTrie:
    """GENRE's nested-dict prefix tree (github.com/facebookresearch/GENRE, genre/trie.py), slimmed down."""

    def __init__(self, sequences: list[list[int]]):
        self.root: dict = {}
        for seq in sequences:
            node = self.root
            for token in seq:
                node = node.setdefault(token, {})

    def get(self, prefix: list[int]) -> list[int] | None:
        node = self.root
        for token in prefix:
            node = node.get(token)
            if node is None:
                return None
        return list(node.keys())


def genre_prefix_fn(trie: DictTrie, start_id: int, end_id: int, vocab_size: int):
    """`prefix_allowed_tokens_fn` with the same rules as our marker mode (outside a mention: all but `<E_e>`)."""
    outside = [i for i in range(vocab_size) if i != end_id]

    def fn(batch_id: int, sent: torch.Tensor) -> list[int]:
        tokens = sent.tolist()
        try:
            last = len(tokens) - 1 - tokens[::-1].index(start_id)
        except ValueError:
            return outside
        prefix = tokens[last + 1 :]
        if end_id in prefix:
            return outside
        allowed = trie.get(prefix)
        return allowed if allowed else [end_id]

    return fn


# --- helpers -------------------------------------------------------------------------------------------------


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def build_trie_measured(names: list[str], tokenizer, end_id: int) -> tuple[EntityTrie, float, float, float]:
    """
    Builds without cache twice: timed (wall clock, tokenisation included), then under tracemalloc (which slows
    allocations down). Returns the trie, seconds, tracemalloc peak (MB) and RSS growth of the first build (MB).
    """
    gc.collect()
    rss0 = rss_mb()
    t0 = time.perf_counter()
    trie = EntityTrie.build(names, tokenizer, end_token_id=end_id)
    seconds = time.perf_counter() - t0
    rss_delta = rss_mb() - rss0
    tracemalloc.start()
    EntityTrie.build(names, tokenizer, end_token_id=end_id)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return trie, seconds, peak / 2**20, rss_delta


def make_model(vocab_size: int, start_id: int, seed: int = 0) -> BartForConditionalGeneration:
    torch.manual_seed(seed)
    config = BartConfig(
        vocab_size=vocab_size,
        d_model=256,
        encoder_layers=4,
        decoder_layers=4,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=1024,
        decoder_ffn_dim=1024,
        max_position_embeddings=128,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        decoder_start_token_id=2,
        forced_eos_token_id=None,
    )
    model = BartForConditionalGeneration(config).eval()
    model.final_logits_bias[0, start_id] = 30.0  # open a mention whenever one may be opened
    return model


def check_spans(sequences: torch.Tensor, start_id: int, end_id: int, valid: set[tuple[int, ...]]) -> float:
    """Fraction of closed spans that are names (must be 1.0 for our processor)."""
    good = total = 0
    for seq in sequences.tolist():
        for start, end, closed in marked_spans(seq, start_id, end_id):
            if closed:
                total += 1
                good += tuple(seq[start + 1 : end + 1]) in valid
            elif end < len(seq):
                total += 1  # interrupted by another <E_s>: not a name
    return good / max(total, 1)


CLOCK = time.perf_counter


class Timed(LogitsProcessor):
    """Wraps a processor and adds up the time spent in it."""

    def __init__(self, inner: LogitsProcessor):
        self.inner, self.seconds = inner, 0.0

    def __call__(self, input_ids, scores):
        t0 = CLOCK()
        out = self.inner(input_ids, scores)
        self.seconds += CLOCK() - t0
        return out


class SpanCounter(LogitsProcessor):
    """Counts rows x steps inside a mention (the newest `<E_s>` not yet closed by `<E_e>`); scores pass through."""

    def __init__(self, start_id: int, end_id: int):
        self.start_id, self.end_id = start_id, end_id
        self.inside = self.rows = 0

    def __call__(self, input_ids, scores):
        pos = torch.arange(1, input_ids.shape[1] + 1)
        last_start = torch.where(input_ids == self.start_id, pos, 0).amax(1)
        last_end = torch.where(input_ids == self.end_id, pos, 0).amax(1)
        self.inside += int((last_start > last_end).sum())
        self.rows += input_ids.shape[0]
        return scores


def time_generate(model, inputs, repeats: int, **kwargs) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = CLOCK()
        with torch.inference_mode():
            model.generate(**inputs, **kwargs)
        best = min(best, CLOCK() - t0)
    return best


# --- sections ------------------------------------------------------------------------------------------------


_DATA: dict = {}


def shared_data() -> tuple[str, list[str], PreTrainedTokenizerFast]:
    """The sample's text, its link targets (most linked first) and the tokenizer, built once for all sections."""
    if not _DATA:
        text, real_names = load_wiki()
        t0 = time.perf_counter()
        tokenizer = train_tokenizer(text)
        print(f"tokenizer: {len(tokenizer)} tokens, trained in {time.perf_counter() - t0:.1f}s")
        _DATA.update(text=text, real_names=real_names, tokenizer=tokenizer)
    return _DATA["text"], _DATA["real_names"], _DATA["tokenizer"]


def encoder_inputs(text: str, tokenizer, batch: int = 32):
    sentences = [s for s in re.split(r"(?<=\.)\s", text[200000:400000]) if 40 < len(s) < 300][:batch]
    return tokenizer(sentences, return_tensors="pt", padding=True, truncation=True, max_length=48)


def bench_standalone(quick: bool = False, repeats: int = 3) -> dict[str, float]:
    results: dict[str, float] = {}
    text, real_names, tokenizer = shared_data()
    start_id, end_id = marker_token_ids(tokenizer)
    vocab = len(tokenizer)
    model = make_model(vocab, start_id)
    batch, new_tokens = 32, 16
    inputs = encoder_inputs(text, tokenizer, batch)
    prompt = torch.tensor([[2, 0, start_id]] * batch)
    sizes = {"10k": 10_000, "1m": 100_000 if quick else 1_000_000}

    for size_key, n in sizes.items():
        names = synthetic_names(text, real_names, n)
        real = sum(1 for name in names[: len(real_names)] if name in set(real_names))
        trie, build_s, peak_mb, rss_delta = build_trie_measured(names, tokenizer, end_id)
        print(
            f"\n[{size_key}] {n} names ({real} real link targets); trie: {trie}, built in {build_s:.2f}s "
            f"(tokenisation included), tracemalloc peak {peak_mb:.0f} MB, RSS +{rss_delta:.0f} MB"
        )
        results[f"trie_build_s_{size_key}"] = build_s
        results[f"trie_mb_{size_key}"] = trie.nbytes / 2**20
        results[f"trie_build_peak_mb_{size_key}"] = peak_mb
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            path = trie.save(os.path.join(tmp, "trie"))
            save_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            EntityTrie.load(path)
            print(
                f"  save {save_s:.2f}s, load {time.perf_counter() - t0:.2f}s, {os.path.getsize(path) / 2**20:.0f} MB"
            )

        sequences = [trie.sequence(i) for i in range(len(names))]
        valid = set(map(tuple, sequences))
        t0 = time.perf_counter()
        tracemalloc.start()
        dict_trie = DictTrie(sequences)
        dict_mb = tracemalloc.get_traced_memory()[0] / 2**20
        tracemalloc.stop()
        dict_s = time.perf_counter() - t0
        print(f"  GENRE dict trie over the same sequences: {dict_s:.1f}s, {dict_mb:.0f} MB (excluding tokenisation)")
        prefix_fn = genre_prefix_fn(dict_trie, start_id, end_id, vocab)
        processor = EntityConstrainedLogitsProcessor(trie, start_token_id=start_id, end_token_id=end_id)
        del sequences

        for mode, kwargs in (("greedy", {"num_beams": 1}), ("beam5", {"num_beams": 5})):
            common = dict(decoder_input_ids=prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens, **kwargs)
            ours_proc = Timed(processor)
            theirs_proc = Timed(PrefixConstrainedLogitsProcessor(prefix_fn, kwargs["num_beams"]))
            ours = dict(logits_processor=LogitsProcessorList([ours_proc]), **common)
            theirs = dict(logits_processor=LogitsProcessorList([theirs_proc]), **common)
            # Warm-up of all three, correctness and constrained fraction (counted by a processor after ours,
            # outside the timing).
            spans = SpanCounter(start_id, end_id)
            with torch.inference_mode():
                model.generate(**inputs, **common)
                out = model.generate(**inputs, **{**ours, "logits_processor": LogitsProcessorList([processor, spans])})
                out_theirs = model.generate(**inputs, **theirs)
            frac = spans.inside / max(spans.rows, 1)
            ok = check_spans(out[:, prompt.shape[1] - 1 :], start_id, end_id, valid)
            # The dict-trie baseline at 1M with beams is slow: one timed run of each side there.
            slow = size_key != "10k" and mode == "beam5"
            free_t = ours_t = theirs_t = float("inf")
            ours_in = theirs_in = float("inf")
            for _ in range(1 if slow else repeats):  # interleaved, the same number of times for each side
                free_t = min(free_t, time_generate(model, inputs, 1, **common))
                ours_proc.seconds = 0.0
                ours_t = min(ours_t, time_generate(model, inputs, 1, **ours))
                ours_in = min(ours_in, ours_proc.seconds)
                theirs_proc.seconds = 0.0
                theirs_t = min(theirs_t, time_generate(model, inputs, 1, **theirs))
                theirs_in = min(theirs_in, theirs_proc.seconds)
            same = bool(torch.equal(out, out_theirs)) if mode == "greedy" else None
            ours_ratio, theirs_ratio = ours_t / free_t, theirs_t / free_t
            added_wall = (ours_t - free_t) / max(theirs_t - free_t, 1e-9)
            print(
                f"  {mode:6s} free {free_t * 1000:7.1f} ms | ours {ours_t * 1000:7.1f} ms ({ours_ratio:.3f}x, "
                f"{ours_in * 1000:.1f} ms in the processor) | prefix_fn {theirs_t * 1000:8.1f} ms "
                f"({theirs_ratio:.2f}x, {theirs_in * 1000:.0f} ms in the processor){' [1 run]' if slow else ''}\n"
                f"         processor time ours/prefix_fn {ours_in / theirs_in:.4f}, wall-clock added time ours/prefix_fn "
                f"{added_wall:.3f} | constrained rows x steps {frac:.0%} | valid spans {ok:.0%}"
                + (f" | same output as prefix_fn: {same}" if same is not None else "")
            )
            results[f"ours_{mode}_{size_key}"] = ours_ratio
            results[f"ours_proc_{mode}_{size_key}"] = 1 + ours_in / free_t
            results[f"prefix_fn_{mode}_{size_key}"] = theirs_ratio
            results[f"added_ratio_{mode}_{size_key}"] = ours_in / theirs_in
            results[f"added_wall_ratio_{mode}_{size_key}"] = added_wall
            results[f"constrained_frac_{mode}_{size_key}"] = frac
            if ok < 1.0:
                print("  ERROR: our processor produced a span that is not a name", file=sys.stderr)
        del dict_trie, prefix_fn, processor, trie
        gc.collect()
    results["added_time_ratio_vs_prefix_fn"] = max(v for k, v in results.items() if k.startswith("added_ratio_"))
    results["max_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return results


# --- EDMem section -------------------------------------------------------------------------------------------


class MentionShaper(LogitsProcessor):
    """
    Gives a random EDMem the mention rhythm of a trained one, in the same way in the three decoding modes.

    A random model repeats one token (with the `<E_s>` bias: `<E_s> <E_s> ...`), so on its own free decoding would
    read the memory at every step and never close a mention, while constrained decoding spells a name and closes
    it. Outside a mention this processor forbids `<E_e>`, and `<E_s>` until the row has had `g` tokens since its last
    `<E_e>` (or the start), with `g` in `1 .. 2 * gap - 1` varying with the example and its mention count, so that
    rows open mentions at different steps (mean `gap`), as in real text. With `length` (free mode only: the
    constrained modes close a mention by spelling a name) it also forbids `<E_s>`/`<E_e>` inside a mention until it
    has `l` tokens, then forces `<E_e>`, `l` varying in the same way in `1 .. 2 * length - 1`. Beams of one example
    share `g` and `l` (`group_size`). Its time is measured and subtracted from every run, so that each mode is timed
    as the model plus its own entity decoding work.
    """

    def __init__(
        self, start_id: int, end_id: int, prompt_len: int, gap: int, length: int | None = None, group_size: int = 1
    ):
        self.start_id, self.end_id, self.prompt_len = start_id, end_id, prompt_len
        self.gap, self.length, self.group_size = gap, length, group_size
        self.seconds = 0.0

    def __call__(self, input_ids, scores):
        t0 = CLOCK()
        generated = input_ids[:, self.prompt_len :]
        rows, n = generated.shape
        example = torch.arange(rows) // self.group_size
        pos = torch.arange(1, n + 1)
        last_start = (
            torch.where(generated == self.start_id, pos, 0).amax(1) if n else torch.zeros(rows, dtype=torch.long)
        )
        last_end = torch.where(generated == self.end_id, pos, 0).amax(1) if n else torch.zeros(rows, dtype=torch.long)
        opened = (generated == self.start_id).sum(1)
        inside = last_start > last_end
        gap = 1 + (example * 5 + opened * 3) % (2 * self.gap - 1)
        forbid_start = ~inside & (n - last_end < gap)
        forbid_end = ~inside
        force_end = None
        if self.length is not None:
            length = 1 + (example * 3 + opened * 5) % (2 * self.length - 1)
            count = n - last_start
            forbid_start |= inside
            forbid_end |= inside & (count < length)
            force_end = (inside & (count >= length)).nonzero().squeeze(1)
        neg = torch.tensor(float("-inf"))
        scores[:, self.start_id] = torch.where(forbid_start, neg, scores[:, self.start_id])
        scores[:, self.end_id] = torch.where(forbid_end, neg, scores[:, self.end_id])
        if force_end is not None and len(force_end):
            scores.index_fill_(0, force_end, float("-inf"))
            scores[force_end, self.end_id] = 0.0
        self.seconds += CLOCK() - t0
        return scores


def clustered_table(num_entities: int, dim: int = 256, num_kinds: int = 1000, seed: int = 0) -> torch.Tensor:
    """A random entity table with the structure of a trained one: rows scattered around `num_kinds` random centres
    (kinds of entities), as much spread within a kind as between centres, at the scale of the model's
    initialisation (std 0.02). An unstructured table (independent rows) is the index's worst case: no clustering of
    it lets a query skip rows."""
    generator = torch.Generator().manual_seed(seed)
    centres = torch.randn(num_kinds, dim, generator=generator)
    rows = centres[torch.randint(0, num_kinds, (num_entities,), generator=generator)]
    return rows.add_(torch.randn(num_entities, dim, generator=generator)).mul_(0.02)


def aimed_queries(table: torch.Tensor, num_queries: int, seed: int = 0) -> torch.Tensor:
    """Queries aimed at random entities of `table`, as a trained model's are: the row's direction plus as much
    noise."""
    generator = torch.Generator().manual_seed(seed)
    rows = table[torch.randint(0, len(table), (num_queries,), generator=generator)] / 0.02
    return rows + torch.randn(num_queries, table.shape[1], generator=generator)


EDMEM_WIDTHS = {
    # d_model, lower layers, upper layers, heads (FFN is 4 x d_model)
    "small": (256, 2, 2, 4),
    "large": (1024, 4, 8, 16),  # the paper's edmem-large transformer
}


def make_edmem(tokenizer, names: list[str], seed: int = 0, width: str = "small") -> EDMemForConditionalGeneration:
    """EDMem of the given width (`EDMEM_WIDTHS`), a `(len(names), 256)` table, random weights."""
    torch.manual_seed(seed)
    start_id, end_id = marker_token_ids(tokenizer)
    d_model, lower, upper, heads = EDMEM_WIDTHS[width]
    config = EDMemConfig(
        vocab_size=len(tokenizer),
        d_model=d_model,
        encoder_lower_layers=lower,
        encoder_upper_layers=upper,
        decoder_lower_layers=lower,
        decoder_upper_layers=upper,
        encoder_attention_heads=heads,
        decoder_attention_heads=heads,
        encoder_ffn_dim=4 * d_model,
        decoder_ffn_dim=4 * d_model,
        entity_vocab_size=len(names),
        entity_embed_dim=256,
        memory_top_k=100,
        max_position_embeddings=128,
        entity_start_token_id=start_id,
        entity_end_token_id=end_id,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        decoder_start_token_id=2,
        forced_eos_token_id=None,
    )
    model = EDMemForConditionalGeneration(config).eval()
    model.entity_vocab = EntityVocab(names)
    with torch.no_grad():
        model.final_logits_bias[0, start_id] = 30.0  # open a mention whenever the shaper lets it
    return model


def mention_stats(sequences: torch.Tensor, start_id: int, end_id: int, trie: EntityTrie | None):
    """Mentions per sequence, fraction of generated tokens inside a mention (name tokens and `<E_e>`), mean
    tokens per closed mention, fraction of closed mentions that spell an entity name."""
    mentions = inside = closed = valid = closed_tokens = 0
    rows = sequences[:, 1:].tolist()
    for seq in rows:
        for start, end, is_closed in marked_spans(seq, start_id, end_id):
            mentions += 1
            inside += end - start - 1 + is_closed
            if is_closed:
                closed += 1
                closed_tokens += end - start - 1
                valid += trie is not None and trie.lookup(seq[start + 1 : end + 1]) >= 0
    return (
        mentions / len(rows),
        inside / (len(rows) * len(rows[0])),
        closed_tokens / max(closed, 1),
        valid / max(closed, 1),
    )


def bench_edmem(
    quick: bool = False,
    repeats: int = 3,
    gap: int = 4,
    cache_dir: str | None = None,
    width: str = "small",
    sizes: tuple[str, ...] = ("10k", "1m"),
    index: bool = True,
) -> dict[str, float]:
    """Free vs static vs dynamic entity decoding through `EDMemForConditionalGeneration.generate`.

    With `index`, the 1M runs are made twice, side by side: exact search and `generate(entity_index=True)` (an
    `EntityIndex` built on the table first, its build time, memory and recall@100 reported); the table is then a
    `clustered_table` (the exact search's cost does not depend on the rows). Result keys are `edmem_*` for the
    small width and `edmem_large_*` for the paper's width; the indexed runs' ratios end in `_index`.
    """
    results: dict[str, float] = {}
    prefix = "edmem" if width == "small" else f"edmem_{width}"
    text, real_names, tokenizer = shared_data()
    start_id, end_id = marker_token_ids(tokenizer)
    inputs = encoder_inputs(text, tokenizer, 32)
    new_tokens, k = 16, 5
    cache_dir = cache_dir or os.path.join(tempfile.gettempdir(), "edmem_bench_tries")
    sizes = {key: n for key, n in {"10k": 10_000, "1m": 100_000 if quick else 1_000_000}.items() if key in sizes}
    d_model, lower, upper, _ = EDMEM_WIDTHS[width]
    print(
        f"\n== EDMem ({width}): d_model {d_model}, {lower}+{upper} layers per side, memory top-100, batch 32, "
        f"{new_tokens} new tokens, "
        f"{k} candidates, mentions opened {gap} tokens after the last one closed =="
    )
    counts = collections.Counter()

    def count_memory(module, args, output):
        queries = output[1].positions.shape[0]
        counts.update(memory_queries=queries, memory_searches=int(queries > 0))

    def count_head(module, args, output):
        counts.update(head_queries=output.positions.shape[0], head_searches=1)

    for size_key, n in sizes.items():
        names = synthetic_names(text, real_names, n)
        t0 = time.perf_counter()
        model = make_edmem(tokenizer, names, width=width)
        t1 = time.perf_counter()
        trie = model.entity_trie(tokenizer, cache_dir=cache_dir)
        print(
            f"\n[{size_key}] {n} entities; model built in {t1 - t0:.1f}s, trie ({trie}) ready in "
            f"{time.perf_counter() - t1:.1f}s"
        )
        searches = [False]
        if index and size_key == "1m":
            searches.append(True)
            results.update(build_index_measured(model, f"{prefix}_" if width != "small" else "", size_key))
        for dec, beams in (("greedy", 1), ("beam5", 5)):
            common = dict(
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                num_beams=beams,
                tokenizer=tokenizer,
                entity_candidates=k,
            )
            # Each constrained mode is compared with a free run whose mentions are as long as its own (mean tokens
            # per mention of a calibration run), so that both read the memory at about the same rate.
            lengths = {}
            for mode in ("static", "dynamic"):
                with torch.inference_mode():
                    out = model.generate(
                        **inputs,
                        entity_decoding=mode,
                        logits_processor=LogitsProcessorList([MentionShaper(start_id, end_id, 1, gap, None, beams)]),
                        **common,
                    )
                lengths[mode] = max(1, round(mention_stats(out, start_id, end_id, trie)[2]))
            runs = {}  # run name -> (entity_decoding, free-mode mention length, indexed search)
            baseline = {}  # constrained run -> its free run
            for indexed in searches:
                tag = "+index" if indexed else ""
                for mode in ("static", "dynamic"):
                    runs[f"free@{lengths[mode]}{tag}"] = ("free", lengths[mode], indexed)
                    runs[mode + tag] = (mode, None, indexed)
                    baseline[mode + tag] = f"free@{lengths[mode]}{tag}"
            shapers = {
                run: MentionShaper(start_id, end_id, 1, gap, length, beams) for run, (_, length, _) in runs.items()
            }
            kwargs = {
                run: dict(
                    entity_decoding=mode,
                    logits_processor=LogitsProcessorList([shapers[run]]),
                    entity_index=indexed,
                    **common,
                )
                for run, (mode, _, indexed) in runs.items()
            }
            stats = {}
            hooks = [
                model.model.decoder.memory.register_forward_hook(count_memory),
                model.entity_linking_head.register_forward_hook(count_head),
            ]
            for run in runs:  # warm-up and counts (hooks only here, not in the timed runs)
                counts.clear()
                with torch.inference_mode():
                    out = model.generate(**inputs, **kwargs[run])
                stats[run] = (*mention_stats(out, start_id, end_id, trie), dict(counts))
            for hook in hooks:
                hook.remove()
            best = dict.fromkeys(runs, float("inf"))
            shaper_s = dict.fromkeys(runs, 0.0)
            with torch.inference_mode():
                for _ in range(repeats):  # interleaved
                    for run in runs:
                        shapers[run].seconds = 0.0
                        t0 = CLOCK()
                        model.generate(**inputs, **kwargs[run])
                        total = CLOCK() - t0
                        if total - shapers[run].seconds < best[run]:
                            best[run], shaper_s[run] = total - shapers[run].seconds, shapers[run].seconds
            print(f"  {dec} (free@L: free decoding with mentions closed after L tokens; +index: an EntityIndex)")
            key = f"{dec}_{size_key}"
            for run, (mode, _, indexed) in runs.items():
                per_seq, frac, mean_len, ok, c = stats[run]
                ratio = best[run] / best[baseline[run]] if mode != "free" else 1.0
                print(
                    f"    {run:14s} {best[run] * 1000:8.1f} ms"
                    + (f" ({ratio:.3f}x {baseline[run]})" if mode != "free" else "")
                    + f"; shaper {shaper_s[run] * 1000:.1f} ms subtracted | mentions/seq {per_seq:.2f}, inside "
                    f"mentions {frac:.0%}, {mean_len:.1f} tokens/mention"
                    + (f", valid names {ok:.0%}" if mode != "free" else "")
                    + f" | memory: {c.get('memory_queries', 0)} queries in {c.get('memory_searches', 0)} table searches"
                    + f"; EL head: {c.get('head_queries', 0)} queries in {c.get('head_searches', 0)} searches"
                )
                tag = "_index" if indexed else ""
                if mode != "free":
                    results[f"{prefix}_{mode}_{key}{tag}"] = ratio
                    if ok < 1.0:
                        print(f"  ERROR: {mode} decoding produced a mention that is not a name", file=sys.stderr)
                if indexed:
                    continue
                names = [mode] if mode != "free" else [f"free_for_{m}" for m in baseline if baseline[m] == run]
                for name in names:
                    results[f"{prefix}_mentions_{name}_{key}"] = per_seq
                    results[f"{prefix}_inside_frac_{name}_{key}"] = frac
                    results[f"{prefix}_memory_queries_{name}_{key}"] = c.get("memory_queries", 0)
                    results[f"{prefix}_ms_{name}_{key}"] = best[run] * 1000
        del model, trie
        gc.collect()
    return results


def build_index_measured(model, prefix: str, size_key: str) -> dict[str, float]:
    """Puts a `clustered_table` in `model`, builds its `EntityIndex` (not cached) and measures the build (wall
    clock), the index's memory (its arrays, and the growth of the process's RSS), its recall@100 on aimed
    queries and on the model's own queries (a random model's: not aimed at any entity, the index's worst case)."""
    import faiss

    faiss.omp_set_num_threads(torch.get_num_threads())
    table = model.model.entity_embeddings.weight
    with torch.no_grad():
        table.copy_(clustered_table(*table.shape, seed=0))
    rss_before = rss_mb()
    t0 = time.perf_counter()
    index = model.build_entity_index(use_cache=False)
    build_s = time.perf_counter() - t0
    rss_growth = rss_mb() - rss_before
    recall = index.recall(aimed_queries(table.detach(), 200, seed=1), table.detach(), k=100)
    own = model.model.decoder.memory.query_proj(torch.randn(200, model.config.d_model)).detach()
    own_recall = index.recall(own, table.detach(), k=100)
    model.set_entity_index(None)
    print(
        f"  index: {index} built in {build_s:.1f}s (fingerprint included), {index.nbytes / 2**20:.0f} MB of arrays "
        f"(RSS +{rss_growth:.0f} MB); recall@100 {recall:.3f} on aimed queries, {own_recall:.3f} on the "
        "random model's queries"
    )
    return {
        f"{prefix}index_recall_at_100_{size_key}": recall,
        f"{prefix}index_build_s_{size_key}": build_s,
        f"{prefix}index_mb_{size_key}": index.nbytes / 2**20,
        f"{prefix}index_recall_random_model_{size_key}": own_recall,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="100K instead of 1M names")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: timings robust to other load)")
    parser.add_argument(
        "--clock",
        choices=["cpu", "wall"],
        default="cpu",
        help="cpu: CPU time of this thread (with --threads 1, robust on a shared machine); wall: perf_counter",
    )
    parser.add_argument(
        "--sections", default="standalone,edmem", help="comma-separated: standalone (plain BART), edmem (generate())"
    )
    parser.add_argument("--gap", type=int, default=4, help="EDMem section: tokens between a mention and the next")
    parser.add_argument(
        "--edmem-width", choices=sorted(EDMEM_WIDTHS), default="small", help="EDMem section: model width"
    )
    parser.add_argument("--edmem-sizes", default="10k,1m", help="EDMem section: entity counts (10k, 1m)")
    parser.add_argument(
        "--no-index", action="store_true", help="EDMem section: exact search only (no EntityIndex runs at 1M)"
    )
    args = parser.parse_args(argv)
    global CLOCK
    CLOCK = time.thread_time if args.clock == "cpu" else time.perf_counter
    if args.clock == "cpu" and args.threads != 1:
        parser.error("--clock cpu measures one thread: use --threads 1")
    torch.set_num_threads(args.threads)
    print(f"torch threads: {args.threads}, clock: {args.clock}; load average: {os.getloadavg()}")
    sections = set(args.sections.split(","))
    results: dict[str, float] = {}
    if "standalone" in sections:
        results.update(bench_standalone(quick=args.quick, repeats=args.repeats))
    if "edmem" in sections:
        results.update(
            bench_edmem(
                quick=args.quick,
                repeats=args.repeats,
                gap=args.gap,
                width=args.edmem_width,
                sizes=tuple(args.edmem_sizes.split(",")),
                index=not args.no_index,
            )
        )
    keys = [
        "ours_greedy_10k",
        "ours_beam5_10k",
        "ours_greedy_1m",
        "ours_beam5_1m",
        "prefix_fn_greedy_10k",
        "prefix_fn_beam5_10k",
        "prefix_fn_greedy_1m",
        "prefix_fn_beam5_1m",
        "added_time_ratio_vs_prefix_fn",
        "ours_proc_greedy_1m",
        "ours_proc_beam5_1m",
        "trie_build_s_1m",
        "trie_mb_1m",
        "trie_build_peak_mb_1m",
        "constrained_frac_greedy_1m",
        "constrained_frac_beam5_1m",
    ]
    runs = ("free_for_static", "static", "free_for_dynamic", "dynamic")
    for p in ("edmem", "edmem_large"):
        keys += [f"{p}_{m}_{d}_{s}" for s in ("10k", "1m") for d in ("greedy", "beam5") for m in ("static", "dynamic")]
        keys += [f"{p}_{m}_{d}_1m_index" for d in ("greedy", "beam5") for m in ("static", "dynamic")]
        keys += [f"{p}_mentions_{m}_{d}_1m" for d in ("greedy", "beam5") for m in runs]
        keys += [f"{p}_memory_queries_{m}_{d}_1m" for d in ("greedy", "beam5") for m in runs]
    keys += [f"{p}index_{f}_1m" for p in ("", "edmem_large_") for f in ("recall_at_100", "build_s", "mb")]
    keys += [f"{p}index_recall_random_model_1m" for p in ("", "edmem_large_")]
    print("RESULT " + " ".join(f"{k}={results[k]:.3f}" for k in keys if k in results))
    return 0


if __name__ == "__main__":
    np.seterr(all="ignore")
    sys.exit(main())
