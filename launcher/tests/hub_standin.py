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

import threading
from http.server import ThreadingHTTPServer

from hub_standin_http import HubStandinHandler, LoggedRequest
from hub_standin_repos import StandinRepo


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
    handler = type(f"{role.title()}Handler", (HubStandinHandler,), {"standin": standin, "role": role})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    return server
