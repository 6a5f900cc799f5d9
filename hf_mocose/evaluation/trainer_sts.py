"""Moved: the trainer's STS evaluation is the core module `hf_mocose.trainer.sts_evaluation`.

Re-exported here (every name in its `__all__`) so that imports written against the old location keep working.
"""

from hf_mocose.trainer.sts_evaluation import *  # noqa: F401,F403
from hf_mocose.trainer.sts_evaluation import __all__  # noqa: F401
