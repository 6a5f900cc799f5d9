"""A model id or folder that cannot be loaded is named in one line saying which case it is, in one Hub request
(`trainer.checks.check_model_source`, used by `MoCoSETrainer` and `scripts/train.py`)."""

from __future__ import annotations

from pathlib import Path

import pytest


# ----------------------------------------------------------------------------- a Hub id that cannot be loaded
class _HubStandIn:
    """Answers huggingface_hub's metadata request (HEAD <repo>/resolve/<revision>/<file>) as the Hub does:
    the `X-Error-Code` header is what huggingface_hub turns into its own errors."""

    ANSWERS = {  # repo -> (status, X-Error-Code)
        "org/exists": (200, None), "org/missing": (401, "RepoNotFound"), "org/gated": (401, "GatedRepo"),
        "org/no-config": (404, "EntryNotFound"), "org/no-revision": (404, "RevisionNotFound"),
    }

    def __init__(self):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        stand_in = self
        self.requests: list[str] = []

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_HEAD(self):
                stand_in.requests.append(self.path)
                repo = "/".join(self.path.split("/")[1:3])
                status, code = stand_in.ANSWERS.get(repo, (404, "RepoNotFound"))
                self.send_response(status)
                if code:
                    self.send_header("X-Error-Code", code)
                self.send_header("X-Repo-Commit", "0" * 40)
                self.send_header("ETag", '"abc"')
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def online_hub(monkeypatch, tmp_path):
    """Offline mode off, no token, huggingface_hub's file URLs pointed at `_HubStandIn`."""
    import huggingface_hub.constants as constants

    hub = _HubStandIn()
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", hub.url + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token-file"))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    yield hub
    hub.server.shutdown()
    hub.server.server_close()


@pytest.mark.parametrize("repo_id, location, words", [
    ("org/missing", {}, "no such model repo on the Hugging Face Hub (a typo?), or a private one, which needs a token"),
    ("org/gated", {}, "a gated repo and no Hub token is set: accept its conditions on https://huggingface.co/org/gated"),
    ("org/no-config", {}, "the Hub repo has no config.json: it is not a transformers model"),
    ("org/no-revision", {"revision": "v9"}, "the Hub repo has no revision 'v9'"),
])
def test_unloadable_hub_id_says_which_case_in_one_request(online_hub, repo_id, location, words):
    from hf_mocose.trainer.checks import check_model_source

    with pytest.raises(FileNotFoundError) as info:
        check_model_source(repo_id, location=location)
    assert str(info.value).startswith(f"model_name_or_path {repo_id!r}: ") and words in str(info.value)
    assert info.value.__cause__ is None and info.value.__context__ is None  # one message, no chain
    assert len(online_hub.requests) == 1  # huggingface_hub's metadata request, never retried


def test_reachable_hub_id_passes(online_hub):
    from hf_mocose.trainer.checks import check_model_source

    check_model_source("org/exists")
    assert online_hub.requests == ["/org/exists/resolve/main/config.json"]


def test_no_network_is_named_and_cached_models_still_load(online_hub, monkeypatch, tmp_path):
    import huggingface_hub.constants as constants

    from hf_mocose.trainer.checks import check_model_source

    online_hub.server.shutdown()
    online_hub.server.server_close()  # nothing listens there now: the connection is refused, as with no network
    with pytest.raises(FileNotFoundError, match="no network: the Hugging Face Hub cannot be reached .* not in the "
                                                "local cache"):
        check_model_source("org/exists")
    snapshot = Path(constants.HF_HUB_CACHE) / "models--org--exists" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("0" * 40)
    check_model_source("org/exists")  # from_pretrained falls back to the cache


def test_command_line_reports_an_unknown_hub_id_in_one_line(online_hub, tmp_path, capsys):
    from hf_mocose.commands.train import cli_main

    argv = ["--model_name_or_path", "nonexistent-org/no-such-model", "--train_file", "builtin:python_docs",
            "--output_dir", str(tmp_path / "run"), "--use_cpu", "true", "--eval_strategy", "no"]
    assert cli_main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("train.py: error: model_name_or_path 'nonexistent-org/no-such-model': "
                                               "no such model repo on the Hugging Face Hub")
    assert len(online_hub.requests) == 1 and not (tmp_path / "run").exists()
