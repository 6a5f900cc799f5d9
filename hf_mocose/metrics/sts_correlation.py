"""STS correlation: Spearman and Pearson (x100) between predicted and gold similarity scores.

An `evaluate` metric script, so `evaluate.load(hf_mocose.metrics.sts_correlation_path())` works offline, unlike
`evaluate.load("spearmanr")`. It scores with `hf_mocose.metrics.score_correlation` (absolute import: `evaluate.load`
imports the script outside the package), as `hf-mocose evaluate` does.
"""

import datasets
import evaluate

from hf_mocose.metrics import score_correlation

_CITATION = """\
@inproceedings{cer-etal-2017-semeval,
    title = "{S}em{E}val-2017 Task 1: Semantic Textual Similarity Multilingual and Crosslingual Focused Evaluation",
    author = "Cer, Daniel and Diab, Mona and Agirre, Eneko and Lopez-Gazpio, I{\\~n}igo and Specia, Lucia",
    booktitle = "Proceedings of SemEval-2017",
    year = "2017",
}
"""

_DESCRIPTION = """\
Spearman and Pearson correlation between predicted similarities (for sentence embeddings: the
cosine similarity of each pair) and gold STS scores, both multiplied by 100 as in the SentEval,
SimCSE and MoCoSE papers. Spearman is the headline number.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `float`): predicted similarity per pair, shape (n,).
    references (`list` of `float`): gold similarity per pair, shape (n,).
Returns:
    spearman (`float`): Spearman rank correlation x100.
    pearson (`float`): Pearson correlation x100.
    n (`int`): number of pairs.
    Both correlations are nan when the predictions are constant (up to float rounding, 1e-9) or the
    references are; fewer than 2 pairs is a ValueError.
Examples:
    >>> metric = evaluate.load(hf_mocose.metrics.sts_correlation_path())
    >>> metric.compute(predictions=[0.1, 0.5, 0.9], references=[1.0, 2.0, 5.0])
    {'spearman': 100.0, 'pearson': 96.07..., 'n': 3}
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class StsCorrelation(evaluate.Metric):
    """Spearman/Pearson x100 of predicted vs gold STS scores."""

    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION, citation=_CITATION, inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({"predictions": datasets.Value("float64"),
                                        "references": datasets.Value("float64")}),
            reference_urls=["https://github.com/facebookresearch/SentEval"])

    def _compute(self, predictions, references):
        return score_correlation(predictions, references)
