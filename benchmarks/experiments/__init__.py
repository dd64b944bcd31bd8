"""What the benchmark scripts share with each other and with the tests (which import it; it imports nothing of
the tests): code of the experiments that is no part of the `edmem_hf` package a user installs. The scripts read as
their protocols; their machinery is here.

- `word_tokenizer`: made-up words and a tiny byte-level BPE over them, trained in a second (`tiny_written_world.py`
  and the tests' tiny models).
- `tiny_world`: `tiny_written_world.py`'s world of made-up people, its corpus and questions, and what a trained
  model finds and answers about its people.
- `qa_world`: the knowledge world as files (its questions in the released format, the mixed-in questions on its
  pages, a seed's dump, corpus and question files).
- `training`: `edmem pretrain`, `edmem finetune` and prediction at an experiment's settings (`Recipe`: the levers).
- `qa_systems`: `toy_world_qa.py`'s systems of one seed, pre-trained, fine-tuned, asked and measured (and
  `qa_fresh_seeds.py`'s, each pre-trained with its own recipe).
- `memory`: memory mask files and what the memory finds at a question's subject.
- `probes`: memorisation probes of the pre-trained models.
- `scoring`: exact match, the majority floor, the two-level bootstrap and the summaries read from them.
- `plots`: the figures.
- `options`: the command line the toy-world experiments share.
- `growth`: `toy_world_growth.py`'s worlds, grown models, ceiling, the writer's two stages and their folders;
  `growth_scoring` (each model asked, the summary over seeds, the headline figures), `growth_diagnostics` (where a
  grown model keeps what it knows), `growth_options` (its command line), `timing` (the time to add entities).

A script of `benchmarks/` imports it as `experiments` (its folder is on the path when run as `python
benchmarks/...`); the tests put `benchmarks/` on the path (`tests/tiny_models.py`).
"""
