"""Every ```python block of the README and docs/ runs, in order within its page, on tiny models and data.

Each page's blocks share one namespace and one working directory, prepared with what the page's prose says the
reader has: `tokenizer` (with `<E_s>`, `<E_e>`), `names` (the entities, in id order), a `model`, `inputs` and a
training `batch`, and, for the corpus and pre-training pages, a MediaWiki dump and a tokenizer folder.
docs/hub.md's blocks run in tests/test_hub.py; the commands of the ```bash blocks are checked by
tests/test_docs_commands.py, which also fails on a fenced block that is neither (other than ```text / ```json).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import torch

from edmem_hf.entity_trie import EntityTrie
from tiny_models import tiny_model_with_entities

ROOT = Path(__file__).resolve().parents[1]
# docs/hub.md runs in tests/test_hub.py, with the presets and saved folders its blocks load
PAGES = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "hub.md")]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def python_blocks(page: Path) -> list[str]:
    return BLOCK.findall(page.read_text(encoding="utf-8"))


def _namespace(workdir: Path) -> dict:
    """What the pages assume the reader has."""
    model, tokenizer, names, words = tiny_model_with_entities(20)
    start, end = tokenizer.convert_tokens_to_ids(["<E_s>", "<E_e>"])
    texts = [f"{words[50]} <E_s> {names[3]} <E_e> {words[51]}", f"<E_s> {names[7]} <E_e> {words[52]} {words[53]}"]
    inputs = tokenizer(texts, return_tensors="pt", padding=True)
    labels = tokenizer([f"<E_s> {names[5]} <E_e>", f"{words[54]}"], return_tensors="pt", padding=True).input_ids
    labels = labels.masked_fill(labels == tokenizer.pad_token_id, -100)
    entity_labels = torch.full_like(inputs.input_ids, -100).masked_fill(inputs.input_ids == start, 3)
    entity_labels[1][inputs.input_ids[1] == start] = 7
    decoder_entity_labels = torch.full_like(labels, -100).masked_fill(labels == start, 5)
    batch = dict(inputs, entity_labels=entity_labels, labels=labels, decoder_entity_labels=decoder_entity_labels)
    trie = EntityTrie.build(names, tokenizer, end_token_id=end)
    return dict(
        torch=torch,
        tokenizer=tokenizer,
        names=names,
        model=model,
        inputs=inputs,
        batch=batch,
        trie=trie,
        trie_or_entity_vocab=model.entity_vocab,
        token_ids=trie.sequence(3),
        prefix=trie.sequence(3)[:1],
        titles=names[:8],
        num_beams=2,
    )


def _prepare_files(page: Path, workdir: Path, namespace: dict) -> None:
    """The files a page's blocks read, made small: a dump and a tokenizer; the corpus the pre-training page uses."""
    if page.name in ("corpus.md", "pretraining.md"):
        from edmem_hf.toy_world import generate_toy_world, write_mediawiki_dump

        write_mediawiki_dump(generate_toy_world(60, seed=0), workdir / "dump.xml.bz2")
        namespace["tokenizer"].save_pretrained(workdir / "my_tokenizer")
    if page.name == "pretraining.md":
        from edmem_hf.corpus import build_corpus

        build_corpus(workdir / "dump.xml.bz2", workdir / "corpus", tokenizer=workdir / "my_tokenizer", num_proc=1)
    if page.name == "fine_tuning.md":
        from conftest import shared_data_path

        for name in ("openqa/nq/edmem_nq-test.jsonl", "generation/creak/edmem_creak-test.jsonl",
                     "openqa/nq/entity_linking/sling_invocab-test.json"):  # fmt: skip
            (workdir / Path(name).name).symlink_to(shared_data_path(f"edmem_release/data/{name}"))


@pytest.mark.parametrize("page", [p for p in PAGES if python_blocks(p)], ids=lambda p: p.name)
def test_the_python_blocks_of_each_page_run(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    namespace = _namespace(tmp_path)
    _prepare_files(page, tmp_path, namespace)
    for number, code in enumerate(python_blocks(page), 1):
        try:
            exec(compile(code, f"{page.name}, python block {number}", "exec"), namespace)
        except Exception as error:
            raise AssertionError(f"{page.relative_to(ROOT)}, python block {number} fails: {error!r}") from error
    assert os.getcwd() == str(tmp_path)
