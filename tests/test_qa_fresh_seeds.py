"""`benchmarks/qa_fresh_seeds.py` (issue 65, items 2 and 3): the fresh seeds' results file was produced from the
frozen recipes (EncDec's the headline with the setting its tuning ledger chose, EDMem's the headline, with that setting
too where EDMem's own ledger finds it better on validation), on seeds no other committed run
of the knowledge experiment has used, its test group read once. The committed files (the runs file, as seeds finish,
and the results file) are held to it once they exist; the check itself is held here on files built the way the
script builds them, and on a tiny run of the script."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import pytest
import torch

from tiny_models import load_benchmark

# isort: split
# benchmarks/ is on the path (tiny_models)
from experiments import scoring

ROOT = Path(__file__).resolve().parents[1]
NOT_THE_RECIPE = ("seeds", "pretrain_jobs")  # which seeds a run reads and how many pre-trainings run side by side


@pytest.fixture(scope="module")
def fresh():
    return load_benchmark("qa_fresh_seeds")


def committed_seeds(leave_out: tuple[Path, ...] = ()) -> set[int]:
    """Every seed a committed results file of the knowledge experiment names (its folders and their archive), but
    the files in `leave_out`."""
    seeds: set[int] = set()

    def walk(value) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                if key in ("seed", "seeds", "validation_seeds"):
                    seeds.update(inner if isinstance(inner, list) else [inner])
                walk(inner)
        elif isinstance(value, list):
            for inner in value:
                walk(inner)

    images = ROOT / "docs" / "images"
    for path in [*images.glob("toy_world_qa*/*.json"), *images.glob("archive/toy_world_qa*/*.json")]:
        if path not in leave_out:
            walk(json.loads(path.read_text(encoding="utf-8")))
    return seeds


def assert_recipes_frozen(
    recipes: dict, ledger: dict, headline, recipes_named: dict, edmem_ledger: dict | None = None
) -> None:
    """`recipes` (as the runs and results files record them) are the frozen recipes: EncDec's is `headline` (the
    Settings of docs/evidence.md's headline) with the setting `ledger` chose (its changes and pre-training options);
    EDMem's the headline's, with its linking recipe, and with that setting too where `edmem_ledger` (EDMem tried with
    it) holds it above the headline on validation. `recipes_named`: toy_world_qa.RECIPES."""
    chosen = ledger["chosen"]
    assert chosen is not None, "the ledger has chosen nothing: no fresh seed may have run"
    assert recipes["ledger_chosen"] == recipes["encdec"]["setting"] == chosen
    changes, options = ledger["settings"][chosen]["changes"], ledger["settings"][chosen]["options"]
    mine = "headline"
    if chosen != "default":
        assert edmem_ledger is not None and chosen in edmem_ledger["complete"], "EDMem was not tried with the choice"
        assert recipes["edmem_ledger"].endswith(".json")

        def mean(name: str) -> float:
            return sum(edmem_ledger["settings"][name]["em"][kind] for kind in ("entity", "literal"))

        mine = chosen if mean(chosen) > mean("default") else "headline"
    assert recipes["frozen_at_commit"] and recipes["edmem"]["setting"] == mine
    edmem_changes, edmem_options = (changes, options) if mine == chosen else ({}, {})
    expected = json.loads(json.dumps(dataclasses.asdict(headline)))

    def recipe_of(settings: dict) -> dict:
        return {key: value for key, value in settings.items() if key not in NOT_THE_RECIPE}

    assert recipe_of(recipes["edmem"]["settings"]) == recipe_of({**expected, **edmem_changes})
    assert recipe_of(recipes["encdec"]["settings"]) == recipe_of({**expected, **changes})
    assert recipes["edmem"]["pretraining_options"] == edmem_options
    assert recipes["encdec"]["pretraining_options"] == options
    assert recipes["edmem"]["linking"] == headline.recipes[0] and recipes["encdec"]["linking"] == "paper"
    for system in ("edmem", "encdec"):
        assert recipes[system]["linking_recipe"] == dataclasses.asdict(recipes_named[recipes[system]["linking"]])


def assert_frozen(
    result: dict, ledger: dict, headline, other_seeds: set[int], recipes_named: dict, edmem_ledger: dict | None = None
) -> None:
    """`result` (a fresh-seed results file) was produced from the frozen recipes (`assert_recipes_frozen`), on three
    seeds outside the validation seeds and `other_seeds`; the test group read once."""
    recipes = result["recipes"]
    assert_recipes_frozen(recipes, ledger, headline, recipes_named, edmem_ledger)
    seeds = set(result["seeds"])
    assert result["fresh_seeds"] == len(seeds) == 3 and {int(seed) for seed in result["per_seed"]} == seeds
    assert all(set(recipes[system]["settings"]["seeds"]) == seeds for system in ("edmem", "encdec"))
    assert not seeds & {0, 1, 2} and not seeds & set(ledger["validation_seeds"]), "a validation seed"
    assert not seeds & other_seeds, f"seeds another committed run used: {sorted(seeds & other_seeds)}"
    assert result["group"] == "test" and result["test_group_reads"] == 1
    assert result["encdec_settings_tried"] == ledger["encdec_settings_tried"]
    assert result["edmem_settings_tried"] == (edmem_ledger or ledger)["edmem_settings_tried"]
    for kind in ("entity", "literal"):  # the gap is the mean of the seeds' gaps
        per_seed = [seed[f"{kind}_gap_edmem_minus_encdec"] for seed in result["per_seed"].values()]
        assert abs(result[f"{kind}_gap_edmem_minus_encdec"] - sum(per_seed) / len(per_seed)) <= 0.02
        low, high = result[f"{kind}_gap_interval"]
        assert low <= high


def write_ledger(tmp_path: Path, chosen: str | None, settings: dict) -> Path:
    """A tuning ledger as qa_tuning.py writes it (`settings`: its SETTINGS), having chosen `chosen` (None: not yet)."""
    runs = {name: {"seeds": [0, 1, 2], "em": {"all": 30.0, "entity": 50.0, "literal": 10.0}, "changes": changes,
                   "options": options, "per_seed": {str(s): {"all": 30.0, "entity": 50.0, "literal": 10.0}
                                                    for s in (0, 1, 2)}}
            for name, (changes, options) in settings.items()}  # fmt: skip
    ledger = {"system": "encdec", "group": "validation", "validation_seeds": [0, 1, 2], "test_group_reads": 0,
              "complete": sorted(runs) if chosen else ["default"], "chosen": chosen, "settings": runs,
              "edmem_settings_tried": 15, "encdec_settings_tried": 13 + len(runs) - 1}  # fmt: skip
    path = tmp_path / f"ledger_{chosen}.json"
    path.write_text(json.dumps(ledger))
    return path


def write_edmem_ledger(tmp_path: Path, setting: str, better: bool) -> Path:
    """EDMem's tuning ledger as qa_tuning.py --system edmem writes it: the headline's figures and `setting` on every
    validation seed, `setting` above them when `better`."""
    figures = {"all": 30.0, "entity": 60.0, "literal": 10.0}
    tried = {**figures, "entity": 70.0 if better else 50.0}
    per_seed = {str(seed): tried for seed in (0, 1, 2)}
    ledger = {"system": "edmem", "group": "validation", "validation_seeds": [0, 1, 2], "test_group_reads": 0,
              "complete": ["default", setting], "chosen": None, "edmem_settings_tried": 16,
              "encdec_settings_tried": 13,
              "settings": {"default": {"seeds": [0, 1, 2], "em": figures, "per_seed": {}},
                           setting: {"seeds": [0, 1, 2], "em": tried, "per_seed": per_seed}}}  # fmt: skip
    path = tmp_path / f"edmem_ledger_{setting}_{better}.json"
    path.write_text(json.dumps(ledger))
    return path


def made_up_run(seed: int, edmem: tuple[int, int], encdec: tuple[int, int]) -> dict:
    """One seed's run as `run_seed` returns it, with made-up answers: each system's right answers out of ten entity
    and ten literal questions a group."""

    def hits(entity: int, literal: int) -> list[tuple[bool, bool]]:
        return [(True, i < entity) for i in range(10)] + [(False, i < literal) for i in range(10)]

    systems = {"edmem_free": edmem, "edmem_static": edmem, "edmem_dynamic": edmem, "encdec": encdec,
               "edmem_free_subject_rows_hidden_at_test": (1, 1), "edmem_free_every_row_hidden_at_test": (0, 1),
               "majority_answer": (0, 1)}  # fmt: skip
    found = {group: {name: hits(*right) for name, right in systems.items()} for group in ("validation", "test")}
    memorised = {"all": 90.0, "entity": 95.0, "literal": 85.0, "by_relation": {}, "decoder_alone": 1.0,
                 "question_form": {"all": 40.0, "entity": 50.0, "literal": 30.0}}  # fmt: skip
    return {"seed": seed, "questions": {"train": 20, "validation": 20, "test": 20}, "entities": 700,
            "memorisation": {"edmem": {"test": memorised}, "encdec": {"test": memorised}},
            "edmem_memory_recall_at_subject": {"validation": 80.0, "test": 70.0}, "hits": found,
            "em": {group: {name: scoring.em(h) for name, h in by.items()} for group, by in found.items()},
            "seconds_this_call": 1}  # fmt: skip


def test_a_fresh_seed_file_is_held_to_the_recipes_the_ledger_froze(fresh, tmp_path):
    """A results file built as the script builds it passes the check; it fails when the ledger chose another
    setting, when the file's EncDec recipe is not the ledger's, and on a seed another committed run used."""
    tuning = fresh.tuning
    ledger_path = write_ledger(tmp_path, "dropout_0", tuning.SETTINGS)
    ledger = json.loads(ledger_path.read_text())
    edmem_path = write_edmem_ledger(tmp_path, "dropout_0", better=False)
    edmem_ledger = json.loads(edmem_path.read_text())
    recipes, tuned = fresh.frozen_recipes(ledger_path, edmem_path)
    assert recipes["encdec"].options == {"dropout": 0.0} and recipes["edmem"].settings.seeds == fresh.SEEDS
    assert recipes["edmem"].setting == "headline" and recipes["edmem"].options == {}  # no better on validation
    record = fresh.freeze(recipes, tuned, ledger_path, tmp_path / "runs.json")
    runs = [made_up_run(seed, (8, 4), (5, 4)) for seed in fresh.SEEDS]
    result = json.loads(json.dumps(fresh.fresh_result(record, tuned, runs, recipes["edmem"].settings)))
    assert result["entity_gap_edmem_minus_encdec"] == 30.0 and result["literal_gap_edmem_minus_encdec"] == 0.0
    assert result["claim"]["entity"] == "lead" and result["per_seed"]["6"]["encdec"]["test"]["entity"] == 50.0
    where = result["per_seed"]["6"]["where_the_entity_gap_comes_from"]
    assert where["edmem_subject_rows_hidden_at_test"]["entity"] == 10.0 and "by_relation" not in where[
        "memorisation_test_group"]["encdec"]  # fmt: skip
    others = committed_seeds(leave_out=(fresh.RESULTS, fresh.RUNS))  # the fresh seeds' own files, once committed
    assert result["edmem_settings_tried"] == 16 and result["validation_seeds_figures"]["edmem"]["em"]["entity"] > 0

    def frozen(result: dict, ledger: dict = ledger, others: set[int] = others, edmem: dict = edmem_ledger) -> None:
        assert_frozen(result, ledger, fresh.qa.HEADLINE, others, fresh.qa.RECIPES, edmem)

    frozen(result)
    with pytest.raises(AssertionError):  # the ledger chose another setting than the file's
        frozen(result, {**ledger, "chosen": "lr_1e-3"})
    with pytest.raises(AssertionError):  # EDMem was not tried with EncDec's choice
        frozen(result, edmem={**edmem_ledger, "complete": ["default"]})
    tampered = copy.deepcopy(result)
    tampered["recipes"]["encdec"]["pretraining_options"] = {}  # EncDec pre-trained without the chosen dropout
    with pytest.raises(AssertionError):
        frozen(tampered)
    tampered = copy.deepcopy(result)
    tampered["recipes"]["edmem"]["settings"]["pretrain_steps"] = 15_000  # not the headline's EDMem
    with pytest.raises(AssertionError):
        frozen(tampered)
    with pytest.raises(AssertionError):  # a seed a committed run has read
        frozen(result, others=others | {fresh.SEEDS[1]})
    # EDMem better with EncDec's choice on validation: its recipe takes it too
    better = write_edmem_ledger(tmp_path, "dropout_0", better=True)
    recipes_better, tuned_better = fresh.frozen_recipes(ledger_path, better)
    assert recipes_better["edmem"].setting == "dropout_0" and recipes_better["edmem"].options == {"dropout": 0.0}
    record_better = fresh.freeze(recipes_better, tuned_better, ledger_path, tmp_path / "runs-better.json")
    result_better = json.loads(
        json.dumps(fresh.fresh_result(record_better, tuned_better, runs, recipes["edmem"].settings))
    )
    frozen(result_better, edmem=json.loads(better.read_text()))
    assert result_better["validation_seeds_figures"]["edmem"]["em"]["entity"] == 70.0
    with pytest.raises(AssertionError):  # the file's EDMem kept the headline where the ledger says otherwise
        frozen(result, edmem=json.loads(better.read_text()))
    figures = tmp_path / "figures"
    for seed in fresh.SEEDS:  # each seed's pre-training logs copied as it finishes
        for system, recipe in recipes.items():
            log = tmp_path / "run" / f"seed-{seed}" / f"pretrain-{system}-{recipe.setting}" / "log.jsonl"
            log.parent.mkdir(parents=True)
            log.write_text(f'{{"seed": {seed}}}\n')
        fresh.copy_logs(seed, recipes, tmp_path / "run", figures)
    fresh.publish(result, tmp_path / "run", figures / "test_fresh_seeds678.json", plots=True)
    assert json.loads((figures / "test_fresh_seeds678.json").read_text()) == result
    assert (figures / "pretrain_log_fresh_seeds678_seed7_encdec_dropout_0.jsonl").read_text() == '{"seed": 7}\n'
    assert (figures / "em_by_model_fresh_seeds678.png").stat().st_size > 0


def test_the_fresh_seeds_are_the_first_no_committed_run_used(fresh):
    assert not set(fresh.SEEDS) & committed_seeds(leave_out=(fresh.RESULTS, fresh.RUNS)) and len(fresh.SEEDS) == 3
    assert fresh.qa.ONE_SEED not in fresh.SEEDS  # a check anyone runs reads none of their test groups


def test_the_committed_fresh_seed_file_was_produced_from_the_frozen_recipes(fresh):
    if not fresh.RESULTS.exists():
        pytest.skip(f"{fresh.RESULTS.name} is not committed yet (the fresh seeds run once the EncDec tuning ledger "
                    "has chosen); the check is held on files built in the other tests")  # fmt: skip
    result = json.loads(fresh.RESULTS.read_text(encoding="utf-8"))
    ledger = json.loads(fresh.LEDGER.read_text(encoding="utf-8"))
    edmem = json.loads(fresh.EDMEM_LEDGER.read_text(encoding="utf-8")) if fresh.EDMEM_LEDGER.exists() else None
    others = committed_seeds(leave_out=(fresh.RESULTS, fresh.RUNS))
    assert_frozen(result, ledger, fresh.qa.HEADLINE, others, fresh.qa.RECIPES, edmem)
    assert result["recipes"]["ledger"] == str(fresh.LEDGER.relative_to(ROOT))
    assert result["recipes"] == json.loads(fresh.RUNS.read_text(encoding="utf-8"))["recipes"]


def test_the_committed_runs_file_holds_the_frozen_recipes_and_fresh_seeds_only(fresh):
    """The runs file, committed as each fresh seed finishes, before the results file exists."""
    if not fresh.RUNS.exists():
        pytest.skip(f"{fresh.RUNS.name} is not committed yet (the fresh seeds begin once the tuning has chosen)")
    held = json.loads(fresh.RUNS.read_text(encoding="utf-8"))
    ledger = json.loads(fresh.LEDGER.read_text(encoding="utf-8"))
    edmem = json.loads(fresh.EDMEM_LEDGER.read_text(encoding="utf-8")) if fresh.EDMEM_LEDGER.exists() else None
    assert_recipes_frozen(held["recipes"], ledger, fresh.qa.HEADLINE, fresh.qa.RECIPES, edmem)
    seeds = [run["seed"] for run in held["runs"]]
    assert len(seeds) == len(set(seeds)) and set(seeds) <= set(fresh.SEEDS)
    assert held["recipes"]["frozen_at_commit"]


def test_nothing_runs_without_a_choice_or_with_recipes_that_moved(fresh, tmp_path, capsys):
    """Refused in one line, before any work: a ledger that has chosen nothing, a choice that is not qa_tuning's
    setting of that name, a run whose recipes changed since it began, a results file already written."""
    tuning = fresh.tuning
    out = tmp_path / "run"

    tried = write_edmem_ledger(tmp_path, "lr_1e-3", better=False)

    runs = tmp_path / "runs.json"

    def refused(ledger: Path, results: Path = tmp_path / "results.json", edmem: Path = tried, *more: str) -> str:
        capsys.readouterr()
        argv = ["--out", str(out), "--ledger", str(ledger), "--results", str(results), "--edmem-ledger", str(edmem),
                "--runs", str(runs), *more]  # fmt: skip
        assert fresh.main(argv) == 1
        said = capsys.readouterr().err.strip()
        assert len(said.splitlines()) == 1 and said.startswith("qa_fresh_seeds.py refused: ")
        return said

    assert "has chosen no EncDec setting yet" in refused(write_ledger(tmp_path, None, tuning.SETTINGS))
    assert not out.exists() and not runs.exists()
    moved = {**tuning.SETTINGS, "lr_1e-3": ({"pretrain_learning_rate": 5e-4}, {})}
    assert "is not qa_tuning.SETTINGS'" in refused(write_ledger(tmp_path, "lr_1e-3", moved))
    ledger = write_ledger(tmp_path, "lr_1e-3", tuning.SETTINGS)
    said = refused(ledger, edmem=tmp_path / "no_edmem_ledger.json")
    assert "EDMem has not been tried with EncDec's choice 'lr_1e-3'" in said and not runs.exists()
    said = refused(ledger, tmp_path / "results.json", tried, "--one-seed")  # the check runs frozen recipes only
    assert "--one-seed runs the recipes the fresh seeds froze" in said and not runs.exists()
    fresh.freeze(*fresh.frozen_recipes(ledger, tried), ledger, runs)  # a run began with lr_1e-3
    dropout = write_edmem_ledger(tmp_path, "dropout_0", better=False)
    assert "differ from those" in refused(write_ledger(tmp_path, "dropout_0", tuning.SETTINGS), edmem=dropout)
    (tmp_path / "read.json").write_text("{}")
    assert "test group was read" in refused(ledger, tmp_path / "read.json")


def test_the_gap_interval_draws_both_systems_alike_and_reads_the_claim():
    right, wrong = [(True, True)] * 20 + [(False, True)] * 20, [(True, False)] * 20 + [(False, False)] * 20
    same = scoring.gap_bootstrap([right, wrong], [right, wrong], samples=200)
    assert same["entity"] == same["literal"] == [0.0, 0.0]  # paired: the seeds' spread is not a gap
    assert scoring.gap_bootstrap([right], [wrong], samples=50)["entity"] == [100.0, 100.0]
    goals = {"entity": 5.0, "literal": -3.0}
    assert scoring.claims({"entity": [6.0, 20.0], "literal": [-2.0, 4.0]}, goals) == {
        "entity": "lead", "entity_goal": "met", "literal": "tie", "literal_goal": "met", "goal": "met"}  # fmt: skip
    read = scoring.claims({"entity": [-12.0, -1.0], "literal": [-5.0, 1.0]}, goals)
    assert (read["entity"], read["entity_goal"], read["literal_goal"], read["goal"]) == (
        "reversal", "missed", "not settled", "missed")  # fmt: skip


def test_the_fresh_seeds_run_end_to_end_at_a_tiny_size(fresh, tmp_path, monkeypatch, capsys):
    """The script at a tiny size (16 people, 20 steps): each system pre-trained with its own recipe (EncDec with the
    ledger's dropout, EDMem with the headline's, no better with it on validation). One seed first, on one machine;
    the other two on another (a new --out), which reads the first seed's run from the runs file rather than running
    it again; then the results file, held to the frozen recipes, each seed's pre-training logs, the claim and the
    RESULT line; and `--one-seed`, the check anyone can run, on a seed of its own."""
    tiny = dataclasses.replace(fresh.qa.HEADLINE, num_people=16, pretrain_steps=20, d_model=32, bootstrap_samples=50)
    monkeypatch.setattr(fresh.qa, "HEADLINE", tiny)
    ledger = write_ledger(tmp_path, "dropout_0", fresh.tuning.SETTINGS)
    edmem_ledger = write_edmem_ledger(tmp_path, "dropout_0", better=False)
    results, runs = tmp_path / "figures" / "test_fresh_seeds678.json", tmp_path / "figures" / "runs.json"
    first, first_seed = fresh.SEEDS[0], str(fresh.SEEDS[0])

    def run(out: str, *more: str) -> int:
        argv = ["--out", str(tmp_path / out), "--ledger", str(ledger), "--results", str(results), "--no-plots",
                "--edmem-ledger", str(edmem_ledger), "--runs", str(runs), *more]  # fmt: skip
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return fresh.main(argv)
        finally:
            torch.set_num_threads(threads)

    assert run("run", "--seeds", first_seed) == 0
    assert not results.exists() and [held["seed"] for held in json.loads(runs.read_text())["runs"]] == [first]
    assert "the results file waits for seeds" in capsys.readouterr().out
    assert run("elsewhere") == 0  # another machine: the first seed's run comes from the runs file
    assert not (tmp_path / "elsewhere" / f"seed-{first}").exists()
    result = json.loads(results.read_text())
    tried = json.loads(edmem_ledger.read_text())
    others = committed_seeds(leave_out=(fresh.RESULTS, fresh.RUNS))
    assert_frozen(result, json.loads(ledger.read_text()), tiny, others, fresh.qa.RECIPES, tried)
    assert result["recipes"] == json.loads(runs.read_text())["recipes"] and result["seeds"] == list(fresh.SEEDS)
    for seed in fresh.SEEDS:
        where = tmp_path / ("run" if seed == first else "elsewhere") / f"seed-{seed}"
        encdec = json.loads((where / "pretrain-encdec-dropout_0" / "config.json").read_text())
        edmem = json.loads((where / "pretrain-edmem-headline" / "config.json").read_text())
        assert (encdec["variant"], encdec["dropout"]) == ("encdec", 0.0) and edmem["dropout"] == 0.1
        assert (results.parent / f"pretrain_log_fresh_seeds678_seed{seed}_encdec_dropout_0.jsonl").stat().st_size
        figures = result["per_seed"][str(seed)]
        assert set(figures["edmem"]) == set(figures["encdec"]) == {"validation", "test"}
        assert set(figures["where_the_entity_gap_comes_from"]["memorisation_test_group"]) == {"edmem", "encdec"}
    claim, last = capsys.readouterr().out.strip().splitlines()[-2:]
    assert claim.startswith("CLAIM on 3 fresh seeds") and "the goal, at least +5" in claim
    assert last.startswith("RESULT fresh_seeds=3 group=test entity_gap_edmem_minus_encdec=")
    for key in ("literal_gap_edmem_minus_encdec", "entity_gap_interval=[", "literal_gap_interval=[",
                "edmem_settings_tried=16", "encdec_settings_tried=18", "encdec_setting=dropout_0",
                "edmem_setting=headline"):  # fmt: skip
        assert f" {key}" in last
    assert run("elsewhere") == 1  # read once: the results file exists
    # --one-seed, the check anyone can run: the frozen recipes on a seed of its own, no committed file touched
    written = {path: path.read_bytes() for path in (results, runs)}
    assert run("check", "--one-seed") == 0
    check = json.loads((tmp_path / "check" / "one_seed.json").read_text())
    assert check["seed"] == fresh.qa.ONE_SEED and check["recipes"] == result["recipes"]
    assert set(check["edmem"]) == set(check["encdec"]) == {"validation", "test"}
    gap = round(check["edmem"]["test"]["entity"] - check["encdec"]["test"]["entity"], 2)
    assert check["entity_gap_edmem_minus_encdec"] == gap
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith(f"RESULT one_seed={fresh.qa.ONE_SEED} group=test edmem_entity_em=")
    assert f" entity_gap_edmem_minus_encdec={gap}" in last
    assert {path: path.read_bytes() for path in (results, runs)} == written
    assert (tmp_path / "check" / f"seed-{fresh.qa.ONE_SEED}" / "pretrain-encdec-dropout_0").is_dir()
