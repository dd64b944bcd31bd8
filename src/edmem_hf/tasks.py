"""The paper's fine-tuning tasks in one import: the readers of the released task files (`task_files.py`), their
rows as training features with the collator (`task_features.py`), and exact match (`evaluation.py`).

    from edmem_hf.tasks import read_qa, encode_qa_record, EDMemSeq2SeqCollator, exact_match, marked_batch
"""

from __future__ import annotations

from .configuration_edmem import IGNORE_INDEX
from .evaluation import exact_match, normalize_answer, strip_generation
from .task_features import (
    EDMemSeq2SeqCollator,
    QAExample,
    ResampledRows,
    encode_generation_record,
    encode_qa_example,
    encode_qa_record,
    encode_static_linking_record,
    in_running_text,
    marked_batch,
)
from .task_files import (
    BadRecordError,
    default_answer_links,
    mark_mentions,
    read_answer_links,
    read_generation,
    read_jsonl,
    read_qa,
)

__all__ = [
    "IGNORE_INDEX",
    "BadRecordError",
    "EDMemSeq2SeqCollator",
    "QAExample",
    "ResampledRows",
    "default_answer_links",
    "encode_generation_record",
    "encode_qa_example",
    "encode_qa_record",
    "encode_static_linking_record",
    "exact_match",
    "in_running_text",
    "mark_mentions",
    "marked_batch",
    "normalize_answer",
    "read_answer_links",
    "read_generation",
    "read_jsonl",
    "read_qa",
    "strip_generation",
]
