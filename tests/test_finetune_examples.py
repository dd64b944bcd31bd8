"""`edmem finetune` (and the examples over it): 2-step Seq2SeqTrainer runs on a tiny model, generating in each
decoding mode, with the task's metrics and a predictions file that `edmem evaluate` scores alike.

The tiny model is first trained (a plain loop, a few seconds) until it answers the questions and writes the outputs
of the files, so that every check below reads real, varied predictions: an empty or constant output fails them."""

from __future__ import annotations

import json
import logging
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from edmem_hf import EntityVocab
from edmem_hf.cli import main as edmem
from edmem_hf.finetuning import run as finetune
from edmem_hf.tasks import EDMemSeq2SeqCollator, encode_generation_record, encode_qa_record, read_generation, read_qa
from tiny_models import make_word_tokenizer, make_words, tiny_model

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

WORDS = make_words(400)
ENTITIES = [" ".join(WORDS[i : i + 2]) for i in range(0, 40, 2)]  # 20 two-word names


def _qa_record(i: int) -> dict:
    subject, answer = ENTITIES[i % 20], ENTITIES[(i * 7 + 3) % 20]
    question = f"{WORDS[100 + i % 5]} {subject} {WORDS[120 + i % 3]}"
    offset = len(WORDS[100 + i % 5]) + 1
    record = {"id": f"q{i}", "question": question, "answer": [answer if i % 4 else "1987"]}
    record |= {"link_offset": [offset], "link_length": [len(subject)], "link_target": ["0"], "entity_name": [subject]}
    if i % 4:
        record["answer_entity"] = [[0, answer]]
    return record


def _generation_record(i: int) -> dict:
    subject = ENTITIES[i % 20]
    record = {"id": str(i), "input": f"{subject} {WORDS[200 + i % 7]}", "output": [f"{WORDS[300 + i % 9]} {subject}"]}
    record |= {"link_offset": [0], "link_length": [len(subject)], "link_target": ["0"], "entity_name": [subject]}
    return record | {"output_entity_name": [[subject]]}


VOCABULARY = ENTITIES + [f"Other {i}" for i in range(20)]
HIDDEN = set(range(0, 20, 2))  # the memory-size study's mask below hides every other name


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: one intra-op thread is faster on a shared machine
    yield
    torch.set_num_threads(threads)


def _train_until_it_answers(model, tokenizer, root, steps: int = 100) -> None:
    """Fits the QA and generation files together (40 rows, one batch) so that generation gives their outputs."""
    qa = read_qa(root / "qa.jsonl", model.entity_vocab)
    generation = read_generation(root / "generation.jsonl", model.entity_vocab)
    features = [encode_qa_record(row, tokenizer) for row in qa]
    features += [encode_generation_record(row, tokenizer) for row in generation]
    batch = EDMemSeq2SeqCollator(tokenizer.pad_token_id)(features)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(steps):
        model(**batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("finetune")
    tokenizer = make_word_tokenizer(bart_template=True)
    start, end = tokenizer.convert_tokens_to_ids(["<E_s>", "<E_e>"])
    for name, make, count in (("qa", _qa_record, 24), ("generation", _generation_record, 16)):
        (root / f"{name}.jsonl").write_text("".join(json.dumps(make(i)) + "\n" for i in range(count)))
    # the released split's shape (sling_invocab-*.json): here one question in four's answer is an entity, not the
    # 18 whose answer is an entity of the model's vocabulary, so that the two splits cannot pass for each other
    links = {f"q{i}": {ENTITIES[(i * 7 + 3) % 20]: ["Q1", "x", "11"]} if i % 4 == 1 else None for i in range(24)}
    (root / "answer_links.json").write_text(json.dumps(links))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    model = tiny_model(vocab_size=len(tokenizer), entity_start_token_id=start, entity_end_token_id=end, dropout=0.0)
    model.entity_vocab = EntityVocab(VOCABULARY)
    _train_until_it_answers(model, tokenizer, root)
    torch.set_num_threads(threads)
    model.save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    hidden = torch.zeros(len(VOCABULARY), dtype=torch.long)  # the authors' format: 1 = hidden
    hidden[sorted(HIDDEN)] = 1
    torch.save(hidden, root / "memory_mask.pt")
    return root


def _arguments(folders, out, data, extra=()):
    return [
        "--model_name_or_path", str(folders / "model"), "--output_dir", str(out),
        "--train_file", str(data), "--validation_file", str(data), "--test_file", str(data),
        "--do_train", "--do_eval", "--do_predict", "--max_steps", "2", "--per_device_train_batch_size", "8",
        "--per_device_eval_batch_size", "8", "--eval_strategy", "no", "--save_strategy", "no",
        "--load_best_model_at_end", "false", "--report_to", "none", "--use_cpu", "--max_target_length", "12",
        "--disable_tqdm", "true", *extra,
    ]  # fmt: skip


def _spans(text: str) -> list[str]:
    return [part.split("<E_e>")[0].strip() for part in text.split("<E_s>")[1:]]


def _assert_real(predictions: dict[str, str], distinct: int) -> None:
    """Non-empty and varied first: an empty or constant output would pass the checks that follow."""
    assert all(text.strip() for text in predictions.values()), predictions
    assert len(set(predictions.values())) >= distinct, predictions


@pytest.mark.parametrize("mode", ["free", "static", "dynamic"])
def test_qa_fine_tuning_in_each_decoding_mode(folders, tmp_path, mode, capsys):
    data, links = folders / "qa.jsonl", folders / "answer_links.json"
    metrics = finetune(
        argv=_arguments(folders, tmp_path, data, ["--entity_decoding", mode, "--test_answer_links", str(links)])
    )
    assert metrics["test_count"] == 24 and metrics["test_count_in_vocab_answer"] == 18  # the model's split
    assert json.loads((tmp_path / "eval_results.json").read_text())["eval_count"] == 24
    predictions = json.loads((tmp_path / f"{mode}_predictions.json").read_text())
    assert sorted(predictions) == sorted(f"q{i}" for i in range(24))
    _assert_real(predictions, distinct=10)
    # the trained model answers: the literal "1987" and the entity answers, in each mode
    assert metrics["test_exact_match_other_answer"] == 100.0 and metrics["test_exact_match_in_vocab_answer"] >= 80.0
    spans = [span for text in predictions.values() for span in _spans(text)]
    assert len(spans) >= 15 and all(span in ENTITIES for span in spans)
    capsys.readouterr()
    command = [
        "evaluate",
        "--task",
        "nq",
        "--data",
        str(data),
        "--predictions",
        str(tmp_path / f"{mode}_predictions.json"),
    ]
    assert edmem([*command, "--answer-links", str(links), "--json"]) == 0
    scored = json.loads(capsys.readouterr().out)
    # one name, one figure: the fine-tuning report's entity split is edmem evaluate's, on the same links
    assert scored["count_entity"] == metrics["test_count_entity"] == 6 and scored["count_non_entity"] == 18
    for name in ("exact_match", "exact_match_entity", "exact_match_non_entity"):
        assert scored[name] == pytest.approx(metrics[f"test_{name}"]), name
    assert "exact_match_in_vocab_answer" not in scored  # the model's split is the fine-tuning report's own


@pytest.mark.parametrize("mode", ["free", "static", "dynamic"])
def test_the_entity_mask_file_hides_names_from_constrained_decoding(folders, tmp_path, mode):
    """The memory-size study's mask (the authors' format: 1 = hidden): static and dynamic decoding spell only the
    visible names; free decoding, unconstrained, still spells hidden ones (so the check can tell the two apart)."""
    data = folders / "qa.jsonl"
    extra = ["--entity_decoding", mode, "--entity_mask_file", str(folders / "memory_mask.pt")]
    finetune(argv=[a for a in _arguments(folders, tmp_path, data, extra) if a not in ("--do_train", "--do_eval")])
    predictions = json.loads((tmp_path / f"{mode}_predictions.json").read_text())
    _assert_real(predictions, distinct=5)
    spans = [span for text in predictions.values() for span in _spans(text)]
    hidden = {ENTITIES[i] for i in HIDDEN}
    assert len(spans) >= 15 and all(span in ENTITIES for span in spans)
    if mode == "free":
        assert set(spans) & hidden
    else:
        assert not set(spans) & hidden and len(set(spans)) >= 3


def test_the_static_linker_trains_on_entity_answers_only_and_drives_static_decoding(folders, tmp_path, caplog):
    data = folders / "qa.jsonl"
    linker = tmp_path / "linker"
    with caplog.at_level(logging.INFO, logger="transformers.trainer"):
        finetune(argv=["--objective", "static_linking", *_arguments(folders, linker, data)])
    assert "Num examples = 18" in caplog.text  # the 18 questions whose answer is an entity
    assert math.isfinite(json.loads((linker / "eval_results.json").read_text())["eval_loss"])
    assert not (linker / "free_predictions.json").exists()  # the linker does not generate
    # A linker that disagrees with the reader: its entity rows rolled by one, it links other entities.
    model = AutoModelForSeq2SeqLM.from_pretrained(linker).eval()
    with torch.no_grad():
        model.model.entity_embeddings.weight.copy_(model.model.entity_embeddings.weight.roll(1, 0))
    model.save_pretrained(linker)
    tokenizer = AutoTokenizer.from_pretrained(folders / "model")
    rows = read_qa(data, model.entity_vocab)
    linked = {}
    for row in rows:
        input_ids = torch.tensor([encode_qa_record(row, tokenizer)["input_ids"]])
        top, _ = model.link_entities(input_ids, top_k=1, decoder_input="question")
        linked[row["id"]] = model.entity_vocab.name_of(int(top[0, 0]))
    reader = tmp_path / "qa"
    extra = ["--entity_decoding", "static", "--entity_candidates", "1", "--static_linker", str(linker)]
    metrics = finetune(argv=_arguments(folders, reader, data, extra))
    predictions = json.loads((reader / "static_predictions.json").read_text())
    assert metrics["test_count"] == 24
    _assert_real(predictions, distinct=5)
    with_mention = {key: _spans(text) for key, text in predictions.items() if "<E_s>" in text}
    assert len(with_mention) >= 12
    assert all(spans == [linked[key]] for key, spans in with_mention.items()), (with_mention, linked)
    gold = {row["id"]: model.entity_vocab.name_of(row["answer_entity"]) for row in rows if row["answer_entity"] >= 0}
    assert sum(linked[key] != gold.get(key) for key in with_mention) >= len(with_mention) // 2


def test_generation_fine_tuning(folders, tmp_path):
    data = folders / "generation.jsonl"
    metrics = finetune(argv=["--task", "wow", *_arguments(folders, tmp_path, data, ["--entity_decoding", "dynamic"])])
    predictions = json.loads((tmp_path / "dynamic_predictions.json").read_text())
    assert sorted(predictions, key=int) == [str(i) for i in range(16)]
    _assert_real(predictions, distinct=12)
    # the trained model writes the outputs: high overlap, and the subject named in each
    for key in ("test_rouge1", "test_rouge2", "test_rougeL", "test_f1", "test_entity_coverage"):
        assert 80 <= metrics[key] <= 100, (key, metrics)
    records = [json.loads(line) for line in data.read_text().splitlines()]
    assert sum(text.replace("<E_s>", "").replace("<E_e>", "").split() == record["output"][0].split()
               for record, text in zip(records, (predictions[str(i)] for i in range(16)))) >= 12  # fmt: skip


def test_qa_fine_tuning_runs_unchanged_under_torchrun(folders, tmp_path):
    """Two CPU processes (DDP over gloo): a training step, then predictions gathered in example order, the same as
    one process's (the distributed sampler pads 24 examples to 32)."""
    data = folders / "qa.jsonl"
    trained = _arguments(folders, tmp_path / "trained", data, ["--entity_decoding", "dynamic"])
    predict_only = [a for a in _arguments(folders, tmp_path / "two", data) if a not in ("--do_train", "--do_eval")]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    logs = []
    for arguments in (trained, predict_only):
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "-m", "edmem_hf.cli"]
        command += ["finetune", *arguments]
        result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
        logs.append(result.stdout + result.stderr)
    assert "Total train batch size (w. parallel, distributed & accumulation) = 16" in logs[0]  # 2 x 8
    assert json.loads((tmp_path / "trained" / "test_results.json").read_text())["test_count"] == 24
    finetune(argv=[a for a in _arguments(folders, tmp_path / "one", data) if a not in ("--do_train", "--do_eval")])
    two = json.loads((tmp_path / "two" / "free_predictions.json").read_text())
    one = json.loads((tmp_path / "one" / "free_predictions.json").read_text())
    _assert_real(one, distinct=10)
    assert list(two) == list(one) == [f"q{i}" for i in range(24)] and two == one
    # each question's own answer (an order mixed up across processes would pair them wrongly)
    assert json.loads((tmp_path / "one" / "test_results.json").read_text())["test_exact_match"] >= 80.0


def _train_briefly(folders, out, data, *extra):
    return [
        "--model_name_or_path", str(folders / "model"), "--output_dir", str(out), "--train_file", str(data),
        "--do_train", "--max_steps", "1", "--per_device_train_batch_size", "4", "--save_strategy", "no",
        "--report_to", "none", "--use_cpu", "--disable_tqdm", "true", *extra,
    ]  # fmt: skip


def test_a_line_that_is_not_a_json_record_is_a_bad_record(folders, tmp_path, capfd, caplog):
    """By default one line naming the file and the line (no traceback); `--bad_records skip` skips it, counted."""
    lines = (folders / "qa.jsonl").read_text().splitlines()
    lines[3] = lines[3][:-9]  # a line cut short, as by an interrupted copy
    data = tmp_path / "train.jsonl"
    data.write_text("\n".join(lines) + "\n")
    argv = ["finetune", *_train_briefly(folders, tmp_path / "out", data)]
    capfd.readouterr()
    assert edmem(argv) == 1
    err = capfd.readouterr().err
    assert "Traceback" not in err and err.count("\n") <= 2, err
    assert f"edmem finetune: {data}, line 4: not JSON at column" in err and "--bad_records skip" in err
    with caplog.at_level(logging.INFO, logger="edmem_hf.task_files"):
        assert edmem([*argv, "--bad_records", "skip"]) == 0
    assert f"{data}: skipped: line 4: not JSON" in caplog.text
    assert "23 records read, skipped: 1 lines not a JSON record" in caplog.text
    (tmp_path / "list.jsonl").write_text('{"id": "1", "question": "q", "answer": ["a"]}\n[1, 2]\n')
    assert edmem(["finetune", *_train_briefly(folders, tmp_path / "out", tmp_path / "list.jsonl")]) == 1
    assert f"{tmp_path / 'list.jsonl'}, line 2: a JSON list, not an object" in capfd.readouterr().err


def test_the_training_log_counts_the_records_used(folders, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="edmem_hf.task_files")
    caplog.set_level(logging.INFO, logger="transformers.trainer")
    finetune(argv=_train_briefly(folders, tmp_path, folders / "qa.jsonl", "--max_train_samples", "8"))
    read = [record.getMessage() for record in caplog.records if record.name == "edmem_hf.task_files"]
    assert len(read) == 1 and "the first 8 of its 24 records read (limit 8)" in read[0]
    assert "8 linked mentions" in read[0] and "6 entity answers" in read[0]  # of the 8 (the file has 24 and 18)
    assert "Num examples = 8" in caplog.text


def test_the_examples_are_the_command(folders, tmp_path):
    sys.path.insert(0, str(EXAMPLES))
    try:
        import finetune_generation
        import finetune_qa
    finally:
        sys.path.remove(str(EXAMPLES))
    data = folders / "qa.jsonl"
    for runner, out in ((finetune_qa.main, "example"), (lambda argv: finetune(argv=argv), "command")):
        runner([a for a in _arguments(folders, tmp_path / out, data) if a not in ("--do_train", "--do_eval")])
    example, command = (
        json.loads((tmp_path / out / "free_predictions.json").read_text()) for out in ("example", "command")
    )
    _assert_real(command, distinct=10)
    assert example == command
    with pytest.raises(SystemExit, match="--task must name a generation task"):
        finetune_generation.main(_arguments(folders, tmp_path, data))


def test_validation_is_scored_with_its_answer_links_as_edmem_evaluate_scores_it(folders, tmp_path, capsys):
    """`--validation_answer_links` splits the validation figures into entity and non-entity answers, and they are
    `edmem evaluate`'s on the same predictions (issue 66: no test passed the option, and only the count was read)."""
    from edmem_hf.evaluation import score_task
    from edmem_hf.task_files import read_jsonl

    data, links = folders / "qa.jsonl", folders / "answer_links.json"
    extra = ["--validation_answer_links", str(links), "--test_answer_links", str(links)]
    metrics = finetune(argv=_arguments(folders, tmp_path, data, extra))
    validation = json.loads((tmp_path / "eval_results.json").read_text())
    assert validation["eval_count_entity"] + validation["eval_count_non_entity"] == validation["eval_count"] == 24
    assert 0 < validation["eval_count_entity"] < 24
    predictions = json.loads((tmp_path / "free_predictions.json").read_text())
    _assert_real(predictions, distinct=10)
    evaluated = score_task("wq", list(read_jsonl(data)), predictions, json.loads(links.read_text()))
    for name in ("exact_match", "exact_match_entity", "exact_match_non_entity"):
        assert validation[f"eval_{name}"] == metrics[f"test_{name}"] == evaluated[name], name
    capsys.readouterr()


def test_a_model_with_the_name_guided_read_fine_tunes_and_predicts(folders, tmp_path):
    """`edmem finetune` builds the names' lookup of a model saved with `name_guided_read` (issue 64): its training
    and generation read candidates by name, where without the lookup the model refuses to run."""
    guided = tmp_path / "guided"
    model = AutoModelForSeq2SeqLM.from_pretrained(folders / "model", name_guided_read=True)
    model.save_pretrained(guided)
    AutoTokenizer.from_pretrained(folders / "model").save_pretrained(guided)
    argv = _arguments(folders, tmp_path / "out", folders / "qa.jsonl")
    argv[argv.index(str(folders / "model"))] = str(guided)
    metrics = finetune(argv=argv)
    assert metrics["test_count"] == 24
    _assert_real(json.loads((tmp_path / "out" / "free_predictions.json").read_text()), distinct=5)


def test_the_logs_hold_the_metrics_as_numbers(folders, tmp_path, capsys):
    """What `edmem finetune` prints of its evaluations are numbers (the Trainer's own print wrote
    `'eval_exact_match': '41.67'`: issue 66), as are the logs of trainer_state.json; progress shows as lines."""
    data = folders / "qa.jsonl"
    extra = ["--logging_steps", "1", "--eval_strategy", "steps", "--eval_steps", "2", "--do_predict", "false"]
    finetune(argv=_arguments(folders, tmp_path, data, extra))
    captured = capsys.readouterr()
    shown = captured.out + captured.err
    assert not re.search(r"'\w+': '", shown), shown  # no value printed as a string
    assert "fine-tune: step 2/2 (100%), loss " in captured.err and "fine-tune evaluation: step " in captured.err
    final = json.loads((tmp_path / "eval_results.json").read_text())
    lines = re.findall(r"^fine-tune: step 2: (eval_.*)$", captured.err, re.M)
    assert len(lines) == 2, captured.err  # during training (--eval_steps 2), then after it
    for line in lines:
        printed = {key: float(value) for key, value in (pair.split(" ") for pair in line.split(", "))}
        assert printed["eval_count"] == 24 and printed["eval_exact_match"] == pytest.approx(
            final["eval_exact_match"], rel=1e-3
        )
    history = json.loads((tmp_path / "trainer_state.json").read_text())["log_history"]
    assert [entry["step"] for entry in history if "loss" in entry] == [1, 2]
    assert sum("eval_exact_match" in entry for entry in history) == 1
    assert all(isinstance(value, (int, float)) for entry in history for value in entry.values()), history
