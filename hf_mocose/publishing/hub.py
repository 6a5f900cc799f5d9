"""Upload exports (and training checkpoints) to the Hugging Face Hub through `huggingface_hub`.

    hf-mocose push OUTPUT_DIR --repo_id user/name [--private] [--revision BRANCH] [--dry_run]

Repository layout this package writes (so `SentenceTransformer(repo_id)` always works):

    /                      the sentence-transformers export + README.md card   (hub_publishing, push)
    mocose/                the full MoCoSE model (config.json with model_type "mocose", weights, tokenizer),
                           for continued training: MoCoSEModel.from_pretrained(repo_id, subfolder="mocose")
    last-checkpoint/       the latest resumable training checkpoint   (hub_strategy="checkpoint")
    checkpoint-N/          every resumable training checkpoint        (hub_strategy="all_checkpoints")

Every upload is ONE `HfApi.create_commit` (`commit_to_hub`): `CommitOperationAdd`s for the new files and,
for a push that owns paths (`hub_ownership.PushScope`: the root export, `mocose/`, a checkpoint folder),
`CommitOperationDelete`s for the files there that the new upload no longer contains, so no stale file
survives a push and nothing outside those paths is touched. The commit names the head it was built on
(`parent_commit`), so a concurrent change makes it fail instead of deleting what it did not see. A push
that puts the export at the root and the MoCoSE model in `mocose/` lands as one commit, and its errors
surface from that one call (or its one `Future`). What a training run publishes, and when, is
`hub_publishing.py`. The token comes from huggingface_hub's usual sources (HF_TOKEN, `hf auth login`
cache) unless passed explicitly; it is never printed, logged or written anywhere.
"""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from pathlib import Path

from .hub_ownership import PushScope, stale_files

logger = logging.getLogger(__name__)

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
    from huggingface_hub.utils import DEFAULT_IGNORE_PATTERNS, filter_repo_objects

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


@contextmanager
def hub_errors(what: str, repo_id: str, token: str | None):
    """Turns any failure of the calls inside into a `HubPushError` naming `what` and `repo_id`, token scrubbed."""
    from huggingface_hub.errors import HfHubHTTPError

    try:
        yield
    except HfHubHTTPError as err:
        status = getattr(err.response, "status_code", None)
        hint = {401: " (token rejected)", 403: " (no write access to this namespace)"}.get(status, "")
        raise HubPushError(
            _scrub(f"{what} to {repo_id!r} failed{hint}: {err}. The local folder was not changed.", token)
        ) from None
    except Exception as err:  # connection refused, timeouts, malformed server answers (httpx errors are no OSError)
        raise HubPushError(
            _scrub(f"{what} to {repo_id!r} failed: {type(err).__name__}: {err}. The local folder was not changed.",
                   token)
        ) from None


def hub_api(token: str | None = None, endpoint: str | None = None, owner=None):
    """An `HfApi` for uploads: the token resolved (`HubPushError` without one), offline mode refused.

    With `owner` (a trainer), the same `HfApi` is reused for the same endpoint and token, so the
    uploads it runs as futures go through its one worker thread in the order they were asked for.
    """
    from huggingface_hub import HfApi, constants

    if constants.is_offline_mode():
        raise HubPushError("Offline mode is on (HF_HUB_OFFLINE=1): unset it to upload to the Hub.")
    token = _resolve_token(token)
    # HF_ENDPOINT is read at call time (huggingface_hub reads it once at import).
    endpoint = endpoint or os.environ.get("HF_ENDPOINT") or None
    if owner is None:
        return HfApi(endpoint=endpoint, token=token)
    apis = owner.__dict__.setdefault("_hub_apis", {})
    if (endpoint, token) not in apis:
        apis[(endpoint, token)] = HfApi(endpoint=endpoint, token=token)
    return apis[(endpoint, token)]


def folder_operations(folder: str | os.PathLike, path_in_repo: str | None = None,
                      ignore_patterns: list[str] | None = None) -> list:
    """A `CommitOperationAdd` for every file `upload_folder` would send from `folder` (same filtering)."""
    from huggingface_hub import CommitOperationAdd

    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"Folder to upload {str(folder)!r} does not exist.")
    prefix = f"{path_in_repo.strip('/')}/" if path_in_repo else ""
    root = folder.expanduser().resolve()
    return [CommitOperationAdd(path_in_repo=prefix + path, path_or_fileobj=str(root / path))
            for path, _ in list_upload_files(root, ignore_patterns)]


def create_hub_repo(name: str, *, token: str | None = None, private: bool | None = None,
                    endpoint: str | None = None, owner=None) -> str:
    """Creates the model repo `name` if needed and returns its `namespace/name` id.

    A bare `name` goes to the token's own namespace, as `Trainer.init_hf_repo` does with the
    `output_dir`'s name when no `hub_model_id` is set. An invalid name is a `ValueError` naming it.
    """
    if "/" in name:
        validate_repo_id(name)
    else:
        try:
            validate_repo_id(f"namespace/{name}")  # the characters of a model name
        except ValueError:
            raise ValueError(f"{name!r} is not a valid model repo name (without hub_model_id the repo is named after "
                             "the output_dir folder, as with Trainer): set hub_model_id to 'namespace/name'.") from None
    api = hub_api(token, endpoint, owner)
    with hub_errors("Creating the repo", name, api.token):
        return api.create_repo(name, private=private, exist_ok=True, repo_type="model").repo_id


def stale_file_deletions(api, repo_id: str, operations: list, scope: PushScope, revision: str | None):
    """`(head commit, CommitOperationDelete list)`: the files under `scope` at `revision`'s head that
    `operations` do not add. A revision with no commit yet has nothing to delete (head None)."""
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete, constants
    from huggingface_hub.errors import RevisionNotFoundError

    try:
        head = api.model_info(repo_id, revision=revision or constants.DEFAULT_REVISION).sha
        existing = api.list_repo_files(repo_id, revision=head, repo_type="model")
    except RevisionNotFoundError:
        return None, []
    added = [op.path_in_repo for op in operations if isinstance(op, CommitOperationAdd)]
    return head, [CommitOperationDelete(path_in_repo=path) for path in stale_files(existing, added, scope)]


def commit_to_hub(
    operations: list,
    repo_id: str,
    *,
    commit_message: str,
    what: str = "Upload",
    private: bool | None = None,
    revision: str | None = None,
    token: str | None = None,
    endpoint: str | None = None,
    run_as_future: bool = False,
    owner=None,
    scope: PushScope | None = None,
):
    """Creates `repo_id` if needed (and the branch `revision`) and commits `operations` in ONE `create_commit`.

    With `scope`, the same commit deletes every file the push owns (`hub_ownership`) that `operations` do not
    add, read from the branch's head, which the commit names as its parent. Returns the `CommitInfo`, or
    with `run_as_future` a `Future` of it whose `result()` raises the `HubPushError`. Errors are
    `HubPushError`s naming `what` and the repo, with the token scrubbed. `owner`: see `hub_api` (futures of
    one trainer run in order).
    """
    from huggingface_hub import constants

    validate_repo_id(repo_id)
    api = hub_api(token, endpoint, owner)

    def commit():
        with hub_errors(what, repo_id, api.token):
            api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
            if revision and revision != constants.DEFAULT_REVISION:
                api.create_branch(repo_id, branch=revision, exist_ok=True)  # a commit needs an existing branch
            head, deletions, description = None, [], None
            if scope is not None:
                head, deletions = stale_file_deletions(api, repo_id, operations, scope, revision)
            if deletions:
                removed = [op.path_in_repo for op in deletions]
                logger.info("Removing %d file(s) the new upload no longer contains: %s", len(removed),
                            ", ".join(removed))
                description = "Removed, as the new upload no longer contains them: " + ", ".join(removed)
            return api.create_commit(repo_id, [*operations, *deletions], commit_message=commit_message,
                                     commit_description=description, revision=revision, repo_type="model",
                                     parent_commit=head)

    return api.run_as_future(commit) if run_as_future else commit()


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
    owner=None,
    scope: PushScope | None = None,
):
    """Uploads `folder` (to `path_in_repo`) in one commit; see `commit_to_hub` for the rest (`scope`: the
    files the push owns and deletes when the upload no longer has them; None deletes nothing).

    Nothing local is modified.
    """
    validate_repo_id(repo_id)
    operations = folder_operations(folder, path_in_repo, ignore_patterns)
    return commit_to_hub(
        operations, repo_id, what=f"Upload of {str(folder)!r}", private=private, revision=revision, token=token,
        endpoint=endpoint, run_as_future=run_as_future, owner=owner, scope=scope,
        commit_message=commit_message or f"Upload {Path(folder).name} with hf-mocose",
    )


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
    """Uploads a sentence-transformers export to the root of `repo_id`, deleting in the same commit the
    root export files an earlier upload left that this export does not have (`hub_ownership`).

    Returns the commit URL, or with `dry_run` the `(path_in_repo, size)` list that would be
    uploaded (nothing is sent, no token is needed; what would be deleted is read at push time).
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
        scope=PushScope(export_root=True),
    )
    return commit.commit_url
