"""The knowledge world of `toy_world_qa.py` and `toy_world_growth.py` as files: its questions in the authors' released
format, the fine-tuning group's questions on its pages (the study's mixed training), and a seed's world, dump, corpus
and question files of its three groups."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from edmem_hf.corpus import build_corpus
from edmem_hf.knowledge_world import KnowledgeWorldSettings, generate_knowledge_world, split_people
from edmem_hf.toy_world import QAPair, ToyWorld, write_mediawiki_dump

if TYPE_CHECKING:
    from toy_world_qa import Settings


def write_released_format(pairs: list[QAPair], split: str, out: Path) -> tuple[Path, Path]:
    """The questions as the authors' released files: `edmem_*.jsonl` (the subject linked in the question) and
    `sling_invocab-*.json` (null for a literal answer), so that the readers and `edmem evaluate` take them as is."""
    data, links = out / f"edmem_toy-{split}.jsonl", out / f"sling_invocab-{split}.json"
    answer_links = {}
    with open(data, "w", encoding="utf-8") as f:
        for i, pair in enumerate(pairs):
            qid = f"{split}-{i}"
            start = pair.question.index(pair.subject)
            record = {
                "id": qid,
                "question": pair.question,
                "answer": [pair.answer],
                "relation": pair.relation,
                "link_offset": [start],
                "link_length": [len(pair.subject)],
                "link_target": [pair.subject],
                "entity_name": [pair.subject],
                "answer_entity": [[pair.answer, pair.answer]] if pair.answer_is_entity else [],
            }
            f.write(json.dumps(record) + "\n")
            answer_links[qid] = {pair.answer: ["", pair.answer, pair.answer]} if pair.answer_is_entity else None
    links.write_text(json.dumps(answer_links))
    return data, links


QUESTIONS_A_PAGE = 24


def with_questions_in_pages(world: ToyWorld, pairs: list[QAPair], shuffled: bool = False, seed: int = 0) -> ToyWorld:
    """`world` with the fine-tuning group's questions and answers (`pairs`) pre-trained on too: the study's mixed
    training. By default each person's questions are a section of their page; `shuffled` puts them, in a random
    order, on pages of their own (`QUESTIONS_A_PAGE` a page, the subject and an entity answer linked), so that a
    question's neighbours are about other people and its subject is known only by its name."""
    pages = dict(world.pages)
    if shuffled:
        order = list(pairs)
        random.Random(seed).shuffle(order)
        for start in range(0, len(order), QUESTIONS_A_PAGE):
            lines = []
            for pair in order[start : start + QUESTIONS_A_PAGE]:
                answer = f"[[{pair.answer}]]" if pair.answer_is_entity else pair.answer
                lines.append(f"{pair.question.replace(pair.subject, f'[[{pair.subject}]]', 1)} {answer}.")
            pages[f"Questions {start // QUESTIONS_A_PAGE + 1}"] = " ".join(lines)
        return replace(world, pages=pages)
    for pair in pairs:
        answer = f"[[{pair.answer}]]" if pair.answer_is_entity else pair.answer
        section = "\n\n== Questions ==\n" if "== Questions ==" not in pages[pair.subject] else "\n"
        pages[pair.subject] += f"{section}{pair.question} {answer}."
    return replace(world, pages=pages)


def make_world(settings: Settings, seed: int, out: Path, varied: bool = True) -> dict:
    """The world, its dump and corpus (with its tokenizer), and the question files of the three groups."""
    biographies = settings.biographies if varied else 1
    world_settings = KnowledgeWorldSettings(settings.num_people, biographies, varied, fullname=settings.fullname)
    world = generate_knowledge_world(world_settings, seed=seed)
    splits = split_people(world, seed, settings.validation_fraction)
    read = world
    if settings.questions_on_pages:
        read = with_questions_in_pages(world, splits["train"], settings.shuffled_questions, seed)
    out.mkdir(parents=True, exist_ok=True)
    dump = write_mediawiki_dump(read, out / "wiki.xml.bz2")
    corpus = out / "corpus"
    if not (corpus / "entity_vocab.json").exists():
        build_corpus(dump, corpus, num_entities=100_000, num_proc=2, vocab_size=3000, seed=seed)
    files = {}
    for split, pairs in splits.items():
        files[split], files[f"{split}_links"] = write_released_format(pairs, split, out)
    return {"world": world, "corpus": corpus, "files": files, "splits": splits,
            "mixed_questions": settings.mixed_questions(files["train"])}  # fmt: skip
