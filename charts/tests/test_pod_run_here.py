"""The pod, run here: the chart rendered with its default values and with values-cpu.yaml, its init container's and
main container's command, args and environment taken exactly as rendered and run on this machine in that order, with
the probes the chart declares asked as the kubelet asks them over the whole life of the pod: start, serving, a shard
killed and recovered, and the SIGTERM drain; then `helm test`'s own request.

What differs from a cluster, and only that:
- the cache PVC's mount path (/data) and the /tmp emptyDir (HOME) are temporary directories here;
- HF_ENDPOINT points at a Hub stand-in on this machine, whose `HuggingFaceTB/SmolLM2-1.7B-Instruct` is a tiny
  random-weight Llama with SmolLM2's tokenizer (the default values' model id, so the rendered args stay as they are);
- the HTTP and shard-metrics ports are free ports here (a pod has its own network namespace);
- `--device cuda` becomes `--device cpu` when this machine has no GPU (said in the test's output);
- the preStop hook (`sleep`, which only lets endpoints drop the pod) is skipped, and the API key secret is unset;
- values-cpu.yaml serves the embedded model, whose conversion the PVC is given from the session's model cache, as an
  earlier start would have left it (the conversion itself is tested in launcher/tests).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest
import requests
from helm import objects_of_kind, render

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "launcher" / "tests"))

from hub_standin import HubStandin
from hub_standin_repos import StandinRepo, write_tiny_llama_repo
from resolution_testing import resolve_model
from tandem_launcher.config import DEFAULT_MODEL_CACHE_DIR, EMBEDDED_MODEL_ID

DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-1.7B-Instruct"
BIN = Path(sys.executable).parent
PROBE_EVERY_S = 0.25
START_TIMEOUT_S = 300.0
RECOVERY_TIMEOUT_S = 180.0


def shared_model_cache() -> Path:
    """The launcher's model cache of this machine (as in integration-tests): the embedded conversion lives there."""
    return Path(os.environ.get("MODEL_CACHE_DIR", DEFAULT_MODEL_CACHE_DIR)).expanduser()


@pytest.fixture(scope="module")
def embedded_model() -> Path:
    """The embedded SmolLM2 converted once per machine (minutes the first time), shared with integration-tests."""
    return resolve_model(EMBEDDED_MODEL_ID, None, shared_model_cache()).path


@pytest.fixture(scope="module")
def standin(embedded_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubStandin]:
    repo_dir = write_tiny_llama_repo(tmp_path_factory.mktemp("tiny-llama"), embedded_model)
    hub = HubStandin()
    hub.add(StandinRepo.from_directory(DEFAULT_MODEL, repo_dir))
    with hub:
        yield hub


def gpu_count() -> int:
    try:
        import torch  # noqa: PLC0415

        return torch.cuda.device_count()
    except Exception:
        return 0


def free_port() -> int:
    import socket  # noqa: PLC0415

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class Probe:
    """One of the container's probes, asked as the kubelet asks it: success is a status in 200..399 within
    timeoutSeconds; anything else (refused, timeout, 5xx) is a failure."""

    kind: str
    path: str
    timeout_s: float
    period_s: float
    failure_threshold: int


@dataclass
class ProbeResult:
    at: float
    kind: str
    status: int | None  # None: no answer (refused or timed out)
    phase: str

    @property
    def success(self) -> bool:
        return self.status is not None and 200 <= self.status < 400


@dataclass
class Prober:
    """Asks the startup probe until it succeeds, then liveness and readiness, every PROBE_EVERY_S (faster than the
    declared periods, so short windows are seen), labelling each answer with the pod's phase."""

    base_url: str
    probes: dict[str, Probe]
    results: list[ProbeResult] = field(default_factory=list)
    phase: str = "start"
    started_at: float | None = None
    t0: float = 0.0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Prober:
        self.t0 = time.monotonic()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def ask(self, probe: Probe) -> int | None:
        try:
            return requests.get(f"{self.base_url}{probe.path}", timeout=probe.timeout_s).status_code
        except requests.RequestException:
            return None

    def _run(self) -> None:
        while not self._stop.is_set():
            kinds = ["startup"] if self.started_at is None else ["liveness", "readiness", "health"]
            for kind in kinds:
                probe = self.probes[kind]
                status = self.ask(probe)
                result = ProbeResult(time.monotonic() - self.t0, kind, status, self.phase)
                self.results.append(result)
                if kind == "startup" and result.success:
                    self.started_at = result.at
            self._stop.wait(PROBE_EVERY_S)

    def of(self, kind: str, phase: str | None = None) -> list[ProbeResult]:
        return [r for r in self.results if r.kind == kind and (phase is None or r.phase == phase)]

    def wait_for(self, kind: str, predicate: Any, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        seen = len(self.results)
        while time.monotonic() < deadline:
            fresh = [r for r in self.results[seen:] if r.kind == kind]
            if any(predicate(r) for r in fresh):
                return
            time.sleep(0.05)
        raise AssertionError(f"no {kind} probe matched within {timeout:g}s; last: {self.of(kind)[-5:]}")


class PodHere:
    """The rendered pod's containers as processes on this machine."""

    def __init__(self, objects: list[dict[str, Any]], root: Path, endpoint: str) -> None:
        (deployment,) = objects_of_kind(objects, "Deployment")
        self.pod = deployment["spec"]["template"]["spec"]
        self.root = root
        self.endpoint = endpoint
        self.pvc = root / "pvc"
        self.tmp = root / "tmp"
        self.pvc.mkdir()
        self.tmp.mkdir()
        self.ports: dict[int, int] = {}
        self.device_note = ""
        (self.main,) = self.pod["containers"]
        self.init_containers = self.pod.get("initContainers", [])
        (test_pod,) = objects_of_kind(objects, "Pod")
        self.test_script = test_pod["spec"]["containers"][0]["args"][0]

    def path(self, value: str) -> str:
        for mount, here in (("/data", self.pvc), ("/tmp", self.tmp)):
            if value == mount or value.startswith(mount + "/"):
                return str(here) + value[len(mount) :]
        return value

    def port(self, container_port: int) -> int:
        return self.ports.setdefault(container_port, free_port())

    def argv(self, container: dict[str, Any]) -> list[str]:
        (program,) = container["command"]
        args = [self.path(arg) for arg in container["args"]]
        for flag in ("--port", "--shard-metrics-port"):
            if flag in args:
                index = args.index(flag) + 1
                args[index] = str(self.port(int(args[index])))
        if "--device" in args and args[args.index("--device") + 1] == "cuda" and gpu_count() == 0:
            args[args.index("--device") + 1] = "cpu"
            self.device_note = "the rendered --device cuda runs as --device cpu: this machine has no GPU"
        return [str(BIN / program), *args]

    def env(self, container: dict[str, Any]) -> dict[str, str]:
        rendered = {item["name"]: self.path(item["value"]) for item in container.get("env", []) if "value" in item}
        assert not [item for item in container.get("env", []) if "valueFrom" in item], "secrets are not set here"
        return {"PATH": os.environ["PATH"], "HF_ENDPOINT": self.endpoint, **rendered}

    def probes(self) -> dict[str, Probe]:
        named_ports = {port["name"]: port["containerPort"] for port in self.main["ports"]}
        probes = {}
        for kind in ("startup", "liveness", "readiness"):
            spec = self.main[f"{kind}Probe"]
            assert named_ports[spec["httpGet"]["port"]] == named_ports["http"]
            probes[kind] = Probe(
                kind,
                spec["httpGet"]["path"],
                float(spec.get("timeoutSeconds", 1)),
                float(spec.get("periodSeconds", 10)),
                int(spec.get("failureThreshold", 3)),
            )
        probes["health"] = Probe("health", "/health", 5.0, 10.0, 1)  # for contrast: what liveness must not be
        return probes

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port(self.main['ports'][0]['containerPort'])}"


def shard_pids(launcher_pid: int) -> list[int]:
    return [
        child.pid
        for child in psutil.Process(launcher_pid).children(recursive=True)
        if any("tandem-shard" in part for part in child.cmdline()[:2])
    ]


def stream_completion(base_url: str, tokens: int, sink: list[Any]) -> None:
    body = {
        "model": "m",
        "prompt": "Once upon a time",
        "max_tokens": tokens,
        "stream": True,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    generated, finish = None, None
    with requests.post(f"{base_url}/v1/completions", json=body, stream=True, timeout=300) as response:
        sink.append(response.status_code)
        # Lines end at CR or LF only: a token's text may hold U+2028 or U+0085, which `str.splitlines` also splits at.
        for line in (raw.decode() for raw in response.iter_lines()):
            if line and line.startswith("data:") and line != "data: [DONE]":
                chunk = json.loads(line[len("data:") :])
                for choice in chunk.get("choices") or []:
                    finish = choice.get("finish_reason") or finish
                if chunk.get("usage"):
                    generated = chunk["usage"]["completion_tokens"]
    sink.append((generated, finish))
    sink.append(time.monotonic())


@pytest.mark.timeout(900)
@pytest.mark.parametrize("value_set", ["default", "cpu"])
def test_the_rendered_pod_starts_serves_recovers_and_drains_as_its_probes_say(
    helm: str, standin: HubStandin, embedded_model: Path, tmp_path: Path, value_set: str
) -> None:
    began = time.monotonic()
    pod = PodHere(render(helm, value_set), tmp_path, standin.url)
    if value_set == "cpu":
        # An earlier start of this pod converted the embedded model into the PVC.
        (pod.pvc / "tandem").mkdir()
        shutil.copytree(embedded_model, pod.pvc / "tandem" / embedded_model.name)

    # Init containers, in order, each to completion; then once more, as when the pod is created again.
    downloaded = False
    for container in pod.init_containers:
        assert container["command"] == ["tandem-launcher"] and container["args"][0] == "download"
        for attempt in ("first start", "next start"):
            before = len(standin.downloads())
            done = subprocess.run(
                pod.argv(container), env=pod.env(container), capture_output=True, text=True, timeout=300, check=False
            )
            assert done.returncode == 0, f"{container['name']} ({attempt}):\n{done.stderr}"
            fetched = len(standin.downloads()) - before
            if attempt == "first start":
                assert fetched > 0 and "fetching" in done.stderr and "downloaded " in done.stderr, done.stderr
                downloaded = True
            else:
                assert fetched == 0, "a model complete in the PVC is not downloaded again"
    assert downloaded == (value_set == "default")

    # The main container.
    requests_before = len(standin.logged())
    main_argv, main_env = pod.argv(pod.main), pod.env(pod.main)
    if pod.device_note:
        print(f"\n[{value_set}] {pod.device_note}")
    log_path = tmp_path / "main.log"
    with log_path.open("wb") as log:
        launcher = subprocess.Popen(main_argv, env=main_env, stdout=log, stderr=subprocess.STDOUT)
    prober = Prober(pod.base_url, pod.probes()).start()
    try:
        _live_the_pod(pod, prober, launcher, log_path)
    finally:
        prober.stop()
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    assert len(standin.logged()) == requests_before, "the serving container never contacts the Hub"
    print(f"\n[{value_set}] the pod's life here took {time.monotonic() - began:.1f}s")


def _live_the_pod(pod: PodHere, prober: Prober, launcher: subprocess.Popen[bytes], log_path: Path) -> None:
    def log_tail() -> str:
        return "\n".join(log_path.read_text(errors="replace").splitlines()[-40:])

    _start(prober, launcher, log_tail)
    marks = {"started": time.monotonic()}
    _serve(pod, prober)
    marks["served"] = time.monotonic()
    stream_tokens = _kill_a_shard_and_recover(pod, prober, launcher, log_tail)
    marks["recovered"] = time.monotonic()
    stream_done_at = _drain(pod, prober, launcher, log_tail, stream_tokens)
    marks["drained"] = time.monotonic()
    steps = list(marks.items())
    shown = ", ".join(f"{name} +{at - steps[0][1]:.1f}s" for name, at in steps)
    print(f"\nstartup probe passed {prober.started_at:.1f}s after the container started; then {shown}")

    # Over the whole life: liveness never failed while the router ran, readiness said what the pod could do.
    living = [r for r in prober.of("liveness") if r.phase in ("serving", "recovering", "recovered")]
    living += [r for r in prober.of("liveness", "draining") if prober.t0 + r.at < stream_done_at]
    assert living and all(r.success for r in living), [r for r in living if not r.success]
    assert prober.of("liveness", "draining"), "liveness was asked during the drain"
    assert all(r.success for r in prober.of("readiness", "recovered"))
    assert any(not r.success for r in prober.of("readiness", "draining"))


def _start(prober: Prober, launcher: subprocess.Popen[bytes], log_tail: Any) -> None:
    """Only the startup probe runs until it succeeds, within its budget (periodSeconds x failureThreshold)."""
    startup = prober.probes["startup"]
    deadline = time.monotonic() + START_TIMEOUT_S
    while prober.started_at is None:
        assert launcher.poll() is None, f"the launcher exited with {launcher.returncode}:\n{log_tail()}"
        assert time.monotonic() < deadline, f"never started:\n{log_tail()}"
        time.sleep(0.1)
    assert prober.started_at < startup.period_s * startup.failure_threshold
    assert not prober.of("liveness", "start") and not prober.of("readiness", "start")


def _serve(pod: PodHere, prober: Prober) -> None:
    """Ready; a chat answers, and `helm test`'s own script succeeds against the pod."""
    prober.phase = "serving"
    prober.wait_for("readiness", lambda r: r.success, 120)
    chat = requests.post(
        f"{pod.base_url}/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 8},
        timeout=120,
    )
    assert chat.status_code == 200 and chat.json()["choices"][0]["message"]["content"], chat.text
    script = pod.test_script.replace(
        next(line.split('"')[1] for line in pod.test_script.splitlines() if line.strip().startswith("url =")),
        f"{pod.base_url}/v1/completions",
    )
    helm_test = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180, check=False)
    assert helm_test.returncode == 0 and "completion:" in helm_test.stdout, helm_test.stderr


def _kill_a_shard_and_recover(pod: PodHere, prober: Prober, launcher: subprocess.Popen[bytes], log_tail: Any) -> int:
    """The launcher restarts the group: readiness drops and comes back, /health answers 503 meanwhile, and liveness
    stays up. Returns a stream length of about 4 s at this machine's speed, for the drain."""
    (shard,) = shard_pids(launcher.pid)
    prober.phase = "recovering"
    os.kill(shard, signal.SIGKILL)
    prober.wait_for("readiness", lambda r: not r.success, 60)
    prober.wait_for("readiness", lambda r: r.success, RECOVERY_TIMEOUT_S)
    assert launcher.poll() is None, log_tail()
    assert any(r.status == 503 for r in prober.of("health", "recovering")), "the window /health fails in"
    prober.phase = "recovered"
    body = {"prompt": "Hi", "max_tokens": 32, "ignore_eos": True}
    # The first request after the restart pays for cold paths; timed alone it made the drain's stream end before
    # SIGTERM (and the router with it, so readiness never answered 503).
    warm = requests.post(f"{pod.base_url}/v1/completions", json=body, timeout=120)
    assert warm.status_code == 200, warm.text
    timed = time.monotonic()
    after = requests.post(f"{pod.base_url}/v1/completions", json=body, timeout=120)
    assert after.status_code == 200, after.text
    return max(32, min(600, int(32 / (time.monotonic() - timed) * 4)))


def _drain(pod: PodHere, prober: Prober, launcher: subprocess.Popen[bytes], log_tail: Any, stream_tokens: int) -> float:
    """SIGTERM with a stream in flight: readiness drops at once, liveness stays up, the stream completes, and the
    launcher exits 0 within terminationGracePeriodSeconds. Returns when the stream ended."""
    grace = pod.pod["terminationGracePeriodSeconds"]
    stream: list[Any] = []
    worker = threading.Thread(target=stream_completion, args=(pod.base_url, stream_tokens, stream))
    worker.start()
    deadline = time.monotonic() + 60
    while not stream and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    prober.phase = "draining"
    terminated_at = time.monotonic()
    launcher.send_signal(signal.SIGTERM)
    prober.wait_for("readiness", lambda r: r.status == 503, 30)
    worker.join(timeout=grace)
    prober.phase = "exiting"
    status = launcher.wait(timeout=grace)
    assert time.monotonic() - terminated_at < grace
    assert status == 0, log_tail()
    assert stream[0] == 200 and stream[1] == (stream_tokens, "length"), stream
    return float(stream[2])
