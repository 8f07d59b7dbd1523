"""A Hugging Face Hub stand-in served over real HTTP, for tests on machines that cannot reach the Hub.

It implements what `huggingface_hub` (2.x) calls for `snapshot_download` and `hf_hub_download`, as the real Hub
answers it:

- `GET /api/models/{repo}/revision/{rev}` (`?blobs=true` adds sizes): the commit (`sha`) and `siblings`;
- `GET /api/models/{repo}/tree/{rev}?recursive=...`: the file listing with sizes, git oids and LFS sha256;
- `HEAD`/`GET /{repo}/resolve/{rev}/{file}`: small files answer 200 with `ETag` (git oid), `X-Repo-Commit` and
  `Content-Length`; LFS files (weights) answer 302 to a CDN on another origin with `X-Linked-Etag` (sha256),
  `X-Linked-Size` and `X-Repo-Commit`, so huggingface_hub drops the Authorization header as it does for the real
  CDN; bodies honour `Range` (206 + `Content-Range`);
- `GET /api/agent-harnesses` (huggingface_hub fetches it once a day), answered with an empty registry;
- errors with the Hub's `X-Error-Code`/`X-Error-Message`: gated repos answer 401 without a token and 403 with a token
  lacking access, missing or private repos 401 (anonymous) or 404, unknown revisions and files 404, unknown tokens
  401 "Invalid credentials in Authorization header".

Every request is logged (`requests`), a file's first download can be cut half-way (`cut_once`) or slowed
(`throttle`), and a file's listed size can be overstated (`StandinRepo.listed_sizes`)."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

LFS_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pth", ".pt")
POINTER_SIZE = 134
_CHUNK = 64 * 1024


def git_blob_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class StandinRepo:
    """A model repo at one commit; `files` maps paths (with `/` for subdirectories) to their bytes."""

    repo_id: str
    files: dict[str, bytes]
    commit: str = ""
    branches: dict[str, str] = field(default_factory=dict)
    gated: bool = False
    private: bool = False
    # Tokens whose account may read the files of a gated or private repo.
    allowed_tokens: set[str] = field(default_factory=set)
    # Sizes the listing reports instead of the real ones (a repo too large for the disk).
    listed_sizes: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.commit:
            digest = hashlib.sha1(self.repo_id.encode())
            for name in sorted(self.files):
                digest.update(name.encode() + hashlib.sha256(self.files[name]).digest())
            self.commit = digest.hexdigest()
        self.branches.setdefault("main", self.commit)

    @classmethod
    def from_directory(cls, repo_id: str, directory: Path, **kwargs: Any) -> StandinRepo:
        files = {
            path.relative_to(directory).as_posix(): path.read_bytes()
            for path in sorted(directory.rglob("*"))
            if path.is_file()
        }
        return cls(repo_id, files, **kwargs)

    def is_lfs(self, path: str) -> bool:
        return path.endswith(LFS_SUFFIXES)

    def sha256(self, path: str) -> str:
        return hashlib.sha256(self.files[path]).hexdigest()

    def listed_size(self, path: str) -> int:
        return self.listed_sizes.get(path, len(self.files[path]))

    def resolve(self, revision: str) -> str | None:
        if revision in self.branches:
            return self.branches[revision]
        return revision if revision == self.commit else None


@dataclass(frozen=True)
class LoggedRequest:
    server: str  # "hub" or "cdn"
    method: str
    path: str
    range: str | None
    authorized: bool
    status: int
    body_bytes: int


class HubStandin:
    """The Hub at `url` and its CDN on another port; `start()` serves both from background threads."""

    def __init__(self, tokens: set[str] | None = None) -> None:
        self.repos: dict[str, StandinRepo] = {}
        # Tokens the stand-in knows (any other one is "invalid credentials").
        self.tokens: set[str] = set(tokens or ())
        self.requests: list[LoggedRequest] = []
        self._lock = threading.Lock()
        self._cuts: dict[str, int] = {}
        self._streamed: dict[str, int] = {}
        self._throttle: dict[str, float] = {}
        self._servers: list[ThreadingHTTPServer] = []
        self._threads: list[threading.Thread] = []
        self.url = ""
        self.cdn_url = ""

    def add(self, repo: StandinRepo) -> StandinRepo:
        self.repos[repo.repo_id] = repo
        return repo

    def cut_once(self, repo_id: str, path: str, after_bytes: int) -> None:
        """The next full download of the file stops after `after_bytes` bytes (the connection is dropped)."""
        self._cuts[self.repos[repo_id].sha256(path)] = after_bytes

    def throttle(self, repo_id: str, path: str, seconds_per_chunk: float) -> None:
        """Bodies of the file are sent 64 KiB at a time with a pause after each chunk."""
        self._throttle[self.repos[repo_id].sha256(path)] = seconds_per_chunk

    def start(self) -> HubStandin:
        hub = _server(self, "hub")
        cdn = _server(self, "cdn")
        self.url = f"http://127.0.0.1:{hub.server_address[1]}"
        self.cdn_url = f"http://127.0.0.1:{cdn.server_address[1]}"
        for server in (hub, cdn):
            thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
            thread.start()
            self._servers.append(server)
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        for server in self._servers:
            server.shutdown()
            server.server_close()
        for thread in self._threads:
            thread.join(timeout=5)
        self._servers, self._threads = [], []

    def __enter__(self) -> HubStandin:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def log(self, entry: LoggedRequest) -> None:
        with self._lock:
            self.requests.append(entry)

    def downloads(self, suffix: str = "") -> list[LoggedRequest]:
        """GETs that sent a file body (from the Hub or the CDN), optionally of paths ending in `suffix`."""
        return [
            entry
            for entry in self.logged()
            if entry.method == "GET"
            and entry.status in (200, 206)
            and "/api/" not in entry.path
            and entry.path.endswith(suffix)
        ]

    def logged(self) -> list[LoggedRequest]:
        with self._lock:
            return list(self.requests)

    def streamed(self, sha256: str) -> int:
        """Bytes of the LFS file sent so far, counted while they are sent (the log records finished requests)."""
        with self._lock:
            return self._streamed.get(sha256, 0)

    def count_streamed(self, sha256: str, size: int) -> None:
        with self._lock:
            self._streamed[sha256] = self._streamed.get(sha256, 0) + size

    def take_cut(self, sha256: str) -> int | None:
        with self._lock:
            return self._cuts.pop(sha256, None)

    def throttle_of(self, sha256: str) -> float:
        return self._throttle.get(sha256, 0.0)

    def file_by_sha256(self, sha256: str) -> tuple[StandinRepo, str] | None:
        for repo in self.repos.values():
            for path in repo.files:
                if repo.is_lfs(path) and repo.sha256(path) == sha256:
                    return repo, path
        return None


def _server(standin: HubStandin, role: str) -> ThreadingHTTPServer:
    handler = type(f"{role.title()}Handler", (_Handler,), {"standin": standin, "role": role})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    return server


class _HubAnswer(Exception):
    """An error response with the Hub's error headers."""

    def __init__(self, status: int, code: str | None, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


_REVISION_API = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)(?:/revision/(?P<rev>[^/]+))?$")
_TREE_API = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/tree/(?P<rev>[^/]+)(?:/(?P<path>.*))?$")
_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")
_CDN = re.compile(r"^/cdn/(?P<sha>[0-9a-f]{64})$")


class _Handler(BaseHTTPRequestHandler):
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


# A model repo with real weights: a tiny random Llama speaking the embedded SmolLM2's tokenizer.

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


def write_tiny_llama_repo(directory: Path, tokenizer_dir: Path, seed: int = 0) -> Path:
    """A 2-layer random-weight Llama with SmolLM2's vocabulary, tokenizer and chat template, its weights in two
    safetensors shards with an index, plus files serving must not fetch (README, a pickle copy of the weights, an
    `original/` copy and a `consolidated.safetensors` duplicate)."""
    import torch  # noqa: PLC0415
    from transformers import LlamaConfig, LlamaForCausalLM  # noqa: PLC0415

    tokenizer = json.loads((tokenizer_dir / "tokenizer.json").read_text())
    generation = json.loads((tokenizer_dir / "generation_config.json").read_text())
    vocab_size = len(tokenizer["model"]["vocab"]) + sum(
        1 for token in tokenizer.get("added_tokens", []) if token["id"] >= len(tokenizer["model"]["vocab"])
    )
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=generation.get("bos_token_id", 1),
        eos_token_id=generation.get("eos_token_id", 2),
        initializer_range=0.2,
    )
    model = LlamaForCausalLM(config).eval()
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory, max_shard_size="4MB")
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).is_file():
            shutil.copyfile(tokenizer_dir / name, directory / name)
    (directory / "README.md").write_text("---\nlicense: apache-2.0\n---\n# tiny random Llama for Tandem's tests\n")
    (directory / ".gitattributes").write_text("*.safetensors filter=lfs diff=lfs merge=lfs -text\n")
    (directory / "original").mkdir(exist_ok=True)
    shards = sorted(directory.glob("model-*.safetensors"))
    shutil.copyfile(shards[0], directory / "original" / "model.safetensors")
    shutil.copyfile(shards[0], directory / "consolidated.safetensors")
    (directory / "pytorch_model.bin").write_bytes(b"pickle copy that serving never fetches")
    return directory


def synthetic_repo(repo_id: str, weights_size: int = 4 * 1024 * 1024, **kwargs: Any) -> StandinRepo:
    """A repo with the files resolution checks for and `weights_size` random bytes of "weights" (for download tests
    that never load the model)."""
    import random  # noqa: PLC0415

    weights = random.Random(repo_id).randbytes(weights_size)
    files = {
        "config.json": json.dumps({"model_type": "llama", "max_position_embeddings": 1024}).encode(),
        "generation_config.json": b'{"eos_token_id": 2}',
        "tokenizer.json": b'{"version": "1.0"}',
        "tokenizer_config.json": b"{}",
        "model.safetensors": weights,
        "README.md": b"# synthetic\n",
        "original/consolidated.00.pth": b"not fetched",
    }
    return StandinRepo(repo_id, files, **kwargs)


def served_names(directory: Path) -> list[str]:
    return sorted(path.name for path in directory.iterdir())


def iter_lines(path: Path) -> Iterator[str]:
    yield from path.read_text(errors="replace").splitlines()
