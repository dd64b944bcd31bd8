"""EDMem's entity-intensive generation metrics as an `evaluate` module:
`edmem_hf.evaluation.load_metric("generation")`.

Loaded by path, so it works offline; the scoring is `edmem_hf.evaluation.generation_scores` (and `bertscore_f1`).
"""

import datasets
import evaluate

from edmem_hf.evaluation import bertscore_f1, generation_scores

_DESCRIPTION = """ROUGE-1/2/L F-measure and unigram F1 (best over the references), entity coverage (total and of
entities unseen in the input) and optionally BERTScore, in percent, on predictions with the mention markers <E_s>/<E_e>
removed, as in the EDMem paper (Zhang et al., EMNLP 2022). See docs/evaluation.md of edmem-hf."""

_KWARGS_DESCRIPTION = """
Args:
    predictions: list of generated texts (markers may be left in).
    references: list of reference texts, or of lists of references, one per prediction.
    reference_entities: optional list, one per prediction, of lists of gold entity names, one list per reference
        (the released `output_entity_name`); adds entity_coverage, entity_coverage_unseen and their counts.
    input_entities: with reference_entities, list of the entity names linked in each input (`entity_name`); the
        unseen coverage leaves them out. Required with reference_entities.
    aliases: optional {entity name: [surface forms]} for entity coverage.
    strip_creak_verdict: score CREAK explanations without their leading "This is true/false because".
    bertscore_model: optional model name (locally cached) or directory; adds bertscore_f1, raises
        edmem_hf.evaluation.MetricUnavailable when bert-score or the model is not available offline.
Returns:
    rouge1, rouge2, rougeL, f1, count (and entity_coverage, count_entity_coverage, entity_coverage_unseen,
    count_entity_coverage_unseen; bertscore_f1).
"""

_CITATION = """@inproceedings{zhang2022edmem,
  title={A Unified Encoder-Decoder Framework with Entity Memory},
  author={Zhang, Zhihan and Yu, Wenhao and Zhu, Chenguang and Jiang, Meng},
  booktitle={EMNLP},
  year={2022}
}"""


class EdmemGeneration(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=[
                datasets.Features(
                    {
                        "predictions": datasets.Value("string"),
                        "references": datasets.List(datasets.Value("string")),
                    }
                ),
                datasets.Features({"predictions": datasets.Value("string"), "references": datasets.Value("string")}),
            ],
        )

    def _compute(
        self,
        predictions,
        references,
        reference_entities=None,
        input_entities=None,
        aliases=None,
        strip_creak_verdict=False,
        bertscore_model=None,
    ):
        if len(predictions) != len(references):
            raise ValueError(f"{len(predictions)} predictions but {len(references)} references")
        records = [{"id": str(i), "output": output} for i, output in enumerate(references)]
        if reference_entities is not None:
            if input_entities is None:
                raise ValueError("reference_entities needs input_entities (the entities linked in each input)")
            if not len(reference_entities) == len(input_entities) == len(predictions):
                raise ValueError("reference_entities and input_entities need one entry per prediction")
            for record, gold, linked in zip(records, reference_entities, input_entities):
                record["output_entity_name"], record["entity_name"] = gold, linked
        elif aliases is not None or input_entities is not None:
            raise ValueError("aliases and input_entities apply to entity coverage, which needs reference_entities")
        predicted = {str(i): p for i, p in enumerate(predictions)}
        scores = generation_scores(records, predicted, strip_creak_verdict, aliases)
        if bertscore_model is not None:
            scores["bertscore_f1"] = bertscore_f1(records, predicted, bertscore_model, strip_creak_verdict)
        return scores
