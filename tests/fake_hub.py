"""A fake Hugging Face Hub for tests: a `ThreadingHTTPServer` on 127.0.0.1 (free port).

It answers the endpoints the real `huggingface_hub` client calls for create-repo, create-branch,
README validation, preupload, commit, model info at a revision and the file tree. It answers
"regular" to every preupload question, so files travel base64-encoded inside the commit's NDJSON
payload (the server decides upload modes; the client follows), and it keeps what arrives: the
committed files per (repo, revision), file deletions applied, each branch's head commit (a new one
per commit; a commit whose `parentCommit` is not the head is refused with 412, as on the Hub), and
every request as received (`raw`, without its Authorization header, which is kept apart in
`authorizations`) so tests can search everything that was sent. A repo created without a namespace
goes to the token's user (`FakeHub.user`), as on the Hub. `fake_hub` is the pytest fixture that
starts one and points huggingface_hub at it (import it into a test module to use it).
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

TOKEN = "hf_fakeTokenForTests0123456789"


class FakeHub:
    """State of the fake Hub: the requests seen, the files committed per (repo, revision)."""

    def __init__(self, token: str = TOKEN):
        self.token = token  # the only bearer token accepted
        self.raw: list[bytes] = []  # request line, headers (no Authorization) and body of every request
        self.authorizations: list[str] = []
        self.requests: list[tuple[str, str]] = []
        self.files: dict[tuple[str, str], dict[str, bytes]] = {}
        self.branches: set[tuple[str, str]] = set()
        self.user = "fake-user"  # the token's owner: the namespace of a repo created without one
        self.fail_create_repo: int | None = None  # HTTP status to answer create-repo with
        self.fail_commit: int | None = None  # HTTP status to answer commits with
        self.commits: list[tuple[str, str, str]] = []  # (repo, revision, commit message)
        self.deleted: list[tuple[str, str, str]] = []  # (repo, revision, path) of every deletion committed
        self.heads: dict[tuple[str, str], str] = {}  # (repo, branch) -> head commit oid
        self.snapshots: dict[str, dict[str, bytes]] = {}  # commit oid -> the files at that commit
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def _new_head(self, repo: str, revision: str, files: dict[str, bytes], initial: bool = False) -> str:
        """Records a new head commit of `revision` holding `files`; an existing repo keeps its head on re-create."""
        if initial and (repo, revision) in self.heads:
            return self.heads[(repo, revision)]
        oid = hashlib.sha1(f"{repo}@{revision}#{len(self.snapshots)}".encode()).hexdigest()
        self.snapshots[oid] = dict(files)
        self.heads[(repo, revision)] = oid
        return oid

    def seed(self, repo: str, files: dict[str, bytes], revision: str = "main") -> None:
        """Puts `files` in `repo` as if an earlier commit had (e.g. a user's own files, an older export)."""
        self.files[(repo, revision)] = dict(files)
        self._new_head(repo, revision, files)

    def _handler(self):
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep pytest output clean
                pass

            def _reply(self, status: int, payload: dict) -> None:
                body = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _record(self) -> bytes:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                headers = "".join(f"{k}: {v}\n" for k, v in self.headers.items() if k.lower() != "authorization")
                hub.raw.append(f"{self.command} {self.path}\n{headers}\n".encode() + body)
                hub.authorizations.append(self.headers.get("Authorization", ""))
                hub.requests.append((self.command, self.path.split("?")[0]))
                return body

            def do_GET(self):
                self._record()
                parts = self.path.split("?")[0].split("/")  # ['', 'api', 'models', ns, name, action, rev, *path]
                if len(parts) < 7 or parts[:3] != ["", "api", "models"] or parts[5] not in ("revision", "tree"):
                    return self._reply(404, {"error": f"no route {self.path}"})
                repo, action, revision = f"{parts[3]}/{parts[4]}", parts[5], parts[6]
                oid = hub.heads.get((repo, revision), revision)
                if oid not in hub.snapshots:
                    return self._reply(404, {"error": f"Invalid rev id: {revision}"})
                files = hub.snapshots[oid]
                if action == "revision":
                    return self._reply(200, {"id": repo, "sha": oid, "siblings": [{"rfilename": p} for p in files]})
                prefix = "/".join(parts[7:])
                return self._reply(200, [
                    {"type": "file", "path": path, "size": len(data), "oid": hashlib.sha1(data).hexdigest()}
                    for path, data in sorted(files.items()) if not prefix or path.startswith(prefix + "/")
                ])

            def do_POST(self):
                body = self._record()
                path = self.path.split("?")[0]
                if self.headers.get("Authorization") != f"Bearer {hub.token}":
                    return self._reply(401, {"error": "Invalid credentials in Authorization header"})
                if path == "/api/validate-yaml":
                    return self._reply(200, {"errors": [], "warnings": []})
                if path == "/api/repos/create":
                    if hub.fail_create_repo:
                        return self._reply(hub.fail_create_repo, {"error": "Internal Error - We're working hard to fix this"})
                    data = json.loads(body)
                    namespace = data.get("organization") or hub.user
                    hub._new_head(f"{namespace}/{data['name']}", "main", {}, initial=True)
                    return self._reply(200, {"url": f"{hub.url}/{namespace}/{data['name']}"})
                parts = path.split("/")  # ['', 'api', 'models', ns, name, action, revision]
                if len(parts) != 7 or parts[:3] != ["", "api", "models"]:
                    return self._reply(404, {"error": f"no route {path}"})
                repo, action, revision = f"{parts[3]}/{parts[4]}", parts[5], parts[6]
                if action == "branch":
                    hub.branches.add((repo, revision))
                    if (repo, revision) not in hub.heads:  # a new branch starts at main's head, with its files
                        main = hub.snapshots.get(hub.heads.get((repo, "main")), {})
                        hub._new_head(repo, revision, main, initial=True)
                    return self._reply(200, {})
                if action == "preupload":
                    files = json.loads(body)["files"]
                    return self._reply(200, {"files": [
                        {"path": f["path"], "uploadMode": "regular", "shouldIgnore": False, "oid": None} for f in files
                    ]})
                if action == "commit" and hub.fail_commit:
                    return self._reply(hub.fail_commit, {"error": "Internal Error - We're working hard to fix this"})
                if action == "commit":
                    items = [json.loads(line) for line in body.splitlines()]
                    header = next(item["value"] for item in items if item["key"] == "header")
                    parent = header.get("parentCommit")
                    if parent is not None and parent != hub.heads.get((repo, revision)):
                        return self._reply(412, {"error": f"A commit has happened since {parent}"})
                    stored = dict(hub.snapshots.get(hub.heads.get((repo, revision)), {}))
                    for item in items:
                        path = item["value"].get("path")
                        if item["key"] == "file":
                            stored[path] = base64.b64decode(item["value"]["content"])
                        elif item["key"] in ("deletedFile", "deletedFolder"):
                            gone = [p for p in stored if p == path or p.startswith(path.rstrip("/") + "/")]
                            if not gone:
                                return self._reply(404, {"error": f"cannot delete {path}: no such file"})
                            for name in gone:
                                del stored[name]
                                hub.deleted.append((repo, revision, name))
                        elif item["key"] != "header":
                            return self._reply(400, {"error": f"unexpected commit item {item['key']}"})
                    hub.files[(repo, revision)] = stored
                    hub.commits.append((repo, revision, header["summary"]))
                    oid = hub._new_head(repo, revision, stored)
                    return self._reply(200, {"commitUrl": f"{hub.url}/{repo}/commit/{oid}", "commitOid": oid,
                                             "pullRequestUrl": None})
                return self._reply(404, {"error": f"no route {path}"})

        return Handler


@pytest.fixture
def fake_hub(monkeypatch, tmp_path):
    """A running `FakeHub` that huggingface_hub talks to (HF_ENDPOINT, HF_TOKEN, offline mode off)."""
    import huggingface_hub.constants as constants

    hub = FakeHub()
    hub.thread.start()
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    # conftest turns offline mode on before huggingface_hub is imported; its constant is what is read.
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token-file"))
    monkeypatch.setattr(constants, "ENDPOINT", hub.url)  # huggingface_hub < 1 builds some URLs from it, read at import
    monkeypatch.delenv("HF_OIDC_RESOURCE", raising=False)
    # huggingface_hub < 1 caches its HTTP session, offline (failing every request) if made while offline mode was on.
    reset_sessions = getattr(__import__("huggingface_hub.utils").utils, "reset_sessions", lambda: None)
    reset_sessions()
    yield hub
    reset_sessions()
    hub.server.shutdown()
    hub.server.server_close()
