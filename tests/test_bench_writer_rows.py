"""`benchmarks/bench_writer_rows.py`: its texts have the first stage's shape (right-padded, one `<E_s>` each, mostly
padding at the longest), and both ways it times make the same rows."""

from __future__ import annotations

import torch

from tiny_models import load_benchmark


def test_the_benchmark_times_the_same_rows_both_ways_on_texts_of_varied_length(capsys):
    bench = load_benchmark("bench_writer_rows")
    ids, mask = bench.writer_texts(91, 3000)
    assert ids.shape[0] == 91 and (ids == bench.E_S).sum(dim=1).eq(1).all()
    assert 0.2 < mask.float().mean() < 0.5 and torch.equal(mask, torch.sort(mask, dim=1, descending=True).values)
    model = bench.knowledge_world_model().eval()
    with torch.no_grad():
        torch.testing.assert_close(model.write_entity_rows(ids[:20], mask[:20], texts_per_pass=None),
                                   model.write_entity_rows(ids[:20], mask[:20], texts_per_pass=8),
                                   atol=1e-5, rtol=1e-5)  # fmt: skip
    assert bench.main(["--rounds", "1", "--texts", "12"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("RESULT writer_rows_speedup=") and " texts=12 " in last
