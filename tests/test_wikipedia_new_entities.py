"""A user's own entities on real text (issue 64, item 5): the writer trained on a corpus `edmem build-corpus` made of
the Wikipedia sample, its practice entities drawn from that corpus (no toy-world file, no questions), then entities
held out of it added from their pages by `edmem add-entities`, and found by name at their mentions
(`benchmarks/wikipedia_new_entities.py`, a few steps here)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from conftest import shared_data_path
from edmem_hf.dump import iter_parsed_pages
from edmem_hf.entity_vocab import EntityVocab

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import wikipedia_new_entities as protocol  # noqa: E402


def test_held_out_entities_are_written_from_their_pages_and_found_by_name(tmp_path):
    sample = shared_data_path("wikipedia/enwiki-pages-articles-sample-206.xml.bz2")
    assert protocol.SAMPLE.resolve() == sample.resolve()
    assert protocol.main(["--out", str(tmp_path / "run"), "--steps", "12", "--results", str(tmp_path / "r.json")]) == 0
    result = json.loads((tmp_path / "r.json").read_text())
    held = result["held_out"]
    assert len(held) >= 20
    # never read: neither their pages in the old dump nor an entity of its corpus
    old_titles = {page.title for page in iter_parsed_pages(str(tmp_path / "run/old-wiki.xml.bz2"))}
    assert not old_titles & set(held) and len(old_titles) > 100
    assert not set(EntityVocab.load(tmp_path / "run/corpus").names) & set(held)
    # the corpus recipe: practice entities drawn from the corpus, rows a sentence, no list of names
    arguments = json.loads((tmp_path / "run/writer/pretraining_args.json").read_text())
    assert arguments["writer_recipe"] == "rows_that_answer_from_corpus"
    assert arguments["written_only_entities_file"] is None and arguments["mixed_questions_file"] is None
    assert arguments["written_only_share"] == 0.2 and arguments["writer_sentence_rows"] is True
    grown = EntityVocab.load(tmp_path / "run/grown")
    assert set(held) <= set(grown.names)
    assert any(grown.aliases[grown.id_of(name)] for name in held)  # the dump's redirects and anchors
    found = result["found_by_name"]
    assert found["added"]["plain"]["entities"] >= 20
    # a name-guided read finds the added entities the plain read of a barely trained model does not
    assert found["added"]["name_guided"]["recall"] >= 95 > found["added"]["plain"]["recall"]
    assert found["trained"]["name_guided"]["recall"] >= found["trained"]["plain"]["recall"]
