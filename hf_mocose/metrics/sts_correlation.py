"""STS correlation: Spearman and Pearson (x100) between predicted and gold similarity scores.

A self-contained `evaluate` metric script (only `evaluate`, `datasets` and `scipy` imports), so
`evaluate.load(path_to_this_file)` works offline, unlike `evaluate.load("spearmanr")`, which needs
the Hugging Face Hub. Get the path with `hf_mocose.metrics.sts_correlation_path()`.
"""

import datasets
import evaluate
import numpy as np
from scipy.stats import pearsonr, spearmanr

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
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {"predictions": datasets.Value("float64"), "references": datasets.Value("float64")}
            ),
            reference_urls=["https://github.com/facebookresearch/SentEval"],
        )

    def _compute(self, predictions, references):
        predictions = np.asarray(predictions, dtype=np.float64)
        references = np.asarray(references, dtype=np.float64)
        if len(predictions) < 2:
            raise ValueError("STS correlation needs at least 2 pairs")
        if np.ptp(predictions) == 0 or np.ptp(references) == 0:
            # A constant input has no correlation; nan rather than a scipy warning.
            return {"spearman": float("nan"), "pearson": float("nan"), "n": int(len(predictions))}
        return {
            "spearman": float(spearmanr(predictions, references)[0] * 100),
            "pearson": float(pearsonr(predictions, references)[0] * 100),
            "n": int(len(predictions)),
        }
