"""The HTTP side of the Hub stand-in: the Hub's routes and its CDN's, answered as the real ones answer
`huggingface_hub` (redirects, ranges, error headers), each request logged."""

from __future__ import annotations

import hashlib
import json
import re
import socket
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

from hub_standin_repos import POINTER_SIZE, StandinRepo, git_blob_oid

if TYPE_CHECKING:
    from hub_standin import HubStandin

_CHUNK = 64 * 1024


@dataclass(frozen=True)
class LoggedRequest:
    server: str  # "hub" or "cdn"
    method: str
    path: str
    range: str | None
    authorized: bool
    status: int
    body_bytes: int


class _HubAnswer(Exception):
    """An error response with the Hub's error headers."""

    def __init__(self, status: int, code: str | None, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


_REVISION_API = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)(?:/revision/(?P<rev>[^/]+))?$")
_TREE_API = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/tree/(?P<rev>[^/]+)(?:/(?P<path>.*))?$")
_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")
_CDN = re.compile(r"^/cdn/(?P<sha>[0-9a-f]{64})$")


class HubStandinHandler(BaseHTTPRequestHandler):
    standin: HubStandin
    role: str
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_HEAD(self) -> None:
        self._serve(head=True)

    def do_GET(self) -> None:
        self._serve(head=False)

    def _serve(self, head: bool) -> None:
        split = urlsplit(self.path)
        self._path, self._query = unquote(split.path), parse_qs(split.query)
        self._status, self._sent = 0, 0
        self._extra_headers: dict[str, str] = {}
        try:
            if self.role == "cdn":
                self._cdn(head)
            else:
                self._hub(head)
        except _HubAnswer as answer:
            self._error(answer, head)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        finally:
            self.standin.log(
                LoggedRequest(
                    server=self.role,
                    method=self.command,
                    path=self._path,
                    range=self.headers.get("Range"),
                    authorized="Authorization" in self.headers,
                    status=self._status,
                    body_bytes=self._sent,
                )
            )

    # The Hub: repo API and /resolve.

    def _hub(self, head: bool) -> None:
        if self._path == "/api/agent-harnesses":  # huggingface_hub's daily fetch of the agent registry
            self._json({"standardEnvVars": [], "harnesses": {}}, head)
        elif match := _TREE_API.match(self._path):
            repo = self._readable_repo(match["repo"], files=False)
            commit = self._commit(repo, match["rev"])
            self._json(self._tree(repo, match["path"] or "", commit), head)
        elif match := _REVISION_API.match(self._path):
            repo = self._readable_repo(match["repo"], files=False)
            commit = self._commit(repo, match["rev"] or "main")
            self._json(self._model_info(repo, commit, blobs=self._query.get("blobs") == ["true"]), head)
        elif match := _RESOLVE.match(self._path):
            repo = self._readable_repo(match["repo"], files=True)
            commit = self._commit(repo, match["rev"])
            self._resolve(repo, commit, match["path"], head)
        else:
            raise _HubAnswer(404, None, f"no route {self._path}")

    def _token(self) -> str | None:
        header = self.headers.get("Authorization", "")
        return header[len("Bearer ") :].strip() if header.startswith("Bearer ") else None

    def _readable_repo(self, repo_id: str, files: bool) -> StandinRepo:
        token = self._token()
        if token is not None and token not in self.standin.tokens:
            raise _HubAnswer(401, None, "Invalid credentials in Authorization header")
        repo = self.standin.repos.get(repo_id)
        if repo is None or (repo.private and token not in repo.allowed_tokens):
            status = 401 if token is None else 404
            raise _HubAnswer(status, "RepoNotFound", "Repository not found")
        if repo.gated and files and token not in repo.allowed_tokens:
            if token is None:
                raise _HubAnswer(
                    401,
                    "GatedRepo",
                    f"Access to model {repo_id} is restricted. You must have access to it and be authenticated to "
                    "access it. Please log in.",
                )
            raise _HubAnswer(
                403,
                "GatedRepo",
                f"Access to model {repo_id} is restricted and you are not in the authorized list. Visit "
                f"{self.standin.url}/{repo_id} to ask for access.",
            )
        return repo

    def _commit(self, repo: StandinRepo, revision: str) -> str:
        commit = repo.resolve(revision)
        if commit is None:
            raise _HubAnswer(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        return commit

    def _model_info(self, repo: StandinRepo, commit: str, blobs: bool) -> dict[str, Any]:
        siblings = []
        for path in sorted(repo.files):
            sibling: dict[str, Any] = {"rfilename": path}
            if blobs:
                sibling.update(size=repo.listed_size(path), blobId=git_blob_oid(repo.files[path]))
                if repo.is_lfs(path):
                    sibling["lfs"] = {"sha256": repo.sha256(path), "size": repo.listed_size(path), "pointerSize": 134}
            siblings.append(sibling)
        return {
            "_id": hashlib.md5(repo.repo_id.encode()).hexdigest()[:24],
            "id": repo.repo_id,
            "modelId": repo.repo_id,
            "author": repo.repo_id.split("/")[0],
            "sha": commit,
            "lastModified": "2025-01-01T00:00:00.000Z",
            "createdAt": "2025-01-01T00:00:00.000Z",
            "private": repo.private,
            "gated": "manual" if repo.gated else False,
            "disabled": False,
            "downloads": 0,
            "likes": 0,
            "library_name": "transformers",
            "tags": ["transformers", "safetensors", "llama", "text-generation"],
            "pipeline_tag": "text-generation",
            "siblings": siblings,
        }

    def _tree(self, repo: StandinRepo, prefix: str, commit: str) -> list[dict[str, Any]]:
        recursive = self._query.get("recursive", ["false"])[0].lower() == "true"
        base = f"{prefix.rstrip('/')}/" if prefix else ""
        entries: dict[str, dict[str, Any]] = {}
        for path in sorted(repo.files):
            if not path.startswith(base):
                continue
            rest = path[len(base) :]
            if "/" in rest and not recursive:
                folder = base + rest.split("/")[0]
                entries[folder] = {"type": "directory", "oid": git_blob_oid(folder.encode()), "size": 0, "path": folder}
                continue
            for depth in range(1, rest.count("/") + 1):
                folder = base + "/".join(rest.split("/")[:depth])
                entries[folder] = {"type": "directory", "oid": git_blob_oid(folder.encode()), "size": 0, "path": folder}
            entry: dict[str, Any] = {
                "type": "file",
                "oid": git_blob_oid(repo.files[path]),
                "size": repo.listed_size(path),
                "path": path,
            }
            if repo.is_lfs(path):
                entry["lfs"] = {"oid": repo.sha256(path), "size": repo.listed_size(path), "pointerSize": POINTER_SIZE}
            entries[path] = entry
        return list(entries.values())

    def _resolve(self, repo: StandinRepo, commit: str, path: str, head: bool) -> None:
        if path not in repo.files:
            self._extra_headers = {"X-Repo-Commit": commit}
            raise _HubAnswer(404, "EntryNotFound", f"{path} does not exist on commit {commit}")
        if repo.is_lfs(path):
            sha256 = repo.sha256(path)
            self._status = 302
            self.send_response(302)
            self.send_header("Location", f"{self.standin.cdn_url}/cdn/{sha256}?X-Signature={quote(commit)}")
            self.send_header("X-Repo-Commit", commit)
            self.send_header("X-Linked-Etag", f'"{sha256}"')
            self.send_header("X-Linked-Size", str(len(repo.files[path])))
            self.send_header("ETag", f'"{git_blob_oid(repo.files[path])}"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        headers = {"X-Repo-Commit": commit, "ETag": f'"{git_blob_oid(repo.files[path])}"'}
        self._body(repo.files[path], headers, head, throttle=0.0, cut=None, sha256=None)

    # The CDN: LFS bodies by sha256, no authorization needed.

    def _cdn(self, head: bool) -> None:
        match = _CDN.match(self._path)
        found = self.standin.file_by_sha256(match["sha"]) if match else None
        if found is None:
            raise _HubAnswer(404, None, "NoSuchKey")
        repo, path = found
        sha256 = match["sha"]  # type: ignore[index]
        cut = None if head or self.headers.get("Range") else self.standin.take_cut(sha256)
        headers = {"ETag": f'"{sha256}"'}
        self._body(repo.files[path], headers, head, throttle=self.standin.throttle_of(sha256), cut=cut, sha256=sha256)

    # Responses.

    def _body(
        self, data: bytes, headers: dict[str, str], head: bool, throttle: float, cut: int | None, sha256: str | None
    ) -> None:
        start, end = 0, len(data) - 1
        status = 200
        requested = self.headers.get("Range")
        if requested and (match := re.fullmatch(r"bytes=(\d+)-(\d*)", requested.strip())):
            start = int(match[1])
            end = min(int(match[2]), end) if match[2] else end
            if start > end:
                raise _HubAnswer(416, None, f"range {requested} outside {len(data)} bytes")
            status = 206
        self._status = status
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(end - start + 1))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
        self.end_headers()
        if head:
            return
        position = start
        while position <= end:
            chunk_end = min(position + _CHUNK, end + 1)
            if cut is not None and chunk_end - start >= cut:
                chunk_end = start + cut
                self.wfile.write(data[position:chunk_end])
                self._sent += chunk_end - position
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            self.wfile.write(data[position:chunk_end])
            self._sent += chunk_end - position
            if sha256 is not None:
                self.standin.count_streamed(sha256, chunk_end - position)
            position = chunk_end
            if throttle:
                self.wfile.flush()
                time.sleep(throttle)

    def _json(self, payload: Any, head: bool) -> None:
        body = json.dumps(payload).encode()
        self._status = 200
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)
            self._sent = len(body)

    def _error(self, answer: _HubAnswer, head: bool) -> None:
        body = json.dumps({"error": answer.message}).encode()
        self._status = answer.status
        self.send_response(answer.status)
        if answer.code:
            self.send_header("X-Error-Code", answer.code)
        self.send_header("X-Error-Message", answer.message)
        for name, value in self._extra_headers.items():
            self.send_header(name, value)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)
