"""`benchmarks/toy_world_growth.py`: the held-out people are absent from everything the model trains on, the grown
models hold them, and the whole experiment runs end to end at a tiny size (the figures are in docs/evidence.md)."""

from __future__ import annotations

import bz2
import dataclasses
import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from edmem_hf import EDMemForConditionalGeneration, EntityVocab
from edmem_hf.dump import iter_parsed_pages
from edmem_hf.pretraining import pretraining_options
from edmem_hf.research.entity_growth import add_entities
from edmem_hf.research.writer_training import WriterTrainingArguments
from edmem_hf.task_features import in_running_text
from edmem_hf.tasks import exact_match, read_jsonl, read_qa
from tiny_models import load_benchmark, tiny_model, tiny_model_with_entities

# isort: split
# benchmarks/ is on the path (tiny_models)
from experiments import growth, memory

FAIR_WORLD = Path(__file__).resolve().parents[1] / "docs" / "images" / "toy_world_growth_fair_world"
HEADLINE_RESULTS = (
    "results_seeds012_practice200_sentence_pages2_60000_steps_rows12_answer_rows_by_text_writer_dropout0_frozen_writer"
    "_10000_decoys_4_own_sentences.json"
)
# docs/evidence.md's command of the headline before it was the plain command, run once a seed
RECIPE_OPTIONS = ["--questions-in-batches", "--pretrain-steps", "60000", "--finetune-epochs", "0",
                  "--practice-people", "200", "--practice-sentence-pages", "2", "--written-only-share", "0",
                  "--writer-dropout", "0", "--writer-passages-per-row", "12", "--writer-rows-apart",
                  "--writer-answer-rows", "--writer-answer-rows-by-text", "--reader-steps", "10000",
                  "--reader-decoy-rows", "4", "--added-texts", "own-sentences", "--estimators", "mean_query",
                  "--continued-steps", "10000", "--timed-additions", "--no-base-shape"]  # fmt: skip


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("toy_world_growth")


def _settings(bench, argv: list[str]) -> dict:
    """The run's settings for `argv`, as results.json records them."""
    return json.loads(json.dumps(dataclasses.asdict(bench.growth_settings(bench.command_line().parse_args(argv)))))


def test_the_plain_command_runs_the_headline_s_recipe(bench, tmp_path, capsys):
    """Without options, the settings are those the headline's results file records (docs/evidence.md, "Entities
    written from text": seeds 0, 1 and 2 combined), field by field. The fields the file lacks came after the run
    and change nothing at their defaults: `writer_more_steps` 0 continues nothing and names no folder, validation
    groups of 0 people draw the same people as before, `writer_random_mask_prob` None masks as every model does, and
    `default_edmem` on trains the default EDMem as before."""
    recorded = json.loads((FAIR_WORLD / HEADLINE_RESULTS).read_text(encoding="utf-8"))["settings"]
    plain = _settings(bench, [])
    later = {
        "writer_more_steps",
        "validation_added_people",
        "validation_practice_people",
        "writer_random_mask_prob",
        "writer_restart_unless_learned",
    }
    assert set(plain) - set(recorded) == later | {"default_edmem"} and not any(plain[key] for key in later)
    assert plain["default_edmem"] is True
    assert set(recorded) <= set(plain)
    for key, value in recorded.items():
        if key == "qa":
            for qa_key, qa_value in value.items():
                assert plain["qa"][qa_key] == qa_value, f"qa.{qa_key}"
            assert set(plain["qa"]) == set(value)
        else:
            assert plain[key] == value, key
    assert plain["qa"]["seeds"] == [0, 1, 2]  # the three seeds in one run, combined
    # the command documented before, run once a seed under the settings before it, is the same run, seed by seed
    for seed in (0, 1, 2):
        assert _settings(bench, ["--setup", "paper", "--seeds", str(seed), *RECIPE_OPTIONS]) == {
            **plain,
            "qa": {**plain["qa"], "seeds": [seed]},
        }
    assert _settings(bench, ["--setup", "paper"]) == json.loads(json.dumps(dataclasses.asdict(bench.GrowthSettings())))
    assert _settings(bench, ["--no-writer-answer-rows-by-text"])["writer_answer_rows_by_text"] is False
    assert _settings(bench, ["--base-shape"])["time_the_base_shape"] is True
    with pytest.raises(SystemExit):  # --quick is the paper's setup, small: refused before any work
        bench.main(["--quick", "--setup", "headline", "--out", str(tmp_path / "run")])
    assert "give --quick or --setup" in capsys.readouterr().err and not (tmp_path / "run").exists()


def test_the_headline_s_writer_stages_are_the_named_writer_recipes(bench, tmp_path):
    """The headline's writer training, as `pretrain` receives it, is `edmem_hf`'s `WRITER_RECIPES`: the first stage
    (`growth.writer_options`) resolves to the WriterTrainingArguments of "rows_that_answer", the second
    (`growth.reader_options`) to those of "frozen_writer", field by field, but for the recipe's name and, in the
    second stage, the model's own options (`entity_row_writer`, `writer_pools_texts`), which it leaves to the first
    stage's model (given, they are the first stage's)."""
    practice = str(tmp_path / "practice_people.txt")
    data = {"practice_people": tmp_path / "practice_people.txt"}

    def resolved(options: dict) -> dict:
        return dataclasses.asdict(pretraining_options(output_dir=str(tmp_path), **options)["writer"])

    def recipe(name: str) -> dict:
        return dataclasses.asdict(WriterTrainingArguments(writer_recipe=name, written_only_entities_file=practice))

    first, rows_that_answer = resolved(growth.writer_options(bench.HEADLINE, data)), recipe("rows_that_answer")
    assert {key for key in first if first[key] != rows_that_answer[key]} == {"writer_recipe"}
    second, frozen_writer = resolved(growth.reader_options(bench.HEADLINE, data)), recipe("frozen_writer")
    left_to_the_model = {"entity_row_writer", "writer_pools_texts"}
    assert {key for key in second if second[key] != frozen_writer[key]} == {"writer_recipe", *left_to_the_model}
    assert all(second[key] is None and first[key] == frozen_writer[key] for key in left_to_the_model)


def test_the_held_out_people_are_only_in_the_new_pages(bench, tmp_path):
    settings = bench.GrowthSettings(qa=bench.Settings(num_people=20))
    data = growth.make_worlds(settings, seed=1, out=tmp_path)
    held = data["held"]
    assert len(held) == 4
    assert not set(held) & set(EntityVocab.load(data["corpus"] / "entity_vocab.json").names)
    old_text = "".join(page.text for page in iter_parsed_pages(str(tmp_path / "old-wiki.xml.bz2")))
    assert not any(name in old_text for name in held)
    assert set(held) <= {page.title for page in iter_parsed_pages(data["new_dump"])}
    files = data["files"]
    for split in ("train", "test"):
        assert not any(record["link_target"][0] in held for record in read_jsonl(files[split]))
    added = list(read_jsonl(files["added"]))
    assert {record["link_target"][0] for record in added} == set(held) and len(added) == 6 * len(held)
    # each added person's own page cut into sentences, one fact each: every fact asked is stated by some sentence
    pages = list(iter_parsed_pages(data["new_dump"]))
    sentences = dict(zip(held, growth.writer_texts(pages, held, "own-sentences")))
    for name, texts in sentences.items():
        assert len(texts) == 6 * settings.qa.biographies and all(text.endswith(".") for text in texts)
        answers = [record["answer"][0] for record in added if record["link_target"][0] == name]
        assert all(sum(a.lower() in t.lower() for t in texts) >= settings.qa.biographies for a in answers), name
    passages = growth.writer_texts(pages, held, "passages")
    assert [len(texts) for texts in passages] != [len(texts) for texts in sentences.values()]
    with pytest.raises(ValueError, match="no page with a sentence to write from for"):
        growth.writer_texts(pages, ["Nobody Anywhere"], "own-sentences")
    question = next(iter(read_jsonl(files["train"])))["question"].replace("'", "&apos;")
    assert data["mixed_questions"] is None and question in bz2.open(tmp_path / "old-wiki.xml.bz2", "rt").read()
    # the questions in the pre-training batches instead: not on the old world's pages
    batches = bench.GrowthSettings(qa=bench.Settings(num_people=20, questions_in_batches=True))
    data = growth.make_worlds(batches, seed=1, out=tmp_path / "batches")
    assert data["mixed_questions"] == data["files"]["train"]
    assert question not in bz2.open(tmp_path / "batches" / "old-wiki.xml.bz2", "rt").read()
    # practice people: in the old world's pages and vocabulary and in its mixed questions, asked in no question file
    practice_settings = replace(batches, practice_people=6)
    data = growth.make_worlds(practice_settings, seed=1, out=tmp_path / "practice")
    practice = (tmp_path / "practice" / "practice_people.txt").read_text(encoding="utf-8").split("\n")[:-1]
    assert len(practice) == 6 and not set(practice) & set(data["held"])
    assert set(practice) <= set(EntityVocab.load(data["corpus"] / "entity_vocab.json").names)
    asked = {split: {record["link_target"][0] for record in read_jsonl(path)}
             for split, path in data["files"].items() if not split.endswith("_links")}  # fmt: skip
    assert asked.pop("practice") == set(practice)  # all 6 asked (20 at most)
    assert asked["train"] and asked["test"] and not set(practice) & set().union(*asked.values())
    mixed = {record["link_target"][0] for record in read_jsonl(data["mixed_questions"])}
    assert mixed == asked["train"] | set(practice)
    assert len(asked["train"] | asked["validation"] | asked["test"]) == 16 and len(data["held"]) == 4
    # practice people stated by one fact each: their pages in the old world and their one question each in the mix
    one_fact = growth.make_worlds(replace(practice_settings, practice_one_fact_pages=3), 1, tmp_path / "one-fact")
    titles = {page.title for page in iter_parsed_pages(str(tmp_path / "one-fact" / "old-wiki.xml.bz2"))}
    assert all({name, f"{name} (2)", f"{name} (3)"} <= titles for name in practice)
    mixed = [record["link_target"][0] for record in read_jsonl(one_fact["mixed_questions"])]
    assert sorted(name for name in mixed if name in practice) == sorted(practice)
    # every fact of each practice person on two pages of one sentence: all their questions in the mix
    sentences = growth.make_worlds(replace(practice_settings, practice_sentence_pages=2), 1, tmp_path / "sentences")
    titles = {page.title for page in iter_parsed_pages(str(tmp_path / "sentences" / "old-wiki.xml.bz2"))}
    assert all({name, *(f"{name} ({k})" for k in range(2, 13))} <= titles for name in practice)
    mixed = [record["link_target"][0] for record in read_jsonl(sentences["mixed_questions"])]
    assert sorted(name for name in mixed if name in practice) == sorted(practice * 6)
    with pytest.raises(ValueError, match="worlds of their own"):
        growth.make_worlds(
            replace(practice_settings, practice_one_fact_pages=3, practice_sentence_pages=2), 1, tmp_path
        )
    with pytest.raises(ValueError, match="worlds of their own"):
        growth.make_worlds(replace(practice_settings, practice_one_fact_pages=3, practice_biographies=2), 1, tmp_path)


def test_the_validation_groups_never_meet_the_pre_training_batches(bench, tmp_path):
    """Issue 64, item 2: the added people of the validation group are held out as the test group's are, and the
    practice people of the validation group are read on their pages but their questions are in no batch."""
    settings = bench.GrowthSettings(qa=bench.Settings(num_people=20, questions_in_batches=True), practice_people=6,
                                    validation_added_people=2, validation_practice_people=3)  # fmt: skip
    data = growth.make_worlds(settings, seed=1, out=tmp_path)
    asked = {split: {record["link_target"][0] for record in read_jsonl(path)}
             for split, path in data["files"].items() if not split.endswith("_links")}  # fmt: skip
    assert len(asked["added"]) == 4 and len(asked["added_validation"]) == 2
    assert asked["added"] | asked["added_validation"] == set(data["held"])
    assert not asked["added"] & asked["added_validation"]
    old_text = "".join(page.text for page in iter_parsed_pages(str(tmp_path / "old-wiki.xml.bz2")))
    vocabulary = set(EntityVocab.load(data["corpus"] / "entity_vocab.json").names)
    mixed = {record["link_target"][0] for record in read_jsonl(data["mixed_questions"])}
    for name in asked["added_validation"]:
        assert name not in old_text and name not in vocabulary and name not in mixed
    practice = set(data["practice"])
    assert len(asked["practice_validation"]) == 3 and asked["practice_validation"] <= practice
    assert not asked["practice_validation"] & mixed and not asked["practice_validation"] & asked["practice"]
    assert mixed & practice == practice - asked["practice_validation"]  # the other practice people's are mixed
    assert all(name in old_text and name in vocabulary for name in asked["practice_validation"])
    with pytest.raises(ValueError, match="give it its own --out"):
        growth.make_worlds(replace(settings, validation_added_people=0), seed=1, out=tmp_path)


def test_each_recipe_keeps_its_models_apart(bench, tmp_path):
    """A run with another recipe trains its own models beside the same world, never reusing the paper's."""
    paper = bench.GrowthSettings()
    assert growth.models_folder(tmp_path, paper) == tmp_path
    folders = {growth.models_folder(tmp_path, replace(paper, recipe=name)) for name in bench.RECIPES}
    assert len(folders) == len(bench.RECIPES) and all(folder.parent == tmp_path for folder in folders - {tmp_path})
    # the writer's models of another written-row share are their own too; the default share's keep their name
    assert growth.writer_folder(paper) == "writer"
    assert (
        growth.writer_folder(replace(paper, written_row_share=1.0, written_table=True))
        == "writer-written-table-share-1.0"
    )
    # a second stage with the writer frozen is a model of its own, its first stage the same folder as without it
    assert growth.writer_folder(replace(paper, written_table=True, reader_steps=500)) == (
        "writer-written-table-frozen-writer-500"
    )
    second_only = replace(paper, written_table=True, reader_steps=500, reader_names_like_written_only=True,
                          reader_row_autoencoding_share=0.5)  # fmt: skip
    assert growth.writer_folder(second_only) == (
        "writer-written-table-frozen-writer-500-names-like-written-only-row-autoencoding-0.5"
    )
    assert growth.writer_folder(replace(second_only, reader_fresh_name_share=0.5)).endswith(
        "-frozen-writer-500-names-like-written-only-row-autoencoding-0.5-fresh-names-0.5"
    )
    assert growth.writer_folder(replace(second_only, reader_decoy_rows=4)).endswith("-row-autoencoding-0.5-decoys-4")
    assert growth.writer_folder(
        replace(second_only, reader_decoy_rows=4, reader_decoys_for_every_entity=True)
    ).endswith("-row-autoencoding-0.5-decoys-4-every-entity")
    every_lever = replace(
        second_only, reader_fresh_name_share=0.5, reader_decoy_rows=4, reader_decoys_for_every_entity=True
    )
    assert growth.writer_folder(replace(every_lever, reader_steps=0)) == "writer-written-table"
    # a first stage continued is a model of its own, and so is every stage after it
    assert growth.writer_folder(replace(paper, writer_more_steps=20000)) == "writer-more-20000"
    assert growth.writer_folder(replace(paper, writer_more_steps=20000, reader_steps=500)) == (
        "writer-more-20000-frozen-writer-500"
    )
    # rows pooled and rows apart are models of their own, even from one passage
    assert growth.writer_folder(replace(paper, writer_passages_per_row=12)) == "writer-pooled-12"
    assert (
        growth.writer_folder(replace(paper, writer_passages_per_row=12, writer_pools_texts=False)) == "writer-rows-12"
    )
    assert growth.writer_folder(replace(paper, writer_pools_texts=False)) == "writer-rows-1"
    rows_that_answer = replace(paper, writer_passages_per_row=12, writer_pools_texts=False, writer_answer_rows=True)
    assert growth.writer_folder(rows_that_answer) == "writer-rows-12-answer-rows"
    assert (
        growth.writer_folder(replace(rows_that_answer, writer_reads_answer_rows=True))
        == "writer-rows-12-answer-rows-read"
    )
    assert growth.writer_folder(replace(rows_that_answer, writer_answer_rows_by_text=True)) == (
        "writer-rows-12-answer-rows-by-text"
    )
    assert growth.writer_folder(replace(rows_that_answer, writer_mean_row_probability=True)) == (
        "writer-rows-12-answer-rows-mean-rows"
    )
    at_test = replace(rows_that_answer, mean_row_probability_at_test=True, reader_steps=5)
    assert growth.writer_folder(at_test) == "writer-rows-12-answer-rows-frozen-writer-5-mean-rows-at-test"


def test_memory_finding_counts_the_misses_that_share_a_word_of_the_name(bench, tmp_path, monkeypatch):
    """Recall over the questions, and the share of the questions whose top entity is another that shares a word with
    the subject's name (a missing top, where the question marks no subject, shares none)."""
    tiny_model(seed=1).save_pretrained(tmp_path / "model")
    questions = tmp_path / "questions.jsonl"
    subjects = ["Ada Quill", "Bo Quill", "Di Roe", "Ed Poe"]
    questions.write_text("".join(json.dumps({"link_target": [name]}) + "\n" for name in subjects))
    monkeypatch.setattr(  # the tops that memory_tops_and_subjects reads
        memory, "memory_top_names", lambda model, tokenizer, path: ["Ada Stone", "Bo Quill", "Cy Moe", None]
    )
    monkeypatch.setattr(memory.AutoTokenizer, "from_pretrained", lambda path: None)
    assert memory.memory_finding(tmp_path / "model", questions) == {"recall": 25.0, "misses_sharing_a_name_word": 25.0}


def test_a_model_is_read_with_mean_row_probabilities_by_a_copy_of_it(bench, tmp_path):
    """`--mean-row-probability-at-test`: a copy of the trained model, its weights and tokenizer, with the option set."""
    model, tokenizer, _, _ = tiny_model_with_entities(5)
    trained = type(model)(replace(model.config, entity_row_writer=True, writer_pools_texts=False))
    trained.entity_vocab = model.entity_vocab
    trained.save_pretrained(tmp_path / "trained")
    tokenizer.save_pretrained(tmp_path / "trained")
    copy = growth.with_mean_row_probability(tmp_path / "trained", tmp_path / "copy")
    loaded = EDMemForConditionalGeneration.from_pretrained(copy)
    assert loaded.config.writer_mean_row_probability and not trained.config.writer_mean_row_probability
    assert all(torch.equal(value, trained.state_dict()[key]) for key, value in loaded.state_dict().items())
    assert AutoTokenizer.from_pretrained(copy).get_vocab() == tokenizer.get_vocab()


def test_reading_with_mean_row_probabilities_a_model_trained_with_them_is_refused(
    bench, tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr(bench, "run_seed", lambda *args: pytest.fail("the run started"))
    with pytest.raises(SystemExit):
        bench.main(["--out", str(tmp_path), "--writer-mean-row-probability", "--mean-row-probability-at-test"])
    assert "--mean-row-probability-at-test reads a model trained without" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # refused before any work


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--writer-more-steps", "-5"], "--writer-more-steps must be 0 or more, got -5"),
        (["--writer-more-steps", "100", "--no-writer"], "--no-writer trains no writer"),
    ],
)
def test_writer_more_steps_without_a_writer_to_continue_is_refused(
    bench, tmp_path, capsys, monkeypatch, argv, message
):
    monkeypatch.setattr(bench, "run_seed", lambda *args: pytest.fail("the run started"))
    with pytest.raises(SystemExit):
        bench.main(["--out", str(tmp_path), *argv])
    assert message in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # refused before any work


WRITER_FOLDER = "writer-row-autoencoding-0.5-written-only-by-mentions-rows-2-answer-rows-by-text-read-mean-rows-names-like-written-only-decoys-2-key-8"


def test_the_writer_s_corruption_is_its_own_model_in_both_stages(bench):
    """`--writer-random-mask-prob` (and `--writer-dropout`) reach both stages' pre-training options and name a
    folder of their own; left out, the writer's model masks as every model does and its folder is the headline's."""
    headline = bench.growth_settings(bench.command_line().parse_args([]))
    unmasked = bench.growth_settings(bench.command_line().parse_args(["--writer-random-mask-prob", "0"]))
    assert growth.writer_corruption(headline) == {"dropout": 0.0}
    assert growth.writer_corruption(unmasked) == {"dropout": 0.0, "random_mask_prob": 0.0}
    assert growth.writer_folder(unmasked) == growth.writer_folder(headline).replace(
        "-dropout-0.0", "-dropout-0.0-random-mask-0.0"
    )
    assert "random-mask" not in growth.writer_folder(headline)


def test_the_headline_reads_the_worst_seed_and_the_seeds_that_read_rows():
    """`growth_scoring.across_seeds`: the worst seed's added-over-trained ratio (not the mean's), the seeds whose
    added people are answered with the read forced onto their rows at >= 50 %, and which seeds are fresh."""
    from experiments import growth_scoring

    def run(seed: int, added: float, oracle: float) -> dict:
        return {"seed": seed, "results": {
            "test": {"writer_before": {"free": {"all": 54.0}}, "writer": {"free": {"all": 52.0}}},
            "added": {"writer": {"free": {"all": added}, "memory_recall": 90.0}},
            "floor": {"added": 4.0, "test": 4.0},
            "diagnostics": {"writer": {"row_swap": {"follow": 0.0}, "oracle_read": {"oracle": oracle}}}}}  # fmt: skip

    runs = [run(0, 44.0, 80.0), run(3, 4.0, 49.9), run(4, 29.0, 50.0)]
    figures = growth_scoring.across_seeds(runs, writer=True)
    assert figures == {"added_over_trained_em_min": 0.0, "reading_learned_seeds": 2, "seeds_run": 3, "fresh_seeds": 2,
                       "test_group_reads": 0}  # fmt: skip
    mean = growth_scoring.headline_figures(growth_scoring.summarise(runs), writer=True)["added_over_trained_em"]
    assert mean == 0.433  # the mean's ratio, (25.67 - 4) / (54 - 4), hides the seed at the floor


def test_the_trained_people_s_change_on_adding_compares_one_read():
    """`growth_scoring.headline_figures` with name-guided copies: the trained people's change on adding is the guided
    model's after adding against the guided model's before (a cost of adding), not against the plain read's (whose
    gap is what the read gains, `trained_em_name_guided` beside `trained_em`); the plain read's change beside it."""
    from experiments import growth_scoring

    run = {"seed": 0, "results": {
        "test": {"writer_before": {"free": {"all": 48.0}}, "writer": {"free": {"all": 47.0}},
                 "writer_before_name_guided": {"free": {"all": 60.0}}, "writer_name_guided": {"free": {"all": 58.0}}},
        "added": {"writer": {"free": {"all": 40.0}, "memory_recall": 56.0},
                  "writer_name_guided": {"free": {"all": 80.0}, "memory_recall": 100.0}},
        "floor": {"added": 4.0, "test": 4.0},
        "diagnostics": {"writer": {"row_swap": {"follow": 0.0}, "oracle_read": {"oracle": 80.0}}}}}  # fmt: skip
    figures = growth_scoring.headline_figures(growth_scoring.summarise([run]), writer=True)
    assert figures["trained_em_change"] == -2.0 and figures["trained_em_change_plain"] == -1.0
    assert (figures["trained_em"], figures["trained_em_name_guided"]) == (48.0, 60.0)
    assert figures["added_over_trained_em"] == 1.357 and figures["added_recall"] == 100.0  # (80 - 4) / (60 - 4)


def test_the_first_stage_alone_records_its_reading_signal(bench, tmp_path, capsys):
    """`--first-stage-only`: the writer's first stage and nothing else (no default EDMem, no second stage), its
    reading signal on practice_validation as training went, and whether reading was learnt read from its last."""
    out = tmp_path / "run"
    argv = ["--quick", "--first-stage-only", "--out", str(out), "--num-people", "12", "--pretrain-steps", "24",
            "--d-model", "32", "--questions-in-batches", "--finetune-epochs", "0", "--practice-people", "4",
            "--practice-sentence-pages", "2", "--validation-practice-people", "2", "--validation-added-people", "1",
            "--writer-rows-apart", "--writer-passages-per-row", "4", "--writer-answer-rows",
            "--writer-answer-rows-by-text", "--writer-reads-answer-rows", "--reader-steps", "5"]  # fmt: skip
    assert bench.main(argv) == 0
    assert "RESULT seeds_run=1 validation_reading_learned_seeds=0" in capsys.readouterr().out
    [stage] = json.loads((out / "first_stages.json").read_text())["runs"]
    assert [Path(p).name for p in (out / "seed-0").glob("pretrain-*")] == [
        "pretrain-writer-rows-4-answer-rows-by-text-read"
    ]
    assert [record["step"] for record in stage["signal"]] == list(range(2, 25, 2))  # 12 evaluations
    assert all(0 <= record["reading_oracle_em"] <= 100 for record in stage["signal"])
    assert stage["reading_learned"] == (stage["signal"][-1]["reading_oracle_em"] >= growth.READING_LEARNED)


@pytest.mark.parametrize("last_read, kept", [({0: 1.7, 1: 98.3}, 1), ({0: 1.7, 1: 14.2, 2: 0.0}, 2), ({0: 50.0}, 0)])
def test_a_first_stage_that_does_not_learn_to_read_is_begun_again(bench, tmp_path, monkeypatch, last_read, kept):
    """`--writer-restart-unless-learned`: an attempt whose last oracle read is below 50 is set aside and the stage
    begun again with the seed + 100 k; the first attempt at 50 or more is kept, and the last is kept whatever its
    signal. A rerun reuses the attempts trained and keeps the same one. Pre-training is stood in for: each attempt
    logs the signal `last_read` gives it once, as a trained folder that is reused would."""
    calls = []

    def pretrain_variant(variant, corpus, out, settings, seed, ffn_dim, recipe, questions, **options):
        calls.append((out.name, seed))
        if not (out / "log.jsonl").exists():
            out.mkdir(parents=True)
            records = [
                {"step": 5, "reading_oracle_em": 0.0},
                {"step": 10, "reading_oracle_em": last_read[(seed - 7) // 100]},
            ]
            (out / "log.jsonl").write_text("".join(json.dumps(record) + "\n" for record in records))
        return out

    monkeypatch.setattr(growth, "pretrain_variant", pretrain_variant)
    argv = ["--writer-restart-unless-learned", "--validation-practice-people", "2"]
    settings = bench.growth_settings(bench.command_line().parse_args(argv))
    plain = replace(settings, reader_steps=0, writer_restart_unless_learned=False)  # attempt 0: the plain run's
    first_stage = tmp_path / f"pretrain-{growth.writer_folder(plain)}"
    assert growth.first_stage_folder(settings) == first_stage.name
    folders = [first_stage] + [tmp_path / f"{first_stage.name}-restart-{k}" for k in (1, 2)]
    for _rerun in range(2):
        calls.clear()
        trained = growth.first_stage_with_restarts(
            settings, tmp_path / "corpus", first_stage, 7, growth.PAPER, None, {}
        )
        assert trained == folders[kept]
        assert calls == [(folders[k].name, 7 + 100 * k) for k in range(kept + 1)]
    assert growth.first_stage_restarts(tmp_path, settings) == kept
    # the stages after it are models of their own: which attempt they continue is the recipe's
    assert "-restarts-frozen-writer-10000" in growth.writer_folder(settings) and "restart" not in first_stage.name
    # without the option the plain run is kept, learnt or not
    calls.clear()
    assert (
        growth.first_stage_with_restarts(plain, tmp_path / "corpus", first_stage, 7, growth.PAPER, None, {})
        == first_stage
    )
    assert calls == [(first_stage.name, 7)]


def test_reading_learnt_is_read_from_the_first_stage_s_log(tmp_path):
    """`growth.reading_learned`: the last reading_oracle_em of the log, not the best; a log without the signal is an
    error naming it (a first stage trained without practice_validation cannot be judged)."""
    (tmp_path / "log.jsonl").write_text(
        "".join(
            json.dumps(r) + "\n"
            for r in [
                {"step": 5, "reading_oracle_em": 60.0},
                {"step": 10, "loss": 1.0},
                {"step": 10, "reading_oracle_em": 49.9},
            ]
        )  # fmt: skip
    )
    assert not growth.reading_learned(tmp_path)
    (tmp_path / "log.jsonl").write_text(json.dumps({"step": 10, "loss": 1.0}) + "\n")
    with pytest.raises(RuntimeError, match="no reading signal"):
        growth.reading_learned(tmp_path)


@pytest.mark.parametrize(
    "refused, reason",
    [([], "give --validation-practice-people"), (["--validation-practice-people", "2", "--no-writer"], "--no-writer")],
)
def test_restarts_need_the_reading_signal_and_the_writer(bench, tmp_path, capsys, refused, reason):
    with pytest.raises(SystemExit):
        bench.main(["--out", str(tmp_path), "--writer-restart-unless-learned", *refused])
    assert reason in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_the_first_stage_alone_needs_the_practice_validation_group(bench, tmp_path, capsys):
    with pytest.raises(SystemExit):
        bench.main(["--out", str(tmp_path), "--first-stage-only"])
    assert "give --validation-practice-people" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_the_writer_s_model_alone_trains_no_default_edmem(bench, tmp_path, capsys):
    """`--no-default-edmem` (the fresh seeds' runs): the writer's two stages, grown and scored, and neither the default
    EDMem nor the ceiling continued from it; the headline's figures that compare with it are left out."""
    out = tmp_path / "run"
    argv = ["--quick", "--no-default-edmem", "--out", str(out), "--num-people", "12", "--pretrain-steps", "12",
            "--d-model", "32", "--questions-in-batches", "--finetune-epochs", "0", "--practice-people", "4",
            "--practice-sentence-pages", "2", "--writer-rows-apart", "--writer-passages-per-row", "4",
            "--writer-answer-rows", "--writer-answer-rows-by-text", "--reader-steps", "4", "--continued-steps", "3",
            "--added-texts", "own-sentences", "--timed-additions", "10", "--no-plots"]  # fmt: skip
    assert bench.main(argv) == 0
    assert "RESULT seeds=1" in capsys.readouterr().out
    result = json.loads((out / "results.json").read_text())
    assert set(result["summary"]["added"]) == {
        "writer_before",
        "writer",
        "writer_before_name_guided",
        "writer_name_guided",
    }
    assert set(result["summary"]["diagnostics"]) == {"writer"} and result["seconds_to_add"] == {}
    headline = result["headline"]
    assert "added_over_trained_em" in headline and "writer_cost_on_trained_em" not in headline
    assert (headline["seeds_run"], headline["fresh_seeds"]) == (1, 0) and headline["reading_learned_seeds"] in (0, 1)
    assert headline["added_over_trained_em_plain_min"] == headline["added_over_trained_em_plain"]  # one seed
    assert headline["test_group_reads"] == 1  # the writer's grown model; its name-guided copy is the same reading
    folders = sorted(path.name for path in (out / "seed-0").iterdir() if path.is_dir())
    assert not any(name in ("pretrain-edmem", "finetune") or "continued" in name for name in folders), folders
    with pytest.raises(SystemExit):
        bench.main(["--out", str(tmp_path / "none"), "--no-default-edmem", "--no-writer"])
    assert "leaves no model to train" in capsys.readouterr().err

    # a seed run on a machine of its own, combined from its results file by the same command line: nothing runs
    other = json.loads((out / "results.json").read_text())
    other["runs"][0]["seed"], other["settings"]["qa"]["seeds"] = 4, [4]
    (tmp_path / "seed-4.json").write_text(json.dumps(other))
    files = ["--combine", str(out / "results.json"), str(tmp_path / "seed-4.json")]
    recipe, combined = argv[: argv.index("--out")] + argv[argv.index("--out") + 2 :], tmp_path / "combined"
    assert bench.main([*recipe, "--out", str(combined), *files]) == 0
    assert "RESULT seeds=2" in capsys.readouterr().out
    both = json.loads((combined / "results.json").read_text())
    assert [p.name for p in combined.iterdir()] == ["results.json"] and both["settings"]["qa"]["seeds"] == [0, 4]
    assert (both["headline"]["seeds_run"], both["headline"]["fresh_seeds"]) == (2, 1)
    assert both["headline"]["added_over_trained_em"] == headline["added_over_trained_em"]  # the same figures twice
    # refused: a file of another recipe (the setting named), a seed twice
    with pytest.raises(SystemExit):
        bench.main([*recipe, "--reader-steps", "5", "--out", str(tmp_path / "other"), *files])
    assert "reader_steps differ" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main([*recipe, "--out", str(tmp_path / "twice"), *files, str(out / "results.json")])
    assert "a seed comes twice" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main([*recipe, "--out", str(out), *files])
    assert "write over a results file it joins" in capsys.readouterr().err


def test_the_experiment_runs_end_to_end(bench, tmp_path, capsys):
    """A tiny world, a few steps: the model is grown by each estimator, decoded and scored, the plot drawn."""
    out = tmp_path / "run"
    argv = ["--quick", "--out", str(out), "--num-people", "12", "--pretrain-steps", "30", "--finetune-epochs", "150",
            "--finetune-learning-rate", "1e-2", "--d-model", "32", "--fit-steps", "3",
            "--questions-in-batches", "--recipe", "masked_spans", "--practice-people", "3", "--row-autoencoding-share", "0.5",
            "--row-autoencoding-written-only", "--writer-passages-by-mentions", "--writer-passages-per-row", "2",
            "--writer-rows-apart", "--writer-answer-rows", "--writer-reads-answer-rows", "--writer-answer-rows-by-text",
            "--writer-mean-row-probability", "--entity-key-dim",
            "8",
            "--fresh-names-like-written-only", "--writer-decoy-rows", "2", "--writer-more-steps", "4", "--reader-steps", "5",
            "--reader-row-autoencoding-share", "0.5", "--reader-fresh-name-share", "0.5", "--reader-decoys-for-every-entity", "--practice-biographies", "2", "--practice-share", "0.5",
            "--practice-questions-people", "2", "--added-texts", "own-sentences", "--continued-steps", "3",
            "--validation-added-people", "1", "--validation-practice-people", "1", "--timed-additions", "10"]  # fmt: skip
    assert bench.main(argv) == 0
    result = json.loads((out / "results.json").read_text())
    # the validation groups scored beside the test groups; the first stage logged its reading signal as it trained
    assert {"added_validation", "practice_validation"} <= set(result["summary"])
    first_stage = next((out / "seed-0" / "recipe-masked_spans").glob("pretrain-writer*/log.jsonl"))
    signals = [r for r in map(json.loads, first_stage.read_text().splitlines()) if "reading_em" in r]
    assert signals and all({"reading_oracle_em", "written_fact_share"} <= set(r) for r in signals)
    seed = out / "seed-0"
    models = seed / "recipe-masked_spans"  # another recipe's models, beside the world
    held = result["runs"][0]["held_out"]
    added = list(read_jsonl(seed / "edmem_toy-added.jsonl"))
    for model_dir in ("finetune", "grown-fitted"):
        predictions = json.loads((models / model_dir / "predict-added-free" / "free_predictions.json").read_text())
        texts = [predictions[r["id"]].replace("<E_s>", "").replace("<E_e>", "").strip() for r in added]
        # an answer to every question before it is scored; the test group is the held-out people but one (the
        # validation group)
        assert len(texts) == 6 * (len(held) - 1) and all(texts)
    plain_reads = {"before", *growth.ESTIMATORS, "writer_before", "writer", "continued_pretraining"}
    guided = {name + growth.NAME_GUIDED for name in ("before", "mean_query", "writer_before", "writer")}
    assert set(result["summary"]["added"]) == plain_reads | guided
    # read guided by names, the added people are found (their names are no other person's); the plain read's beside
    headline = result["headline"]
    assert headline["added_recall"] == result["summary"]["added"]["writer_name_guided"]["memory_recall"]["mean"]
    assert headline["added_recall_plain"] == result["summary"]["added"]["writer"]["memory_recall"]["mean"]
    assert headline["added_recall"] >= 90 and headline["added_recall"] > headline["added_recall_plain"]
    # the ceiling: pre-trained its own 3 steps (its folder says so) with the questions the pre-training mixed in
    ceiling = json.loads((models / "pretrain-continued-3" / "pretraining_args.json").read_text())
    assert ceiling["max_steps"] == 3 and ceiling["mixed_questions_file"]
    assert (
        ceiling["mixed_questions_file"]
        == json.loads((models / "pretrain-edmem" / "pretraining_args.json").read_text())["mixed_questions_file"]
    )
    # before adding, the memory cannot hold a new subject
    assert result["summary"]["added"]["before"]["memory_recall"]["mean"] == 0.0
    assert result["summary"]["added"]["writer_before"]["memory_recall"]["mean"] == 0.0
    for trained_dir, estimators in (
        ("finetune", growth.ESTIMATORS),
        (
            f"finetune-{WRITER_FOLDER}-more-4-frozen-writer-5-row-autoencoding-0.5-fresh-names-0.5-every-entity",
            ["writer"],
        ),
    ):
        trained = EDMemForConditionalGeneration.from_pretrained(models / trained_dir)
        size = trained.config.entity_vocab_size
        for estimator in estimators:
            folder = (
                f"grown-{WRITER_FOLDER}-more-4-frozen-writer-5-row-autoencoding-0.5-fresh-names-0.5-every-entity-from-own-sentences"
                if estimator == "writer"
                else f"grown-{estimator}"
            )
            grown = EDMemForConditionalGeneration.from_pretrained(models / folder)
            assert grown.entity_vocab.names == trained.entity_vocab.names + held
            # only the new rows differ from the trained model; every other weight is the trained one
            for key, value in trained.state_dict().items():
                other = grown.state_dict()[key]
                # the table's rows, and the rows it keeps apart, gain the new ones after the trained ones
                assert torch.equal(other[: len(value)] if "entity_embeddings" in key else other, value), key
    assert trained.entity_writer is not None and trained.config.entity_row_writer
    # the first stage went on 4 steps more from its model, with its options, in a folder of its own
    more = json.loads((models / f"pretrain-{WRITER_FOLDER}-more-4" / "pretraining_args.json").read_text())
    alone = json.loads((models / f"pretrain-{WRITER_FOLDER}" / "pretraining_args.json").read_text())
    assert more["max_steps"] == 4 and more["model_name_or_path"] == str(models / f"pretrain-{WRITER_FOLDER}")
    assert more["writer_decoy_rows"] == alone["writer_decoy_rows"] == 2 and more["entity_key_dim"] == 8
    before_more = EDMemForConditionalGeneration.from_pretrained(models / f"pretrain-{WRITER_FOLDER}")
    # the second stage began from that model and kept its writer, and so did fine-tuning (`trained`)
    first = EDMemForConditionalGeneration.from_pretrained(models / f"pretrain-{WRITER_FOLDER}-more-4")
    assert not torch.equal(before_more.entity_writer.row_proj.weight, first.entity_writer.row_proj.weight)
    second = EDMemForConditionalGeneration.from_pretrained(
        models / f"pretrain-{WRITER_FOLDER}-more-4-frozen-writer-5-row-autoencoding-0.5-fresh-names-0.5-every-entity"
    )
    assert torch.equal(first.entity_writer.row_proj.weight, second.entity_writer.row_proj.weight)
    stage = (
        models / f"pretrain-{WRITER_FOLDER}-more-4-frozen-writer-5-row-autoencoding-0.5-fresh-names-0.5-every-entity"
    )
    assert json.loads((stage / "pretraining_args.json").read_text())["fresh_name_share"] == 0.5  # this stage's alone
    assert (
        json.loads((models / f"pretrain-{WRITER_FOLDER}" / "pretraining_args.json").read_text())["fresh_name_share"]
        == 0.0
    )
    assert not torch.equal(first.model.decoder.layers[-1].fc1.weight, second.model.decoder.layers[-1].fc1.weight)
    assert torch.equal(second.entity_writer.row_proj.weight, trained.entity_writer.row_proj.weight)
    assert trained.config.entity_key_dim == 8  # the writer's model only
    assert EDMemForConditionalGeneration.from_pretrained(models / "finetune").config.entity_key_dim is None
    # the diagnostics (edmem_hf.research.diagnostics; tests/test_diagnostics.py), for the default EDMem and the writer
    for system in ("default", "writer"):
        figures = result["runs"][0]["results"]["diagnostics"][system]
        assert figures["row_swap"]["questions"] > 0 and 0 <= figures["row_swap"]["follow"] <= 100
        assert figures["row_swap_read"]["questions"] == figures["row_swap"]["questions"]
        assert set(figures["oracle_read"]) == {"plain", "oracle"} and set(figures["rewrite"]) == {"plain", "rewritten"}
        assert 0 <= figures["row_content"]["probe"] <= 100 and 0 <= figures["row_content"]["majority"] <= 100
    written = result["runs"][0]["results"]["diagnostics"]["writer"]["written_facts"]
    assert 0 <= written["fact_share"] <= 100 and 0 <= written["name_share"] <= 100 and written["chance"] == 6.25
    assert "written_facts" not in result["runs"][0]["results"]["diagnostics"]["default"]
    # the writer's rows of one fact each: every added question answered, the EM in range, found and forced
    fact_rows = result["runs"][0]["results"]["diagnostics"]["writer"]["fact_rows"]
    assert set(fact_rows) == {"plain", "oracle", "several", "several_person_found", "several_fact_found"}
    assert all(0.0 <= value <= 100.0 for value in fact_rows.values())
    assert fact_rows["several_fact_found"] <= fact_rows["several_person_found"]
    assert "fact_rows" not in result["runs"][0]["results"]["diagnostics"]["default"]
    # a row each sentence of the added people's pages (the writer's model keeps a row a passage apart)
    sentence_rows = result["runs"][0]["results"]["diagnostics"]["writer"]["sentence_rows"]
    assert set(sentence_rows) == {"em", "person_found"} and all(0 <= v <= 100 for v in sentence_rows.values())
    first_stage = EDMemForConditionalGeneration.from_pretrained(models / f"pretrain-{WRITER_FOLDER}")
    assert first_stage.config.writer_pools_texts is False and first_stage.config.writer_mean_row_probability
    # a row a passage: the frozen second stage keeps the trained entities' rows apart, and the added people gain a
    # row for each sentence of their page after them
    grown = EDMemForConditionalGeneration.from_pretrained(
        models
        / f"grown-{WRITER_FOLDER}-more-4-frozen-writer-5-row-autoencoding-0.5-fresh-names-0.5-every-entity-from-own-sentences"
    )
    kept = grown.model.entity_embeddings.written_row_entity_ids.tolist()
    new = [entity for entity in kept if entity >= size]
    assert set(new) == set(range(size, size + len(held))) and kept[-len(new) :] == new and len(kept) > len(new)
    trained = EDMemForConditionalGeneration.from_pretrained(models / "finetune")
    fitted = EDMemForConditionalGeneration.from_pretrained(models / "grown-fitted").model.entity_embeddings.weight
    mean = EDMemForConditionalGeneration.from_pretrained(models / "grown-mean_query").model.entity_embeddings.weight
    assert not torch.allclose(fitted[size:], mean[size:])
    assert (out / "growth.png").stat().st_size > 0
    # the queries the rows-alone bound reads are the memory's own: their best rows are what the memory found
    tokenizer = AutoTokenizer.from_pretrained(models / "finetune")
    names, queries = memory.subject_queries(trained.eval(), tokenizer, seed / "edmem_toy-test.jsonl")
    table = trained.model.entity_embeddings.weight.detach()
    found = [trained.entity_vocab.name_of(int(i)) == name for i, name in zip((queries @ table.T).argmax(-1), names)]
    finding = memory.memory_finding(models / "finetune", seed / "edmem_toy-test.jsonl")
    assert finding["recall"] == round(100 * sum(found) / len(found), 2)
    # the writer's passages state the asked fact more often drawn by mentions (the subject's own page) than uniformly
    facts = result["runs"][0]["results"]["passage_facts"]
    assert set(facts["uniform"]) == set(facts["by_mentions"]) and "occupation" in facts["uniform"]
    assert 0 < facts["uniform"]["all"] < facts["by_mentions"]["all"] <= 100
    # the reader's take of a row under each naming of the practice people: every practice question, figures in range
    shape = result["runs"][0]["results"]["diagnostics"]["writer"]["name_shape"]
    assert shape["questions"] == len(list(read_jsonl(seed / "edmem_toy-practice.jsonl")))
    assert all(0.0 <= shape[k] <= 100.0 for k in ("own_name", "fresh_any_words", "fresh_people_words"))
    # the practice people's rows hidden: the mask hides them and no one else, and every EM is read again with it
    practice = set((seed / "practice_people.txt").read_text(encoding="utf-8").split("\n")) - {""}
    vocab = EntityVocab.load(models / "finetune")
    mask = torch.load(models / "finetune" / "practice_rows_hidden_mask.pt", weights_only=True)
    assert len(practice) == 3 and {vocab.name_of(i) for i in mask.nonzero().flatten().tolist()} == practice
    # a stream of practice people: the questions of two of them mixed into pre-training, each on its own page alone
    mixed = {record["question"] for record in read_jsonl(seed / "edmem_toy-train_and_practice.jsonl")}
    assert sum(any(name in question for question in mixed) for name in practice) == 2
    links = [
        (page.title, link.target) for page in iter_parsed_pages(str(seed / "old-wiki.xml.bz2")) for link in page.links
    ]
    assert all([title for title, target in links if target == name] == [name] for name in practice)
    for split, name in (("test", "writer_before"), ("added", "writer"), ("test", "before")):
        assert 0.0 <= result["summary"][split][name]["free_practice_rows_hidden"]["all"]["mean"] <= 100.0
        figures = result["runs"][0]["results"][split][name]
        assert {"memory_misses_sharing_a_name_word", "memory_misses_sharing_a_name_word_practice_rows_hidden"} <= set(
            figures
        )
    bound = result["runs"][0]["results"]["rows_alone"]
    assert -1.0 <= bound["added_query_cosine_between_people"] <= 1.0
    assert 0.0 <= bound["added_recall_with_rows_from_their_questions"] <= 100.0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith(
        f"RESULT seeds=1 people_added={len(held)} practice_people=3 practice_biographies=2 practice_one_fact_pages=0 "
        "practice_sentence_pages=0 practice_share=0.5 practice_questions_people=2 pretrain_steps=30 written_table=0 "
        "row_autoencoding_share=0.5 row_autoencoding_written_only=1 writer_passages_by_mentions=1 "
        "writer_passages_per_row=2 writer_pools_texts=0 writer_answer_rows=1 writer_reads_answer_rows=1 writer_answer_rows_by_text=1 writer_mean_row_probability=1 mean_row_probability_at_test=0 entity_key_dim=8 writer_dropout=None writer_random_mask_prob=None writer_restart_unless_learned=0 added_texts=own-sentences "
        "fresh_names_like_written_only=1 writer_decoy_rows=2 written_row_share=0.5 writer_more_steps=4 reader_steps=5 "
        "reader_names_like_written_only=0 reader_row_autoencoding_share=0.5 reader_fresh_name_share=0.5 "
    )
    for key in ("added_over_trained_em", "trained_em_change", "seconds_to_add_10_fitted", "seconds_to_add_10_mean",
                "added_over_trained_em_with_floor", "added_recall", "row_swap_follow", "writer_cost_on_trained_em",
                "seconds_to_add_10_writer", "estimator=writer", "trained_memory_recall_practice_rows_hidden_writer",
                "practice_em_writer_before", "passage_facts_uniform", "passage_facts_by_mentions",
                "name_shape_own_name_writer", "fact_rows_plain_writer", "fact_rows_oracle_writer", "sentence_rows_em_writer", "name_shape_fresh_any_words_writer",
                "name_shape_fresh_people_words_writer", "trained_em_practice_rows_hidden",
                "added_over_trained_em_practice_rows_hidden", "writer_cost_on_trained_em_practice_rows_hidden"):  # fmt: skip
        assert f" {key}" in last
    _a_grown_model_recalls_and_answers_on_a_case_built_to_succeed(bench, seed, models, tmp_path)
    # a rerun reuses the answers and times only what is asked and not yet measured
    assert bench.main([*argv[:-1], "20", "--timed-estimators", "mean_query", "--no-plots"]) == 0
    timed = json.loads((out / "seconds_to_add.json").read_text())["toy_model"]
    assert (
        set(timed["mean_query"]) == {"10", "20"} and set(timed["fitted"]) == {"10"} and set(timed["writer"]) == {"10"}
    )


def _a_grown_model_recalls_and_answers_on_a_case_built_to_succeed(bench, seed, models, tmp_path):
    """The trained model grown with rows written from the very queries they will be asked with, measured as the
    experiment measures: an added person whose row is the memory's query at the question's subject is the memory's
    top entity there (`memory_finding`), and a new place whose row is the entity-linking head's query at that question
    is the static answer, spelled and scored right. Before adding, neither."""
    record = next(r for r in read_jsonl(seed / "edmem_toy-added.jsonl") if r["relation"] == "born_in")
    person, asked = record["link_target"][0], tmp_path / "asked.jsonl"
    asked.write_text(json.dumps(record) + "\n")
    tokenizer = AutoTokenizer.from_pretrained(models / "finetune")
    model = EDMemForConditionalGeneration.from_pretrained(models / "finetune").eval()
    longest = 2 * model.model.entity_embeddings.weight.norm(dim=-1).max().item()  # the row outscores every other
    assert memory.memory_finding(models / "finetune", asked)["recall"] == 0.0
    _, query = memory.subject_queries(model, tokenizer, asked)
    add_entities(model, [person], rows=query / query.norm(dim=-1, keepdim=True) * longest)
    question = tokenizer([in_running_text(read_qa(asked, model.entity_vocab)["question"][0])], return_tensors="pt")
    place = "Newtown Vale"
    (place_id,) = add_entities(model, [place], rows=torch.zeros(1, model.config.entity_embed_dim))
    linking_queries = []
    hook = model.entity_linking_head.query_proj.register_forward_hook(lambda m, i, out: linking_queries.append(out))
    before, _ = model.link_entities(question.input_ids, question.attention_mask, top_k=1)
    hook.remove()
    assert before.tolist() != [[place_id]]
    with torch.no_grad():
        model.model.entity_embeddings.weight[place_id] = linking_queries[0][0] / linking_queries[0][0].norm() * longest
    model.save_pretrained(tmp_path / "grown-built")
    tokenizer.save_pretrained(tmp_path / "grown-built")

    assert memory.memory_finding(tmp_path / "grown-built", asked)["recall"] == 100.0
    grown = EDMemForConditionalGeneration.from_pretrained(tmp_path / "grown-built").eval()
    answer = grown.generate(**question, entity_decoding="static", entity_candidates=1, tokenizer=tokenizer,
                            max_new_tokens=12, return_dict_in_generate=True)  # fmt: skip
    (mention,) = answer.entity_mentions[0]
    assert (mention.entity_id, mention.entity_name) == (place_id, place)
    text = tokenizer.decode(answer.sequences[0], skip_special_tokens=True)
    assert exact_match(text, [place]) and not exact_match(text, record["answer"]), text
