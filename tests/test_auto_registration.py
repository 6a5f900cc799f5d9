"""`import hf_mocose` is light, yet transformers' Auto classes and sentence-transformers load MoCoSE checkpoints after it.

Each case runs in a fresh interpreter: what is imported first is the point.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

FINAL = Path(__file__).resolve().parent / "fixtures" / "saved_before_move" / "mocose" / "final"

CASES = {
    "import hf_mocose loads neither torch nor transformers":
        "import sys, hf_mocose\nprint(sorted(m for m in ('torch', 'transformers') if m in sys.modules))",
    "AutoConfig and AutoModel imported after hf_mocose":
        "import hf_mocose\nfrom transformers import AutoConfig, AutoModel\n"
        "print([type(AutoConfig.from_pretrained(FINAL)).__name__, type(AutoModel.from_pretrained(FINAL)).__name__])",
    "AutoConfig alone":
        "import hf_mocose\nfrom transformers import AutoConfig\nprint([type(AutoConfig.from_pretrained(FINAL)).__name__])",
    "transformers imported before hf_mocose":
        "from transformers import AutoModel\nimport hf_mocose\nprint([type(AutoModel.from_pretrained(FINAL)).__name__])",
    "SentenceTransformer on a checkpoint":
        "import hf_mocose\nfrom sentence_transformers import SentenceTransformer\n"
        "print([SentenceTransformer(FINAL, device='cpu').encode(['A sentence.']).shape[-1]])",
}
EXPECTED = {
    "import hf_mocose loads neither torch nor transformers": "[]",
    "AutoConfig and AutoModel imported after hf_mocose": "['MoCoSEConfig', 'MoCoSEModel']",
    "AutoConfig alone": "['MoCoSEConfig']",
    "transformers imported before hf_mocose": "['MoCoSEModel']",
    "SentenceTransformer on a checkpoint": "[16]",  # the fixture's hidden size
}


# With peft installed (as most GPU images have it; .ci/run installs it in its floors stage), transformers.trainer_utils imports peft, which
# imports the auto classes: they load while that module, or one of ours importing TrainerCallback, is half-initialised.
# Each of these failed so before the registration waited for the imports under way to settle.
AUTO_MODEL = "from transformers import AutoModel\nprint([type(AutoModel.from_pretrained(FINAL)).__name__])"
PEFT_CASES = {
    "with peft: the EMA module imported first": "import hf_mocose.models.ema\n" + AUTO_MODEL,
    "with peft: the encoder module imported first": "import hf_mocose.models.encoder_init\n" + AUTO_MODEL,
    "with peft: MoCoSETrainer imported first": "from hf_mocose import MoCoSETrainer\n" + AUTO_MODEL,
    "with peft: Trainer imported after hf_mocose": "import hf_mocose\nfrom transformers import Trainer\n" + AUTO_MODEL,
}
CASES.update(PEFT_CASES)
EXPECTED.update(dict.fromkeys(PEFT_CASES, "['MoCoSEModel']"))


@pytest.mark.parametrize("case", list(CASES))
def test_the_mocose_type_is_known_after_import_hf_mocose(case):
    if case in PEFT_CASES:
        pytest.importorskip("peft", reason="peft is not installed (.ci/run installs it in its floors stage)")
    code = f"FINAL = {str(FINAL)!r}\n" + CASES[case]
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == EXPECTED[case]
