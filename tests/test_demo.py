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


def _answers_by_mode(printed: str) -> dict[str, dict[str, list[tuple[str, str, list[str]]]]]:
    """(gold, generated, the entity each generated mention was linked to) per question of each set (training,
    held-out), for each decoding mode; and the exact match printed for each."""
    answers = {}
    for mode, body in re.findall(r"--- (\w+): exact match[^\n]*\n(.*?)(?=\n--- |\n\nThe held-out)", printed, re.S):
        questions = {"training": [], "held-out": []}
        for name, block in re.findall(r"\[([\w-]+)\] Q: (.*?)(?=\n\[|\Z)", body, re.S):
            gold, generated = re.search(r"gold: (.*?)   generated: (.*)", block).groups()
            questions[name].append((gold, generated, re.findall(r"mention -> (.*?); candidates", block)))
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

    # what each figure is measured on is printed beside it
    assert re.search(r"pre-training validation \(1 passages held out of pre-training; \d+ masked tokens", printed)
    assert "held out), training loss" in printed
    answers = _answers_by_mode(printed)
    assert set(answers) == set(summary["exact_match"]["training"]) == {"free", "static", "dynamic"}
    assert summary["questions"] == {"training": 18, "held-out": 4}  # every 5th of the world's 22 questions held out
    names = set(model.entity_vocab.names)
    for mode, sets in answers.items():
        for name, questions in sets.items():
            assert len(questions) == summary["questions"][name]  # every question printed
            # The summary's exact match is that of the printed answers, and the printed line says on what.
            hits = sum(exact_match(generated, [gold]) for gold, generated, _ in questions)
            assert summary["exact_match"][name][mode] == hits / len(questions)
            share = f"{100 * hits / len(questions):.1f}% on the {len(questions)} {name} questions"
            assert re.search(rf"--- {mode}: exact match .*{re.escape(share)}", printed)
    assert "The held-out questions were not fine-tuned on" in printed
    assert "pretrain:" not in captured.err  # no progress bar in a log (pytest's stderr is not a terminal)
    for mode in ("static", "dynamic"):
        for _, generated, linked in answers[mode]["training"] + answers[mode]["held-out"]:
            # Constrained decoding: every generated mention spells an entity name of the memory, and is linked.
            mentions = re.findall(r"<E_s>(.*?)<E_e>", generated)
            assert mentions and all(mention.strip() in names for mention in mentions), generated
            assert [mention.strip() for mention in mentions] == linked
    # At this budget the model has learned which entities answer, not yet to spell them: free decoding closes no
    # mention and matches nothing, while the constraint turns its entity choice into names. Measured with this
    # seed: free 0/22, static and dynamic 4/22, the share of the most common gold answer (the floor asserted).
    golds = collections.Counter(gold for gold, _, _ in answers["static"]["training"])
    majority_share = golds.most_common(1)[0][1] / len(answers["static"]["training"])
    training = summary["exact_match"]["training"]
    for mode in ("static", "dynamic"):
        assert training[mode] >= majority_share > training["free"]


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
