"""A model's generation_config.json sampling values become OpenAI requests' defaults (`--generation-config auto`),
and every EOS id its config.json names ends a request, through the launcher, on the embedded model with a generation
config that recommends `top_k: 1` and a config.json that names `.` as a second EOS token."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from tandem_harness import TandemServer, embedded_model_dir

# top_k 1 leaves only the most likely token, so a request sampled with these defaults decodes greedily whatever its
# seed, where the OpenAI default (temperature 1, no top_k) would sample.
RECOMMENDED = {"do_sample": True, "temperature": 0.7, "top_k": 1}
MESSAGES = [{"role": "user", "content": "Write a short poem about a lighthouse."}]
# Only config.json names it: the shard reads it from there and reports it in Info, the router's only EOS source.
EXTRA_EOS_TEXT = "."


@pytest.fixture(scope="module")
def recommending_tandem(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TandemServer]:
    workdir = tmp_path_factory.mktemp("generation-config")
    embedded = embedded_model_dir()
    model_dir = workdir / "model"
    model_dir.mkdir()
    for file in embedded.iterdir():
        if file.name not in ("generation_config.json", "config.json"):
            (model_dir / file.name).symlink_to(file)
    generation_config = json.loads((embedded / "generation_config.json").read_text())
    (model_dir / "generation_config.json").write_text(json.dumps({**generation_config, **RECOMMENDED}))
    config = json.loads((embedded / "config.json").read_text())
    extra_eos = json.loads((embedded / "tokenizer.json").read_text())["model"]["vocab"][EXTRA_EOS_TEXT]
    (model_dir / "config.json").write_text(json.dumps({**config, "eos_token_id": [config["eos_token_id"], extra_eos]}))
    server = TandemServer.start(workdir / "launcher.log", "--model-id", str(model_dir), "--kv-cache-memory", "128MiB")
    yield server
    assert server.stop() == 0, server.log_tail()


def _chat(server: TandemServer, **fields: Any) -> str:
    body = {"messages": MESSAGES, "max_tokens": 24, **fields}
    reply = requests.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    return str(reply.json()["choices"][0]["message"]["content"])


def test_info_reports_the_recommended_sampling_values(recommending_tandem: TandemServer) -> None:
    assert recommending_tandem.info()["default_sampling"] == {"temperature": 0.7, "top_k": 1}


def test_requests_that_set_no_sampling_fields_use_the_recommended_ones(recommending_tandem: TandemServer) -> None:
    greedy = _chat(recommending_tandem, temperature=0)
    assert [_chat(recommending_tandem, seed=seed) for seed in (1, 2, 3)] == [greedy] * 3


def test_fields_the_client_sets_override_the_recommended_ones(recommending_tandem: TandemServer) -> None:
    greedy = _chat(recommending_tandem, temperature=0)
    sampled = [_chat(recommending_tandem, temperature=1.0, top_k=0, seed=seed) for seed in (1, 2, 3)]
    assert any(text != greedy for text in sampled), sampled


def test_the_embedded_models_own_config_recommends_nothing(tandem: TandemServer) -> None:
    assert tandem.info()["default_sampling"] == {}


def test_the_router_logs_the_defaults_it_applies(recommending_tandem: TandemServer) -> None:
    log = recommending_tandem.log_path.read_text(errors="replace")
    assert "sample with generation_config.json's values" in log, recommending_tandem.log_tail()


def _complete(server: TandemServer, **fields: Any) -> dict[str, Any]:
    body = {"prompt": "The capital of France is Paris. The capital of Germany is", "max_tokens": 12, **fields}
    reply = requests.post(f"{server.base_url}/v1/completions", json={**body, "temperature": 0}, timeout=120)
    assert reply.status_code == 200, reply.text
    return dict(reply.json()["choices"][0])


def test_every_eos_id_of_the_models_config_ends_a_request_unless_it_ignores_eos(
    recommending_tandem: TandemServer,
) -> None:
    ignoring = _complete(recommending_tandem, ignore_eos=True)
    assert ignoring["finish_reason"] == "length" and EXTRA_EOS_TEXT in ignoring["text"], ignoring
    ended = _complete(recommending_tandem)
    end = ignoring["text"].index(EXTRA_EOS_TEXT)
    assert ended["finish_reason"] == "stop", ended
    assert ended["text"] in (ignoring["text"][:end], ignoring["text"][: end + 1]), (ended, ignoring)
