"""EDMem's open-domain QA exact match as an `evaluate` module: `edmem_hf.evaluation.load_metric("qa")`.

Loaded by path, so it works offline; the scoring is `edmem_hf.evaluation.qa_scores`.
"""

import datasets
import evaluate

from edmem_hf.evaluation import qa_scores

_DESCRIPTION = """Exact match in percent, best over each question's answers, after SQuAD's answer normalisation with
the mention markers <E_s>/<E_e> removed (as in the EDMem paper, Zhang et al., EMNLP 2022)."""

_KWARGS_DESCRIPTION = """
Args:
    predictions: list of generated answers (markers may be left in).
    references: list of lists of acceptable answers, one list per prediction.
    answer_is_entity: optional list of booleans, one per prediction: whether the gold answer is an entity; adds
        exact_match_entity / exact_match_non_entity and their counts (the paper's Table 2 split).
Returns:
    exact_match, count (and with answer_is_entity: exact_match_entity, count_entity, exact_match_non_entity,
    count_non_entity).
"""

_CITATION = """@inproceedings{zhang2022edmem,
  title={A Unified Encoder-Decoder Framework with Entity Memory},
  author={Zhang, Zhihan and Yu, Wenhao and Zhu, Chenguang and Jiang, Meng},
  booktitle={EMNLP},
  year={2022}
}"""


class EdmemQa(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {"predictions": datasets.Value("string"), "references": datasets.List(datasets.Value("string"))}
            ),
        )

    def _compute(self, predictions, references, answer_is_entity=None):
        if len(predictions) != len(references):
            raise ValueError(f"{len(predictions)} predictions but {len(references)} references")
        records = [{"id": str(i), "answer": answers} for i, answers in enumerate(references)]
        links = None
        if answer_is_entity is not None:
            if len(answer_is_entity) != len(predictions):
                raise ValueError(f"{len(predictions)} predictions but {len(answer_is_entity)} answer_is_entity flags")
            links = {str(i): ({} if is_entity else None) for i, is_entity in enumerate(answer_is_entity)}
        return qa_scores(records, {str(i): p for i, p in enumerate(predictions)}, links)
