"""The name-guided read at scale (`EDMemConfig(name_guided_read=True)`, `name_candidates.NameCandidates`): building
the lookup of a million entities' names, its size, a mention's lookup, adding entities with the lookup rebuilt, and
the encoder's forward pass with and without the name-guided read, side by side in one run.

    python benchmarks/bench_name_candidates.py                 # 1M entities (about 2 minutes on one core)
    python benchmarks/bench_name_candidates.py --entities 100000

Ends with one line `RESULT key=value ...`: `build_seconds`, `lookup_mb`, `lookup_us_per_mention`,
`add_100k_seconds` (100,000 names appended and the lookup rebuilt), `forward_ratio` (name-guided / plain).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from edmem_hf import EDMemConfig, EDMemForConditionalGeneration, EntityVocab  # noqa: E402
from edmem_hf.name_candidates import NameCandidates  # noqa: E402
from edmem_hf.tokenization import train_tokenizer  # noqa: E402

SYLLABLES = ["an", "ba", "dra", "lun", "vo", "mer", "zin", "ro", "ta", "sen", "pol", "gor", "ki", "el", "os", "ur"]


def made_up_names(count: int, seed: int = 0) -> list[str]:
    """`count` distinct two-word names of made-up words, as the knowledge world draws people's names."""
    rng = random.Random(seed)
    words = sorted({"".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 4))).title() for _ in range(20_000)})
    names: set[str] = set()
    while len(names) < count:
        names.add(f"{rng.choice(words)} {rng.choice(words)} {rng.choice(words)}")
    return sorted(names)


def timed(function, repeats: int = 1) -> float:
    start = time.perf_counter()
    for _ in range(repeats):
        function()
    return (time.perf_counter() - start) / repeats


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entities", type=int, default=1_000_000)
    parser.add_argument("--added", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    names = made_up_names(args.entities + args.added)
    trained, added = names[: args.entities], names[args.entities :]
    tokenizer = train_tokenizer((f"who is {name}?" for name in random.Random(1).sample(names, min(50_000, len(names)))),
                                vocab_size=4000)  # fmt: skip
    vocab = EntityVocab(trained)
    start = time.perf_counter()
    lookup = NameCandidates.build(vocab, tokenizer)
    build_seconds = time.perf_counter() - start
    lookup_mb = (lookup.hashes.nbytes + lookup.entity_ids.nbytes) / 2**20

    questions = [f"Where was <E_s> {name} <E_e> born?" for name in random.Random(2).sample(trained, 32)]
    batch = tokenizer(questions, return_tensors="pt", padding=True)
    start_id, end_id = tokenizer.convert_tokens_to_ids(["<E_s>", "<E_e>"])
    found = lookup.of_mentions(batch.input_ids, start_id, end_id)
    assert (found[:, 0] >= 0).all(), "every question's subject is found by name"
    lookup_us = 1e6 * timed(lambda: lookup.of_mentions(batch.input_ids, start_id, end_id), args.repeats) / 32

    start = time.perf_counter()
    NameCandidates.build(vocab.extended(added), tokenizer)
    add_seconds = time.perf_counter() - start

    config = EDMemConfig.from_tokenizer(tokenizer, entity_vocab_size=args.entities, d_model=256, encoder_ffn_dim=1024,
                                        decoder_ffn_dim=1024, encoder_attention_heads=4, decoder_attention_heads=4,
                                        encoder_lower_layers=2, encoder_upper_layers=2, decoder_lower_layers=2,
                                        decoder_upper_layers=2, entity_embed_dim=256)  # fmt: skip
    plain = EDMemForConditionalGeneration(config).eval()
    guided = EDMemForConditionalGeneration(
        EDMemConfig.from_dict({**config.to_dict(), "name_guided_read": True})
    ).eval()
    guided.load_state_dict(plain.state_dict())
    guided.entity_vocab = vocab
    guided.set_name_candidates(lookup)
    encoder_plain, encoder_guided = plain.get_encoder(), guided.get_encoder()
    with torch.no_grad():
        encoder_plain(**batch), encoder_guided(**batch)  # warm up
        times = {"plain": [], "guided": []}
        for _ in range(args.repeats):  # interleaved, so that both meet the same load
            times["plain"].append(timed(lambda: encoder_plain(**batch)))
            times["guided"].append(timed(lambda: encoder_guided(**batch)))
    ratio = min(times["guided"]) / min(times["plain"])
    print(f"{args.entities:,} entities: lookup built in {build_seconds:.1f} s ({len(lookup):,} spellings, "
          f"{lookup_mb:.0f} MB); {lookup_us:.0f} us a mention; {args.added:,} added and rebuilt in {add_seconds:.1f} s; "
          f"encoder forward of 32 questions {min(times['plain']):.3f} s plain, {min(times['guided']):.3f} s guided")  # fmt: skip
    print(f"RESULT entities={args.entities} build_seconds={build_seconds:.1f} lookup_mb={lookup_mb:.1f} "
          f"lookup_us_per_mention={lookup_us:.0f} add_{args.added // 1000}k_seconds={add_seconds:.1f} "
          f"forward_ratio={ratio:.3f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
