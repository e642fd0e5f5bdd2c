"""A local stand-in for the Hugging Face Hub's HTTP API: the routes huggingface_hub (2.x) calls to
create a repo and a branch, push a folder (`upload_folder`: preupload, commit) and download a
snapshot (`snapshot_download`: the revision's info, its file tree, each file's resolve URL), and
check a model card's front matter as the Hub does before a push (`card_errors`, in part), on
127.0.0.1, for tests that cross that boundary. huggingface_hub talks to it as to the Hub when
HF_ENDPOINT names it (a subprocess's environment) or `endpoint=` does.

What it leaves out, on purpose: Git LFS and Xet storage (every file is committed inline, as
"regular", which the Hub does for small text files; huggingface_hub then never opens a Xet
transfer), pull requests, tags, the web pages. Writes need `Authorization: Bearer TOKEN`; a
private repo is 404 to a reader without it, as on the Hub.

    with HubStandIn(token="hf_test") as hub:
        env = {"HF_ENDPOINT": hub.url, "HF_TOKEN": "hf_test"}
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

_REPO = r"(?P<repo>[^/]+/[^/]+)"
_REV = r"(?P<rev>[^/]+)"


# Hub tasks (`pipeline_tag`), the part of the Hub's list a card of pingctl could name
TASKS = {"time-series-forecasting", "tabular-regression", "tabular-classification", "text-generation",
         "graph-ml", "other"}


def card_errors(content: str) -> list[str]:
    """What the Hub's README.md check (`/api/validate-yaml`) would refuse in a model card's front
    matter, for the keys a pingctl card sets: YAML, a known task, dataset ids, model-index entries."""
    import yaml

    if not content.startswith("---\n"):
        return []
    try:
        meta = yaml.safe_load(content[4:].partition("\n---\n")[0])
    except yaml.YAMLError as e:
        return [f"invalid YAML: {e}"]
    if not isinstance(meta, dict):
        return ["metadata is not a mapping"]
    errors = []
    if "pipeline_tag" in meta and meta["pipeline_tag"] not in TASKS:
        errors.append(f'"pipeline_tag" must be a known task, not {meta["pipeline_tag"]!r}')
    if not all(isinstance(d, str) and d for d in meta.get("datasets") or []):
        errors.append('"datasets" must be a list of dataset ids')
    for entry in meta.get("model-index") or []:
        for r in entry.get("results") or [None] if entry.get("name") else [None]:
            dataset = r.get("dataset", {}) if isinstance(r, dict) else {}
            ok = isinstance(r, dict) and r.get("task", {}).get("type") and dataset.get("name") and dataset.get("type") \
                and all(m.get("type") and "value" in m for m in r.get("metrics", []))
            if not ok:
                errors.append('"model-index": each entry needs a name, and results with task.type, dataset.name, '
                              'dataset.type and metrics with a type and a value')
    return errors


def git_oid(data: bytes) -> str:
    """The git blob id of `data` (what the Hub gives a regular file as its oid and ETag)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Repo:
    private: bool
    branches: dict[str, str] = field(default_factory=dict)  # branch -> commit id
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)  # commit id -> {path: content}

    def commit(self, branch: str, files: dict[str, bytes], message: str) -> str:
        parent = self.branches.get(branch, "")
        oid = hashlib.sha1(json.dumps([parent, message, sorted((p, git_oid(b)) for p, b in files.items())])
                           .encode()).hexdigest()
        self.commits[oid] = dict(files)
        self.branches[branch] = oid
        return oid

    def resolve(self, rev: str) -> str | None:
        """A branch name or a commit id -> the commit id (None: no such revision)."""
        return self.branches.get(rev) or (rev if rev in self.commits else None)


class HubStandIn:
    """The stand-in, serving on a free port of 127.0.0.1 while in a `with` block. `repos` holds
    what was pushed; `requests` every (method, path) asked, in order."""

    def __init__(self, token: str = "hf_standin_token"):
        self.token = token
        self.repos: dict[str, Repo] = {}
        self.requests: list[tuple[str, str]] = []
        self.lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._server.daemon_threads = True
        self._server.hub = self  # what the handler answers from
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> HubStandIn:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def files(self, repo_id: str, rev: str = "main") -> dict[str, bytes]:
        repo = self.repos[repo_id]
        return repo.commits[repo.resolve(rev)]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as huggingface_hub's client expects

    @property
    def hub(self) -> HubStandIn:
        return self.server.hub

    def log_message(self, *args) -> None:  # quiet: `hub.requests` keeps what was asked
        pass

    def do_GET(self) -> None:
        self._route("GET")

    def do_HEAD(self) -> None:
        self._route("HEAD")

    def do_POST(self) -> None:
        self._route("POST")

    def _route(self, method: str) -> None:
        url = urlsplit(self.path)
        self.body = self.rfile.read(int(self.headers.get("Content-Length") or 0)) if method == "POST" else b""
        with self.hub.lock:
            self.hub.requests.append((method, unquote(url.path)))
            for m, pattern, fn in ROUTES:
                hit = re.fullmatch(pattern, url.path)  # quoted: a branch "a/b" is one part, a%2Fb
                if hit and (m == method or (m, method) == ("GET", "HEAD")):
                    return fn(self, **{k: unquote(v) for k, v in hit.groupdict().items() if v is not None})
            self._send(404, {"error": f"no route {method} {url.path}"})

    # ------------------------------------------------------------ answers

    def _send(self, status: int, doc=None, body: bytes | None = None, headers: dict | None = None) -> None:
        data = body if body is not None else json.dumps(doc).encode() if doc is not None else b""
        self.send_response(status)
        self.send_header("Content-Type", "application/json" if body is None else "application/octet-stream")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _authorized(self) -> bool:
        return self.headers.get("Authorization") == f"Bearer {self.hub.token}"

    def _repo(self, repo: str, write: bool = False) -> Repo | None:
        """The repo, or None once a 401 or a 404 is sent (a private one is hidden from a reader
        without the token; a write needs it)."""
        if write and not self._authorized():
            self._send(401, {"error": "Invalid credentials in Authorization header"})
            return None
        r = self.hub.repos.get(repo)
        if r is None or (r.private and not self._authorized()):
            self._send(404, {"error": "Repository not found"}, headers={"X-Error-Code": "RepoNotFound"})
            return None
        return r

    def _commit_of(self, r: Repo, rev: str) -> str | None:
        oid = r.resolve(rev)
        if oid is None:
            self._send(404, {"error": f"Invalid rev id: {rev}"}, headers={"X-Error-Code": "RevisionNotFound"})
        return oid

    # ------------------------------------------------------------ routes

    def validate_yaml(self) -> None:
        errors = card_errors(json.loads(self.body)["content"])
        self._send(400 if errors else 200, {"errors": [{"message": e} for e in errors], "warnings": []})

    def create_repo(self) -> None:
        if not self._authorized():
            return self._send(401, {"error": "Invalid credentials in Authorization header"})
        doc = json.loads(self.body or b"{}")
        repo = f"{doc.get('organization')}/{doc['name']}"
        if repo in self.hub.repos:
            return self._send(409, {"error": "You already created this model repo", "url": f"{self.hub.url}/{repo}"})
        self.hub.repos[repo] = r = Repo(private=doc.get("visibility") == "private" or bool(doc.get("private")))
        r.commit("main", {".gitattributes": b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n"},
                 "initial commit")
        self._send(200, {"url": f"{self.hub.url}/{repo}", "name": repo})

    def create_branch(self, repo: str, branch: str) -> None:
        r = self._repo(repo, write=True)
        if r is None:
            return None
        if branch in r.branches:
            return self._send(409, {"error": f"Reference already exists: refs/heads/{branch}"})
        start = r.resolve(json.loads(self.body or b"{}").get("startingPoint") or "main")
        r.branches[branch] = start
        self._send(200, {})

    def info(self, repo: str, rev: str = "main") -> None:
        r = self._repo(repo)
        oid = r and self._commit_of(r, rev)
        if oid:
            self._send(200, {"id": repo, "modelId": repo, "sha": oid, "private": r.private,
                             "siblings": [{"rfilename": p} for p in sorted(r.commits[oid])]})

    def tree(self, repo: str, rev: str) -> None:
        r = self._repo(repo)
        oid = r and self._commit_of(r, rev)
        if oid:
            files = r.commits[oid]
            self._send(200, [{"type": "file", "oid": git_oid(files[p]), "size": len(files[p]), "path": p}
                             for p in sorted(files)])

    def preupload(self, repo: str, rev: str) -> None:
        r = self._repo(repo, write=True)
        oid = r and self._commit_of(r, rev)
        if oid:
            have = r.commits[oid]
            self._send(200, {"files": [
                {"path": f["path"], "uploadMode": "regular", "shouldIgnore": False,
                 "oid": git_oid(have[f["path"]]) if f["path"] in have else None}
                for f in json.loads(self.body)["files"]]})

    def commit(self, repo: str, rev: str) -> None:
        r = self._repo(repo, write=True)
        oid = r and self._commit_of(r, rev)
        if not oid:
            return None
        files, summary = dict(r.commits[oid]), ""
        for line in self.body.splitlines():
            item = json.loads(line)
            value = item["value"]
            if item["key"] == "header":
                summary = value.get("summary", "")
            elif item["key"] == "file":
                files[value["path"]] = base64.b64decode(value["content"])
            elif item["key"] == "deletedFile":
                files.pop(value["path"], None)
            else:  # lfsFile, deletedFolder: never asked of a stand-in that says "regular"
                return self._send(400, {"error": f"unsupported commit operation {item['key']}"})
        new = r.commit(rev, files, summary)
        self._send(200, {"commitUrl": f"{self.hub.url}/{repo}/commit/{new}", "commitOid": new,
                         "pullRequestUrl": None})

    def resolve(self, repo: str, rev: str, file: str) -> None:
        r = self._repo(repo)
        oid = r and self._commit_of(r, rev)
        if not oid:
            return None
        data = r.commits[oid].get(file)
        if data is None:
            return self._send(404, {"error": "Entry not found"},
                              headers={"X-Error-Code": "EntryNotFound", "X-Repo-Commit": oid})
        self._send(200, body=data, headers={"X-Repo-Commit": oid, "ETag": f'"{git_oid(data)}"'})


ROUTES = [
    ("POST", r"/api/validate-yaml", _Handler.validate_yaml),
    ("POST", r"/api/repos/create", _Handler.create_repo),
    ("POST", rf"/api/models/{_REPO}/branch/(?P<branch>[^/]+)", _Handler.create_branch),
    ("GET", rf"/api/models/{_REPO}(?:/revision/{_REV})?", _Handler.info),
    ("GET", rf"/api/models/{_REPO}/tree/{_REV}", _Handler.tree),
    ("POST", rf"/api/models/{_REPO}/preupload/{_REV}", _Handler.preupload),
    ("POST", rf"/api/models/{_REPO}/commit/{_REV}", _Handler.commit),
    ("GET", rf"/{_REPO}/resolve/{_REV}/(?P<file>.+)", _Handler.resolve),
]
