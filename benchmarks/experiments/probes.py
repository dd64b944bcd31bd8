"""Memorisation probes of the knowledge world's pre-trained models: how often a model fills a masked fact of a
person's first biography (teacher-forced), with the encoder given nothing, and with the subject named to the encoder
only (what a question can read out); and whether the memory finds a person by name or by the facts around it."""

from __future__ import annotations

import re
from pathlib import Path

import torch
from transformers import AutoTokenizer

from edmem_hf import EDMemForConditionalGeneration, EDMemForEntityLinking
from edmem_hf.collator import EDMemMaskingCollator
from edmem_hf.configuration_edmem import ENTITY_END_TOKEN, ENTITY_START_TOKEN, EDMemConfig
from edmem_hf.knowledge_world import PERSON_ATTRIBUTES, PRONOUNS, TEMPLATES
from edmem_hf.task_features import in_running_text
from edmem_hf.toy_world import ToyEntity, ToyWorld

ENTITY_RELATIONS = tuple(relation for relation, _, is_entity in PERSON_ATTRIBUTES if is_entity)


def marked_biography(world: ToyWorld, person: str) -> str:
    """The person's first biography as the corpus marks it: links and the person's names `<E_s> ... <E_e>`."""
    entity = world.entity(person)
    text = world.pages[person].split("\n\n== ")[0]
    text = re.sub(r"\[\[([^\]|]+)\]\]", rf"{ENTITY_START_TOKEN} \1 {ENTITY_END_TOKEN}", text)
    names = re.compile(rf"\b({re.escape(person)}|{re.escape(entity.aliases[0])})\b")
    return names.sub(rf"{ENTITY_START_TOKEN} \1 {ENTITY_END_TOKEN}", text)


def _percent_by_kind(hits: dict[str, list[bool]]) -> dict[str, float]:
    """% of hits over every relation, over the entity relations and over the literal ones."""
    kinds = {"all": list(hits), "entity": list(ENTITY_RELATIONS),
             "literal": [relation for relation in hits if relation not in ENTITY_RELATIONS]}  # fmt: skip
    out = {}
    for kind, relations in kinds.items():
        values = [hit for relation in relations for hit in hits[relation]]
        out[kind] = round(100 * sum(values) / len(values), 2)
    return out


@torch.no_grad()
def _probe_target(spans: EDMemMaskingCollator | None, ids: torch.Tensor, inside: list[int]):
    """What the decoder is teacher-forced on to fill the masked positions `inside` of `ids`, and where in it the
    filled tokens are: the passage itself (the paper's target), or with `spans` (a collator of the `masked_spans`
    target) the masked span alone, as pre-training made it."""
    return (ids, inside) if spans is None else spans.masked_span_target(ids, inside)


def _span_collator(tokenizer, decoder_target: str) -> EDMemMaskingCollator | None:
    """The collator whose targets the probes ask a `--decoder_target masked_spans` model for (None: the passage)."""
    return EDMemMaskingCollator(tokenizer, decoder_target="masked_spans") if decoder_target == "masked_spans" else None


def memorisation(model_dir: Path, world: ToyWorld, people: dict[str, list[str]], decoder_target: str = "passage"
                 ) -> dict:  # fmt: skip
    """How often the pre-trained model fills a masked fact of a person's first biography (read in pre-training):
    every token of the value masked, the value's tokens predicted (teacher-forced decoder for the seq2seq models,
    the masked-LM head for EncMem), a hit when all are right. By half (`people`: half -> names) and relation.
    For a model with a memory, also how often the memory's top entity at a masked entity value is that value.
    For the seq2seq models, also `decoder_alone`: the same facts filled with every encoder input token masked, what
    the decoder holds keyed on its own prefix, which a question (whose subject only the encoder reads) cannot use;
    and `question_form`: the facts filled with the subject named to the encoder only (`question_form_hits`), what
    a question can read out of what was memorised. For a model with a memory, also `memory_finds_the_person`.
    `decoder_target`: what the model's pre-training decoder wrote (`--decoder_target`), which the probes ask for."""
    config = EDMemConfig.from_pretrained(model_dir)
    encoder_only = config.variant == "encmem"
    model = (EDMemForEntityLinking if encoder_only else EDMemForConditionalGeneration).from_pretrained(model_dir)
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    has_memory = config.variant != "encdec"
    spans = _span_collator(tokenizer, decoder_target)
    result = {}
    for half, names in people.items():
        hits: dict[str, list[bool]] = {}
        decoder_alone: list[bool] = []
        linked: list[bool] = []
        question_form: dict[str, list[bool]] = {}
        for person in names:
            if not encoder_only:
                found = question_form_hits(model, tokenizer, world.entity(person), spans)
                for relation, hit in found.items():
                    question_form.setdefault(relation, []).append(hit)
            text = marked_biography(world, person)
            encoded = tokenizer(text, return_offsets_mapping=True, return_tensors="pt")
            ids, offsets = encoded.input_ids[0], encoded.offset_mapping[0].tolist()
            blank = torch.full_like(ids, tokenizer.mask_token_id)
            blank[[0, -1]] = ids[[0, -1]]  # <s> and </s> kept: the encoder reads nothing else
            alone_of: dict[tuple[int, ...], torch.Tensor] = {}  # the blank input's fill, by target (the passage: one)
            for relation, _, is_entity in PERSON_ATTRIBUTES:
                value = world.entity(person).attributes[relation]
                match = re.search(rf"(?<![\w-]){re.escape(value)}(?![\w-])", text, flags=re.IGNORECASE)
                if match is None:
                    raise RuntimeError(f"{person!r}'s first biography does not state {relation} = {value!r}")
                inside = [i for i, (s, e) in enumerate(offsets) if e > s and s < match.end() and e > match.start()]
                masked = ids.clone()
                masked[inside] = tokenizer.mask_token_id
                target, filled = _probe_target(spans, ids, inside)
                labels = {} if encoder_only else {"labels": target[None]}  # the decoder teacher-forced
                output = model(input_ids=masked[None], output_attended_entities=is_entity and has_memory, **labels)
                predicted = output.logits[0].argmax(-1)
                hits.setdefault(relation, []).append(bool((predicted[filled] == target[filled]).all()))
                if not encoder_only:
                    key = tuple(target.tolist())
                    if key not in alone_of:
                        alone_of[key] = model(input_ids=blank[None], **labels).logits[0].argmax(-1)
                    alone = alone_of[key]
                    decoder_alone.append(bool((alone[filled] == target[filled]).all()))
                if is_entity and has_memory:
                    access = output.attended_entities if encoder_only else output.encoder_attended_entities
                    position = inside[0] - 1  # the value's <E_s>
                    row = (access.positions[:, 1] == position).nonzero()[0, 0]
                    linked.append(model.entity_vocab.name_of(int(access.top_entity_ids[row, 0])) == value)
        per_relation = {relation: round(100 * sum(v) / len(v), 2) for relation, v in hits.items()}
        entity = [hit for relation in ENTITY_RELATIONS for hit in hits[relation]]
        literal = [hit for relation, v in hits.items() if relation not in ENTITY_RELATIONS for hit in v]
        result[half] = {"all": round(100 * sum(map(sum, hits.values())) / sum(map(len, hits.values())), 2),
                        "entity": round(100 * sum(entity) / len(entity), 2),
                        "literal": round(100 * sum(literal) / len(literal), 2), "by_relation": per_relation}  # fmt: skip
        if decoder_alone:
            result[half]["decoder_alone"] = round(100 * sum(decoder_alone) / len(decoder_alone), 2)
        if question_form:
            result[half]["question_form"] = _percent_by_kind(question_form)
        if has_memory:
            result[half]["memory_finds_the_person"] = memory_finds_the_person(model, tokenizer, world, names)
        if linked:
            result[half]["memory_names_the_masked_entity"] = round(100 * sum(linked) / len(linked), 2)
    return result


def _value_positions(tokenizer, text: str, value: str) -> tuple[torch.Tensor, list[int]]:
    """`text`'s token ids and the positions of the tokens of `value` (its first whole-word occurrence)."""
    encoded = tokenizer(text, return_offsets_mapping=True, return_tensors="pt")
    match = re.search(rf"(?<![\w-]){re.escape(value)}(?![\w-])", text, flags=re.IGNORECASE)
    if match is None:
        raise RuntimeError(f"{text!r} does not state {value!r}")
    offsets = encoded.offset_mapping[0].tolist()
    return encoded.input_ids[0], [
        i for i, (s, e) in enumerate(offsets) if e > s and s < match.end() and e > match.start()
    ]


@torch.no_grad()
def question_form_hits(model, tokenizer, person: ToyEntity, spans: EDMemMaskingCollator | None = None
                       ) -> dict[str, bool]:  # fmt: skip
    """Per relation: does the pre-trained seq2seq model fill the value when only its encoder names the subject?

    The encoder reads a statement of the fact (the first template) with the subject marked and the value masked;
    the decoder is teacher-forced on the same statement with the pronoun as its subject, so that, as when it answers
    a question, it can reach the fact only through the encoder (with `spans`, a collator of the `masked_spans`
    target, the decoder writes the masked value alone). A hit when every token of the value is right."""
    subject_pronoun, _ = PRONOUNS[person.attributes["pronoun"]]
    subject = f"{ENTITY_START_TOKEN} {person.name} {ENTITY_END_TOKEN}"
    hits = {}
    for relation, _, is_entity in PERSON_ATTRIBUTES:
        value = person.attributes[relation]
        marked = f"{ENTITY_START_TOKEN} {value} {ENTITY_END_TOKEN}" if is_entity else value
        template = TEMPLATES[relation][0]
        # in running text, as a question is tokenised: " She", not the sentence-initial "S" "he"
        target = in_running_text(template.format(S=subject_pronoun.capitalize(), s=subject_pronoun, V=marked))
        source = in_running_text(template.format(S=subject, s=subject, V=marked))
        source, masked = _value_positions(tokenizer, source, value)
        source = source.clone()
        source[masked] = tokenizer.mask_token_id
        if spans is None:
            target_ids, inside = _value_positions(tokenizer, target, value)
        else:
            target_ids, inside = spans.masked_span_target(source, masked)
        predicted = model(input_ids=source[None], labels=target_ids[None]).logits[0].argmax(-1)
        hits[relation] = bool((predicted[inside] == target_ids[inside]).all())
    return hits


PERSON_CONTEXTS = {  # how a person is named to the memory in `memory_finds_the_person`
    "name_alone": lambda world, person: f"{ENTITY_START_TOKEN} {person} {ENTITY_END_TOKEN}",
    "question": lambda world, person: in_running_text(
        PERSON_ATTRIBUTES[0][1].format(f"{ENTITY_START_TOKEN} {person} {ENTITY_END_TOKEN}")
    ),
    "first_biography": lambda world, person: marked_biography(world, person),
}


@torch.no_grad()
def memory_finds_the_person(model, tokenizer, world: ToyWorld, people: list[str]) -> dict[str, float]:
    """How often the memory's top entity at a person's first mention is the person, when the person is named alone,
    in a question, or in their first biography (which also states their facts): whether the memory finds a person
    by name or by the facts around the name."""
    found = {}
    for context, text_of in PERSON_CONTEXTS.items():
        hits = []
        for person in people:
            batch = tokenizer([text_of(world, person)], return_tensors="pt", truncation=True,
                              max_length=model.config.max_position_embeddings)  # fmt: skip
            if isinstance(model, EDMemForEntityLinking):
                access = model(**batch, output_attended_entities=True).attended_entities
            else:
                access = model.get_encoder()(**batch, output_attended_entities=True).memory_access
            hits.append(model.entity_vocab.name_of(int(access.top_entity_ids[0, 0])) == person)
        found[context] = round(100 * sum(hits) / len(hits), 2)
    return found
