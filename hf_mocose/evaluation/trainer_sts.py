"""Moved: the trainer's STS evaluation is the core module `hf_mocose.trainer_evaluation`.

Re-exported here so that imports written against the old location keep working.
"""

from hf_mocose.trainer_evaluation import (
    STS_COLUMNS,
    STS_EVALUATOR_NAME,
    MoCoSESimilarityEvaluator,
    STSEvaluationMixin,
    check_sts_dataset,
    eval_max_length,
    stsb_dev_dataset,
)

__all__ = [
    "STS_COLUMNS",
    "STS_EVALUATOR_NAME",
    "MoCoSESimilarityEvaluator",
    "STSEvaluationMixin",
    "check_sts_dataset",
    "eval_max_length",
    "stsb_dev_dataset",
]
