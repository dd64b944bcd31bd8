"""The entity memory's masks and what it finds: the authors' memory mask files (1 for a hidden entity), and the
memory's top entity at each question's marked subject (recall, and the misses that share a word of the name)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import AutoTokenizer

from edmem_hf import EDMemForConditionalGeneration, EntityVocab
from edmem_hf.research.diagnostics import first_mention_tops
from edmem_hf.task_features import in_running_text
from edmem_hf.tasks import read_jsonl, read_qa


def save_entity_mask(hidden: torch.Tensor, path: Path) -> Path:
    """The authors' memory mask file (their get_memory_mask.py, read by `--entity_mask_file`): a long tensor, 1 for a
    hidden entity."""
    torch.save(hidden.long(), path)
    return path


def write_entity_mask(num_entities: int, visible_fraction: float, seed: int, path: Path) -> Path:
    """The authors' random memory mask: each entity hidden with probability `1 - visible_fraction`, saved."""
    return save_entity_mask(random_entity_mask(num_entities, visible_fraction, seed), path)


def hidden_rows(num_entities: int, names: list[str] | None, vocab) -> torch.Tensor:
    """1 for each entity of `names` (every entity when None), 0 for the others."""
    if names is None:
        return torch.ones(num_entities, dtype=torch.long)
    hidden = torch.zeros(num_entities, dtype=torch.long)
    hidden[[vocab.id_of(name) for name in names]] = 1
    return hidden


def random_entity_mask(num_entities: int, visible_fraction: float, seed: int) -> torch.Tensor:
    """The authors' random memory mask: 1 for a hidden entity, each hidden with probability `1 - visible_fraction`."""
    generator = torch.Generator().manual_seed(seed)
    return (torch.rand(num_entities, generator=generator) >= visible_fraction).long()


@torch.no_grad()
def memory_tops_and_subjects(
    model_dir: Path, data_file: Path, hidden: Sequence[str] = ()
) -> tuple[list[str | None], list[str]]:
    """For each question (file order): the memory's top entity at its marked subject (`memory_top_names`), and the
    subject. `hidden`: names of entities whose rows are hidden from the memory meanwhile."""
    model = EDMemForConditionalGeneration.from_pretrained(model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if model.config.name_guided_read:
        model.name_candidates(tokenizer)
    if hidden:
        model.set_entity_mask(hidden_rows(model.config.entity_vocab_size, list(hidden), model.entity_vocab) == 0)
    subjects = [record["link_target"][0] for record in read_jsonl(data_file)]
    return memory_top_names(model, tokenizer, data_file), subjects


def memory_hits(model_dir: Path, data_file: Path, hidden: Sequence[str] = ()) -> list[bool]:
    """For each question (file order): is the memory's top entity at the marked subject the subject?"""
    tops, subjects = memory_tops_and_subjects(model_dir, data_file, hidden)
    return [top == subject for top, subject in zip(tops, subjects)]


def memory_top_names(model, tokenizer, data_file: Path) -> list[str | None]:
    """For each question (file order): the name of the encoder memory's top entity at its marked subject, as `model`
    (in eval mode, with its entity mask) finds it; None where the question has no marked subject."""
    rows = read_qa(data_file, model.entity_vocab)
    found = first_mention_tops(model, tokenizer, [in_running_text(q) for q in rows["question"]])
    tops = {qid: None if top is None else model.entity_vocab.name_of(top) for qid, top in zip(rows["id"], found)}
    return [tops.get(record["id"]) for record in read_jsonl(data_file)]  # the first mention: the subject


def memory_finding(model_dir: Path, data_file: Path, hidden: list[str] | None = None) -> dict[str, float]:
    """`recall`: how often the memory's top entity at a question's marked subject is the subject (%);
    `misses_sharing_a_name_word`: how often it is another entity whose name shares a word with the subject's (%, of
    all the questions): whether a query that misses is keyed on one word of the name. `hidden`: names of entities
    whose rows are hidden meanwhile."""
    tops, subjects = memory_tops_and_subjects(model_dir, data_file, hidden or ())
    misses = [(top, subject) for top, subject in zip(tops, subjects) if top != subject]
    sharing = sum(top is not None and bool(set(top.split()) & set(subject.split())) for top, subject in misses)
    return {
        "recall": round(100 * (1 - len(misses) / len(subjects)), 2),
        "misses_sharing_a_name_word": round(100 * sharing / len(subjects), 2),
    }


@torch.no_grad()
def subject_queries(model, tokenizer, data_file: Path) -> tuple[list[str], torch.Tensor]:
    """The encoder memory's query at each question's marked subject (file order) for `model` in eval mode: the
    subjects' names and the `(questions, entity_embed_dim)` queries."""
    encoder = model.get_encoder()
    captured = []
    hook = encoder.memory.query_proj.register_forward_hook(lambda module, inputs, output: captured.append(output))
    names, queries = [], []
    for record, question in zip(read_jsonl(data_file), read_qa(data_file, model.entity_vocab)["question"]):
        captured.clear()
        encoder(**tokenizer([in_running_text(question)], return_tensors="pt"))
        names.append(record["link_target"][0])
        queries.append(captured[0][0])  # the first mention of the question is its subject
    hook.remove()
    return names, torch.stack(queries)


def practice_rows_mask(model_dir: Path, practice: list[str]) -> Path:
    """A memory mask file (`--entity_mask_file`) hiding the practice people's rows from the model's memory: they are
    scaffolding of the writer's training, asked nothing at test, and their written rows take other people's queries."""
    vocab = EntityVocab.load(model_dir)
    return save_entity_mask(hidden_rows(len(vocab), practice, vocab), model_dir / "practice_rows_hidden_mask.pt")
