"""The writer's rows in training: texts read a few at a time by length against one padded pass (CPU, one thread).

`write_entity_rows` reads its texts `WRITER_TEXTS_PER_PASS` at a time in order of length, each group cut after its
longest text, where one pass pads every text to the batch's longest. Setting: the knowledge world's first stage
(`toy_world_growth.py`'s headline recipe), whose batches hand the writer about 90 texts, 88 tokens the longest and a
third of the padded batch tokens: a quarter of the texts biography passages (40-128 tokens), the rest one-sentence
pages (12-30); its model's widths (d_model 64, one layer a stack, 4 heads, rows of 64). Timed: the rows and a
backward pass through them (what a training step spends on the writer), the two ways in interleaved rounds so that
load from other processes hits them alike; the ratio is the median of the rounds' ratios.

    python benchmarks/bench_writer_rows.py [--rounds 20] [--texts 91]

Ends with `RESULT writer_rows_speedup=... one_pass_ms=... grouped_ms=... texts=... texts_per_pass=...`.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from edmem_hf.configuration_edmem import EDMemConfig
from edmem_hf.entity_writer import WRITER_TEXTS_PER_PASS
from edmem_hf.modeling_edmem import EDMemForConditionalGeneration

BOS, PAD, EOS, E_S, E_E = 0, 1, 2, 5, 6


def knowledge_world_model(vocab: int = 3000, entities: int = 1000) -> EDMemForConditionalGeneration:
    """A model of the knowledge world's widths with a writer of entity rows (random weights, no dropout)."""
    config = EDMemConfig(vocab_size=vocab, d_model=64, encoder_lower_layers=1, encoder_upper_layers=1,
                         decoder_lower_layers=1, decoder_upper_layers=1, encoder_ffn_dim=256, decoder_ffn_dim=256,
                         encoder_attention_heads=4, decoder_attention_heads=4, entity_vocab_size=entities,
                         entity_embed_dim=64, max_position_embeddings=160, entity_row_writer=True, dropout=0.0,
                         pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS, decoder_start_token_id=EOS,
                         entity_start_token_id=E_S, entity_end_token_id=E_E)  # fmt: skip
    return EDMemForConditionalGeneration(config).train()


def writer_texts(texts: int, vocab: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """`(texts, L)` writer inputs `<s> <E_s> name <E_e> words </s>`, right-padded, and their mask: a quarter of
    biography length (40-128 tokens), the rest one sentence (12-30)."""
    generator = torch.Generator().manual_seed(seed)
    long = torch.rand(texts, generator=generator) < 0.25
    lengths = torch.where(long, torch.randint(40, 129, (texts,), generator=generator),
                          torch.randint(12, 31, (texts,), generator=generator))  # fmt: skip
    ids = torch.full((texts, int(lengths.max())), PAD)
    for k, length in enumerate(lengths.tolist()):
        words = torch.randint(10, vocab, (length - 6,), generator=generator).tolist()
        ids[k, :length] = torch.tensor([BOS, E_S, 7, 8, E_E, *words, EOS])
    return ids, (ids != PAD).long()


def time_rows(model: EDMemForConditionalGeneration, ids: torch.Tensor, mask: torch.Tensor, per: int | None) -> float:
    """Seconds for the rows of `ids` and a backward pass through them, `per` texts a pass (None: one pass)."""
    model.zero_grad(set_to_none=True)
    started = time.perf_counter()
    model.write_entity_rows(ids, mask, texts_per_pass=per).square().mean().backward()
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--texts", type=int, default=91, help="writer texts a batch (the first stage's mean)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = knowledge_world_model()
    ids, mask = writer_texts(args.texts, model.config.vocab_size)
    print(f"{args.texts} texts, the longest {ids.shape[1]} tokens, {mask.float().mean():.0%} of the padded batch")
    for per in (None, WRITER_TEXTS_PER_PASS):  # warm-up
        time_rows(model, ids, mask, per)
    one_pass, grouped = [], []
    for _ in range(args.rounds):
        one_pass.append(time_rows(model, ids, mask, None))
        grouped.append(time_rows(model, ids, mask, WRITER_TEXTS_PER_PASS))
    speedup = statistics.median(whole / parts for whole, parts in zip(one_pass, grouped))
    print(f"one pass {min(one_pass) * 1e3:.1f} ms, {WRITER_TEXTS_PER_PASS} texts a pass {min(grouped) * 1e3:.1f} ms "
          f"(fastest rounds); median ratio {speedup:.2f}")  # fmt: skip
    print(f"RESULT writer_rows_speedup={speedup:.2f} one_pass_ms={min(one_pass) * 1e3:.1f} "
          f"grouped_ms={min(grouped) * 1e3:.1f} texts={args.texts} texts_per_pass={WRITER_TEXTS_PER_PASS}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
