"""What is refused before any work, in one line: a model that cannot be loaded, and Trainer switches that cannot work.

A model folder must hold whole weights; a Hub id is asked of the Hub with one metadata request, no retries
(`from_pretrained` would retry an unreachable Hub for ~25 s and end in a chain of tracebacks).

Most Trainer switches work with MoCoSE as they are (docs/trainer_switches.md); `check_trainer_switches` refuses
those that would crash at some later step or be silently ignored: NEFTune, label smoothing, fp16 on the CPU,
DDP's unused-parameter search under FGSM "previous", sequence lengths beyond the encoder's position limit, a
`metric_for_best_model` that `evaluate()` never returns.
"""

from __future__ import annotations

from pathlib import Path

from ..models.encoding import check_length_fits_encoder
from ..launch.checkpoints import check_weights_complete
from .sts_evaluation import STS_EVALUATOR_NAME

HUB_CHECK_TIMEOUT_S = 10  # huggingface_hub's own metadata timeout (HF_HUB_ETAG_TIMEOUT)
# What `MoCoSETrainer.evaluate` scores (trainer/sts_evaluation.py), as `{prefix}_{name}`.
STS_METRICS = (f"{STS_EVALUATOR_NAME}_spearman", f"{STS_EVALUATOR_NAME}_pearson")


def check_model_source(name_or_path: str, field: str = "model_name_or_path", location: dict | None = None) -> None:
    """Fails with one message naming `name_or_path` unless it is a model folder with whole weights or a Hub id the
    Hub (offline: the local cache) has. `location`: `revision`, `subfolder`, `token`, as `from_pretrained` takes."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        check_weights_complete(path, action="start from")
        return
    if path.exists():
        raise NotADirectoryError(f"{field} {name_or_path!r} is a file: give the folder that holds config.json.")
    try:
        validate_repo_id(name_or_path)
    except HFValidationError:
        problem = ("no such folder, and not a Hub id that can be reached offline (a Hub id looks like 'namespace/name'). "
                   "Give the path of a model folder, or download the model while online first.")
    else:
        problem = hub_model_problem(name_or_path, **(location or {}))
    if problem is not None:  # raised here, outside any except block: one message, no chained traceback
        raise FileNotFoundError(f"{field} {name_or_path!r}: {problem}")


def _in_cache(repo_id: str, filename: str, revision: str | None) -> bool:
    from huggingface_hub import try_to_load_from_cache
    return isinstance(try_to_load_from_cache(repo_id, filename, revision=revision), str)


def hub_model_problem(repo_id: str, revision: str | None = None, subfolder: str | None = None,
                      token: str | bool | None = None, **_) -> str | None:
    """What stops `from_pretrained(repo_id)`, in words that say which case it is and what to do; None if nothing.
    Offline (HF_HUB_OFFLINE=1) or with no network, the local Hugging Face cache answers instead."""
    from huggingface_hub import get_hf_file_metadata, get_token, hf_hub_url
    from huggingface_hub.errors import (GatedRepoError, OfflineModeIsEnabled, RepositoryNotFoundError,
                                        RevisionNotFoundError)

    from ..compat import HUB_TRANSPORT_ERRORS, RemoteEntryNotFoundError, hub_offline
    filename = f"{subfolder.strip('/')}/config.json" if subfolder else "config.json"
    if hub_offline():
        return None if _in_cache(repo_id, filename, revision) else (
            "no such folder, and not a Hub id that can be reached offline (offline mode (HF_HUB_OFFLINE=1) is on and "
            "it is not in the local Hugging Face cache). Give the path of a model folder, or download the model while "
            "online first.")
    try:
        get_hf_file_metadata(hf_hub_url(repo_id, filename, revision=revision), token=token, timeout=HUB_CHECK_TIMEOUT_S)
    except (*HUB_TRANSPORT_ERRORS, OfflineModeIsEnabled) as err:
        if _in_cache(repo_id, filename, revision):
            return None  # from_pretrained falls back to the cached copy
        reason = " ".join(str(err).split()) or type(err).__name__
        return (f"no network: the Hugging Face Hub cannot be reached ({reason}) and the model is not in the local "
                "cache. Give the path of a model folder, or download the model where there is network first.")
    except GatedRepoError:
        login = "your token has no access to it" if get_token() or token else "no Hub token is set"
        return (f"a gated repo and {login}: accept its conditions on https://huggingface.co/{repo_id}, then log in "
                "with a token that has access (hf auth login, or HF_TOKEN).")
    except RepositoryNotFoundError:
        if get_token() or token:
            return ("no such model repo on the Hugging Face Hub, or a private one your token cannot read: check the "
                    "id for a typo, or give the path of a model folder.")
        return ("no such model repo on the Hugging Face Hub (a typo?), or a private one, which needs a token "
                "(hf auth login, or HF_TOKEN): check the id, or give the path of a model folder.")
    except RevisionNotFoundError:
        return f"the Hub repo has no revision {revision!r}: give a branch, tag or commit it has."
    except RemoteEntryNotFoundError:
        where = f"revision {revision!r} of " if revision else ""
        return (f"{where}the Hub repo has no {filename}: it is not a transformers model"
                f"{'' if subfolder else ' (if the model is in a sub-folder, set subfolder in model_init_kwargs)'}.")
    return None


def check_trainer_switches(trainer) -> None:
    """Raises a one-line `ValueError` naming the first switch of `trainer.args` that cannot work (module docstring)."""
    args = trainer.args
    if args.neftune_noise_alpha is not None:
        raise ValueError(f"neftune_noise_alpha={args.neftune_noise_alpha!r} (NEFTune) is noise on the word embeddings "
                         "for instruction fine-tuning of generative models; MoCoSE perturbs those embeddings with FGSM "
                         "instead (fgsm_mode, fgsm_epsilon). Leave neftune_noise_alpha unset.")
    if args.label_smoothing_factor:
        raise ValueError(f"label_smoothing_factor={args.label_smoothing_factor!r} smooths the labels of a "
                         "classification loss; the contrastive InfoNCE loss has none, so it would do nothing. Set "
                         "label_smoothing_factor to 0.")
    if args.fp16 and args.device.type == "cpu":  # accelerate ignores it there: no autocast, no grad scaler
        raise ValueError("fp16=True does nothing when training on the CPU: accelerate runs fp32 there, without "
                         "autocast or loss scaling. Use bf16=True for mixed precision on the CPU, or train on a GPU.")
    if args.ddp_find_unused_parameters and args.world_size > 1 and args.fgsm_mode == "previous":
        raise ValueError("ddp_find_unused_parameters=True: DDP then hands the loss copies of the model's outputs, and "
                         "fgsm_mode 'previous' reads no gradient on them. Every MoCoSE parameter is used each step: "
                         "leave ddp_find_unused_parameters False (or use fgsm_mode 'exact' or 'off').")
    config, tokenizer = trainer.accelerator.unwrap_model(trainer.model).config, trainer.processing_class
    check_length_fits_encoder("max_seq_length", config.max_seq_length, config, tokenizer, "for training")
    if args.eval_max_seq_length is not None:
        check_length_fits_encoder("eval_max_seq_length", args.eval_max_seq_length, config, tokenizer, "for evaluation")
    if trainer.compute_metrics is None:  # a user's compute_metrics may add metrics we cannot name
        check_metric_for_best_model(args, trainer.eval_dataset)


def check_metric_for_best_model(args, eval_dataset) -> None:
    """Refuses a `metric_for_best_model` the STS evaluation never returns (a KeyError mid-training otherwise)."""
    metric = args.metric_for_best_model
    if metric is None or args.eval_strategy == "no":
        return
    prefixes = [f"eval_{name}" for name in eval_dataset] if isinstance(eval_dataset, dict) else ["eval"]
    widths = [f"_dim{dim}" for dim in (args.matryoshka_dims or [])[1:]]  # sts_evaluation's per-width metrics
    produced = [f"{prefix}_{name}{width}" for prefix in prefixes for width in ["", *widths] for name in STS_METRICS]
    if (metric if metric.startswith("eval_") else f"eval_{metric}") not in produced:
        raise ValueError(f"metric_for_best_model={metric!r} is never computed: MoCoSETrainer's evaluation returns "
                         f"{', '.join(produced)} (Spearman and Pearson x 100 on the STS pairs; the eval_ prefix may be "
                         "left out).")
