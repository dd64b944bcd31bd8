"""Build an EDMem from a config, train it a little, save it, reload it with AutoModelForSeq2SeqLM, generate.

Runs offline on a CPU in under a minute:

    python examples/quickstart.py --out /tmp/edmem-quickstart
"""

from __future__ import annotations

import argparse

import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

import edmem_hf  # noqa: F401  (registers EDMem with the Auto classes)
from edmem_hf import EDMemConfig, EDMemForConditionalGeneration, EntityVocab
from edmem_hf.tokenization import train_tokenizer

ENTITIES = ["Paris", "France", "Berlin", "Germany", "Rome", "Italy"]
# (question, answer, question mention -> entity, answer entity)
EXAMPLES = [
    ("What is the capital of <E_s> France <E_e>?", "<E_s> Paris <E_e>", "France", "Paris"),
    ("What is the capital of <E_s> Germany <E_e>?", "<E_s> Berlin <E_e>", "Germany", "Berlin"),
    ("What is the capital of <E_s> Italy <E_e>?", "<E_s> Rome <E_e>", "Italy", "Rome"),
]


def entity_labels_for(token_ids: torch.Tensor, entity_ids: list[int], start_id: int) -> torch.Tensor:
    """The entity id at each `<E_s>` (in order), -100 elsewhere: EDMem's mention supervision."""
    labels = torch.full_like(token_ids, -100)
    labels[token_ids == start_id] = torch.tensor(entity_ids)
    return labels


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="edmem-quickstart")
    parser.add_argument("--steps", type=int, default=150)
    args = parser.parse_args()
    torch.manual_seed(0)

    # 1. A tokenizer with <E_s>, <E_e> and <mask> (here trained on a handful of sentences).
    corpus = [q + " " + a for q, a, _, _ in EXAMPLES] * 20 + [f"{e} is a place." for e in ENTITIES] * 20
    tokenizer = train_tokenizer(corpus, vocab_size=400, min_frequency=1)
    start_id, end_id = tokenizer.convert_tokens_to_ids(["<E_s>", "<E_e>"])

    # 2. A tiny EDMem from a config: 1 lower + 1 upper layer on each side, a 6-entity memory.
    config = EDMemConfig(
        vocab_size=len(tokenizer),
        d_model=64,
        encoder_lower_layers=1,
        encoder_upper_layers=1,
        decoder_lower_layers=1,
        decoder_upper_layers=1,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        max_position_embeddings=64,
        entity_vocab_size=len(ENTITIES),
        entity_embed_dim=32,
        memory_top_k=3,
        entity_start_token_id=start_id,
        entity_end_token_id=end_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.eos_token_id,
        forced_eos_token_id=tokenizer.eos_token_id,
        dropout=0.0,
    )
    model = EDMemForConditionalGeneration(config)
    model.entity_vocab = EntityVocab(ENTITIES)

    # 3. A batch with mention supervision, and a few optimiser steps.
    questions = tokenizer([q for q, _, _, _ in EXAMPLES], return_tensors="pt", padding=True)
    answers = tokenizer([a for _, a, _, _ in EXAMPLES], return_tensors="pt", padding=True)
    labels = answers.input_ids.masked_fill(answers.attention_mask == 0, -100)
    batch = {
        **questions,
        "labels": labels,
        "entity_labels": entity_labels_for(
            questions.input_ids, [ENTITIES.index(e) for *_, e, _ in EXAMPLES], start_id
        ),
        "decoder_entity_labels": entity_labels_for(labels, [ENTITIES.index(e) for *_, e in EXAMPLES], start_id),
    }
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for step in range(args.steps):
        out = model(**batch)
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if step % 50 == 0 or step == args.steps - 1:
            print(
                f"step {step:3d}  loss {out.loss.item():.3f}  lm {out.lm_loss.item():.3f}  entity {out.entity_loss.item():.3f}"
            )

    # 4. Save (weights as safetensors, entity_vocab.json, the modeling code for trust_remote_code) and reload.
    model.save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    model = AutoModelForSeq2SeqLM.from_pretrained(args.out)
    tokenizer = AutoTokenizer.from_pretrained(args.out)
    print(f"reloaded {type(model).__name__} with {len(model.entity_vocab)} entities from {args.out}")

    # 5. Generate: answers come back with their entity markers.
    generated = model.generate(**questions, max_new_tokens=8, num_beams=2)
    for (question, *_), text in zip(EXAMPLES, tokenizer.batch_decode(generated, skip_special_tokens=False)):
        text = text.replace(tokenizer.pad_token, "").replace(tokenizer.eos_token, "").replace(tokenizer.bos_token, "")
        print(f"{question!r} -> {text.strip()!r}")


if __name__ == "__main__":
    main()
