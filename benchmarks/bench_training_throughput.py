"""Training throughput of EDMem vs a BART of the same widths and depth (CPU): forward + backward + AdamW step.

Setting: d_model 256, FFN 4 x d_model, heads of width 64 as in BART (4 heads here; BART-large's 16 with
`--d-model 1024`); EDMem with 2 lower + 2 upper layers on each side, BART with 4 + 4; entity embeddings of width
256 (the paper's); 10K and 100K entities. Batches: synthetic 128-token passages
with 12 mentions each (the paper's average density after heuristic labelling), corrupted by
`EDMemMaskingCollator` (P_rtm 0.3, P_ssm 0.5); BART gets the same `input_ids`/`labels` without the entity
fields. The models are stepped in interleaved rounds (EDMem-10K, EDMem-100K, BART) so that load from other
processes hits them alike (one step per model per round). The EDMem/BART ratios are computed within each round
and their median is reported; tokens/s is each model's fastest round. Tokens/s counts non-padding input tokens.
Target: EDMem >= 0.8x BART.

    python benchmarks/bench_training_throughput.py [--batch-size 8] [--rounds 6] [--vocab-size 16384] [--threads N]
        [--d-model 256] [--heads D_MODEL/64] [--lower 2] [--upper 2] [--entities 10000,100000]

Ends with `RESULT edmem_vs_bart_10k=... edmem_vs_bart_100k=... edmem_tokens_per_s_10k=... bart_tokens_per_s=...`.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from types import SimpleNamespace

import torch
from transformers import BartConfig, BartForConditionalGeneration

from edmem_hf.collator import EDMemMaskingCollator
from edmem_hf.configuration_edmem import EDMemConfig
from edmem_hf.modeling_edmem import EDMemForConditionalGeneration

BOS, PAD, EOS, UNK, MASK, E_S, E_E = range(7)


class _Tokenizer(SimpleNamespace):
    """What the collator needs of a tokenizer: the special ids."""

    def convert_tokens_to_ids(self, token: str) -> int:
        return {"<E_s>": E_S, "<E_e>": E_E}.get(token, UNK)


def make_examples(n: int, vocab_size: int, n_entities: int, length: int = 128, mentions: int = 12, seed: int = 0):
    """Synthetic passages: `<s>`, words, `mentions` x (`<E_s>` 1-3 words `<E_e>`), `</s>`; linked mentions."""
    rng = random.Random(seed)
    examples = []
    for _ in range(n):
        ids, labels = [BOS], [-100]
        slots = sorted(rng.sample(range(1, length - 6 * mentions), mentions))
        pos = 1
        for slot in slots:
            while pos < slot:
                ids.append(rng.randrange(7, vocab_size))
                labels.append(-100)
                pos += 1
            name = [rng.randrange(7, vocab_size) for _ in range(rng.randint(1, 3))]
            ids += [E_S, *name, E_E]
            labels += [rng.randrange(n_entities)] + [-100] * (len(name) + 1)
        while len(ids) < length - 1:
            ids.append(rng.randrange(7, vocab_size))
            labels.append(-100)
        ids.append(EOS)
        labels.append(-100)
        examples.append({"input_ids": ids, "entity_labels": labels})
    return examples


def make_models(vocab_size: int, d_model: int, heads: int, lower: int, upper: int, entities: list[int]):
    common = dict(
        vocab_size=vocab_size,
        d_model=d_model,
        encoder_ffn_dim=4 * d_model,
        decoder_ffn_dim=4 * d_model,
        encoder_attention_heads=heads,
        decoder_attention_heads=heads,
        max_position_embeddings=160,
        dropout=0.1,
        pad_token_id=PAD,
        bos_token_id=BOS,
        eos_token_id=EOS,
        decoder_start_token_id=EOS,
        forced_eos_token_id=EOS,
    )
    models = {}
    for n in entities:
        torch.manual_seed(0)
        config = EDMemConfig(
            encoder_lower_layers=lower,
            encoder_upper_layers=upper,
            decoder_lower_layers=lower,
            decoder_upper_layers=upper,
            entity_vocab_size=n,
            entity_embed_dim=256,
            entity_start_token_id=E_S,
            entity_end_token_id=E_E,
            **common,
        )
        models[f"edmem_{n // 1000}k"] = EDMemForConditionalGeneration(config)
    torch.manual_seed(0)
    bart = BartConfig(encoder_layers=lower + upper, decoder_layers=lower + upper, **common)
    models["bart"] = BartForConditionalGeneration(bart)
    return models


def step_fn(model, optimizer, batch, is_edmem: bool):
    inputs = batch if is_edmem else {k: batch[k] for k in ("input_ids", "attention_mask", "labels")}

    def step():
        loss = model(**inputs).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--vocab-size", type=int, default=16384)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--heads", type=int, default=None, help="attention heads (default: d_model / 64, as BART)")
    parser.add_argument("--lower", type=int, default=2)
    parser.add_argument("--upper", type=int, default=2)
    parser.add_argument("--entities", type=str, default="10000,100000")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    entities = [int(x) for x in args.entities.split(",")]
    heads = args.heads or args.d_model // 64

    tok = _Tokenizer(mask_token_id=MASK, pad_token_id=PAD, unk_token_id=UNK, all_special_ids=list(range(7)))
    collator = EDMemMaskingCollator(tok, seed=0)
    n_batches = 2
    batches = [
        collator(make_examples(args.batch_size, args.vocab_size, min(entities), seed=i)) for i in range(n_batches)
    ]
    tokens = [int(b["attention_mask"].sum()) for b in batches]
    models = make_models(args.vocab_size, args.d_model, heads, args.lower, args.upper, entities)
    steps = {}
    for name, model in models.items():
        model.train()
        # Fused AdamW, as `edmem pretrain` uses by default.
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=True)
        steps[name] = [step_fn(model, optimizer, b, name != "bart") for b in batches]
        params = sum(p.numel() for p in model.parameters())
        print(f"{name}: {params / 1e6:.1f}M parameters")
    print(
        f"threads={torch.get_num_threads()} batch={args.batch_size}x{batches[0]['input_ids'].shape[1]} "
        f"vocab={args.vocab_size} d_model={args.d_model} heads={heads} layers={args.lower}+{args.upper}"
    )

    for name in steps:  # warm-up: allocator, AdamW state
        steps[name][0]()
    # One step per model per round, on the same batch, models in turn; a model's figure is its best round.
    # Ratios are taken within a round (the models ran back to back, under the same load) and their median is
    # reported; tokens/s is each model's best round.
    best = {name: 0.0 for name in steps}
    ratios = {name: [] for name in steps}
    for r in range(args.rounds):
        i = r % n_batches
        rates = {}
        for name in steps:
            start = time.perf_counter()
            steps[name][i]()
            rates[name] = tokens[i] / (time.perf_counter() - start)
            best[name] = max(best[name], rates[name])
        for name in steps:
            ratios[name].append(rates[name] / rates["bart"])
        print(f"round {r}: " + ", ".join(f"{n} {v:,.0f} tokens/s" for n, v in rates.items()), flush=True)
    tps = best
    ratio = {name: statistics.median(values) for name, values in ratios.items()}
    for name, value in tps.items():
        spread = f"{min(ratios[name]):.2f}-{max(ratios[name]):.2f}"
        print(f"{name}: best {value:,.0f} tokens/s; median {ratio[name]:.2f}x BART (rounds: {spread})")
    fields = [f"edmem_vs_bart_{n // 1000}k={ratio[f'edmem_{n // 1000}k']:.3f}" for n in entities]
    fields.append(f"edmem_tokens_per_s_{entities[0] // 1000}k={tps[f'edmem_{entities[0] // 1000}k']:.0f}")
    fields.append(f"bart_tokens_per_s={tps['bart']:.0f}")
    print("RESULT " + " ".join(fields))


if __name__ == "__main__":
    main()
