"""Entity ids say whose they are: a model folder's `entity_vocab.json` records its id space (ours, where every row is
an entity and "none" is -100, or the authors', where row 0 means none), a vocabulary of ours made from the authors'
released files keeps each row's id in theirs, and their files' ids are mapped through it."""

from __future__ import annotations

import json

import pytest

from conftest import shared_data_path
from edmem_hf.cli import main as edmem
from edmem_hf.entity_vocab import AUTHORS_ID_SPACE, OWN_ID_SPACE, EntityVocab
from edmem_hf.tasks import IGNORE_INDEX, read_answer_links, read_qa

WQ = "edmem_release/data/openqa/wq"


@pytest.fixture(scope="module")
def wq_folder(tmp_path_factory):
    """The entity vocabulary `edmem write-preset --task-data` writes for the released WebQuestions files."""
    folder = tmp_path_factory.mktemp("wq") / "model"
    assert edmem(["write-preset", "edmem-base", str(folder), "--task-data", str(shared_data_path(WQ))]) == 0
    return folder


def test_a_model_folder_says_whose_ids_it_uses(wq_folder):
    saved = json.loads((wq_folder / "entity_vocab.json").read_text())
    assert saved["id_space"] == OWN_ID_SPACE == "edmem-hf"
    assert saved["names"][0] == "United States" and saved["authors_ids"][0] == 11  # our row 0, their id 11
    assert len(saved["authors_ids"]) == len(saved["names"]) and min(saved["authors_ids"]) >= 10  # none is no row
    vocab = EntityVocab.load(wq_folder)
    assert vocab.from_authors_id(11) == 0 and vocab.from_authors_id(0) is None
    assert EntityVocab.from_dict({"names": ["A"]}).id_space == OWN_ID_SPACE  # a file from before id_space


def test_a_released_answer_entity_resolves_to_its_name_and_none_is_never_an_entity(wq_folder, caplog):
    vocab = EntityVocab.load(wq_folder)
    rows = {row["id"]: row for row in read_qa(shared_data_path(f"{WQ}/edmem_wq-test.jsonl"), vocab, "skip")}
    # record 1 gives its answer as [678, "lawyer"]: the entity the files elsewhere name Lawyer, found by its id
    assert rows["1"]["answers"] == ["Lawyer", "lawyer"] and vocab.name_of(rows["1"]["answer_entity"]) == "Lawyer"
    assert [vocab.name_of(e) for e in rows["1"]["mention_entities"]] == [
        "James K. Polk",
        "President of the United States",
    ]
    # our row 0 is a real entity: every mention of it is labelled 0, not read as none
    us = [row for row in rows.values() if 0 in row["mention_entities"]]
    assert len(us) == 22 and all("<E_s>" in row["question"] for row in us)
    assert all(e != IGNORE_INDEX for row in rows.values() for e in row["mention_entities"])  # every link labelled
    links = read_answer_links(shared_data_path(f"{WQ}/entity_linking/sling_invocab-test.json"), vocab)
    assert links["1"] == [rows["1"]["answer_entity"]]


def test_in_the_authors_ids_row_0_means_none():
    vocab = EntityVocab([None] * 10 + ["Lawyer", "Paris"], id_space=AUTHORS_ID_SPACE)
    assert vocab.from_authors_id(10) == 10 and vocab.from_authors_id(0) is None and vocab.from_authors_id(12) is None
    with pytest.raises(
        ValueError, match=r"row 0 is named 'Paris', but in the authors' ids rows 0..9 are not entities"
    ):
        EntityVocab(["Paris"] + [None] * 10, id_space=AUTHORS_ID_SPACE)
    with pytest.raises(ValueError, match="entity 1 has the authors' id 0, which is not an entity in their ids"):
        EntityVocab(["Paris", "Lyon"], authors_ids=[12, 0])
    with pytest.raises(ValueError, match="unknown id_space 'mine'"):
        EntityVocab(["Paris"], id_space="mine")
    grown = EntityVocab(["Paris"], authors_ids=[12]).extended(["Lyon"])
    assert grown.authors_ids == [12, None] and EntityVocab.from_dict(grown.to_dict()) == grown


def test_files_of_ours_may_name_the_entity_where_the_authors_give_its_id(tmp_path):
    """The toy worlds' files give the entity's name as `link_target`: read by name, never as an id."""
    record = {"id": "1", "question": "where was Ada born?", "answer": ["Paris"], "link_offset": [10]}
    record |= {
        "link_length": [3],
        "link_target": ["Ada"],
        "entity_name": ["Ada"],
        "answer_entity": [["Paris", "Paris"]],
    }
    (tmp_path / "qa.jsonl").write_text(json.dumps(record) + "\n")
    row = read_qa(tmp_path / "qa.jsonl", EntityVocab(["Paris", "Ada"], authors_ids=[11, 12]))[0]
    assert row["mention_entities"] == [1] and row["answer_entity"] == 0
