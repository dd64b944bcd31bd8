"""`benchmarks/qa_tuning.py`: EncDec's settings tried on the validation groups (issue 65). Its results file is the
ledger of finished runs across machines: a run it records is not run again, and the choice waits for every seed of
every setting; the test group is never read."""

from __future__ import annotations

import json

import pytest

from tiny_models import load_benchmark


@pytest.fixture(scope="module")
def tuning():
    return load_benchmark("qa_tuning")


def _run(setting: str, seed: int, entity: float, literal: float) -> dict:
    hits = [(True, i < entity / 10) for i in range(10)] + [(False, i < literal / 10) for i in range(10)]
    return {"system": "encdec", "setting": setting, "seed": seed, "changes": {}, "options": {},
            "em": {"all": (entity + literal) / 2, "entity": entity, "literal": literal}, "hits": hits}  # fmt: skip


def test_the_results_file_is_the_ledger_and_the_choice_waits_for_every_run(tuning, tmp_path, monkeypatch):
    results, out = tmp_path / "results.json", tmp_path / "runs"
    for seed, entity in ((0, 60.0), (1, 50.0)):  # finished on this machine
        where = out / f"seed-{seed}" / "pretrain-encdec-lr_1e-3"
        where.mkdir(parents=True)
        (where / "validation.json").write_text(json.dumps(_run("lr_1e-3", seed, entity, 20.0)))
    first = tuning.combine(out, "encdec", [0, 1, 2], results)
    assert first["settings"]["lr_1e-3"]["seeds"] == [0, 1] and first["chosen"] is None
    assert first["test_group_reads"] == 0 and first["settings"]["default"]["from"] == tuning.HEADLINE.name
    assert first["edmem_settings_tried"] == 15 and first["encdec_settings_tried"] == 13
    # another machine: the ledger's runs are kept and not run again; its own finished runs join them
    ran = []
    monkeypatch.setattr(tuning, "run_setting", lambda system, name, seed, where: ran.append((name, seed)) or
                        _run(name, seed, 70.0, 30.0))  # fmt: skip
    tuning.main(["--out", str(tmp_path / "elsewhere"), "--results", str(results), "--settings", "lr_1e-3"])
    assert ran == [("lr_1e-3", 2)]
    second = json.loads(results.read_text())
    assert second["settings"]["lr_1e-3"]["seeds"] == [0, 1, 2]
    assert second["settings"]["lr_1e-3"]["em"]["entity"] == 60.0 and "lr_1e-3" in second["complete"]
    assert second["encdec_settings_tried"] == 14 and second["chosen"] is None  # other settings still to run


def test_each_system_keeps_a_ledger_of_its_own(tuning, tmp_path, monkeypatch):
    """Tuning EDMem writes EDMem's ledger; EncDec's, which the fresh seeds read, is left as it was."""
    assert tuning.results_file("encdec") == tuning.RESULTS
    assert tuning.results_file("edmem") != tuning.RESULTS and tuning.results_file("edmem").parent == tuning.FIGURES
    written = []
    monkeypatch.setattr(tuning, "combine", lambda out, system, seeds, results: written.append((system, results)) or
                        {"edmem_settings_tried": 0, "encdec_settings_tried": 0, "complete": [], "chosen": None,
                         "best_so_far": None})  # fmt: skip
    monkeypatch.setattr(tuning, "recorded", lambda results, system: {})
    monkeypatch.setattr(tuning, "run_setting", lambda *args: pytest.fail("a run started"))
    tuning.main(["--combine", "--system", "edmem", "--out", str(tmp_path)])
    assert written == [("edmem", tuning.results_file("edmem"))]
