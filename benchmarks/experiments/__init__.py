"""What the benchmark scripts share with each other and with the tests (which import it; it imports nothing of
the tests): code of the experiments that is no part of the `edmem_hf` package a user installs.

- `word_tokenizer`: made-up words and a tiny byte-level BPE over them, trained in a second (`tiny_written_world.py`
  and the tests' tiny models).

A script of `benchmarks/` imports it as `experiments` (its folder is on the path when run as `python
benchmarks/...`); the tests put `benchmarks/` on the path (`tests/tiny_models.py`).
"""
