"""Bad input stops with a message naming the problem: the model given only `inputs_embeds`, `edmem build-corpus` on
a broken tokenizer, a malformed page under `--strict` and a dump without passages (exit 1), and `edmem pretrain`
on an output directory to overwrite or holding old `step-N` checkpoints."""

from __future__ import annotations

import json
import os
import shutil
import sys

import pytest
import torch

from edmem_hf.cli import main as edmem
from edmem_hf.pretraining import PretrainingArguments, list_checkpoints, pretrain
from edmem_hf.tokenization import train_tokenizer
from edmem_hf.toy_world import generate_toy_world, render_mediawiki_dump
from tiny_models import tiny_batch, tiny_model

sys.path.insert(0, os.path.dirname(__file__))
from test_collator import make_corpus  # noqa: E402

# --- the model ---------------------------------------------------------------------------------------------------


def test_inputs_embeds_without_input_ids_is_refused_by_a_memory_model_only():
    batch = tiny_batch()
    model = tiny_model().eval()
    embeds = model.get_input_embeddings()(batch["input_ids"])
    message = r"EDMem finds mentions by their <E_s> tokens: pass input_ids, not only inputs_embeds"
    with pytest.raises(ValueError, match=message):
        model(inputs_embeds=embeds, attention_mask=batch["attention_mask"], labels=batch["labels"])
    with pytest.raises(ValueError, match=message):
        model.generate(inputs_embeds=embeds, attention_mask=batch["attention_mask"], max_new_tokens=2)
    decoder_embeds = model.get_input_embeddings()(batch["labels"].clamp_min(0))
    with pytest.raises(ValueError, match=r"finds mentions by their <E_s> tokens: pass decoder_input_ids, not only"):
        model(input_ids=batch["input_ids"], decoder_inputs_embeds=decoder_embeds)
    with pytest.raises(ValueError, match="exactly one of input_ids or inputs_embeds"):
        model.get_encoder()(input_ids=batch["input_ids"], inputs_embeds=embeds)
    encdec = tiny_model(variant="encdec").eval()  # no memory, no mention to find: embeddings alone are enough
    with torch.no_grad():
        by_embeds = encdec(inputs_embeds=encdec.get_input_embeddings()(batch["input_ids"]), labels=batch["labels"])
        by_ids = encdec(input_ids=batch["input_ids"], labels=batch["labels"])
    torch.testing.assert_close(by_embeds.logits, by_ids.logits)


# --- edmem build-corpus --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def world_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("world")
    world = generate_toy_world(30, seed=2)
    train_tokenizer(list(world.pages.values()), vocab_size=400, min_frequency=1).save_pretrained(root / "tokenizer")
    xml = render_mediawiki_dump(world)
    (root / "toy.xml").write_text(xml, encoding="utf-8")
    broken_page = (
        "  <page>\n    <title>Broken page</title>\n    <ns>0</ns>\n    <id>999</id>\n"
        "    <revision>\n      <id>5</id>\n    </revision>\n  </page>\n"
    )
    (root / "malformed.xml").write_text(xml.replace("</mediawiki>", broken_page + "</mediawiki>"), encoding="utf-8")
    pages = xml.split("<page>")
    redirects = pages[0] + "".join("<page>" + page for page in pages[1:] if "<redirect" in page)
    if not redirects.rstrip().endswith("</mediawiki>"):
        redirects += "</mediawiki>\n"
    (root / "redirects-only.xml").write_text(redirects, encoding="utf-8")
    return root


def _build_corpus(capsys, dump, out, *options) -> tuple[int, str]:
    capsys.readouterr()
    code = edmem(["build-corpus", "--dump", str(dump), "--out", str(out), "--num_entities", "10", *options])
    return code, capsys.readouterr().err


def test_build_corpus_with_a_broken_tokenizer_exits_1_naming_it(world_files, tmp_path, capsys):
    broken = tmp_path / "broken-tokenizer"
    shutil.copytree(world_files / "tokenizer", broken)
    (broken / "tokenizer.json").write_text("{not json", encoding="utf-8")
    code, err = _build_corpus(capsys, world_files / "toy.xml", tmp_path / "out", "--tokenizer", str(broken))
    assert code == 1
    assert err.startswith("edmem build-corpus: error: ") and str(broken) in err and "Traceback" not in err
    assert not (tmp_path / "out" / "passages").exists()


def test_build_corpus_strict_on_a_malformed_page_exits_1_naming_the_page(world_files, tmp_path, capsys):
    options = ("--tokenizer", str(world_files / "tokenizer"), "--passage_length", "64")
    dump = world_files / "malformed.xml"
    code, err = _build_corpus(capsys, dump, tmp_path / "strict", *options, "--strict")
    assert code == 1
    assert err.startswith(f"edmem build-corpus: error: {dump}: page 'Broken page' (id 999): no text")
    assert "--strict stops at the first malformed page" in err and "Traceback" not in err
    assert not (tmp_path / "strict" / "passages").exists()
    assert _build_corpus(capsys, dump, tmp_path / "lenient", *options)[0] == 0  # the same dump, without --strict


def test_build_corpus_on_a_dump_without_passages_exits_1_naming_the_dump(world_files, tmp_path, capsys):
    dump = world_files / "redirects-only.xml"
    code, err = _build_corpus(capsys, dump, tmp_path / "empty", "--tokenizer", str(world_files / "tokenizer"))
    assert code == 1
    assert err.startswith(f"edmem build-corpus: error: {dump}: no passages (")
    assert "is this a pages-articles dump?" in err and "Traceback" not in err
    assert not (tmp_path / "empty" / "passages").exists()


# --- edmem pretrain ------------------------------------------------------------------------------------------------

TINY = dict(
    d_model=32,
    encoder_lower_layers=1,
    encoder_upper_layers=1,
    decoder_lower_layers=1,
    decoder_upper_layers=1,
    encoder_ffn_dim=64,
    decoder_ffn_dim=64,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    entity_embed_dim=16,
    max_position_embeddings=160,
)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("corpus"), n_train=32, n_validation=8)


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: one intra-op thread is faster on a shared machine
    yield
    torch.set_num_threads(threads)


def _pretraining(corpus, out, **overrides) -> PretrainingArguments:
    settings = dict(output_dir=str(out), corpus_dir=corpus, per_device_train_batch_size=8, learning_rate=1e-3)
    settings |= dict(logging_steps=1, eval_steps=0, save_steps=1, disable_tqdm=True, report_to="none", **TINY)
    return PretrainingArguments(**settings | overrides)


def _logged_steps(out) -> list[int]:
    lines = (out / "log.jsonl").read_text(encoding="utf-8").splitlines()
    return [record["step"] for record in map(json.loads, lines) if "loss" in record]


def test_overwrite_output_dir_deletes_the_checkpoints_and_the_log(corpus, tmp_path):
    out = tmp_path / "run"
    pretrain(_pretraining(corpus, out, max_steps=3))
    assert len(list_checkpoints(str(out))) == 3 and _logged_steps(out) == [1, 2, 3]
    with pytest.raises(ValueError, match="already has checkpoints; use --resume auto to continue, or"):
        pretrain(_pretraining(corpus, out, max_steps=1, resume="no"))
    assert pretrain(_pretraining(corpus, out, max_steps=1, resume="no", overwrite_output_dir=True))["global_step"] == 1
    assert _logged_steps(out) == [1]  # the old run's records are gone
    [checkpoint] = list_checkpoints(str(out))  # only the new run's, numbered from 0 again
    assert checkpoint.endswith("checkpoint_0")
    assert (
        json.loads((tmp_path / "run" / "checkpoints" / "checkpoint_0" / "trainer_state.json").read_text())[
            "global_step"
        ]
        == 1
    )


def test_old_step_checkpoints_are_refused_naming_them(corpus, tmp_path, capsys):
    out = tmp_path / "run"
    pretrain(_pretraining(corpus, out, max_steps=1))
    for step in (2, 10):  # the older loop's layout: checkpoints/step-N with a trainer_state.json
        old = out / "checkpoints" / f"step-{step}"
        old.mkdir()
        (old / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    # resumed from the newest checkpoint, or from a named one, the old directories would stay: refused
    for resume, overwrite in (("auto", False), ("auto", True), (str(out / "checkpoints" / "checkpoint_0"), False)):
        with pytest.raises(ValueError, match=r"checkpoints holds step-N checkpoints .* \(step-2, step-10\)"):
            pretrain(_pretraining(corpus, out, max_steps=2, resume=resume, overwrite_output_dir=overwrite))
    with pytest.raises(ValueError, match="step-10: a step-N checkpoint of an earlier version"):
        pretrain(_pretraining(corpus, out, max_steps=2, resume=str(out / "checkpoints" / "step-10")))
    capsys.readouterr()
    argv = ["pretrain", "--output_dir", str(out), "--corpus_dir", corpus, "--max_steps", "2", "--report_to", "none"]
    assert edmem(argv + [arg for key, value in TINY.items() for arg in (f"--{key}", str(value))]) == 2
    printed = capsys.readouterr().out
    assert "edmem pretrain: error: " in printed and "(step-2, step-10)" in printed and "move them out of" in printed
    # starting afresh deletes them with the rest
    assert pretrain(_pretraining(corpus, out, max_steps=1, resume="no", overwrite_output_dir=True))["global_step"] == 1
    assert sorted(os.listdir(out / "checkpoints")) == ["checkpoint_0"]


def test_pretrain_on_a_corpus_with_a_broken_tokenizer_names_it(corpus, tmp_path, capsys):
    broken = tmp_path / "corpus"
    shutil.copytree(corpus, broken)
    (broken / "tokenizer" / "tokenizer.json").write_text("{not json", encoding="utf-8")
    capsys.readouterr()
    assert edmem(["pretrain", "--output_dir", str(tmp_path / "out"), "--corpus_dir", str(broken)]) == 2
    printed = capsys.readouterr().out
    assert f"edmem pretrain: error: tokenizer directory '{broken / 'tokenizer'}' could not be loaded" in printed


def test_finetune_names_what_a_model_folder_lacks(tmp_path, capsys):
    from edmem_hf.finetuning import ModelFolderError, check_model_folder, cli_main

    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    lacks = []
    for missing, add in (("no tokenizer", "tokenizer.json"), ("no weights", "model.safetensors"),
                         ("no entity_vocab.json", "entity_vocab.json")):  # fmt: skip
        with pytest.raises(ModelFolderError, match=missing):
            check_model_folder(str(folder))
        lacks.append(missing)
        (folder / add).write_text("{}")
    check_model_folder(str(folder))  # all there
    check_model_folder("org/model-on-the-hub")  # not a folder: the Hub's to answer
    (folder / "tokenizer.json").unlink()
    check_model_folder(str(folder), tokenizer_name="elsewhere")
    train = tmp_path / "edmem_t-train.jsonl"
    train.write_text('{"id": "a", "question": "Who?", "answer": ["x"]}\n')
    argv = ["--model_name_or_path", str(folder), "--train_file", str(train), "--output_dir", str(tmp_path / "out"),
            "--do_train", "--report_to", "none"]  # fmt: skip
    assert cli_main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("edmem finetune: ") and "no tokenizer" in err[-1]
