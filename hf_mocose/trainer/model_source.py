"""Whether a model id or folder can be loaded, asked before anything is loaded, answered in one line.

A folder must hold whole weights. A Hub id is asked of the Hub once, with huggingface_hub's own
metadata request for its `config.json` (`get_hf_file_metadata`, no retries), and its own errors say
what is wrong: no network (a transport error, or `OfflineModeIsEnabled` with HF_HUB_OFFLINE=1), no
such repo or a typo (`RepositoryNotFoundError`; the Hub answers the same for a private repo the token
cannot see), a gated repo (`GatedRepoError`), a missing revision (`RevisionNotFoundError`) or a repo
without `config.json` (`RemoteEntryNotFoundError`). Without this check `from_pretrained` would
retry an unreachable Hub for ~25 s and end in a chain of tracebacks.
"""

from __future__ import annotations

from pathlib import Path

from ..training.checkpoints import check_weights_complete

HUB_CHECK_TIMEOUT_S = 10  # huggingface_hub's own metadata timeout (HF_HUB_ETAG_TIMEOUT)


def check_model_source(name_or_path: str, field: str = "model_name_or_path", location: dict | None = None) -> None:
    """Fails with one message naming `name_or_path` unless it is a model folder or a Hub id that can be loaded.

    A folder's weights must be whole (`checkpoints.check_weights_complete`). Anything else must be a
    valid Hub id that the Hub (or, offline or without network, the local cache) has: see the module.
    `location`: `revision`, `subfolder`, `token` (as `from_pretrained` takes them).
    """
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

    One metadata request for `config.json`, without retries; offline (HF_HUB_OFFLINE=1) or with no
    network, the local Hugging Face cache answers instead.
    """
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url
    from huggingface_hub.errors import (
        GatedRepoError,
        OfflineModeIsEnabled,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )
    from huggingface_hub.utils import get_token, httpx

    filename = f"{subfolder.strip('/')}/config.json" if subfolder else "config.json"
    where = f"revision {revision!r} of " if revision else ""
    download = "Give the path of a model folder, or download the model where there is network first."
    if constants.is_offline_mode():
        if _in_cache(repo_id, filename, revision):
            return None
        return ("no such folder, and not a Hub id that can be reached offline (offline mode (HF_HUB_OFFLINE=1) is on "
                "and it is not in the local Hugging Face cache). Give the path of a model folder, or download the "
                "model while online first.")
    try:
        get_hf_file_metadata(hf_hub_url(repo_id, filename, revision=revision), token=token, timeout=HUB_CHECK_TIMEOUT_S)
    except (httpx.TransportError, OfflineModeIsEnabled) as err:
        if _in_cache(repo_id, filename, revision):
            return None  # from_pretrained falls back to the cached copy
        reason = " ".join(str(err).split()) or type(err).__name__
        return (f"no network: the Hugging Face Hub cannot be reached ({reason}) and the model is not in the local "
                f"cache. {download}")
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
        return (f"{where}the Hub repo has no {filename}: it is not a transformers model"
                f"{'' if subfolder else ' (if the model is in a sub-folder, set subfolder in model_init_kwargs)'}.")
    return None
