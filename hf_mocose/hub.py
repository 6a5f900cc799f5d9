"""Upload exports (and training checkpoints) to the Hugging Face Hub through `huggingface_hub`.

    hf-mocose push OUTPUT_DIR --repo_id user/name [--private] [--revision BRANCH] [--dry_run]

Repository layout this package writes (so `SentenceTransformer(repo_id)` always works):

    /                      the sentence-transformers export + README.md card   (publish_final_model, push)
    mocose/                the full MoCoSE model (config.json with model_type "mocose", weights, tokenizer),
                           for continued training: MoCoSEModel.from_pretrained(repo_id, subfolder="mocose")
    last-checkpoint/       the latest resumable training checkpoint   (hub_strategy="checkpoint")
    checkpoint-N/          every resumable training checkpoint        (hub_strategy="all_checkpoints")

The token comes from huggingface_hub's usual sources (HF_TOKEN, `hf auth login` cache) unless
passed explicitly; it is never printed, logged or written anywhere.
"""

from __future__ import annotations

import os
from pathlib import Path

MOCOSE_SUBFOLDER = "mocose"
# Training-loop internals that are never uploaded with a checkpoint's model files.
CHECKPOINT_IGNORE = ["_*", ".*"]


class HubPushError(RuntimeError):
    """An upload failed (no token, offline mode, HTTP error); the local folder is untouched."""


def validate_repo_id(repo_id: str) -> str:
    """Returns `repo_id` if it is `namespace/name`; raises a `ValueError` naming it otherwise.

    huggingface_hub's `validate_repo_id` checks the characters; the namespace is required here because
    a bare name would land in whatever account the token belongs to.
    """
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id as check_characters

    try:
        valid = isinstance(repo_id, str) and repo_id.count("/") == 1
        if valid:
            check_characters(repo_id)
    except HFValidationError:
        valid = False
    if not valid:
        raise ValueError(
            f"Invalid repo id {repo_id!r}: expected 'namespace/name' (your user or organisation name, a slash, and a "
            "model name of letters, digits, '-', '_' or '.', without '--' or '..'), e.g. 'alice/mocose-bert-base'."
        )
    return repo_id


def list_upload_files(folder: str | os.PathLike, ignore_patterns: list[str] | None = None) -> list[tuple[str, int]]:
    """`(path_in_repo, size)` for every file `upload_folder` would send, with the same filtering."""
    from huggingface_hub.utils import filter_repo_objects
    from huggingface_hub.utils._paths import DEFAULT_IGNORE_PATTERNS

    root = Path(folder).expanduser().resolve()
    files = {p.relative_to(root).as_posix(): p for p in sorted(root.glob("**/*")) if p.is_file()}
    kept = filter_repo_objects(files, ignore_patterns=[*(ignore_patterns or []), *DEFAULT_IGNORE_PATTERNS])
    return [(path, files[path].stat().st_size) for path in kept]


def _resolve_token(token: str | None) -> str:
    from huggingface_hub import get_token

    token = token or get_token()
    if not token:
        raise HubPushError(
            "No Hugging Face token found. Set the HF_TOKEN environment variable or run `hf auth login` "
            "(a token with write access to the target namespace)."
        )
    return token


def _scrub(message: str, token: str | None) -> str:
    return message.replace(token, "***") if token else message


def upload_to_hub(
    folder: str | os.PathLike,
    repo_id: str,
    *,
    path_in_repo: str | None = None,
    private: bool | None = None,
    revision: str | None = None,
    commit_message: str | None = None,
    token: str | None = None,
    endpoint: str | None = None,
    ignore_patterns: list[str] | None = None,
    run_as_future: bool = False,
):
    """Creates `repo_id` if needed (and the branch `revision`) and uploads `folder` with `upload_folder`.

    Returns the `CommitInfo` (or a `Future` of it with `run_as_future`). Errors are raised as
    `HubPushError` with the token scrubbed from the message; nothing local is modified.
    """
    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import HfHubHTTPError

    validate_repo_id(repo_id)
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"Folder to upload {str(folder)!r} does not exist.")
    if constants.is_offline_mode():
        raise HubPushError("Offline mode is on (HF_HUB_OFFLINE=1): unset it to upload to the Hub.")
    token = _resolve_token(token)
    # HF_ENDPOINT is read at call time (huggingface_hub reads it once at import).
    api = HfApi(endpoint=endpoint or os.environ.get("HF_ENDPOINT") or None, token=token)
    try:
        api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
        if revision and revision != constants.DEFAULT_REVISION:
            api.create_branch(repo_id, branch=revision, exist_ok=True)  # upload_folder needs an existing branch
        return api.upload_folder(
            repo_id=repo_id,
            folder_path=str(folder),
            path_in_repo=path_in_repo,
            revision=revision,
            commit_message=commit_message or f"Upload {folder.name} with hf-mocose",
            ignore_patterns=ignore_patterns,
            run_as_future=run_as_future,
        )
    except HfHubHTTPError as err:
        status = getattr(err.response, "status_code", None)
        hint = {401: " (token rejected)", 403: " (no write access to this namespace)"}.get(status, "")
        raise HubPushError(
            _scrub(f"Upload of {str(folder)!r} to {repo_id!r} failed{hint}: {err}. The local folder was not changed.", token)
        ) from None
    except Exception as err:  # connection refused, timeouts, malformed server answers (httpx errors are no OSError)
        raise HubPushError(
            _scrub(f"Upload of {str(folder)!r} to {repo_id!r} failed: {type(err).__name__}: {err}. "
                   "The local folder was not changed.", token)
        ) from None


def push_export(
    export_dir: str | os.PathLike,
    repo_id: str,
    *,
    private: bool | None = None,
    revision: str | None = None,
    commit_message: str | None = None,
    dry_run: bool = False,
    token: str | None = None,
    endpoint: str | None = None,
) -> str | list[tuple[str, int]]:
    """Uploads a sentence-transformers export to the root of `repo_id`.

    Returns the commit URL, or with `dry_run` the `(path_in_repo, size)` list that would be
    uploaded (nothing is sent, no token is needed).
    """
    validate_repo_id(repo_id)
    export_dir = Path(export_dir)
    if not export_dir.is_dir():
        raise FileNotFoundError(f"Export folder {str(export_dir)!r} does not exist.")
    if not (export_dir / "modules.json").is_file():
        raise ValueError(
            f"{str(export_dir)!r} is not a sentence-transformers export (no modules.json); "
            "run `hf-mocose export CHECKPOINT OUTPUT_DIR` first."
        )
    if dry_run:
        return list_upload_files(export_dir)
    commit = upload_to_hub(
        export_dir, repo_id, private=private, revision=revision, token=token, endpoint=endpoint,
        commit_message=commit_message or "Upload sentence-transformers export (hf-mocose)",
    )
    return commit.commit_url


# ----------------------------------------------------------------------------- training integration
def checkpoint_path_in_repo(hub_strategy: str, checkpoint_folder: str | os.PathLike) -> str | None:
    """Where a training checkpoint goes in the repo for `hub_strategy` (None: not pushed on save).

    Mirrors transformers' names (`last-checkpoint/`, `checkpoint-N/`), but the model files that
    transformers would push to the root go to `mocose/`: the root belongs to the export.
    """
    strategy = str(getattr(hub_strategy, "value", hub_strategy))
    return {
        "checkpoint": "last-checkpoint",
        "all_checkpoints": Path(checkpoint_folder).name,
        "every_save": MOCOSE_SUBFOLDER,
    }.get(strategy)


def push_training_checkpoint(trainer, checkpoint_folder: str | os.PathLike):
    """Replacement for `Trainer._push_from_checkpoint`: pushes a checkpoint without touching the root.

    Call it from `MoCoSETrainer._push_from_checkpoint(checkpoint_folder)` (main process only).
    Returns the upload `Future`, or None when `hub_strategy` pushes nothing on save ("end").
    """
    args = trainer.args
    path_in_repo = checkpoint_path_in_repo(args.hub_strategy, checkpoint_folder)
    if not trainer.is_world_process_zero() or path_in_repo is None:
        return None
    ignore = list(CHECKPOINT_IGNORE)
    if path_in_repo == MOCOSE_SUBFOLDER:  # model files only, as transformers does for every_save
        ignore += ["optimizer.pt", "scheduler.pt", "rng_state*.pth", "fgsm_state*.pt", "trainer_state.json"]
    return upload_to_hub(
        checkpoint_folder, trainer.hub_model_id, path_in_repo=path_in_repo, revision=args.hub_revision,
        private=args.hub_private_repo, token=args.hub_token, ignore_patterns=ignore, run_as_future=True,
        commit_message=f"Training in progress, step {trainer.state.global_step}",
    )


def describe_hardware(args) -> str:
    """'N x <GPU name>' (or CPU) for the card, from the live training arguments."""
    import torch

    world = getattr(args, "world_size", 1)
    if torch.cuda.is_available():
        return f"{world} x {torch.cuda.get_device_name(0)}"
    return f"{world} x CPU process" + ("es" if world > 1 else "")


def publish_final_model(
    trainer,
    final_dir: str | os.PathLike,
    *,
    export_dir: str | os.PathLike | None = None,
    eval_results: str | os.PathLike | dict | None = None,
    corpus: str | None = None,
    datasets: list[str] | tuple[str, ...] = (),
    push: bool | None = None,
    max_seq_length: int | None = None,
    **card_kwargs,
) -> Path | None:
    """End-of-training publishing: export, card and (with `push_to_hub`) upload.

    Exports `final_dir` (the saved MoCoSE model) to `export_dir` (default
    `<output_dir>/sentence-transformers`), writes the card with the live run's facts (global
    batch size, hardware, wall time, hyper-parameters) and, when `args.push_to_hub` (or `push`),
    uploads the export to the repo root and `final_dir` to `mocose/` (`upload_final_model`).
    `max_seq_length` is the export's inference length (default: see `export_to_sentence_transformers`).
    Runs on the main process only; returns the export folder there, None elsewhere. `card_kwargs` go to
    `write_model_card` (e.g. `base_model=...` to override the config's `base_model_name_or_path`).
    """
    if not trainer.is_world_process_zero():
        return None
    push = trainer.args.push_to_hub if push is None else push
    if push:
        final_repo_id(trainer)  # no repo id: fail before the export, not after it
    export_dir = export_final_model(trainer, final_dir, export_dir=export_dir, eval_results=eval_results,
                                    corpus=corpus, datasets=datasets, max_seq_length=max_seq_length, **card_kwargs)
    if push:
        upload_final_model(trainer, final_dir, export_dir)
    return export_dir


def final_repo_id(trainer) -> str:
    """The repo the final model goes to (`hub_model_id`); a `ValueError` says how to set it when there is none."""
    repo_id = getattr(trainer, "hub_model_id", None) or trainer.args.hub_model_id
    if not repo_id:
        raise ValueError("Publishing to the Hub needs a repo id: set hub_model_id to 'namespace/name'.")
    return validate_repo_id(repo_id)


def export_final_model(trainer, final_dir, *, export_dir=None, eval_results=None, corpus=None, datasets=(),
                       max_seq_length: int | None = None, **card_kwargs) -> Path:
    """Writes the sentence-transformers export of `final_dir` with the live run's card; returns its folder.

    `max_seq_length` is the export's inference length (default: see `export_to_sentence_transformers`).
    """
    from .export import export_to_sentence_transformers

    args = trainer.args
    export_dir = Path(export_dir or Path(args.output_dir) / "sentence-transformers")
    runtime = next((e["train_runtime"] for e in reversed(trainer.state.log_history) if "train_runtime" in e), None)
    repo_id = getattr(trainer, "hub_model_id", None) or args.hub_model_id
    return export_to_sentence_transformers(
        final_dir, export_dir, overwrite=True, max_seq_length=max_seq_length, eval_results=eval_results,
        repo_id=repo_id, corpus=corpus, datasets=datasets, training_args=args,
        global_batch_size=getattr(trainer, "global_batch_size", None), train_runtime=runtime, hardware=describe_hardware(args),
        **{"export_name": Path(args.output_dir).name, **card_kwargs},
    )


def upload_final_model(trainer, final_dir, export_dir, *, commit_message: str | None = None,
                       revision: str | None = None, token: str | None = None, private: bool | None = None,
                       blocking: bool = True):
    """Uploads `final_dir` to `mocose/`, then the export (with its card) to the repo root.

    `revision`, `token` and `private` default to `hub_revision`, `hub_token` and `hub_private_repo`.
    Returns the root commit's `CommitInfo`, or with `blocking=False` its `Future` (both uploads
    then run in the background, in order).
    """
    args = trainer.args
    hub = dict(revision=revision or args.hub_revision, token=token or args.hub_token,
               private=args.hub_private_repo if private is None else private, run_as_future=not blocking)
    repo_id = final_repo_id(trainer)
    upload_to_hub(final_dir, repo_id, path_in_repo=MOCOSE_SUBFOLDER, ignore_patterns=CHECKPOINT_IGNORE,
                  commit_message="Upload the MoCoSE model (hf-mocose)", **hub)
    return upload_to_hub(export_dir, repo_id, commit_message=commit_message or "Upload sentence-transformers export "
                         "(hf-mocose)", **hub)


class HubPublishingMixin:
    """`Trainer` hooks that keep the Hub layout above: checkpoints in sub-folders, the export at the root.

    `push_to_hub()` publishes what `hf-mocose export` + `hf-mocose push` (and the end of
    `scripts/train.py`) publish; `_push_from_checkpoint` sends resumable checkpoints where
    `hub_strategy` says, never to the root.
    """

    def _push_from_checkpoint(self, checkpoint_folder):
        from transformers.utils.hub import PushInProgress

        if not self.args.hub_always_push and self.push_in_progress is not None and not self.push_in_progress.is_done():
            return
        job = push_training_checkpoint(self, checkpoint_folder)
        if job is not None:
            self.push_in_progress = PushInProgress([job])

    def push_to_hub(self, commit_message: str | None = "End of training", blocking: bool = True,
                    token: str | None = None, revision: str | None = None, private: bool | None = None,
                    final_dir: str | os.PathLike | None = None, **card_kwargs):
        """Saves the model and publishes it to `hub_model_id`, as `hf-mocose export` + `push` would.

        The MoCoSE model is saved to `final_dir` (default `<output_dir>/final`) and uploaded to the
        repo's `mocose/` folder; its sentence-transformers export, with the model card, is written to
        `<output_dir>/sentence-transformers` and uploaded to the repo root, so
        `SentenceTransformer(hub_model_id)` loads it. `token`, `revision` and `private` default to
        `hub_token`, `hub_revision` and `hub_private_repo`; `card_kwargs` go to the card
        (`eval_results`, `corpus`, `datasets`, `base_model`, `language`, `license`, `tags`...) and
        `max_seq_length` to the export (its inference length).

        Returns the root commit's `CommitInfo` (a `Future` of it with `blocking=False`) on the main
        process, None on the others. Raises a `ValueError` without `hub_model_id`, a `HubPushError`
        when the upload fails.
        """
        self.callback_handler.on_push_begin(self.args, self.state, self.control)
        if self.is_world_process_zero():
            final_repo_id(self)  # fail before saving anything
        final_dir = Path(final_dir or Path(self.args.output_dir) / "final")
        self.save_model(str(final_dir), _internal_call=True)  # every process (sharded saves need them all)
        if not self.is_world_process_zero():
            return None
        self._finish_current_push()
        export_dir = export_final_model(self, final_dir, **card_kwargs)
        return upload_final_model(self, final_dir, export_dir, commit_message=commit_message, revision=revision,
                                  token=token, private=private, blocking=blocking)
