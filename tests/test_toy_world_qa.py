"""`benchmarks/toy_world_qa.py`: its question files are the released format the readers and `edmem evaluate` take,
no test-half question reaches fine-tuning or pre-training, and the experiment runs end to end at a tiny size (the
figures themselves are in docs/evidence.md)."""

from __future__ import annotations

import bz2
import dataclasses
import json
import re
from pathlib import Path

import pytest
import torch

from edmem_hf import EntityVocab
from edmem_hf.evaluation import evaluate_files
from edmem_hf.finetuning import run as finetune
from edmem_hf.knowledge_world import KnowledgeWorldSettings, generate_knowledge_world, split_people
from edmem_hf.tasks import IGNORE_INDEX, read_jsonl, read_qa
from tiny_models import load_benchmark, make_word_tokenizer, tiny_model

# isort: split
# benchmarks/ is on the path (tiny_models)
from experiments import memory, options, probes, qa_world, scoring, training

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("toy_world_qa")


def test_question_files_read_back_and_score(bench, tmp_path):
    world = generate_knowledge_world(KnowledgeWorldSettings(num_people=10), seed=3)
    test = split_people(world, seed=3)["test"]
    data, links = qa_world.write_released_format(test, "test", tmp_path)
    vocab = EntityVocab([e.name for e in world.entities])
    rows = read_qa(data, vocab)
    assert len(rows) == len(test)
    for row, pair in zip(rows, test):
        assert row["question"].replace(f"<E_s> {pair.subject} <E_e>", pair.subject) == pair.question
        assert row["mention_entities"] == [vocab.id_of(pair.subject)]
        assert row["answer_entity"] == (vocab.id_of(pair.answer) if pair.answer_is_entity else IGNORE_INDEX)
    # gold answers score 100 on both kinds; an entity for every question scores 0 on the literal ones
    gold = {row["id"]: pair.answer_with_markers for row, pair in zip(rows, test)}
    (tmp_path / "gold.json").write_text(json.dumps(gold))
    scores = evaluate_files("qa", data, tmp_path / "gold.json", answer_links=links)
    assert scores["exact_match_entity"] == scores["exact_match_non_entity"] == 100.0
    hits = scoring.question_hits(data, links, tmp_path / "gold.json")
    assert scoring.em(hits) == {"all": 100.0, "entity": 100.0, "literal": 100.0}
    entity = {row["id"]: f"<E_s> {world.entities[5].name} <E_e>" for row in rows}
    (tmp_path / "entity.json").write_text(json.dumps(entity))
    assert evaluate_files("qa", data, tmp_path / "entity.json", answer_links=links)["exact_match_non_entity"] == 0.0


def test_no_validation_or_test_question_is_fine_tuned_on_or_pre_trained_on(bench, tmp_path):
    settings = bench.Settings(num_people=12, mix_qa=True)
    data = qa_world.make_world(settings, seed=5, out=tmp_path)
    records = {group: list(read_jsonl(data["files"][group])) for group in ("train", "validation", "test")}
    assert {group: len(rows) for group, rows in records.items()} == {"train": 36, "validation": 18, "test": 18}
    people = {group: {r["link_target"][0] for r in rows} for group, rows in records.items()}
    assert len(people["train"] | people["validation"] | people["test"]) == 12  # three disjoint groups
    dump = bz2.open(tmp_path / "wiki.xml.bz2", "rt", encoding="utf-8").read()

    def in_dump(question):
        return question in dump or question.replace("'", "&apos;") in dump

    assert all(in_dump(r["question"]) for r in records["train"])  # mixed in
    for group in ("validation", "test"):
        assert not {r["question"] for r in records["train"]} & {r["question"] for r in records[group]}
        assert not any(in_dump(r["question"]) for r in records[group])
        for person in people[group]:  # every validation and test person is read in pre-training
            assert f"<title>{person}</title>" in dump


def test_mixed_questions_are_on_by_default_and_can_be_turned_off(bench, tmp_path):
    parser = options.experiment_parser("test", "out")
    assert options.with_overrides(bench.Settings(), parser.parse_args([])).mix_qa is True
    settings = options.with_overrides(bench.Settings(num_people=12), parser.parse_args(["--no-mix-qa"]))
    assert settings.mix_qa is False
    data = qa_world.make_world(settings, seed=5, out=tmp_path)
    dump = bz2.open(tmp_path / "wiki.xml.bz2", "rt", encoding="utf-8").read()
    train = list(read_jsonl(data["files"]["train"]))
    assert train and not any(r["question"] in dump or r["question"].replace("'", "&apos;") in dump for r in train)


def test_the_systems_beside_edmem_can_be_switched(bench):
    parser = bench.qa_parser()
    full = bench.qa_settings(parser.parse_args(["--setup", "paper"]))
    assert full.encmem and full.encdec_matched and full.single_biography_ablation
    lean = bench.qa_settings(
        parser.parse_args(["--setup", "paper", "--no-encmem", "--no-encdec-matched", "--no-single-biography-ablation"])
    )
    assert not (lean.encmem or lean.encdec_matched or lean.single_biography_ablation)
    quick = bench.qa_settings(parser.parse_args(["--quick", "--encdec-matched"]))
    assert quick.encdec_matched and not quick.encmem and quick.num_people == bench.QUICK.num_people


FAIR_WORLD = ROOT / "docs" / "images" / "toy_world_qa_fair_world"


def test_the_plain_command_runs_the_headline_s_recipe_and_setup_paper_the_paper_s(bench, tmp_path):
    """Without options, the settings are those the headline's results file records (docs/evidence.md, "The fair
    world"); `--setup paper` with the switches of its documented command, those of the paper's recipe's file."""

    def recorded(name: str) -> dict:
        return json.loads((FAIR_WORLD / name).read_text(encoding="utf-8"))["settings"]

    def settings(argv: list[str]) -> dict:
        return json.loads(json.dumps(dataclasses.asdict(bench.qa_settings(bench.qa_parser().parse_args(argv)))))

    assert settings([]) == recorded("test_3seeds_questions_in_batches_30000_steps_el_per_token.json")
    lean = ["--no-encmem", "--no-encdec-matched", "--no-single-biography-ablation", "--no-memory-hidden-in-finetuning"]
    assert settings(["--setup", "paper", *lean]) == recorded("test_3seeds_paper_recipe.json")
    assert settings(["--setup", "headline", "--pretrain-steps", "100"])["pretrain_steps"] == 100
    with pytest.raises(SystemExit):  # --quick is the paper's setup, small: refused before any work
        bench.main(["--quick", "--setup", "headline", "--out", str(tmp_path / "run")])
    assert not (tmp_path / "run").exists()


def test_shuffled_questions_sit_on_pages_of_their_own(bench, tmp_path):
    """`--shuffled-questions`: the fine-tuning group's questions on question pages, people mixed, each subject
    linked (known only by its name there); none on a person's page; no validation or test question anywhere."""
    settings = bench.Settings(num_people=30, shuffled_questions=True)
    data = qa_world.make_world(settings, seed=2, out=tmp_path)
    dump = bz2.open(tmp_path / "wiki.xml.bz2", "rt", encoding="utf-8").read()
    assert "== Questions ==" not in dump
    pages = re.findall(r"<title>Questions \d+</title>.*?<text[^>]*>(.*?)</text>", dump, flags=re.S)
    assert len(pages) == -(-15 * 6 // qa_world.QUESTIONS_A_PAGE)
    train = list(read_jsonl(data["files"]["train"]))
    linked = [re.findall(r"\[\[([^\]|]+)\]\] born\?|\[\[([^\]|]+)\]\]", page) for page in pages]
    assert all(len({a or b for a, b in page}) > 3 for page in linked)  # several people a page
    for record in train:
        subject = record["link_target"][0]
        linked_question = record["question"].replace(subject, f"[[{subject}]]")
        assert linked_question in dump or linked_question.replace("'", "&apos;") in dump
    for group in ("validation", "test"):
        assert not any(r["link_target"][0] + "]]" in " ".join(pages) for r in read_jsonl(data["files"][group]))


def test_majority_floor_and_bootstrap(bench, tmp_path):
    world = generate_knowledge_world(KnowledgeWorldSettings(num_people=12), seed=0)
    splits = split_people(world, seed=0)
    files = {split: qa_world.write_released_format(pairs, split, tmp_path)[0] for split, pairs in splits.items()}
    floor = json.loads(scoring.majority_answers(files["train"], files["test"], tmp_path / "m.json").read_text())
    train = list(read_jsonl(files["train"]))
    for record in read_jsonl(files["test"]):  # the most common training answer of the question's form
        answers = [r["answer"][0] for r in train if r["relation"] == record["relation"]]
        assert answers.count(floor[record["id"]]) == max(answers.count(a) for a in answers)
    hits = [(True, i % 2 == 0) for i in range(40)] + [(False, False)] * 40
    low, high = scoring.bootstrap([hits], samples=200)["entity"]
    assert low < 50.0 < high and high - low < 50
    assert scoring.bootstrap([hits], samples=200)["literal"] == [0.0, 0.0]


def test_the_bootstrap_resamples_seeds(bench):
    """Seeds that disagree widen the interval: one seed right on every question and one wrong on every question
    give an interval from 0 to 100 (resampling the questions alone would give 50 to 50)."""
    right, wrong = [(True, True)] * 60 + [(False, True)] * 60, [(True, False)] * 60 + [(False, False)] * 60
    low, high = scoring.bootstrap([right, wrong], samples=400)["entity"]
    assert low == 0.0 and high == 100.0
    assert scoring.bootstrap([right, right], samples=100)["all"] == [100.0, 100.0]


def test_validity_needs_one_system_over_both_bars(bench):
    """One system must meet the entity bar and the literal bar: one at each is not valid."""
    settings = bench.Settings()

    def summary(**systems):
        scores = {name: {"em": {"entity": entity, "literal": literal}} for name, (entity, literal) in systems.items()}
        return {"test": {**scores, "majority_answer": {"em": {"entity": 1.0, "literal": 4.0}}}}

    split = scoring.validity(summary(edmem_free=(80.0, 5.0), encdec=(40.0, 30.0)), settings)
    assert not split["valid"] and split["valid_system"] is None
    both = scoring.validity(summary(edmem_free=(80.0, 5.0), encdec=(60.0, 30.0)), settings)
    assert both["valid"] and both["valid_system"] == "encdec" and both["group"] == "test"
    chosen = scoring.validity({"validation": summary(encdec=(60.0, 30.0))["test"]}, settings)
    assert chosen["group"] == "validation"


def test_recipes_share_what_they_can(bench):
    """A recipe's models sit in folders named by what sets them apart from the paper's: EncDec has no linking loss,
    so the linking levers leave its pre-training the paper's; the masking lever does not."""
    recipes = bench.RECIPES
    assert recipes["paper"] == training.Recipe() and recipes["paper"].pretraining_suffix("edmem") == ""
    assert recipes["el_per_token"].pretraining_suffix("encdec") == ""
    assert recipes["el_per_token"].pretraining_suffix("edmem") == "-entity_loss_reduction=per_lm_token"
    assert recipes["salient_numbers"].pretraining_suffix("encdec") == "-number_mask_prob=0.5"
    assert recipes["finetune_el_weight_2"].pretraining_suffix("edmem") == ""
    assert recipes["finetune_el_weight_2"].finetuning_suffix("edmem") == "-finetune_entity_loss_weight=2.0"
    assert recipes["finetune_el_weight_2"].finetuning_suffix("encdec") == ""
    settings = bench.qa_settings(bench.qa_parser().parse_args(["--recipes", "el_per_token", "paper", "--no-test"]))
    assert settings.recipes == ("el_per_token", "paper") and settings.read_test is False


def test_hidden_rows_mask_the_named_entities(bench):
    vocab = EntityVocab(["a", "b", "c", "d"])
    assert memory.hidden_rows(4, ["b", "d"], vocab).tolist() == [0, 1, 0, 1]
    assert memory.hidden_rows(4, None, vocab).tolist() == [1, 1, 1, 1]


def test_entity_mask_file_is_the_authors_format(bench, tmp_path):
    """The authors' get_memory_mask.py format (a long tensor, 1 = hidden), read by the fine-tuning script's
    `--entity_mask_file`: constrained decoding then spells only the entities the file leaves visible."""
    path = memory.write_entity_mask(1000, 0.1, seed=0, path=tmp_path / "mask.pt")
    hidden = torch.load(path, weights_only=True)
    assert hidden.dtype == torch.long and hidden.shape == (1000,) and set(hidden.unique().tolist()) == {0, 1}
    assert 50 < int((hidden == 0).sum()) < 150  # about a tenth visible
    assert torch.equal(torch.load(memory.write_entity_mask(1000, 0.1, 0, tmp_path / "again.pt")), hidden)  # seeded

    world = generate_knowledge_world(KnowledgeWorldSettings(num_people=20), seed=3)
    names = [e.name for e in world.entities]
    data, _ = qa_world.write_released_format(split_people(world, seed=3)["test"], "test", tmp_path)
    tokenizer = make_word_tokenizer(bart_template=True)
    start, end = tokenizer.convert_tokens_to_ids(["<E_s>", "<E_e>"])
    model = tiny_model(vocab_size=len(tokenizer), entity_vocab_size=len(names), entity_start_token_id=start,
                       entity_end_token_id=end, init_std=0.3)  # fmt: skip
    model.entity_vocab = EntityVocab(names)
    with torch.no_grad():  # a random model that opens mentions (as the decoding tests bias it)
        model.final_logits_bias[0, start] = 12.0
        model.final_logits_bias[0, tokenizer.eos_token_id] = -12.0
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    mask = memory.write_entity_mask(len(names), 0.25, seed=0, path=tmp_path / "memory_mask.pt")
    visible = {names[i] for i in (torch.load(mask, weights_only=True) == 0).nonzero().flatten().tolist()}
    assert 0 < len(visible) < len(names) // 2

    def spelled(out, *extra) -> list[str]:
        finetune(argv=[
            "--model_name_or_path", str(tmp_path / "model"), "--output_dir", str(out), "--test_file", str(data),
            "--do_predict", "--entity_decoding", "dynamic", "--entity_candidates", "3", "--max_target_length", "24",
            "--per_device_eval_batch_size", "32", "--eval_strategy", "no", "--save_strategy", "no",
            "--load_best_model_at_end", "false", "--report_to", "none", "--use_cpu", "--disable_tqdm", "true", *extra,
        ])  # fmt: skip
        texts = json.loads((out / "dynamic_predictions.json").read_text()).values()
        return [
            part.split("<E_e>")[0].strip() for text in texts for part in text.split("<E_s>")[1:] if "<E_e>" in part
        ]

    masked = spelled(tmp_path / "masked", "--entity_mask_file", str(mask))
    assert len(masked) >= 10 and len(set(masked)) >= 3  # real, varied mentions first
    assert set(masked) <= visible, set(masked) - visible
    assert set(spelled(tmp_path / "all")) - visible  # without the file, hidden entities are spelled too


def test_the_experiment_runs_end_to_end(bench, tmp_path, capsys):
    """A tiny world, a few steps: the systems are pre-trained, fine-tuned, decoded and scored, the plots drawn."""
    out = tmp_path / "run"
    argv = ["--quick", "--out", str(out), "--num-people", "16", "--pretrain-steps", "30", "--finetune-epochs", "300",
            "--finetune-learning-rate", "1e-2", "--d-model", "32", "--curve", "10", "--encdec-matched"]  # fmt: skip
    threads = torch.get_num_threads()
    # one thread, as the benchmark's own side-by-side pre-trainings: the same reductions whatever the cores
    torch.set_num_threads(1)
    try:
        assert bench.main(argv) == 0
    finally:
        torch.set_num_threads(threads)
    printed = capsys.readouterr().out
    assert "--quick is a smoke run" in printed  # says it shows the pipeline, not the claim
    result = json.loads((out / "results.json").read_text())
    # the curve: a 10-step budget pre-trained from scratch beside the run's own 30 steps
    assert [point["steps"] for point in result["curve"]] == [10, 30]
    assert result["curve"][1]["encdec"]["em_validation"] == result["runs"][0]["em"]["validation"]["encdec"]
    short = json.loads(
        (
            out / "curve-seed-0" / "steps-10" / "finetune-encdec" / "validation-free" / "free_predictions.json"
        ).read_text()
    )
    assert len(short) == 4 * 6 and all(short.values())
    assert (out / "em_against_steps.png").stat().st_size > 0
    seed = out / "seed-0"
    test = list(read_jsonl(seed / "edmem_toy-test.jsonl"))
    for system in ("finetune-edmem/free/free", "finetune-encdec/free/free"):
        predictions = json.loads((seed / f"{system}_predictions.json").read_text())
        texts = [predictions[record["id"]].replace("<E_s>", "").replace("<E_e>", "").strip() for record in test]
        assert all(texts) and len(texts) == result["runs"][0]["questions"]["test"] == 4 * 6  # an answer each
    assert result["runs"][0]["questions"] == {"train": 8 * 6, "validation": 4 * 6, "test": 4 * 6}
    assert len(set(texts)) > 2  # EncDec's answers vary (EDMem's, this small and brief, may all be one name)
    summary = result["summary"]["test"]
    assert {"edmem_free", "edmem_static", "edmem_dynamic", "encdec", "majority_answer",
            "edmem_free_every_row_hidden_at_test", "edmem_free_subject_rows_hidden_at_test"} <= set(summary)  # fmt: skip
    hits = scoring.question_hits(seed / "edmem_toy-test.jsonl", seed / "sling_invocab-test.json",
                               seed / "finetune-encdec" / "free" / "free_predictions.json")  # fmt: skip
    assert summary["encdec"]["em"] == scoring.em(hits)
    right = [text for text, (_, hit) in zip(texts, hits) if hit]
    assert all(text.lower() in {r["answer"][0].lower() for r in test} for text in right)
    for scores in summary.values():
        low, high = scores["interval"]["all"]
        assert 0.0 <= low <= scores["em"]["all"] <= high <= 100.0
    memorised = result["runs"][0]["memorisation"]["edmem"]
    assert set(memorised) == {"train", "validation", "test"} and 0.0 <= memorised["test"]["entity"] <= 100.0
    assert set(memorised["validation"]["question_form"]) == {"all", "entity", "literal"}
    assert "memory_names_the_masked_entity" in memorised["test"]
    assert set(memorised["test"]["memory_finds_the_person"]) == {"name_alone", "question", "first_biography"}
    for variant in ("edmem", "encdec"):  # what the decoder fills with the encoder given nothing
        alone = result["runs"][0]["memorisation"][variant]["test"]["decoder_alone"]
        assert 0.0 <= alone <= 100.0
    counts = result["runs"][0]["parameters"]
    assert counts["edmem"]["with_table"] > counts["edmem"]["without_table"]
    assert counts["encdec"]["with_table"] == counts["encdec"]["without_table"]
    # the EncDec of EDMem's size: within half a unit of feed-forward width (4 layers x (2 d + 1)) of EDMem's count
    assert abs(counts["encdec_matched"]["with_table"] - counts["edmem"]["with_table"]) <= 2 * (2 * 32 + 1)
    assert counts["encdec_matched"]["with_table"] > counts["encdec"]["with_table"]
    assert (
        "encdec_matched" in summary and "free_over_parameter_matched_encdec_on_entity_answers" in result["orderings"]
    )
    # hidden at test time: the same fine-tuned model, its mask every row / the test subjects' rows
    every = torch.load(seed / "mask-every-row.pt")
    subjects = torch.load(seed / "mask-test-subjects.pt")
    assert every.tolist() == [1] * len(every) and int(subjects.sum()) == 4
    assert (out / "em_by_model.png").stat().st_size > 0 and (out / "em_memory_hidden.png").stat().st_size > 0
    last = printed.strip().splitlines()[-1]
    for key in ("valid", "valid_system", "best_entity_em", "floor_entity", "best_literal_em", "floor_literal",
                "edmem_free_entity", "encdec_entity", "memory_hidden_drop", "literal_gap_edmem_minus_encdec",
                "entity_gap_edmem_minus_encdec", "seed_level_interval"):  # fmt: skip
        assert f" {key}=" in last
    assert last.startswith(
        "RESULT seeds=1 people=16 group=test test_questions=24 recipe=paper pretrain_steps=30 questions_in_batches=0 "
        "finetune_epochs=300 "
    )


def test_memory_finds_the_person_reads_the_top_entity_at_the_first_mention(bench):
    """A memory whose table row of each person is the query its name gives finds every person named alone."""
    world = generate_knowledge_world(KnowledgeWorldSettings(num_people=8, biographies=1), seed=0)
    people = sorted(e.name for e in world.entities if e.type == "person")
    tokenizer = make_word_tokenizer(bart_template=True)
    start, end = tokenizer.convert_tokens_to_ids(["<E_s>", "<E_e>"])
    names = [e.name for e in world.entities]
    model = tiny_model(vocab_size=len(tokenizer), entity_vocab_size=len(names), entity_start_token_id=start,
                       entity_end_token_id=end, max_position_embeddings=1024).eval()  # fmt: skip
    model.entity_vocab = EntityVocab(names)
    from edmem_hf.research.entity_growth import memory_queries

    queries = memory_queries(model, [[probes.PERSON_CONTEXTS["name_alone"](world, p)] for p in people], tokenizer)
    with torch.no_grad():
        for person, query in zip(people, queries):
            model.model.entity_embeddings.weight[model.entity_vocab.id_of(person)] = 50 * query / query.norm()
    found = probes.memory_finds_the_person(model, tokenizer, world, people)
    assert found["name_alone"] == 100.0 and set(found) == {"name_alone", "question", "first_biography"}


def test_probes_ask_a_masked_spans_model_for_its_own_target(bench):
    """The memorisation probes teacher-force a `--decoder_target masked_spans` model on what its collator makes of
    the same masking: `<mask>`, the value (inside its markers when it is an entity), EOS."""
    from edmem_hf.collator import EDMemMaskingCollator
    from test_collator import make_tokenizer

    tokenizer = make_tokenizer()
    start, end = tokenizer.convert_tokens_to_ids(["<E_s>", "<E_e>"])
    collator = EDMemMaskingCollator(tokenizer, decoder_target="masked_spans")
    words = tokenizer(" was born in the old century", add_special_tokens=False).input_ids
    name, city = (tokenizer(f" {n}", add_special_tokens=False).input_ids for n in ("Alpha City", "Beta River"))
    ids = [tokenizer.bos_token_id, start, *name, end, *words, start, *city, end, tokenizer.eos_token_id]
    city_at = list(range(len(ids) - 2 - len(city), len(ids) - 2))
    century_at = list(range(city_at[0] - 1 - 2, city_at[0] - 1))  # the words before the city's <E_s>
    for inside, is_entity in ((city_at, True), (century_at, False)):
        ids_t = torch.tensor(ids)
        masked = torch.zeros(1, len(ids), dtype=torch.bool)
        masked[0, inside] = True
        labels = torch.full((1, len(ids)), IGNORE_INDEX)
        expected, _, scored, _ = collator._masked_span_targets(ids_t[None], masked, labels, masked, [len(ids)])
        target, filled = probes._probe_target(collator, ids_t, inside)
        assert target.tolist() == expected[0].tolist() and filled == scored[0].nonzero()[:, 0].tolist()
        assert target[filled].tolist() == ids_t[inside].tolist() and len(filled) >= 1
        assert (start in target.tolist()) == is_entity
        markers = ([start], [end]) if is_entity else ([], [])
        run = ids_t[inside].tolist()
        assert target.tolist() == [tokenizer.mask_token_id, *markers[0], *run, *markers[1], tokenizer.eos_token_id]
        assert probes._probe_target(None, ids_t, inside) == (ids_t, inside)
    assert isinstance(probes._span_collator(tokenizer, "masked_spans"), EDMemMaskingCollator)
    assert probes._span_collator(tokenizer, "passage") is None


def test_no_finetuning_asks_the_pretrained_model(bench, tmp_path):
    """`--finetune-epochs 0` (the study's mixed training): the model asked is the pre-trained one, untouched."""
    settings = options.with_overrides(
        bench.Settings(), options.experiment_parser("t", "o").parse_args(["--finetune-epochs", "0"])
    )
    assert settings.finetune_epochs == 0
    pretrained = tmp_path / "pretrained"
    assert training.finetune_model(pretrained, tmp_path / "train.jsonl", tmp_path / "ft", settings, 0) == pretrained
    assert not (tmp_path / "ft").exists()
    with pytest.raises(ValueError, match="finetune-epochs"):
        training.finetune_model(
            pretrained, tmp_path / "train.jsonl", tmp_path / "ft", settings, 0, tmp_path / "mask.pt"
        )


def test_a_folder_of_a_finished_pre_training_of_other_steps_is_refused(bench, tmp_path):
    (tmp_path / "trainer_state.json").write_text(json.dumps({"max_steps": 3000}))
    settings = dataclasses.replace(bench.QUICK, pretrain_steps=15000)
    with pytest.raises(ValueError, match="holds a pre-training of 3000 steps and this run asks 15000"):
        training.pretrain_variant("edmem", tmp_path / "corpus", tmp_path, settings, seed=0)
