"""Time to add entities written by the writer of entity rows at the `edmem-base` shape (`presets.py`: BART-base
widths, 4 + 8 layers a side, the authors' 1,000,010 x 256 table; random weights, with `entity_row_writer`).

Each new entity has one passage, a biography sentence with its name swapped in (as `toy_world_growth.py` times the
other estimators); `add_entities(model, names, passages, tokenizer, estimator="writer")` reads
`<s> <E_s> name <E_e> passage </s>` with the lower encoder layers and the writer's head, in batches, and appends the
rows to the table. Wall-clock time of that call (tokenising, writing, growing the table); `--bf16` runs it under
CPU autocast to bfloat16 (matrix products in bfloat16, the rows kept in float32), about twice as fast on a CPU with
AVX512-BF16. The model reads guided by names (`EDMemConfig.name_guided_read`), so the call also rebuilds the lookup of
every name, the million old ones and the new (`name_candidates.NameCandidates`; `--no-name-guided`: without it). With
`--entities` below 100,000 the 100,000 figure is extrapolated linearly from the measured one, and the RESULT line says
so (the lookup's share does not scale with the entities added: extrapolating overstates it).

    python benchmarks/bench_entity_writer.py                      # 100,000 entities, measured
    python benchmarks/bench_entity_writer.py --entities 5000      # 5,000 measured, 100,000 extrapolated

Ends with `RESULT seconds_to_add_100k_base=... measured_entities=... measured_seconds=... threads=... name_guided=...`.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch

from edmem_hf import EDMemForConditionalGeneration, EntityVocab
from edmem_hf.pretraining import PretrainingArguments, build_config
from edmem_hf.research.entity_growth import add_entities
from edmem_hf.research.writer_training import WriterTrainingArguments
from edmem_hf.tokenization import train_tokenizer

TABLE_ROWS = 1_000_010  # the authors' table (presets.py)
TARGET = 100_000
SENTENCE = "<E_s> {name} <E_e> was born in 1931. She studied history at a university and worked as an engineer."


def base_shape_model(tokenizer, name_guided: bool = False, rows: int = TABLE_ROWS) -> EDMemForConditionalGeneration:
    """A model of the `edmem-base` preset's shape with a writer of entity rows: random weights, `rows` rows (the
    authors' 1,000,010); with `name_guided`, read guided by names, the lookup of their names built."""
    with tempfile.TemporaryDirectory() as scratch:
        arguments = PretrainingArguments(output_dir=scratch, preset="edmem-base")
        config = build_config(arguments, tokenizer, rows, WriterTrainingArguments(entity_row_writer=True))
    config.name_guided_read = name_guided
    model = EDMemForConditionalGeneration(config).eval()
    model.entity_vocab = EntityVocab([f"Entity {i}" for i in range(rows)])
    if name_guided:
        model.name_candidates(tokenizer)
    return model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--entities", type=int, default=TARGET, help="entities added (measured)")
    parser.add_argument("--table-rows", type=int, default=TABLE_ROWS, help=argparse.SUPPRESS)  # the tests' small table
    parser.add_argument("--batch-size", type=int, default=256, help="writer inputs read at once")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch threads")
    parser.add_argument("--bf16", action="store_true", help="write under CPU autocast to bfloat16")
    parser.add_argument("--name-guided", action=argparse.BooleanOptionalAction, default=True,
                        help="the model reads guided by names: adding rebuilds the name lookup (default: on)")  # fmt: skip
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    words = ["born", "studied", "history", "university", "worked", "engineer", "Newcomer", "was", "in", "She"]
    tokenizer = train_tokenizer([" ".join(words)] * 50 + [SENTENCE.format(name=f"Newcomer {i}") for i in range(500)],
                                vocab_size=1000)  # fmt: skip
    model = base_shape_model(tokenizer, args.name_guided, args.table_rows)
    names = [f"Newcomer {i}" for i in range(args.entities)]
    passages = [[SENTENCE.format(name=name)] for name in names]
    started = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
        ids = add_entities(model, names, passages, tokenizer, estimator="writer", batch_size=args.batch_size)
    seconds = time.perf_counter() - started
    assert len(ids) == args.entities and model.config.entity_vocab_size == args.table_rows + args.entities
    if args.name_guided:  # the lookup in use holds the new names
        assert model.name_candidates().num_entities == args.table_rows + args.entities
    at_target = seconds * TARGET / args.entities
    how = "measured" if args.entities == TARGET else f"extrapolated_from_{args.entities}"
    print(f"{args.entities} entities written in {seconds:.1f} s ({args.threads} threads); {TARGET}: {at_target:.1f} s")
    print(f"RESULT seconds_to_add_100k_base={at_target:.1f} how={how} measured_entities={args.entities} "
          f"measured_seconds={seconds:.1f} threads={args.threads} bf16={args.bf16} name_guided={args.name_guided}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
