"""Do written rows carry facts? A tiny EDMem with a writer of entity rows (docs/model.md, "Entities written from
text"), pre-trained on a world where one fact is the only thing to know, then grown by `add_entities` with people
it never read; one pre-training run per seed (tests/test_written_entities.py runs the first).

The world: people named from shared pools of first and last names (an unseen person's name is made of trained
tokens, as in the knowledge world), each born in one of a few cities, stated in three sentence forms; each sentence
is a passage. `trained` people are read as EDMem reads any entity (their rows are free parameters, half their
mentions read through written rows); `practice` people are read through written rows only, under a fresh name each
batch (`edmem pretrain --written_only_entities_file`): a masked city of theirs can only come from the row written
from another of their sentences, so the writer must put the city in the row and the reader take it out. The
practice people are the writer's scaffolding, hidden from the memory once training ends. Queries score a key of
`ENTITY_KEY_DIM` columns of the row, the rest is a value (`edmem pretrain --entity_key_dim`).

Measured after training, teacher-forced, on the second sentence form with the city's tokens masked as pre-training
masks a mention (`found_and_answered`): *unseen*, people added by `add_entities` from one sentence each (the first
form), found (the memory's top entity at their name is their new row) and answered (the city filled in); *told*, the
same people added from a sentence that gives each another city: answers that follow the row are its city, not the
person's; *trained*, the trained people found and answered on their own rows. Levers: `--practice N` practice people
(0: none), `--entity-key-dim K` (0: the whole row a key), `--restated` (each passage two sentences, the city stated
twice: a masked city is then mostly readable from the passage itself, as in a page of several biographies),
`--random-mask-prob P` and `--dropout P` (the knowledge world's pre-training corrupts with both: 0.3 and 0.1),
`--batch-size B` (32; the knowledge world's: 8).

`--employers N` gives each person a second fact, an employer among N, stated in three sentence forms of its own: a
passage then states one of a person's two facts, and a row written from another passage holds the hidden fact or the
other one. The writer reads a row a passage, kept apart (`edmem pretrain --writer_pools_texts false`,
`--writer_passages_per_row 5`: every other passage of the person), and the query has to choose the row that holds
what the passage hides, as in the knowledge world's sentence pages; `--answer-rows` makes the rows that name it the
linking loss's gold among the person's rows (`--writer_answer_rows`). The unseen people are then added a row for
each of two sentences (the first city form and the first employer form), kept apart, and asked both facts: the city
(`unseen_answered`) and the employer (`unseen_employer_answered`), in their second forms. `--more-facts F` gives
each person F more such facts (each among N values, three forms of its own; results `fact3`, `fact4`, ...): the
knowledge world's people have six facts, and a person's rows are then six facts between them; every other passage
of the person is a row (`--writer_passages_per_row` 3 (2 + F) - 1), and the unseen people are added a row for the
first form of each fact.

`--questions` asks as the knowledge world does: a question form for the city and each fact ("w1 {p} w2 ?", the
answer the value, an entity), every trained and practice person asked each, a quarter of the pre-training examples
in the fine-tuning format (`--mixed_questions_file`); after training the people are asked them too, teacher-forced
(`*_asked_found`, `*_asked_answered`, and each fact's `*_asked_answered`).

    python benchmarks/tiny_written_world.py --seeds 0 1 2 3 4 --out runs/tiny-written-world

A rerun with the same `--out` reuses the runs that are done. Ends with one line `RESULT key=value ...`: means over
the seeds, and `seeds_passing`, the seeds whose unseen people are all found and all but at most one answered
(the test's criterion).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from experiments.tiny_world import (
    SIZES,
    fact_key,
    found_and_answered,
    hide_practice_people,
    questions_answered,
    sentence,
    tiny_world,
    write_corpus,
)
from experiments.word_tokenizer import make_word_tokenizer

from edmem_hf import EDMemForConditionalGeneration
from edmem_hf.pretraining import pretrain, pretraining_options
from edmem_hf.research.entity_growth import add_entities

STEPS = 6000
BATCH_SIZE = 32  # the knowledge world's pre-training: 8
ENTITY_KEY_DIM = 16  # of entity_embed_dim 32


def pretraining_arguments(
    corpus: Path,
    output_dir: Path,
    seed: int,
    steps: int = STEPS,
    entity_key_dim: int | None = ENTITY_KEY_DIM,
    positions: int = 32,
    random_mask_prob: float = 0.0,
    dropout: float = 0.0,
    rows_apart: int = 0,
    answer_rows: bool = False,
    batch_size: int = BATCH_SIZE,
    questions: bool = False,
) -> dict:
    """`pretrain`'s arguments (`pretraining_options`: `args`, `writer`, `mixing`; `pretrain(**arguments)`) of the
    tiny model (two layers a stack, d_model 64, `positions` tokens a passage or writer input) with a writer, trained
    `steps` steps on `corpus`; no token masked at random and no dropout unless asked (the knowledge world's
    pre-training has both: 0.3 and 0.1). With `rows_apart` P, a written entity is read through the rows of up to P
    passages, each a row of its own (with `answer_rows`, those that name what the passage hides its gold). With
    `questions`, the corpus's questions are a quarter of the examples (`--mixed_questions_file`)."""
    practice = corpus / "practice.txt"
    apart = dict(writer_pools_texts=False, writer_passages_per_row=rows_apart, writer_answer_rows=answer_rows)
    mixed = dict(mixed_questions_file=str(corpus / "questions.jsonl")) if questions else {}
    return pretraining_options(
        **(apart if rows_apart else {}),
        **mixed,
        output_dir=str(output_dir), corpus_dir=str(corpus), entity_row_writer=True, written_row_share=0.5,
        written_only_share=0.0, written_only_entities_file=str(practice) if practice.read_text() else None,
        d_model=64, encoder_lower_layers=1, encoder_upper_layers=1, decoder_lower_layers=1, decoder_upper_layers=1,
        encoder_ffn_dim=128, decoder_ffn_dim=128, encoder_attention_heads=4, decoder_attention_heads=4,
        entity_embed_dim=32, entity_key_dim=entity_key_dim, max_position_embeddings=positions, dropout=dropout,
        random_mask_prob=random_mask_prob, per_device_train_batch_size=batch_size, learning_rate=3e-3, max_steps=steps,
        eval_steps=0, save_steps=steps, logging_steps=500, report_to="none", disable_tqdm=True, seed=seed,
    )  # fmt: skip


def measure(model_dir: Path, tokenizer, world: dict, restated: bool = False) -> dict:
    """The figures of one trained model (the module's docstring): counts out of `len(people)`. The unseen people are
    added from the first form (with `restated`, the first two; with facts beyond the city, and the first form of each,
    a row each, kept apart as the model reads them) and asked in the second (the second and third), each fact's
    answers under its key (`fact_key`)."""
    forms, home, unseen = world["forms"], world["home"], world["unseen"]
    written_from, question = (f"{forms[0]} {forms[1]}", f"{forms[1]} {forms[2]}") if restated else (forms[0], forms[1])
    told = {p: world["cities"][(world["cities"].index(home[p]) + 1) % len(world["cities"])] for p in unseen}
    facts = world["facts"]  # each written from its first form, asked in its second
    result = {}
    for name, city_of in (("unseen", home), ("told", told)):
        model = EDMemForConditionalGeneration.from_pretrained(model_dir).eval()
        hide_practice_people(model, world)
        texts = [[sentence(world, written_from, person, city_of[person])]
                 + [sentence(world, fact["forms"][0], person, city_of[person], fact) for fact in facts]
                 for person in unseen]  # fmt: skip
        ids = add_entities(model, unseen, texts, tokenizer)  # the model's writer, its default
        result[f"{name}_found"], result[f"{name}_answered"] = found_and_answered(
            model, tokenizer, unseen, ids, city_of, question, world
        )
        for k, fact in enumerate(facts if name == "unseen" else []):
            result[f"unseen_{fact_key(k)}_answered"] = found_and_answered(
                model, tokenizer, unseen, ids, home, fact["forms"][1], world, asked="{e}", fact=fact
            )[1]
        if world["question_forms"]:
            result |= questions_answered(model, tokenizer, unseen, ids, city_of, world, name, facts=name == "unseen")
    ids = [model.entity_vocab.id_of(person) for person in world["trained"]]
    result["trained_found"], result["trained_answered"] = found_and_answered(
        model, tokenizer, world["trained"], ids, home, question, world
    )
    for k, fact in enumerate(facts):
        result[f"trained_{fact_key(k)}_answered"] = found_and_answered(
            model, tokenizer, world["trained"], ids, home, fact["forms"][1], world, asked="{e}", fact=fact
        )[1]
    if world["question_forms"]:
        result |= questions_answered(model, tokenizer, world["trained"], ids, home, world, "trained")
    return result


def passes(result: dict, world: dict) -> bool:
    """The test's criterion: every unseen person found, all but at most one answered."""
    unseen = len(world["unseen"])
    return result["unseen_found"] == unseen and result["unseen_answered"] >= unseen - 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4], help="Pre-training seeds.")
    parser.add_argument("--steps", type=int, default=STEPS, help="Pre-training steps.")
    parser.add_argument("--practice", type=int, default=SIZES["practice"], help="Practice people (0: none).")
    parser.add_argument("--entity-key-dim", type=int, default=ENTITY_KEY_DIM,
                        help="Columns of a row that queries score (0: the whole row, no value apart).")  # fmt: skip
    parser.add_argument("--cities", type=int, default=SIZES["cities"], help="Cities a person may be born in.")
    parser.add_argument("--tagged", action="store_true",
                        help="Each person a pair of words of their own in every sentence about them (an identity).")  # fmt: skip
    parser.add_argument("--restated", action="store_true",
                        help="Each passage two sentences about its person, the city stated twice.")  # fmt: skip
    parser.add_argument("--random-mask-prob", type=float, default=0.0,
                        help="Chance that each other token is masked (the paper's and the knowledge world's: 0.3).")  # fmt: skip
    parser.add_argument("--dropout", type=float, default=0.0, help="Dropout (the knowledge world's: 0.1).")
    parser.add_argument("--employers", type=int, default=0,
                        help="A second fact, an employer among this many, a passage stating one fact; rows apart.")  # fmt: skip
    parser.add_argument("--more-facts", type=int, default=0,
                        help="With --employers: this many more facts, each among as many values, stated as the "
                        "employer is.")  # fmt: skip
    parser.add_argument("--questions", action="store_true",
                        help="A question for the city and each fact, a quarter of the pre-training examples, and the "
                        "people asked them after training.")  # fmt: skip
    parser.add_argument("--answer-rows", action="store_true",
                        help="With --employers: the rows that name what a passage hides are the linking gold.")  # fmt: skip
    parser.add_argument("--batch-size", type=int, default=BATCH_SIZE,
                        help="Pre-training batch size (the knowledge world's: 8).")  # fmt: skip
    parser.add_argument("--out", type=Path, required=True, help="Runs and results_<setting>.json go here.")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps {args.steps}: at least one step")
    if args.batch_size < 1:
        parser.error(f"--batch-size {args.batch_size}: at least one passage a batch")
    if args.more_facts and not args.employers:
        parser.error("--more-facts are facts beyond the employer: give --employers, their values' count")
    if args.answer_rows and not args.employers:
        parser.error("--answer-rows chooses among a person's rows, which --employers gives")
    if args.employers and args.restated:
        parser.error("--employers and --restated are worlds of their own: give one")
    torch.set_num_threads(1)
    tokenizer = make_word_tokenizer(bart_template=True)
    world = tiny_world(tokenizer, practice=args.practice, cities=args.cities, tagged=args.tagged,
                       employers=args.employers, more_facts=args.more_facts, questions=args.questions)  # fmt: skip
    variant = (
        ("-restated" if args.restated else "")
        + ("-tagged" if args.tagged else "")
        + (f"-cities{args.cities}" if args.cities != SIZES["cities"] else "")
        + (f"-employers{args.employers}" if args.employers else "")
        + (f"-more-facts{args.more_facts}" if args.more_facts else "")
        + ("-questions" if args.questions else "")
    )
    corruption = (f"-random-mask{args.random_mask_prob}" if args.random_mask_prob else "") + (
        f"-dropout{args.dropout}" if args.dropout else ""
    )
    corruption += f"-batch{args.batch_size}" if args.batch_size != BATCH_SIZE else ""
    setting = f"practice{args.practice}-key{args.entity_key_dim}{variant}{corruption}"
    setting += "-answer-rows" if args.answer_rows else ""
    corpus = args.out / f"corpus-practice{args.practice}{variant}"
    if not (corpus / "practice.txt").exists():
        write_corpus(tokenizer, world, corpus, restated=args.restated)
    per_seed = {}
    for seed in args.seeds:
        model_dir = args.out / f"{setting}-{args.steps}-steps-seed{seed}"
        if not (model_dir / "model.safetensors").exists():
            positions = 64 if args.restated else 32  # a passage of two sentences, and a writer input of one
            rows_apart = 3 * (1 + len(world["facts"])) - 1 if world["facts"] else 0  # every other passage
            arguments = pretraining_arguments(corpus, model_dir, seed, args.steps, args.entity_key_dim or None,
                                              positions, args.random_mask_prob, args.dropout,
                                              rows_apart, args.answer_rows,
                                              args.batch_size, args.questions)  # fmt: skip
            pretrain(**arguments)
        per_seed[seed] = measure(model_dir, tokenizer, world, args.restated)
        per_seed[seed]["passes"] = passes(per_seed[seed], world)
        print(f"seed {seed}: {per_seed[seed]}", flush=True)
    group = {"unseen": "unseen", "told": "unseen", "trained": "trained"}  # the first word of a key
    people = {key: len(world[group[key.split("_")[0]]]) for key in next(iter(per_seed.values())) if key != "passes"}
    summary = {key: 100 * sum(r[key] for r in per_seed.values()) / (people[key] * len(per_seed)) for key in people}
    summary["seeds_passing"] = sum(r["passes"] for r in per_seed.values())
    results = dict(setting=setting, sizes=SIZES | {"practice": args.practice, "cities": args.cities},
                   steps=args.steps, entity_key_dim=args.entity_key_dim, restated=args.restated, tagged=args.tagged,
                   employers=args.employers, more_facts=args.more_facts, questions=args.questions, answer_rows=args.answer_rows,
                   random_mask_prob=args.random_mask_prob, dropout=args.dropout, batch_size=args.batch_size,
                   seeds=args.seeds, per_seed=per_seed, percent_over_seeds=summary)  # fmt: skip
    (args.out / f"results_{setting}_{args.steps}_steps.json").write_text(json.dumps(results, indent=1) + "\n")
    print(f"RESULT setting={setting} seeds={','.join(map(str, args.seeds))} steps={args.steps} "
          + " ".join(f"{key}={value:.1f}" if key != "seeds_passing" else f"{key}={value}"
                     for key, value in summary.items()))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
