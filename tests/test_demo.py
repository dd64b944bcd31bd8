"""`edmem demo` runs the whole path offline, leaves a loadable model, and answers its questions: in a tiny seeded
setting, the constrained modes generate entity names of the memory where free decoding does not."""

from __future__ import annotations

import collections
import json
import logging
import re

import pytest
import torch
from transformers import AutoModelForSeq2SeqLM

import edmem_hf  # noqa: F401
from edmem_hf.cli import main
from edmem_hf.tasks import exact_match
from edmem_hf.toy_world import generate_toy_world


def _answers_by_mode(printed: str) -> dict[str, dict[str, list[tuple[str, str, str, list[str]]]]]:
    """(question, gold, generated, the entity each generated mention was linked to) per question of each set
    (training, held-out), for each decoding mode, as printed."""
    answers = {}
    for mode, body in re.findall(r"--- (\w+): exact match[^\n]*\n(.*?)(?=\n--- |\n\nThe held-out)", printed, re.S):
        questions = {"training": [], "held-out": []}
        for name, question, block in re.findall(r"\[([\w-]+)\] Q: (.*?)\n(.*?)(?=\n\[|\Z)", body, re.S):
            gold, generated = re.search(r"gold: (.*?)   generated: (.*)", block).groups()
            linked = re.findall(r"mention -> (.*?); candidates", block)
            questions[name].append((question, gold, generated, linked))
        answers[mode] = questions
    return answers


def test_demo_end_to_end_with_tiny_settings(tmp_path, capsys, caplog):
    out = tmp_path / "demo"
    options = {"num_entities": 24, "pretrain_steps": 10, "finetune_epochs": 40, "d_model": 64, "num_proc": 1}
    argv = ["demo", "--out", str(out), "--show_questions", "1000"]
    code = main(argv + [f"--{key}={value}" for key, value in options.items()])
    assert code == 0
    captured = capsys.readouterr()
    printed = captured.out
    assert "Removed shared tensor" not in captured.err + caplog.text
    summary = json.loads((out / "demo_summary.json").read_text())
    model = AutoModelForSeq2SeqLM.from_pretrained(out / "model")
    assert len(model.entity_vocab) == model.config.entity_vocab_size == summary["entities"]
    assert (out / "model" / "tokenizer.json").is_file()
    assert (out / "pretrain" / "checkpoints").is_dir()
    assert torch.isfinite(next(model.parameters())).all()

    # It says up front how long it takes, and shows progress (lines: pytest's stderr is not a terminal).
    assert printed.startswith("edmem demo: about ") and "on 2 idle CPU cores" in printed.splitlines()[0]
    for stage, steps in (("pretrain", 10), ("fine-tune", summary["finetune_steps"])):
        assert f"{stage}: {steps} steps to go (from step 0 of {steps})" in captured.err
        assert re.search(
            rf"^{stage}: step {steps}/{steps} \(100%\), loss \d+\.\d+, \d+:\d\d elapsed$", captured.err, re.M
        )
    assert "\r" not in captured.err and "{'loss': '" not in printed + captured.err  # no bar; numbers as numbers
    assert "Setting accelerator" not in printed + captured.err  # (test_progress.py checks it in a fresh process)

    # what each figure is measured on is printed beside it
    validation = summary["validation_passages"]
    assert validation == round(0.1 * summary["passages"]) == 2
    assert re.search(
        rf"pre-training validation, on the {validation} passages held out of pre-training \(\d+ masked tokens", printed
    )
    assert "held out), " in printed and " steps, training loss" in printed
    answers = _answers_by_mode(printed)
    assert set(answers) == set(summary["exact_match"]["training"]) == {"free", "static", "dynamic"}
    assert summary["questions"] == {"training": 18, "held-out": 4}  # every 5th of the world's 22 questions held out
    world_questions = {pair.question for pair in generate_toy_world(num_entities=24, seed=0).qa_pairs}
    names = set(model.entity_vocab.names)
    for mode, sets in answers.items():
        for name, questions in sets.items():
            assert len(questions) == summary["questions"][name]  # every question printed, as plain text
            assert {question for question, *_ in questions} <= world_questions
            # The summary's exact match (percent) is that of the printed answers, and the printed line says on what.
            hits = sum(exact_match(generated, [gold]) for _, gold, generated, _ in questions)
            assert summary["exact_match"][name][mode] == round(100 * hits / len(questions), 2)
            share = f"{100 * hits / len(questions):.1f}% on the {len(questions)} {name} questions"
            assert re.search(rf"--- {mode}: exact match .*{re.escape(share)}", printed)
    assert "The held-out questions were not fine-tuned on" in printed
    assert "<s>" not in printed and "<E_s>" not in printed
    for mode in ("static", "dynamic"):
        for _, _, generated, linked in answers[mode]["training"] + answers[mode]["held-out"]:
            # Constrained decoding: every generated mention spells an entity name of the memory, and is linked.
            assert linked and all(entity in names and entity in generated for entity in linked), generated
    # Static against dynamic: the printed verdict is the printed answers'.
    static, dynamic = (
        [generated for _, _, generated, _ in answers[mode]["training"] + answers[mode]["held-out"]]
        for mode in ("static", "dynamic")
    )
    differ = sum(a != b for a, b in zip(static, dynamic))
    if differ:
        assert f"Static and dynamic decoding answer {differ} of the 22 questions differently:" in printed
    else:
        assert (
            "Static and dynamic decoding give the same answer to all 22 questions: every answer is one entity"
            in printed
        )
    # At this budget the model has learned which entities answer, not yet to spell them: free decoding closes no
    # mention and matches nothing, while the constraint turns its entity choice into names. Measured with this
    # seed: free 0/22, static and dynamic 4/22, the share of the most common gold answer (the floor asserted).
    golds = collections.Counter(gold for _, gold, _, _ in answers["static"]["training"])
    majority_share = 100 * golds.most_common(1)[0][1] / len(answers["static"]["training"])
    training = summary["exact_match"]["training"]
    for mode in ("static", "dynamic"):
        assert training[mode] >= round(majority_share, 2) > training["free"]

    # The last lines: where the model is, two lines of Python that load it, what to read next.
    last = printed.rstrip().splitlines()
    assert last[-1].startswith("Read next: docs/quickstart.md")
    assert f"The model, its tokenizer and its entity vocabulary are in {out / 'model'}. Load them with:" in last[-6]
    snippet = [line.strip() for line in last[-4:-2]]
    namespace: dict = {}
    exec("\n".join(snippet), namespace)  # noqa: S102 (the printed snippet, run as a user would paste it)
    assert type(namespace["model"]).__name__ == "EDMemForConditionalGeneration"
    assert (
        len(namespace["model"].entity_vocab) == summary["entities"]
        and namespace["tokenizer"].convert_tokens_to_ids("<E_s>") == 5
    )


def test_only_the_tied_weight_notice_is_silenced(caplog):
    """Accelerate's "Removed shared tensor" notice on saving tied weights is dropped; its other warnings are not."""
    from edmem_hf.demo import quiet_tied_weight_saving

    accelerate_logger = logging.getLogger("accelerate.utils.other")
    with caplog.at_level("WARNING", logger="accelerate.utils.other"), quiet_tied_weight_saving():
        accelerate_logger.warning("[RANK 0] Removed shared tensor {'lm_head.weight'} while saving. This should be OK")
        accelerate_logger.warning("a real warning")
    assert "a real warning" in caplog.text and "Removed shared tensor" not in caplog.text
    with caplog.at_level("WARNING", logger="accelerate.utils.other"):
        accelerate_logger.warning("Removed shared tensor {'x'} while saving")
    assert "Removed shared tensor" in caplog.text  # only while inside


def test_demo_help_describes_every_option(capsys):
    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "generate a toy world, build its corpus, pre-train and fine-tune" in help_text
    for option, described in (
        ("--d-model D_MODEL", "Hidden width of the tiny model."),
        ("--pretrain-steps PRETRAIN_STEPS", "Pre-training optimizer steps (batch 16)."),
        ("--held-out-every HELD_OUT_EVERY", "Every N-th question is held out of fine-tuning and scored apart."),
    ):
        assert f"{option} {described}" in help_text  # every option: tests/test_cli_help.py
