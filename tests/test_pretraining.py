"""The Accelerate pre-training loop: loss falls, exact resume after a stop and a half-written checkpoint, the CLI.
Runs killed with SIGKILL and 2-process (gloo) runs are in test_crash_resume.py."""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import subprocess
import sys
from dataclasses import asdict

import pytest
import torch
from transformers import TrainerState

from edmem_hf.pretraining import PretrainingArguments, cli_main, list_checkpoints, pretrain, pretraining_options

sys.path.insert(0, os.path.dirname(__file__))
from test_collator import make_corpus  # noqa: E402

TINY = dict(
    d_model=64,
    encoder_lower_layers=1,
    encoder_upper_layers=1,
    decoder_lower_layers=1,
    decoder_upper_layers=1,
    encoder_ffn_dim=128,
    decoder_ffn_dim=128,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    entity_embed_dim=32,
    max_position_embeddings=160,
)


@pytest.fixture(autouse=True)
def _one_thread():
    # Tiny models: one intra-op thread is faster, and much faster on a shared 2-core machine.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("corpus"), n_train=64, n_validation=16)


def _args(corpus, out, **kw):
    base = dict(
        max_eval_samples=8,
        output_dir=str(out),
        corpus_dir=corpus,
        per_device_train_batch_size=8,
        per_device_eval_batch_size=8,
        learning_rate=1e-3,
        logging_steps=1,
        eval_steps=0,
        save_steps=1000,
        disable_tqdm=True,
        report_to="none",
        **TINY,
    )
    base.update(kw)
    return PretrainingArguments(**base)


def _options(corpus, out, **kw):
    """`pretrain`'s arguments (`args`, `writer`, `mixing`) from `_args`' settings and `kw`, by name."""
    from dataclasses import asdict

    from edmem_hf.pretraining import pretraining_options

    return pretraining_options(**{**asdict(_args(corpus, out)), **kw})


def _log(out):
    with open(os.path.join(out, "log.jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def _weights(out):
    from safetensors.torch import load_file

    return load_file(os.path.join(out, "model.safetensors"))


def test_loss_falls_and_model_loads(corpus, tmp_path):
    out = tmp_path / "run"
    result = pretrain(_args(corpus, out, max_steps=16, eval_steps=8))
    assert result["completed"] and result["global_step"] == 16
    log = _log(out)
    train = [r for r in log if r["type"] == "train"]
    assert len(train) == 16
    first = sum(r["loss"] for r in train[:4]) / 4
    last = sum(r["loss"] for r in train[-4:]) / 4
    assert last < first - 0.5, (first, last)
    assert all(k in train[0] for k in ("loss", "lm_loss", "entity_loss", "learning_rate", "tokens_per_s"))
    # Warm-up (10%) then linear decay to 0.
    lrs = [r["learning_rate"] for r in train]
    assert max(lrs) == pytest.approx(1e-3, rel=1e-6) and lrs[-1] == 0.0
    evals = [r for r in log if r["type"] == "eval"]
    assert [r["step"] for r in evals] == [8, 16]
    # A fixed evaluation masking seed: the same masked tokens and mentions at every evaluation.
    assert evals[0]["eval_masked_tokens"] == evals[1]["eval_masked_tokens"] > 0
    assert evals[0]["eval_masked_mentions"] == evals[1]["eval_masked_mentions"] > 0
    assert evals[1]["eval_ppl"] < evals[0]["eval_ppl"]
    assert 0.0 <= evals[1]["eval_acc"] <= 1.0
    # trainer_state.json in the Trainer's format, its log history the same entries as log.jsonl.
    state = TrainerState.load_from_json(str(out / "trainer_state.json"))
    assert (state.global_step, state.max_steps, state.epoch) == (16, 16, 2.0)
    assert state.log_history == [
        {k: v for k, v in r.items() if k != "type"} for r in log if r["type"] in ("train", "eval")
    ]
    assert state.best_metric == evals[1]["eval_ppl"] and state.best_global_step == 16

    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    import edmem_hf  # noqa: F401  (registers the auto classes)

    model = AutoModelForSeq2SeqLM.from_pretrained(str(out))
    assert type(model).__name__ == "EDMemForConditionalGeneration"
    assert model.entity_vocab is not None and len(model.entity_vocab) == model.config.entity_vocab_size
    tok = AutoTokenizer.from_pretrained(str(out))
    assert tok.convert_tokens_to_ids("<E_s>") == model.config.entity_start_token_id
    saved = _weights(out)
    loaded = model.state_dict()
    assert all(torch.equal(saved[k], loaded[k]) for k in saved)


@pytest.mark.parametrize("variant", ["encdec", "encmem"])
def test_the_ablation_variants_pretrain(corpus, tmp_path, variant):
    """The paper's EncDec (no memory) and EncMem (encoder + memory, masked LM on the encoder) train with the same
    loop; EncMem's entity-linking accuracy is read on the input's mentions."""
    from edmem_hf import EDMemForConditionalGeneration, EDMemForEntityLinking

    out = tmp_path / variant
    result = pretrain(_args(corpus, out, max_steps=12, eval_steps=6, variant=variant))
    assert result["completed"]
    train = [r for r in _log(out) if r["type"] == "train"]
    assert sum(r["loss"] for r in train[-3:]) < sum(r["loss"] for r in train[:3]) - 0.3
    evals = [r for r in _log(out) if r["type"] == "eval"]
    model_class = EDMemForEntityLinking if variant == "encmem" else EDMemForConditionalGeneration
    model = model_class.from_pretrained(str(out))
    assert model.config.variant == variant
    if variant == "encmem":
        assert 0.0 <= evals[-1]["eval_acc"] <= 1.0 and 0.0 <= evals[-1]["eval_encoder_acc"] <= 1.0
        assert train[-1]["lm_loss"] > 0 and train[-1]["entity_loss"] > 0
    else:  # no memory, no entity-linking head: nothing to score
        assert math.isnan(evals[-1]["eval_acc"]) and not train[-1].get("entity_loss")


def test_kill_and_resume_is_exact(corpus, tmp_path, caplog):
    # 64 passages / batch 8 = 8 batches per epoch; 2 accumulation steps: 4 optimizer steps per epoch. The step-3
    # checkpoint is in the middle of epoch 0 (6 micro-batches to skip) and the 6 steps cross an epoch boundary.
    # Dropout is on: its RNG must be restored too.
    common = dict(max_steps=6, gradient_accumulation_steps=2, save_steps=3, save_total_limit=2, dropout=0.1)
    full = tmp_path / "full"
    pretrain(_args(corpus, full, **common))
    killed = tmp_path / "killed"
    first = pretrain(_args(corpus, killed, max_steps_this_run=5, **common))
    assert not first["completed"] and first["global_step"] == 5
    assert [os.path.basename(p) for p in list_checkpoints(str(killed))] == ["checkpoint_0"]
    assert not os.path.exists(killed / "model.safetensors")
    # A crash while writing the next checkpoint leaves a directory without trainer_state.json.
    shutil.copytree(killed / "checkpoints" / "checkpoint_0", killed / "checkpoints" / "checkpoint_1")
    os.remove(killed / "checkpoints" / "checkpoint_1" / "trainer_state.json")
    with caplog.at_level(logging.WARNING, logger="edmem_hf.pretraining"):
        second = pretrain(_args(corpus, killed, **common))  # --resume auto
    assert "incomplete checkpoint" in caplog.text and "checkpoint_1" in caplog.text
    assert "not the one a fresh run" not in caplog.text
    assert second["completed"] and second["global_step"] == 6
    starts = [r for r in _log(killed) if r["type"] == "start"]
    assert starts[-1]["resumed_from"].endswith("checkpoint_0") and starts[-1]["step"] == 3
    a, b = _weights(full), _weights(killed)
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    # The same losses after the resume point as in the uninterrupted run, and the same log history.
    full_losses = {r["step"]: r["loss"] for r in _log(full) if r["type"] == "train"}
    resumed = [r for r in _log(killed) if r["type"] == "train"][-3:]
    assert [r["step"] for r in resumed] == [4, 5, 6]
    assert all(r["loss"] == full_losses[r["step"]] for r in resumed)
    full_state, killed_state = (TrainerState.load_from_json(str(d / "trainer_state.json")) for d in (full, killed))
    history = [
        [(r["step"], r["epoch"], r["loss"]) for r in s.log_history if "loss" in r] for s in (full_state, killed_state)
    ]
    assert history[0] == history[1]
    assert [epoch for _, epoch, _ in history[0]] == [0.25, 0.5, 0.75, 1.0, 1.25, 1.5]
    # Accelerate's naming and rotation: checkpoint_<i> for the i-th save, the last K kept; the incomplete one
    # was deleted and its number reused.
    assert [os.path.basename(p) for p in list_checkpoints(str(killed))] == ["checkpoint_0", "checkpoint_1"]
    checkpoint = TrainerState.load_from_json(str(killed / "checkpoints" / "checkpoint_1" / "trainer_state.json"))
    assert (checkpoint.global_step, checkpoint.epoch, checkpoint.max_steps) == (6, 1.5, 6)
    # The same folder asked for more steps continues the run, and says that it is not a fresh run of that many.
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="edmem_hf.pretraining"):
        longer = pretrain(_args(corpus, killed, **{**common, "max_steps": 8}))
    assert longer["global_step"] == 8
    assert "resuming at step 6 a run of 6 steps as one of 8" in caplog.text
    rotated = pretrain(_args(corpus, tmp_path / "rotated", max_steps=4, save_steps=1, save_total_limit=2))
    assert rotated["global_step"] == 4
    assert [os.path.basename(p) for p in list_checkpoints(str(tmp_path / "rotated"))] == [
        "checkpoint_2",
        "checkpoint_3",
    ]


def test_dataloader_workers_do_not_change_the_run(corpus, tmp_path):
    # Masking is seeded per passage, so collating in worker processes gives the very same run.
    pretrain(_args(corpus, tmp_path / "w0", max_steps=3, dropout=0.1))
    pretrain(_args(corpus, tmp_path / "w2", max_steps=3, dropout=0.1, dataloader_num_workers=2))
    a, b = _weights(tmp_path / "w0"), _weights(tmp_path / "w2")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_resume_policy_errors(corpus, tmp_path):
    out = tmp_path / "run"
    pretrain(_args(corpus, out, max_steps=2, save_steps=1))
    with pytest.raises(ValueError, match="already has checkpoints"):
        pretrain(_args(corpus, out, max_steps=2, resume="no"))
    with pytest.raises(ValueError, match="not a complete checkpoint"):
        pretrain(_args(corpus, out, max_steps=2, resume=str(tmp_path / "nowhere")))
    # Already finished: resuming does no more steps.
    assert pretrain(_args(corpus, out, max_steps=2))["global_step"] == 2


def _argv(out, corpus, *extra):
    argv = ["--output_dir", str(out), "--corpus_dir", corpus, "--logging_steps", "1", "--disable_tqdm"]
    argv += ["--report_to", "none", "--per_device_train_batch_size", "4", *extra]
    for key, value in TINY.items():
        argv += [f"--{key}", str(value)]
    return argv


def test_cli(corpus, tmp_path, capsys):
    out = tmp_path / "cli"
    argv = _argv(out, corpus, "--max_steps", "2")
    assert cli_main(argv) == 0
    assert os.path.isfile(out / "model.safetensors") and os.path.isfile(out / "entity_vocab.json")
    assert cli_main(argv + ["--mixed_precision", "fp8"]) == 2
    assert "mixed_precision" in capsys.readouterr().out
    assert cli_main(["--output_dir", str(tmp_path / "x")]) == 2  # no corpus


def test_a_run_saves_its_arguments_and_runs_again_from_them(corpus, tmp_path, capsys):
    out = tmp_path / "saved"
    assert cli_main(_argv(out, corpus, "--max_steps", "2", "--learning_rate", "5e-4")) == 0
    saved = json.loads((out / "pretraining_args.json").read_text())
    assert saved["learning_rate"] == 5e-4 and saved["max_steps"] == 2 and saved["d_model"] == TINY["d_model"]
    options = pretraining_options(**saved)  # every field, as the three option objects hold them
    assert saved == {**asdict(options["args"]), **asdict(options["writer"]), **asdict(options["mixing"])}
    # Run again from the file with more steps: it resumes the same run (its checkpoint at step 2).
    saved["max_steps"], saved["save_steps"] = 3, 1
    again = tmp_path / "again.json"
    again.write_text(json.dumps(saved))
    assert cli_main([str(again)]) == 0
    starts = [record for record in _log(out) if record["type"] == "start"]
    assert [record["step"] for record in starts] == [0, 2] and starts[1]["max_steps"] == 3
    assert json.loads((out / "pretraining_args.json").read_text())["max_steps"] == 3  # the last start's
    assert cli_main([str(tmp_path / "missing.json")]) == 2
    assert "no such arguments file" in capsys.readouterr().out
    unknown = tmp_path / "unknown.json"
    unknown.write_text(json.dumps({**saved, "learning_rat": 1e-3}))
    assert cli_main([str(unknown)]) == 2
    assert "learning_rat" in capsys.readouterr().out  # the key no option has, named


def _run_cli(out, corpus, *extra, processes=1):
    """`edmem pretrain` in fresh processes (torchrun, gloo, for several), as a user runs it."""
    env = dict(os.environ, ACCELERATE_USE_CPU="true", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    # --standalone: a rendezvous on a free local port (other test runs may share the machine).
    launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes)]
    cmd = [sys.executable, *(launcher if processes > 1 else []), "-m", "edmem_hf.cli", "pretrain"]
    proc = subprocess.run(cmd + _argv(out, corpus, *extra), env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]


def test_bf16_mixed_precision(corpus, tmp_path):
    """bf16 autocast really runs (losses near, but not equal to, float32's), the optimizer steps, and the saved
    weights are the float32 parameters (Accelerate autocasts the forward pass; the parameters stay float32)."""
    # In its own process: Accelerate keeps one mixed-precision setting per process.
    out, reference = tmp_path / "bf16", tmp_path / "fp32"
    common = ("--max_steps", "2", "--save_steps", "1", "--warmup_ratio", "0", "--learning_rate", "1e-3")
    _run_cli(out, corpus, *common, "--mixed_precision", "bf16")
    pretrain(_args(corpus, reference, max_steps=2, save_steps=1, warmup_ratio=0.0, per_device_train_batch_size=4))
    assert _log(out)[0]["mixed_precision"] == "bf16"
    assert TrainerState.load_from_json(str(out / "trainer_state.json")).global_step == 2
    bf16_losses = [r["loss"] for r in _log(out) if r["type"] == "train"]
    fp32_losses = [r["loss"] for r in _log(reference) if r["type"] == "train"]
    assert len(bf16_losses) == 2 and all(torch.isfinite(torch.tensor(bf16_losses)))
    # The first step sees the same weights and batch: only the autocast rounding separates the two losses.
    assert bf16_losses[0] != fp32_losses[0]
    assert bf16_losses[0] == pytest.approx(fp32_losses[0], rel=0.02)
    final = _weights(out)
    assert {t.dtype for t in final.values() if t.is_floating_point()} == {torch.float32}
    from safetensors.torch import load_file

    after_step_1 = load_file(str(out / "checkpoints" / "checkpoint_0" / "model.safetensors"))
    changed = [k for k in after_step_1 if not torch.equal(after_step_1[k], final[k])]
    assert len(changed) > len(after_step_1) // 2  # the second (bf16) step updated the parameters


def test_bad_corpus(tmp_path):
    with pytest.raises(ValueError, match="not an EDMem corpus"):
        pretrain(PretrainingArguments(output_dir=str(tmp_path / "o"), corpus_dir=str(tmp_path), report_to="none"))


@pytest.mark.parametrize("decoder_target", ["passage", "masked_spans"])
def test_evaluate_counts_the_masked_tokens_and_mentions(corpus, decoder_target):
    """PPL is over the masked target positions, ACC over linked, span-masked mentions (decoder side aligned)."""
    from accelerate import Accelerator
    from torch.utils.data import DataLoader

    from edmem_hf.collator import EDMemMaskingCollator
    from edmem_hf.pretraining import _IndexedPassages, build_model, evaluate, load_corpus

    passages, vocab, tok = load_corpus(corpus)
    model = build_model(PretrainingArguments(output_dir="unused", **TINY), tok, vocab)
    collator = EDMemMaskingCollator(tok, seed=7, return_salient_span_mask=True, decoder_target=decoder_target)
    markers = torch.tensor([tok.mask_token_id, tok.eos_token_id, -100, *tok.convert_tokens_to_ids(["<E_s>", "<E_e>"])])
    data = _IndexedPassages(passages["validation"], fixed_epoch=0)
    expected_tokens = expected_mentions = 0
    masked_log_probs = []
    model.eval()
    for start in range(0, len(data), 8):
        batch = collator([data[i] for i in range(start, min(start + 8, len(data)))])
        if decoder_target == "passage":  # the labels at masked input positions; mentions where the input's are
            masked = (batch["input_ids"] != batch["labels"]) & (batch["labels"] != -100)
            chosen = batch["salient_span_mask"]
        else:  # every label but the separators, markers and EOS; mentions at the labels' own <E_s>
            masked = ~torch.isin(batch["labels"], markers)
            assert int(masked.sum()) == int((batch["input_ids"] == tok.mask_token_id).sum())
            chosen = batch["decoder_salient_span_mask"]
            assert int(chosen.sum()) == int(batch["salient_span_mask"].sum()) > 0
        expected_tokens += int(masked.sum())
        expected_mentions += int((chosen & (batch["decoder_entity_labels"] != -100)).sum())
        hidden = ("salient_span_mask", "decoder_salient_span_mask", "scored_target", "example_index")
        inputs = {k: v for k, v in batch.items() if k not in hidden}
        with torch.no_grad():
            log_probs = model(**inputs).logits.double().log_softmax(dim=-1)
        # The probability the model gives each masked token's original id, position by position.
        for row, position in masked.nonzero().tolist():
            masked_log_probs.append(log_probs[row, position, batch["labels"][row, position]].item())
    model.train()
    assert expected_mentions > 0 and len(masked_log_probs) == expected_tokens
    perplexity = torch.tensor(masked_log_probs, dtype=torch.float64).mean().neg().exp().item()
    loader = DataLoader(data, batch_size=8, collate_fn=collator)
    metrics = evaluate(model, loader, Accelerator(cpu=True))
    assert metrics["eval_masked_tokens"] == expected_tokens
    assert metrics["eval_masked_mentions"] == expected_mentions
    assert metrics["eval_ppl"] == pytest.approx(perplexity, rel=1e-4)
    assert 0.0 <= metrics["eval_acc"] <= 1.0 and 0.0 <= metrics["eval_encoder_acc"] <= 1.0
    assert model.training  # evaluate() restores the mode


def test_start_from_checkpoint_or_config_json(corpus, tmp_path):
    first = tmp_path / "first"
    pretrain(_args(corpus, first, max_steps=1))
    second = tmp_path / "second"
    # Another seed (a fresh model would differ) and a zero learning rate (training keeps what was loaded): the
    # second run ends with the very weights of the named checkpoint.
    args = _args(corpus, second, max_steps=1, seed=7, learning_rate=0.0, weight_decay=0.0)
    args.model_name_or_path = str(first)
    pretrain(args)
    assert _log(second)[-1]["type"] == "end"
    loaded, named = _weights(second), _weights(first)
    assert loaded.keys() == named.keys() and all(torch.equal(loaded[k], named[k]) for k in named)
    fresh = tmp_path / "fresh"
    pretrain(_args(corpus, fresh, max_steps=1, seed=7, learning_rate=0.0, weight_decay=0.0))
    assert not torch.equal(_weights(fresh)["model.shared.weight"], named["model.shared.weight"])
    # A config JSON (e.g. the saved one) builds a new model; options override it.
    args = PretrainingArguments(
        output_dir=str(tmp_path / "third"),
        corpus_dir=corpus,
        max_steps=1,
        config_name=str(first / "config.json"),
        dropout=0.2,
        report_to="none",
        disable_tqdm=True,
        per_device_train_batch_size=8,
        eval_steps=0,
        max_eval_samples=8,
    )
    pretrain(args)
    with open(tmp_path / "third" / "config.json", encoding="utf-8") as f:
        config = json.load(f)
    assert config["d_model"] == TINY["d_model"] and config["dropout"] == 0.2
    # A checkpoint keeps its shape: an architecture option that differs is refused, not ignored; training options
    # (the dropout here) are taken anew and saved with the model.
    wider = 2 * TINY["d_model"]
    with pytest.raises(ValueError, match=rf"--d_model {wider}: the checkpoint at .* has d_model={TINY['d_model']}"):
        pretrain(_args(corpus, tmp_path / "fourth", max_steps=1, model_name_or_path=str(first), d_model=wider))
    with pytest.raises(ValueError, match="--preset and --config_name build a new model"):
        pretrain(_args(corpus, tmp_path / "fourth", max_steps=1, model_name_or_path=str(first), preset="edmem-base"))
    pretrain(_args(corpus, tmp_path / "fifth", max_steps=1, model_name_or_path=str(first), dropout=0.3))
    with open(tmp_path / "fifth" / "config.json", encoding="utf-8") as f:
        assert json.load(f)["dropout"] == 0.3


def test_epochs_when_no_max_steps_and_resume_at_an_epoch_end(corpus, tmp_path):
    # 64 passages, batch 8, accumulation 2: 4 optimizer steps per epoch; the step-4 checkpoint ends epoch 0.
    common = dict(max_steps=-1, num_train_epochs=1.5, gradient_accumulation_steps=2, save_steps=4, dropout=0.1)
    out = tmp_path / "epochs"
    result = pretrain(_args(corpus, out, **common))
    assert result["global_step"] == 6
    assert [r["epoch"] for r in _log(out) if r["type"] == "train"] == [0.25, 0.5, 0.75, 1.0, 1.25, 1.5]
    stopped = tmp_path / "stopped"
    pretrain(_args(corpus, stopped, max_steps_this_run=5, **common))
    assert pretrain(_args(corpus, stopped, **common))["global_step"] == 6
    assert [r["step"] for r in _log(stopped) if r["type"] == "start"] == [0, 4]
    a, b = _weights(out), _weights(stopped)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_deepspeed_configs_clip_and_accumulate_like_the_defaults():
    """DeepSpeed clips inside its engine: the shipped YAMLs must carry `edmem pretrain`'s defaults (the authors'
    clipping of 0.1), or the documented command would train with another clipping than it says."""
    import dataclasses

    import yaml

    defaults = {f.name: f.default for f in dataclasses.fields(PretrainingArguments)}
    assert defaults["max_grad_norm"] == 0.1
    examples = os.path.join(os.path.dirname(__file__), "..", "examples", "accelerate_configs")
    for name in ("deepspeed_zero2.yaml", "deepspeed_zero3.yaml"):
        with open(os.path.join(examples, name), encoding="utf-8") as f:
            deepspeed = yaml.safe_load(f)["deepspeed_config"]
        assert deepspeed["gradient_clipping"] == defaults["max_grad_norm"], name
        assert deepspeed["gradient_accumulation_steps"] == defaults["gradient_accumulation_steps"], name


def _write_questions(folder) -> str:
    """A QA file in the released format (`edmem_*-train.jsonl` with its `sling_invocab-train.json`): for each
    entity of the tiny corpus, "Where is X?" answered by the next entity."""
    from test_collator import ENTITY_NAMES

    folder.mkdir(parents=True, exist_ok=True)
    links = {}
    with open(folder / "edmem_tiny-train.jsonl", "w", encoding="utf-8") as f:
        for i, name in enumerate(ENTITY_NAMES):
            answer = ENTITY_NAMES[(i + 1) % len(ENTITY_NAMES)]
            record = {"id": f"q{i}", "question": f"Where is {name}?", "answer": [answer], "link_offset": [9],
                      "link_length": [len(name)], "link_target": [name], "entity_name": [name]}  # fmt: skip
            f.write(json.dumps(record) + "\n")
            links[f"q{i}"] = {answer: ["", answer, answer]}
    (folder / "sling_invocab-train.json").write_text(json.dumps(links))
    return str(folder / "edmem_tiny-train.jsonl")


def test_more_questions_than_the_mixed_share_holds_are_said(caplog):
    from edmem_hf.research.example_mixing import question_repeats

    with caplog.at_level(logging.WARNING, logger="edmem_hf.research.example_mixing"):
        assert question_repeats(64, 12, 0.5) == 5 and question_repeats(1000, 12, 0.01) == 1
        assert not caplog.text  # rounding alone is not said
        assert question_repeats(300, 100, 0.1) == 1
    assert "--mixed_questions_share 0.1: 100 questions beside 300 passages" in caplog.text and "0.25" in caplog.text


def test_mixed_questions_are_learned_and_resume_exactly(corpus, tmp_path):
    from edmem_hf.collator import QuestionsAndPassagesCollator
    from edmem_hf.modeling_edmem import EDMemForConditionalGeneration
    from edmem_hf.research.example_mixing import _mixed_questions

    questions_file = _write_questions(tmp_path / "qa")
    common = dict(max_steps=120, learning_rate=3e-3, mixed_questions_file=questions_file, mixed_questions_share=0.5)
    mixed = pretrain(**_options(corpus, tmp_path / "mixed", **common))
    plain = pretrain(**_options(corpus, tmp_path / "plain", max_steps=120, learning_rate=3e-3))
    assert mixed["completed"] and plain["completed"]

    model = EDMemForConditionalGeneration.from_pretrained(tmp_path / "mixed")
    features = _mixed_questions(_options(corpus, tmp_path / "x", **common)["mixing"], *_tokenizer_and_vocab(corpus))
    assert len(features) == 12 and all(f["decoder_entity_labels"].count(-100) < len(f["labels"]) for f in features)
    from edmem_hf.task_features import EDMemSeq2SeqCollator

    masking = _masking(corpus)
    batch = QuestionsAndPassagesCollator(masking, EDMemSeq2SeqCollator(masking.pad_token_id))(features)

    def question_loss(path) -> float:
        model = EDMemForConditionalGeneration.from_pretrained(path).eval()
        with torch.no_grad():
            return model(**batch).lm_loss.item()

    # The questions were trained on: their answers far likelier than after the passages alone.
    assert question_loss(tmp_path / "mixed") < question_loss(tmp_path / "plain") - 1.0
    del model
    # A run killed and resumed is the uninterrupted one (the questions' order is the sampler's).
    killed = tmp_path / "killed"
    pretrain(**_options(corpus, killed, max_steps_this_run=70, save_steps=60, **common))
    pretrain(**_options(corpus, killed, save_steps=60, **common))
    a, b = _weights(tmp_path / "mixed"), _weights(killed)
    assert all(torch.equal(a[key], b[key]) for key in a)
    with pytest.raises(ValueError, match="mixed_questions_share"):
        _options(corpus, tmp_path / "y", mixed_questions_file=questions_file, mixed_questions_share=1.0)
    empty = tmp_path / "qa" / "edmem_empty-train.jsonl"
    empty.write_text("")
    with pytest.raises(ValueError, match="edmem_empty-train.jsonl has no question"):
        pretrain(**_options(corpus, tmp_path / "empty", max_steps=1, mixed_questions_file=str(empty)))


def test_balanced_entities_make_their_share_of_what_an_epoch_reads(corpus, tmp_path):
    import numpy as np

    from edmem_hf.modeling_edmem import EDMemForConditionalGeneration
    from edmem_hf.pretraining import _dataloaders, build_config, load_corpus
    from edmem_hf.research.example_mixing import balanced_order
    from test_collator import ENTITY_NAMES

    assert balanced_order(np.arange(100) < 10, 0.5).tolist() == list(range(100)) + list(range(10)) * 8
    assert len(balanced_order(np.arange(100) < 90, 0.5)) == 180  # the 10 others nine times
    assert balanced_order(np.zeros(5, dtype=bool), 0.5).tolist() == list(range(5))  # no side to balance
    datasets, vocab, tokenizer = load_corpus(corpus)
    labels = datasets["train"]["entity_labels"]
    few = ENTITY_NAMES[0]  # an entity some passages mention, most not
    mentioning = [vocab.id_of(few) in row for row in labels]
    assert 0 < sum(mentioning) < len(labels) / 2
    names = tmp_path / "few.txt"
    names.write_text(f"{few}\n")
    questions = _write_questions(tmp_path / "qa")
    options = _options(corpus, tmp_path / "out", balanced_entities_file=str(names), balanced_entities_share=0.5,
                       mixed_questions_file=questions, max_steps=4)  # fmt: skip
    args = options["args"]
    model = EDMemForConditionalGeneration(build_config(args, tokenizer, len(vocab)))
    model.entity_vocab = vocab
    train_set = _dataloaders(args, datasets, tokenizer, 1, model, mixing=options["mixing"])[1].dataset
    passages = [train_set.passages[(0, i)] for i in range(len(train_set.passages))]
    about = [vocab.id_of(few) in example["entity_labels"] for example in passages]
    assert abs(sum(about) / len(about) - 0.5) < 0.1
    assert {example["example_index"] for example in passages} == set(range(len(labels)))  # every passage read
    asked = [train_set.questions[i] for i in range(len(train_set.questions))]
    # asked about it (q0) or answered by it (q11): 2 of 12 questions, five times each beside the 10 others
    assert len(asked) == 20
    assert sum(vocab.id_of(few) in q["entity_labels"] + q["decoder_entity_labels"] for q in asked) == 10
    assert pretrain(**options)["completed"]
    with pytest.raises(ValueError, match="go together"):
        _options(corpus, tmp_path / "x", balanced_entities_file=str(names))
    with pytest.raises(ValueError, match=r"balanced_entities_share must be in \(0, 1\)"):
        _options(corpus, tmp_path / "x", balanced_entities_file=str(names), balanced_entities_share=1.0)
    names.write_text("Nobody\n")
    with pytest.raises(ValueError, match="1 names not in the entity vocabulary, e.g. 'Nobody'"):
        pretrain(**_options(corpus, tmp_path / "y", balanced_entities_file=str(names), balanced_entities_share=0.5))


def _tokenizer_and_vocab(corpus):
    from edmem_hf.pretraining import load_corpus

    _, vocab, tokenizer = load_corpus(corpus)
    return tokenizer, vocab


def _masking(corpus):
    from edmem_hf.collator import EDMemMaskingCollator

    return EDMemMaskingCollator(_tokenizer_and_vocab(corpus)[0])


def test_masked_span_targets_train_and_evaluate(corpus, tmp_path):
    result = pretrain(_args(corpus, tmp_path / "spans", max_steps=16, eval_steps=8, decoder_target="masked_spans"))
    assert result["completed"]
    evals = [r for r in _log(tmp_path / "spans") if r["type"] == "eval"]
    assert evals[0]["eval_masked_tokens"] == evals[1]["eval_masked_tokens"] > 0
    assert evals[1]["eval_ppl"] < evals[0]["eval_ppl"] and evals[1]["eval_masked_mentions"] > 0
    train = [r for r in _log(tmp_path / "spans") if r["type"] == "train"]
    assert sum(r["loss"] for r in train[-4:]) < sum(r["loss"] for r in train[:4]) - 2.0
    with pytest.raises(ValueError, match="needs a decoder"):
        pretrain(_args(corpus, tmp_path / "encmem", max_steps=1, variant="encmem", decoder_target="masked_spans"))
