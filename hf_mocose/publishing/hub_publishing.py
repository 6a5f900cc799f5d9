"""What a training run publishes to the Hub, and when: `MoCoSETrainer.push_to_hub` and checkpoint pushes.

Layout (see `hub.py`): the sentence-transformers export with its card at the repo root, the MoCoSE
model in `mocose/`, resumable checkpoints in `last-checkpoint/` or `checkpoint-N/` -- never the root,
where transformers' own `push_to_hub`/`_push_from_checkpoint` would put the MoCoSE `config.json` and
break `SentenceTransformer(repo_id)`.

`push_to_hub(**kwargs)` takes every keyword `Trainer.push_to_hub` takes (`commit_message`, `blocking`,
`token`, `revision`, `private`, and `create_model_card`'s `model_name`, `language`, `license`, `tags`,
`finetuned_from`, `tasks`, `dataset_tags`, `dataset`, `dataset_args`), plus hf-mocose's card and export
keywords (`PUSH_TO_HUB_KEYWORDS`); anything else, and a bad repo id, fails before anything is saved.
The final push is one commit; checkpoint pushes and the final one go through one `HfApi` per trainer,
so with `blocking=False` they land in the order they were asked for.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from .hub import (
    CHECKPOINT_IGNORE,
    MOCOSE_SUBFOLDER,
    commit_to_hub,
    create_hub_repo,
    folder_operations,
    upload_to_hub,
    validate_repo_id,
)
from .hub_ownership import PushScope
from .model_card import TRAINER_CARD_KEYWORDS, card_kwargs_from_trainer_keywords

logger = logging.getLogger(__name__)

# hf-mocose's own `push_to_hub` keywords, beside transformers' (`TRAINER_CARD_KEYWORDS`).
MOCOSE_PUSH_KEYWORDS = ("final_dir", "eval_results", "corpus", "datasets", "base_model", "max_seq_length", "template")
PUSH_TO_HUB_KEYWORDS = (*TRAINER_CARD_KEYWORDS, *MOCOSE_PUSH_KEYWORDS)


def check_push_keywords(kwargs: dict) -> None:
    """A `TypeError` naming every keyword `push_to_hub` does not take (before anything is saved or sent)."""
    unknown = sorted(set(kwargs) - set(PUSH_TO_HUB_KEYWORDS))
    if unknown:
        raise TypeError(
            f"push_to_hub() got unexpected keyword argument(s) {', '.join(map(repr, unknown))}; it takes "
            f"commit_message, blocking, token, revision, private, {', '.join(PUSH_TO_HUB_KEYWORDS)}."
        )


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


def _log_failed_push(future) -> None:
    """A background checkpoint push that failed is reported when it fails, not lost with its `Future`."""
    error = future.exception()
    if error is not None:
        logger.error("A checkpoint push failed (training goes on): %s", error)


def push_training_checkpoint(trainer, checkpoint_folder: str | os.PathLike):
    """Replacement for `Trainer._push_from_checkpoint`: pushes a checkpoint without touching the root.

    Call it from `MoCoSETrainer._push_from_checkpoint(checkpoint_folder)` (main process only).
    Returns the upload `Future` (its failure is also logged), or None when `hub_strategy` pushes
    nothing on save ("end").
    """
    args = trainer.args
    path_in_repo = checkpoint_path_in_repo(args.hub_strategy, checkpoint_folder)
    if not trainer.is_world_process_zero() or path_in_repo is None:
        return None
    ignore = list(CHECKPOINT_IGNORE)
    if path_in_repo == MOCOSE_SUBFOLDER:  # model files only, as transformers does for every_save
        ignore += ["optimizer.pt", "scheduler.pt", "rng_state*.pth", "fgsm_state*.pt", "trainer_state.json"]
    job = upload_to_hub(
        checkpoint_folder, trainer.hub_model_id, path_in_repo=path_in_repo, revision=args.hub_revision,
        private=args.hub_private_repo, token=args.hub_token, ignore_patterns=ignore, run_as_future=True,
        commit_message=f"Training in progress, step {trainer.state.global_step}", owner=trainer,
        scope=PushScope(folders=(path_in_repo,)),  # the folder holds this checkpoint only: no file of an older one
    )
    job.add_done_callback(_log_failed_push)
    return job


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
    uploads the export to the repo root and `final_dir` to `mocose/` in one commit (`upload_final_model`).
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


def trainer_repo_id(trainer) -> str | None:
    """The repo id the trainer made or was given (`hub_model_id`, the trainer's own before the arguments')."""
    return getattr(trainer, "hub_model_id", None) or trainer.args.hub_model_id


def final_repo_id(trainer) -> str:
    """The repo the final model goes to (`hub_model_id`); a `ValueError` says how to set it when there is none."""
    repo_id = trainer_repo_id(trainer)
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
    repo_id = trainer_repo_id(trainer)
    return export_to_sentence_transformers(
        final_dir, export_dir, overwrite=True, max_seq_length=max_seq_length, eval_results=eval_results,
        repo_id=repo_id, corpus=corpus, datasets=datasets, training_args=args, trainer_state=trainer.state,
        global_batch_size=getattr(trainer, "global_batch_size", None), hardware=describe_hardware(args),
        **{"export_name": Path(args.output_dir).name, **card_kwargs},
    )


def upload_final_model(trainer, final_dir, export_dir, *, commit_message: str | None = None,
                       revision: str | None = None, token: str | None = None, private: bool | None = None,
                       blocking: bool = True):
    """Uploads `final_dir` to `mocose/` and the export (with its card) to the repo root, in ONE commit, which
    also deletes the files of `mocose/` and of the root export that the new ones do not contain (`hub_ownership`).

    `revision`, `token` and `private` default to `hub_revision`, `hub_token` and `hub_private_repo`.
    Returns the commit's `CommitInfo`, or with `blocking=False` its `Future` (queued after the
    trainer's earlier uploads; `result()` raises the `HubPushError` if it fails).
    """
    args = trainer.args
    operations = [*folder_operations(final_dir, MOCOSE_SUBFOLDER, CHECKPOINT_IGNORE), *folder_operations(export_dir)]
    return commit_to_hub(
        operations, final_repo_id(trainer), what=f"Upload of {str(export_dir)!r} and {str(final_dir)!r}",
        commit_message=commit_message or "Upload the sentence-transformers export and the MoCoSE model (hf-mocose)",
        revision=revision or args.hub_revision, token=token or args.hub_token,
        private=args.hub_private_repo if private is None else private, run_as_future=not blocking, owner=trainer,
        scope=PushScope(export_root=True, folders=(MOCOSE_SUBFOLDER,)),
    )


class HubPublishingMixin:
    """`Trainer` hooks that keep the Hub layout above: checkpoints in sub-folders, the export at the root.

    `push_to_hub()` publishes what `hf-mocose export` + `hf-mocose push` (and the end of
    `scripts/train.py`) publish; `_push_from_checkpoint` sends resumable checkpoints where
    `hub_strategy` says, never to the root; `init_hf_repo` names and creates the repo as
    `Trainer.init_hf_repo` does, through hf-mocose's checks.
    """

    def init_hf_repo(self, token: str | None = None, private: bool | None = None) -> None:
        """Creates the repo `hub_model_id`, or without one `<output_dir's name>` in the token's namespace
        (as `Trainer.init_hf_repo`), and records its id in `self.hub_model_id`. Main process only."""
        if not self.is_world_process_zero():
            return
        name = self.args.hub_model_id or Path(self.args.output_dir).absolute().name
        self.hub_model_id = create_hub_repo(
            name, token=token if token is not None else self.args.hub_token, owner=self,
            private=private if private is not None else self.args.hub_private_repo,
        )
        self.push_in_progress = None

    def _push_from_checkpoint(self, checkpoint_folder):
        from transformers.utils.hub import PushInProgress

        strategy = self.args.hub_strategy
        if not self.is_world_process_zero() or checkpoint_path_in_repo(strategy, checkpoint_folder) is None:
            return
        if not self.args.hub_always_push and self.push_in_progress is not None and not self.push_in_progress.is_done():
            return
        self.callback_handler.on_push_begin(self.args, self.state, self.control)  # as Trainer's own checkpoint push
        job = push_training_checkpoint(self, checkpoint_folder)
        if self.push_in_progress is None or self.push_in_progress.is_done():
            self.push_in_progress = PushInProgress([job])
        else:
            self.push_in_progress.jobs.append(job)

    def export_sentence_transformers(self, output_dir: str | os.PathLike | None = None, *,
                                     final_dir: str | os.PathLike | None = None, **card_kwargs) -> Path | None:
        """Saves the model and writes its sentence-transformers export, with the model card; returns the export.

        What `push_to_hub()` publishes, without the upload: the MoCoSE model is saved to `final_dir` (default
        `<output_dir>/final`, what `SentenceTransformer` cannot load) and exported to `output_dir` (default
        `<args.output_dir>/sentence-transformers`), which `SentenceTransformer(output_dir)` loads: the online
        branch with its pooling, truncating at the encoder's inference length (`max_seq_length=` to choose
        another). Built on `hf_mocose.export_to_sentence_transformers`; `card_kwargs` are its card keywords
        (`eval_results`, `corpus`, `datasets`, `base_model`, `template`, `max_seq_length`...). Call it on every
        process (sharded saves need them all); the main process writes the export and gets its folder, the
        others None.
        """
        final_dir = Path(final_dir or Path(self.args.output_dir) / "final")
        self.save_model(str(final_dir), _internal_call=True)
        if not self.is_world_process_zero():
            return None
        return export_final_model(self, final_dir, export_dir=output_dir, **card_kwargs)

    def push_to_hub(self, commit_message: str | None = "End of training", blocking: bool = True,
                    token: str | None = None, revision: str | None = None, private: bool | None = None, **kwargs):
        """Saves the model and publishes it to `hub_model_id`, as `hf-mocose export` + `push` would.

        The MoCoSE model is saved to `final_dir` (default `<output_dir>/final`), its sentence-transformers
        export, with the model card, to `<output_dir>/sentence-transformers`; both go up in ONE commit
        (`commit_message`): the export at the repo root, so `SentenceTransformer(hub_model_id)` loads it,
        the MoCoSE model in `mocose/`. `token`, `revision` and `private` default to `hub_token`,
        `hub_revision` and `hub_private_repo`. Without `hub_model_id` the repo is `<output_dir's name>` in
        the token's namespace, as with `Trainer`.

        Keywords (anything else is a `TypeError` before anything is saved): `Trainer.create_model_card`'s
        `model_name`, `language`, `license`, `tags` (a string is one tag), `finetuned_from`, `tasks`,
        `dataset_tags`, `dataset`, `dataset_args` (see `model_card.card_kwargs_from_trainer_keywords`);
        hf-mocose's `eval_results`, `corpus`, `datasets`, `base_model`, `template` (the card),
        `max_seq_length` (the export's inference length) and `final_dir`.

        Returns the commit's `CommitInfo` (a `Future` of it with `blocking=False`, whose `result()` raises
        the upload's `HubPushError`) on the main process, None on the others.
        """
        check_push_keywords(kwargs)
        final_dir = Path(kwargs.pop("final_dir", None) or Path(self.args.output_dir) / "final")
        card_kwargs = card_kwargs_from_trainer_keywords(**kwargs)  # conflicting names fail now, not after saving
        repo_id = trainer_repo_id(self)
        if repo_id and self.is_world_process_zero():
            validate_repo_id(repo_id)
        self.callback_handler.on_push_begin(self.args, self.state, self.control)
        token = token if token is not None else self.args.hub_token
        if self.hub_model_id is None:  # as Trainer: push_to_hub=False during training, the repo is made now
            self.init_hf_repo(token=token, private=private)
        self.save_model(str(final_dir), _internal_call=True)  # every process (sharded saves need them all)
        if not self.is_world_process_zero():
            return None
        model_tags = getattr(self.accelerator.unwrap_model(self.model), "model_tags", None) or []
        if model_tags:  # as Trainer.push_to_hub: the model's own tags join the card's
            card_kwargs["tags"] = [*card_kwargs.get("tags", []), *model_tags]
        self._finish_current_push()
        export_dir = export_final_model(self, final_dir, **card_kwargs)
        return upload_final_model(self, final_dir, export_dir, commit_message=commit_message, revision=revision,
                                  token=token, private=private, blocking=blocking)
