"""LoRA adapters through the real stack: a tiny random Llama served by `tandem-launcher` with two PEFT adapters given
at start-up and a third loaded at run time, which sends the least recently used out of memory (`--max-cpu-loras 2`).
Each adapter's greedy tokens equal transformers' with that adapter merged into the weights, alone and mixed with the
base model and each other in the same batches; cached prefixes stay with the adapter that computed them; a malformed
adapter is refused and changes nothing."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
import torch
from tandem_harness import FLOAT32_EAGER, TandemServer, write_tiny_llama
from transformers import AutoTokenizer, LlamaForCausalLM, PreTrainedModel

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "server" / "tests"))

from lora_testing import AdapterSpec, greedy, merged, write_adapter

MAX_NEW_TOKENS = 8
# Long enough to stream through the run-time loads and unloads.
STREAMED_TOKENS = 400
# Below this logit gap between the reference's two likeliest tokens, float32 sums in another order may pick either.
NEAR_TIE = 1e-3
PROMPTS = ("The capital of France is", "def fibonacci(n):", "Once upon a time there was")
ADAPTERS = {
    "sql": AdapterSpec(rank=8, alpha=16, targets=("q_proj", "k_proj", "v_proj", "o_proj"), seed=1),
    "chat": AdapterSpec(rank=16, alpha=8, targets=("v_proj", "down_proj"), use_rslora=True, seed=2),
}
LOADED_LATER = AdapterSpec(rank=4, alpha=8, targets=("gate_proj", "up_proj"), seed=3)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The base checkpoint with the embedded model's tokenizer, and one PEFT directory per adapter."""
    root = tmp_path_factory.mktemp("lora")
    base = write_tiny_llama(root / "base")
    paths = {"base": root / "base"}
    for name, spec in {**ADAPTERS, "later": LOADED_LATER}.items():
        paths[name] = write_adapter(root / name, base, spec)
    broken = write_adapter(root / "broken", base, AdapterSpec(rank=4, alpha=4, targets=("q_proj",), seed=4))
    broken_config = json.loads((broken / "adapter_config.json").read_text())
    (broken / "adapter_config.json").write_text(json.dumps({**broken_config, "r": 8}))
    paths["broken"] = broken
    return paths


@pytest.fixture(scope="module")
def references(files: dict[str, Path]) -> dict[str | None, PreTrainedModel]:
    """transformers in float32: the base model (key None) and each adapter merged into it by hand."""
    torch.set_num_threads(1)
    base = LlamaForCausalLM.from_pretrained(files["base"], dtype=torch.float32).eval()
    specs = {**ADAPTERS, "later": LOADED_LATER}
    return {None: base} | {name: merged(base, files[name], spec) for name, spec in specs.items()}


@pytest.fixture(scope="module")
def server(files: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[TandemServer]:
    log_path = tmp_path_factory.mktemp("lora-server") / "launcher.log"
    adapters = ",".join(f"{name}={files[name]}" for name in ADAPTERS)
    server = TandemServer.start(
        log_path,
        "--model-id", str(files["base"]), *FLOAT32_EAGER,
        "--kv-cache-memory", "16MiB",
        "--lora-adapters", adapters,
        "--max-loras", "2",
        # Two adapters' weights in memory: loading a third at run time lets the least recently used one go.
        "--max-cpu-loras", "2",
        "--allow-runtime-lora-updating",
    )  # fmt: skip
    yield server
    assert server.stop() == 0, server.log_tail()


def generate(server: TandemServer, prompt: str, adapter: str | None) -> list[int]:
    parameters = {"max_new_tokens": MAX_NEW_TOKENS, "details": True, "adapter_id": adapter}
    response = requests.post(
        f"{server.base_url}/generate", json={"inputs": prompt, "parameters": parameters}, timeout=120
    )
    assert response.status_code == 200, response.text
    return [token["id"] for token in response.json()["details"]["tokens"]]


def assert_reference_tokens(model: PreTrainedModel, prompt_ids: list[int], got: list[int], what: str) -> None:
    """`got` equals the reference's greedy tokens, or departs from them only where its two likeliest nearly tie."""
    want, logits = greedy(model, prompt_ids, len(got))
    for position, (wanted, token) in enumerate(zip(want, got, strict=True)):
        if wanted != token:
            top2 = torch.topk(logits[position], 2).values
            assert float(top2[0] - top2[1]) < NEAR_TIE, f"{what}: {got} departs from {want} at {position}"
            return


def test_models_lists_the_base_model_and_each_adapter_with_its_parent(server: TandemServer, files: dict[str, Path]):
    models = requests.get(f"{server.base_url}/v1/models", timeout=10).json()["data"]
    base = str(files["base"])
    assert [(model["id"], model["parent"]) for model in models] == [(base, None), ("sql", base), ("chat", base)]


def test_each_adapter_and_the_base_give_their_own_reference_alone_and_batched_together(
    server: TandemServer, files: dict[str, Path], references: dict[str | None, PreTrainedModel]
) -> None:
    tokenizer = AutoTokenizer.from_pretrained(files["base"])
    cases = [(prompt, adapter) for prompt in PROMPTS for adapter in (None, "sql", "chat")]
    alone = {case: generate(server, *case) for case in cases}
    with ThreadPoolExecutor(len(cases)) as pool:
        together = dict(zip(cases, pool.map(lambda case: generate(server, *case), cases), strict=True))
    for prompt, adapter in cases:
        prompt_ids = tokenizer(prompt).input_ids
        what = f"{prompt!r} under {adapter or 'the base model'}"
        assert_reference_tokens(references[adapter], prompt_ids, alone[prompt, adapter], what)
        assert_reference_tokens(references[adapter], prompt_ids, together[prompt, adapter], f"{what}, batched")
    assert alone[PROMPTS[0], "sql"] != alone[PROMPTS[0], None], "the adapter changes nothing"
    assert server.metric("tandem_lora_requests_total", adapter="sql") >= 2 * len(PROMPTS)
    assert "vllm:lora_requests_info{" in requests.get(f"{server.base_url}/metrics", timeout=10).text


def test_the_openai_model_field_selects_the_adapter_and_names_it_in_the_answer(server: TandemServer) -> None:
    body = {"model": "chat", "prompt": PROMPTS[1], "max_tokens": MAX_NEW_TOKENS, "temperature": 0}
    response = requests.post(f"{server.base_url}/v1/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    assert response.json()["model"] == "chat"
    native = requests.post(
        f"{server.base_url}/generate",
        json={"inputs": PROMPTS[1], "parameters": {"max_new_tokens": MAX_NEW_TOKENS, "adapter_id": "chat"}},
        timeout=120,
    )
    assert response.json()["choices"][0]["text"] == native.json()["generated_text"]
    unknown = requests.post(f"{server.base_url}/v1/completions", json={**body, "model": "sq1"}, timeout=30)
    assert unknown.status_code == 400
    assert "it serves" in unknown.json()["error"]["message"]


def test_a_prompt_cached_under_one_adapter_is_recomputed_under_another(server: TandemServer) -> None:
    prompt = " ".join(["tokens shared by every turn of one agent"] * 6)
    hits = "tandem_prefix_cache_hits_tokens_total"
    generate(server, prompt, "sql")
    before = server.metric(hits)
    generate(server, prompt, "sql")
    after_same = server.metric(hits)
    assert after_same > before, "the same adapter reuses its cached prompt"
    generate(server, prompt, "chat")
    generate(server, prompt, None)
    assert server.metric(hits) == after_same, "another adapter or the base model reused blocks it did not compute"


def stream_ids(server: TandemServer, prompt: str, adapter: str, max_new_tokens: int) -> list[int]:
    body = {"inputs": prompt, "parameters": {"max_new_tokens": max_new_tokens, "adapter_id": adapter}}
    ids = []
    with requests.post(f"{server.base_url}/generate_stream", json=body, stream=True, timeout=300) as response:
        assert response.status_code == 200, response.text
        for line in response.iter_lines(decode_unicode=True):
            if line and line.startswith("data:"):
                ids.append(json.loads(line[len("data:") :])["token"]["id"])
    return ids


def test_an_adapter_loads_and_unloads_at_run_time_and_a_malformed_one_changes_nothing(
    server: TandemServer, files: dict[str, Path], references: dict[str | None, PreTrainedModel]
) -> None:
    url = server.base_url
    # A stream under another adapter runs through every load and unload below, untouched by them.
    streaming = ThreadPoolExecutor(1).submit(stream_ids, server, PROMPTS[0], "chat", STREAMED_TOKENS)
    broken = {"lora_name": "broken", "lora_path": str(files["broken"])}
    refused = requests.post(f"{url}/v1/load_lora_adapter", json=broken, timeout=60)
    assert refused.status_code == 400, refused.text
    assert "broken" in refused.json()["error"]["message"]
    missing = {"lora_name": "missing", "lora_path": str(files["base"] / "absent")}
    assert requests.post(f"{url}/v1/load_lora_adapter", json=missing, timeout=60).status_code == 400
    later = {"lora_name": "later", "lora_path": str(files["later"])}
    loaded = requests.post(f"{url}/v1/load_lora_adapter", json=later, timeout=60)
    assert loaded.status_code == 200, loaded.text
    assert not streaming.done(), "the stream ended before the adapter loaded"
    models = [model["id"] for model in requests.get(f"{url}/v1/models", timeout=10).json()["data"]]
    assert models[1:] == ["sql", "chat", "later"]
    tokenizer = AutoTokenizer.from_pretrained(files["base"])
    prompt_ids = tokenizer(PROMPTS[2]).input_ids
    assert_reference_tokens(references["later"], prompt_ids, generate(server, PROMPTS[2], "later"), "later")
    unloaded = requests.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "later"}, timeout=60)
    assert unloaded.status_code == 200, unloaded.text
    gone = requests.post(
        f"{url}/generate", json={"inputs": PROMPTS[2], "parameters": {"adapter_id": "later"}}, timeout=30
    )
    assert gone.status_code == 422
    # "sql" left memory when "later" loaded beside the streaming "chat", and was read again for this request.
    assert_reference_tokens(references["sql"], prompt_ids, generate(server, PROMPTS[2], "sql"), "sql afterwards")
    assert "read LoRA adapter 'sql' again from" in server.log_path.read_text(errors="replace")
    streamed = streaming.result(timeout=300)
    assert len(streamed) == STREAMED_TOKENS
    chat_ids = tokenizer(PROMPTS[0]).input_ids
    assert_reference_tokens(references["chat"], chat_ids, streamed, "the stream under chat")
