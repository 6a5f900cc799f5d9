"""Uploads to the Hugging Face Hub, and what a training run publishes there (`HubPublishingMixin`).

Layout (so `SentenceTransformer(repo_id)` always works): the sentence-transformers export with its card at the root,
the MoCoSE model in `mocose/` (`MoCoSEModel.from_pretrained(repo_id, subfolder="mocose")`), resumable checkpoints in
`last-checkpoint/` or `checkpoint-N/` (`hub_strategy`), never at the root, where transformers would put them.

Every push is ONE `create_commit` (`upload_folders`; `upload_folder` may split it, and cannot spare a README) that
also deletes the files the push owns and the upload lacks (`stale_files`: an older `model.safetensors` would load
instead of a new sharded one), against the head they were read from (`parent_commit`). The token is never printed
or written.
"""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from pathlib import Path

from ..compat import announce_push
from .eval_results import EVAL_RESULTS_DIR, EVAL_RESULTS_PATTERN
from .runtimes import RUNTIME_FILES

logger = logging.getLogger(__name__)

MOCOSE_SUBFOLDER = "mocose"
CHECKPOINT_IGNORE = ["_*", ".*"]  # training-loop internals, never uploaded with a checkpoint's model files
# What an export's `SentenceTransformer.save` writes or wrote at the root (any tokenizer, weight format, sharding).
EXPORT_PATTERNS = (
    "config.json", "modules.json", "config_sentence_transformers.json", "sentence_bert_config.json",
    "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json",
    "model-*-of-*.safetensors", "pytorch_model-*-of-*.bin", "tokenizer.json", "tokenizer_config.json",
    "special_tokens_map.json", "added_tokens.json", "vocab.txt", "vocab.json", "merges.txt", "spiece.model",
    "sentencepiece.bpe.model", "tokenizer.model", "chat_template.jinja", "1_Pooling/*", "2_Dense/*",
    EVAL_RESULTS_PATTERN,
)
NEVER_DELETED = [".gitattributes", "README.md", "*/README.md"]
# Keywords of `Trainer.push_to_hub(**kwargs)` -> `Trainer.create_model_card` (transformers 5.x), then hf-mocose's own.
PUSH_TO_HUB_KEYWORDS = ("model_name", "language", "license", "tags", "finetuned_from", "tasks", "dataset_tags",
                        "dataset", "dataset_args", "final_dir", "eval_results", "corpus", "datasets", "base_model",
                        "max_seq_length", "template")


class HubPushError(RuntimeError):
    """An upload failed (no token, offline mode, HTTP error); the local folder is untouched."""


def validate_repo_id(repo_id: str) -> str:
    """`repo_id` if a valid `namespace/name` (a bare name would land in the token's account); else a `ValueError`."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id as check_characters
    try:
        if isinstance(repo_id, str) and repo_id.count("/") == 1:
            check_characters(repo_id)
            return repo_id
    except HFValidationError:
        pass
    raise ValueError(f"Invalid repo id {repo_id!r}: expected 'namespace/name' (your user or organisation name, a "
                     "slash, and a model name of letters, digits, '-', '_' or '.', without '--' or '..'), e.g. "
                     "'alice/mocose-bert-base'.")


def list_upload_files(folder: str | os.PathLike, ignore_patterns: list[str] | None = None) -> list[tuple[str, int]]:
    """`(path_in_repo, size)` for every file `upload_folder` would send, with the same filtering."""
    from huggingface_hub.utils import DEFAULT_IGNORE_PATTERNS, filter_repo_objects
    root = Path(folder).expanduser().resolve()
    if not root.is_dir():
        raise FileNotFoundError(f"Folder to upload {str(folder)!r} does not exist.")
    files = {p.relative_to(root).as_posix(): p for p in sorted(root.glob("**/*")) if p.is_file()}
    kept = filter_repo_objects(files, ignore_patterns=[*(ignore_patterns or []), *DEFAULT_IGNORE_PATTERNS])
    return [(path, files[path].stat().st_size) for path in kept]


def stale_files(existing, uploaded, *, export_root: bool = False, folders: tuple[str, ...] = ()) -> list[str]:
    """The files of `existing` the push owns (`folders`; `export_root`: the export's) that `uploaded` lacks, sorted.

    The export owns its root files, its module folders, `.eval_results/hf-mocose-*.yaml`, and in `onnx/` and
    `openvino/` the names its runtime export writes, when it has that folder: files made some other way stay."""
    from huggingface_hub.utils import filter_repo_objects
    uploaded = set(uploaded)
    patterns = [f"{folder.strip('/')}/*" for folder in folders if folder.strip("/")]
    if export_root:
        tops = {path.split("/")[0] for path in uploaded if "/" in path}
        patterns += [*EXPORT_PATTERNS, *(f"{top}/*" for top in tops - {*RUNTIME_FILES, EVAL_RESULTS_DIR}),
                     *(name for top in tops & set(RUNTIME_FILES) for name in RUNTIME_FILES[top])]
    owned = filter_repo_objects(existing, allow_patterns=patterns, ignore_patterns=NEVER_DELETED) if patterns else []
    return sorted(set(owned) - uploaded)


@contextmanager
def hub_errors(what: str, repo_id: str, token: str | None):
    """Turns any failure of the calls inside into a `HubPushError` naming `what` and `repo_id`, token scrubbed."""
    from huggingface_hub.errors import HfHubHTTPError
    try:
        yield
    except Exception as err:  # HTTP errors, connection refused, timeouts (httpx errors are no OSError)
        http = isinstance(err, HfHubHTTPError)
        hint = {401: " (token rejected)", 403: " (no write access to this namespace)"}.get(
            getattr(err.response, "status_code", None), "") if http else ""
        error = str(err) if http else f"{type(err).__name__}: {err}"
        message = f"{what} to {repo_id!r} failed{hint}: {error}. The local folder was not changed."
        raise HubPushError(message.replace(token, "***") if token else message) from None


def hub_api(token: str | None = None, endpoint: str | None = None, owner=None):
    """An `HfApi` for uploads (token resolved, offline refused); one per `owner`, endpoint, token: pushes in order."""
    from huggingface_hub import HfApi, get_token

    from ..compat import hub_offline
    if hub_offline():  # a missing token said in the same line: else it shows up only on the next try
        no_token = "" if token or get_token() else " and no Hugging Face token is set (HF_TOKEN, or `hf auth login`)"
        raise HubPushError(f"Offline mode is on (HF_HUB_OFFLINE=1){no_token}: unset it"
                           f"{', and set a token,' * bool(no_token)} to upload to the Hub.")
    if not (token := token or get_token()):
        raise HubPushError("No Hugging Face token found. Set the HF_TOKEN environment variable or run `hf auth login` "
                           "(a token with write access to the target namespace).")
    endpoint = endpoint or os.environ.get("HF_ENDPOINT") or None  # read now: huggingface_hub reads it once at import
    apis = owner.__dict__.setdefault("_hub_apis", {}) if owner is not None else {}
    return apis.setdefault((endpoint, token), HfApi(endpoint=endpoint, token=token))


def upload_folders(repo_id: str, folders: list[tuple], *, commit_message: str, what: str = "Upload",
                   export_root: bool = False, private: bool | None = None, revision: str | None = None,
                   token: str | None = None, endpoint: str | None = None, run_as_future: bool = False, owner=None):
    """Creates `repo_id` (and branch `revision`) if needed and uploads `folders`, `(folder, path_in_repo or None,
    ignore_patterns or None)`, in ONE commit that deletes the stale files it owns. Returns the `CommitInfo` (with
    `run_as_future` its `Future`); errors are `HubPushError`s naming `what` and the repo."""
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete, constants
    from huggingface_hub.errors import RevisionNotFoundError
    validate_repo_id(repo_id)
    api = hub_api(token, endpoint, owner)
    adds = [CommitOperationAdd(path_in_repo=f"{prefix.strip('/')}/{path}" if prefix else path,
                               path_or_fileobj=str(Path(folder).expanduser().resolve() / path))
            for folder, prefix, ignore in folders for path, _ in list_upload_files(folder, ignore)]

    def commit():
        with hub_errors(what, repo_id, api.token):
            api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
            if revision and revision != constants.DEFAULT_REVISION:
                api.create_branch(repo_id, branch=revision, exist_ok=True)  # a commit needs an existing branch
            try:
                head = api.model_info(repo_id, revision=revision or constants.DEFAULT_REVISION).sha
                existing = api.list_repo_files(repo_id, revision=head, repo_type="model")
            except RevisionNotFoundError:  # no commit yet: nothing to delete
                head, existing = None, []
            removed = stale_files(existing, [op.path_in_repo for op in adds], export_root=export_root,
                                  folders=tuple(prefix for _, prefix, _ in folders if prefix))
            if removed:
                logger.info("Removing %d file(s) the new upload no longer contains: %s", len(removed), ", ".join(removed))
            return api.create_commit(
                repo_id, [*adds, *(CommitOperationDelete(path_in_repo=path) for path in removed)],
                commit_message=commit_message, revision=revision, repo_type="model", parent_commit=head,
                commit_description="Removed, as the new upload no longer contains them: " + ", ".join(removed)
                if removed else None)

    return api.run_as_future(commit) if run_as_future else commit()


def push_export(export_dir: str | os.PathLike, repo_id: str, *, private: bool | None = None,
                revision: str | None = None, commit_message: str | None = None, dry_run: bool = False,
                token: str | None = None, endpoint: str | None = None) -> str | list[tuple[str, int]]:
    """Uploads an export to `repo_id`'s root, deleting stale export files; the commit URL, or the `dry_run` list."""
    validate_repo_id(repo_id)
    export_dir = Path(export_dir)
    if not export_dir.is_dir():
        raise FileNotFoundError(f"Export folder {str(export_dir)!r} does not exist.")
    if not (export_dir / "modules.json").is_file():
        raise ValueError(f"{str(export_dir)!r} is not a sentence-transformers export (no modules.json); "
                         "run `hf-mocose export CHECKPOINT OUTPUT_DIR` first.")
    if dry_run:
        return list_upload_files(export_dir)
    return upload_folders(
        repo_id, [(export_dir, None, None)], export_root=True, what=f"Upload of {str(export_dir)!r}", private=private,
        revision=revision, token=token, endpoint=endpoint,
        commit_message=commit_message or "Upload sentence-transformers export (hf-mocose)").commit_url


# ----------------------------------------------------------------------------- what a training run publishes
def checkpoint_path_in_repo(hub_strategy: str, checkpoint_folder: str | os.PathLike) -> str | None:
    """Where `hub_strategy` puts a checkpoint: transformers' folder, `mocose/` for the root; None: not on save."""
    return {"checkpoint": "last-checkpoint", "all_checkpoints": Path(checkpoint_folder).name,
            "every_save": MOCOSE_SUBFOLDER}.get(str(getattr(hub_strategy, "value", hub_strategy)))


def _log_failed_push(future) -> None:  # a failed background push is reported, not lost with its `Future`
    if future.exception() is not None:
        logger.error("A checkpoint push failed (training goes on): %s", future.exception())


def push_training_checkpoint(trainer, checkpoint_folder: str | os.PathLike):
    """`Trainer._push_from_checkpoint` without touching the root: the checkpoint replaces its repo folder whole.
    Main process only; returns the upload `Future` (failures logged), or None if `hub_strategy` pushes nothing."""
    args = trainer.args
    path_in_repo = checkpoint_path_in_repo(args.hub_strategy, checkpoint_folder)
    if not trainer.is_world_process_zero() or path_in_repo is None:
        return None
    ignore = list(CHECKPOINT_IGNORE)
    if path_in_repo == MOCOSE_SUBFOLDER:  # model files only, as transformers does for every_save
        ignore += ["optimizer.pt", "scheduler.pt", "rng_state*.pth", "fgsm_*.pt", "trainer_state.json"]
    job = upload_folders(trainer.hub_model_id, [(checkpoint_folder, path_in_repo, ignore)], revision=args.hub_revision,
                         private=args.hub_private_repo, token=args.hub_token, run_as_future=True, owner=trainer,
                         what=f"Upload of {str(checkpoint_folder)!r}",
                         commit_message=f"Training in progress, step {trainer.state.global_step}")
    job.add_done_callback(_log_failed_push)
    return job


def trainer_repo_id(trainer) -> str | None:
    """The repo id the trainer made or was given (`hub_model_id`, the trainer's own before the arguments')."""
    return getattr(trainer, "hub_model_id", None) or trainer.args.hub_model_id


def final_repo_id(trainer) -> str:
    """The repo the final model goes to (`hub_model_id`); a `ValueError` says how to set it when there is none."""
    if not (repo_id := trainer_repo_id(trainer)):
        raise ValueError("Publishing to the Hub needs a repo id: set hub_model_id to 'namespace/name'.")
    return validate_repo_id(repo_id)


def export_final_model(trainer, final_dir, *, export_dir=None, max_seq_length: int | None = None, **card_kwargs) -> Path:
    """Writes the sentence-transformers export of `final_dir` with the live run's card (`card_facts`); returns it."""
    from .export import export_to_sentence_transformers
    from .card_facts import card_facts
    output_dir = Path(trainer.args.output_dir)
    return export_to_sentence_transformers(
        final_dir, Path(export_dir or output_dir / "sentence-transformers"), overwrite=True,
        max_seq_length=max_seq_length, repo_id=trainer_repo_id(trainer), facts=card_facts(trainer),
        **{"export_name": output_dir.name, **card_kwargs})


def upload_final_model(trainer, final_dir, export_dir, *, commit_message: str | None = None,
                       revision: str | None = None, token: str | None = None, private: bool | None = None,
                       blocking: bool = True):
    """Uploads the export to the root, `final_dir` to `mocose/`, in ONE commit: its `CommitInfo` (or `Future`)."""
    args = trainer.args
    return upload_folders(
        final_repo_id(trainer), [(final_dir, MOCOSE_SUBFOLDER, CHECKPOINT_IGNORE), (export_dir, None, None)],
        export_root=True, what=f"Upload of {str(export_dir)!r} and {str(final_dir)!r}",
        commit_message=commit_message or "Upload the sentence-transformers export and the MoCoSE model (hf-mocose)",
        revision=revision or args.hub_revision, token=token or args.hub_token,
        private=args.hub_private_repo if private is None else private, run_as_future=not blocking, owner=trainer)


def publish_final_model(trainer, final_dir: str | os.PathLike, *, push: bool | None = None, **card_kwargs) -> Path | None:
    """End-of-training publishing: exports `final_dir` (`export_final_model`) and, when `args.push_to_hub` (or
    `push`), uploads both (`upload_final_model`). Returns the export folder on the main process, None elsewhere."""
    if not trainer.is_world_process_zero():
        return None
    push = trainer.args.push_to_hub if push is None else push
    if push:
        final_repo_id(trainer)  # no repo id: fail before the export, not after it
    export_dir = export_final_model(trainer, final_dir, **card_kwargs)
    if push:
        upload_final_model(trainer, final_dir, export_dir)
    return export_dir


class HubPublishingMixin:
    """`Trainer` hooks that keep the layout above: `push_to_hub()`, checkpoint pushes, `init_hf_repo`."""

    def init_hf_repo(self, token: str | None = None, private: bool | None = None) -> None:
        """Main process only: creates the repo as `Trainer` does (named after output_dir by default)."""
        if not self.is_world_process_zero():
            return
        name = self.args.hub_model_id or Path(self.args.output_dir).absolute().name
        try:
            validate_repo_id(name if "/" in name else f"namespace/{name}")  # a bare name: the characters of a name
        except ValueError:
            if "/" in name:
                raise
            raise ValueError(f"{name!r} is not a valid model repo name (without hub_model_id the repo is named after "
                             "the output_dir folder, as with Trainer): set hub_model_id to 'namespace/name'.") from None
        api = hub_api(token if token is not None else self.args.hub_token, owner=self)
        with hub_errors("Creating the repo", name, api.token):
            private = private if private is not None else self.args.hub_private_repo
            self.hub_model_id = api.create_repo(name, private=private, exist_ok=True, repo_type="model").repo_id
        self.push_in_progress = None

    def _push_from_checkpoint(self, checkpoint_folder):
        from transformers.utils.hub import PushInProgress
        if not self.is_world_process_zero() or checkpoint_path_in_repo(self.args.hub_strategy, checkpoint_folder) is None:
            return
        if not self.args.hub_always_push and self.push_in_progress is not None and not self.push_in_progress.is_done():
            return
        announce_push(self)  # as Trainer's own checkpoint push
        job = push_training_checkpoint(self, checkpoint_folder)
        if self.push_in_progress is None or self.push_in_progress.is_done():
            self.push_in_progress = PushInProgress([job])
        else:
            self.push_in_progress.jobs.append(job)

    def export_sentence_transformers(self, output_dir: str | os.PathLike | None = None, *,
                                     final_dir: str | os.PathLike | None = None, **card_kwargs) -> Path | None:
        """What `push_to_hub()` publishes, saved without the upload (`final_dir`, `output_dir` default under
        `args.output_dir`). Call it on every process (sharded saves need them all); the main one gets the folder."""
        final_dir = Path(final_dir or Path(self.args.output_dir) / "final")
        self.save_model(str(final_dir), _internal_call=True)
        if not self.is_world_process_zero():
            return None
        return export_final_model(self, final_dir, export_dir=output_dir, **card_kwargs)

    def push_to_hub(self, commit_message: str | None = "End of training", blocking: bool = True,
                    token: str | None = None, revision: str | None = None, private: bool | None = None, **kwargs):
        """Saves the model and publishes it to `hub_model_id` as `hf-mocose export` + `push` would, in ONE commit:
        the MoCoSE model in `mocose/`, its export with the card at the root. Takes `PUSH_TO_HUB_KEYWORDS` (others
        are a `TypeError` before anything is saved). Returns the `CommitInfo` (with `blocking=False` its `Future`)
        on the main process, None on the others."""
        from .model_card import card_kwargs_from_trainer_keywords
        if unknown := sorted(set(kwargs) - set(PUSH_TO_HUB_KEYWORDS)):
            raise TypeError(f"push_to_hub() got unexpected keyword argument(s) {', '.join(map(repr, unknown))}; it "
                            f"takes commit_message, blocking, token, revision, private, {', '.join(PUSH_TO_HUB_KEYWORDS)}.")
        final_dir = Path(kwargs.pop("final_dir", None) or Path(self.args.output_dir) / "final")
        card_kwargs = card_kwargs_from_trainer_keywords(**kwargs)  # conflicting names fail now, not after saving
        if trainer_repo_id(self) and self.is_world_process_zero():
            validate_repo_id(trainer_repo_id(self))
        announce_push(self)
        token = token if token is not None else self.args.hub_token
        if self.hub_model_id is None:  # as Trainer: push_to_hub=False during training, the repo is made now
            self.init_hf_repo(token=token, private=private)
        model_tags = getattr(self.accelerator.unwrap_model(self.model), "model_tags", None) or []
        if model_tags:  # as Trainer.push_to_hub: the model's own tags join the card's
            card_kwargs["tags"] = [*card_kwargs.get("tags", []), *model_tags]
        self._finish_current_push()  # the checkpoint pushes still running land first
        export_dir = self.export_sentence_transformers(final_dir=final_dir, **card_kwargs)  # saves on every process
        if export_dir is None:
            return None
        return upload_final_model(self, final_dir, export_dir, commit_message=commit_message, revision=revision,
                                  token=token, private=private, blocking=blocking)
