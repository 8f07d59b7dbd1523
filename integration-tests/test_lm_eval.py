"""lm-evaluation-harness's `local-completions` against the real stack: a local multiple-choice task scored
with prompt logprobs (`echo` + `logprobs`), checked choice by choice against transformers, and a
`generate_until` task."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import requests
import torch
from reference import Reference
from tandem_harness import TandemServer

# Tandem and transformers both run fp32 on CPU; batch shapes round differently, never by this much.
LOGLIKELIHOOD_TOLERANCE = 2e-3

QUESTIONS = [
    {"question": "The capital of France is", "choices": [" Paris", " London", " Berlin", " a banana"], "answer": 0},
    {"question": "Two plus two equals", "choices": [" four", " seven", " the sky"], "answer": 0},
    {"question": "The colour of grass is", "choices": [" green", " purple"], "answer": 0},
]

MULTIPLE_CHOICE_TASK = """\
task: tandem_tiny_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: answer
metric_list:
  - metric: acc
"""

GENERATE_TASK = """\
task: tandem_tiny_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "{{{{question}}}}"
doc_to_target: "{{{{choices[answer]}}}}"
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 8
metric_list:
  - metric: exact_match
"""


def _write_tasks(directory: Path) -> None:
    data = directory / "questions.jsonl"
    data.write_text("".join(json.dumps(question) + "\n" for question in QUESTIONS))
    (directory / "tandem_tiny_mc.yaml").write_text(MULTIPLE_CHOICE_TASK.format(data=data))
    (directory / "tandem_tiny_gen.yaml").write_text(GENERATE_TASK.format(data=data))


@torch.inference_mode()
def _reference_loglikelihood(reference: Reference, context: str, continuation: str) -> float:
    """log P(continuation | context), split into tokens as lm-eval splits the pair."""
    context_ids = reference.tokenizer(context, add_special_tokens=False).input_ids
    whole_ids = reference.tokenizer(context + continuation, add_special_tokens=False).input_ids
    logits = reference.model(torch.tensor([whole_ids])).logits[0]
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    return sum(float(logprobs[p - 1, whole_ids[p]]) for p in range(len(context_ids), len(whole_ids)))


def _evaluate(tandem: TandemServer, tasks_dir: Path, tokenizer_dir: str) -> dict[str, Any]:
    # Imported here, after the offline settings: `datasets` reads them once, at import.
    import lm_eval  # noqa: PLC0415
    from lm_eval.tasks import TaskManager  # noqa: PLC0415

    return lm_eval.simple_evaluate(
        model="local-completions",
        model_args={
            "base_url": f"{tandem.base_url}/v1/completions",
            "model": "tandem",
            "tokenizer_backend": "huggingface",
            "tokenizer": tokenizer_dir,
            "max_length": 512,
        },
        tasks=["tandem_tiny_mc", "tandem_tiny_gen"],
        # Only the local tasks: indexing the built-in ones takes half a minute.
        task_manager=TaskManager(include_path=str(tasks_dir), include_defaults=False),
        log_samples=True,
    )


@pytest.fixture(scope="module")
def evaluation(tandem: TandemServer, reference: Reference, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Both tasks evaluated once; lm-eval tokenizes with the served model's own tokenizer files."""
    tasks_dir = tmp_path_factory.mktemp("lm_eval_tasks")
    _write_tasks(tasks_dir)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("HF_DATASETS_OFFLINE", "1")
        env.setenv("HF_HUB_OFFLINE", "1")
        env.setenv("HF_DATASETS_CACHE", str(tasks_dir / "datasets-cache"))
        return _evaluate(tandem, tasks_dir, reference.tokenizer.name_or_path)


def test_multiple_choice_loglikelihoods_match_transformers(evaluation: dict[str, Any], reference: Reference) -> None:
    samples = evaluation["samples"]["tandem_tiny_mc"]
    assert len(samples) == len(QUESTIONS)
    differences: list[float] = []
    for sample in samples:
        choices = QUESTIONS[sample["doc_id"]]["choices"]
        scored = [float(response[0]) for response in sample["filtered_resps"]]
        assert len(scored) == len(choices)
        for (context, continuation), loglikelihood in zip(sample["arguments"], scored, strict=True):
            expected = _reference_loglikelihood(reference, context, continuation)
            assert math.isfinite(loglikelihood) and loglikelihood < 0
            differences.append(abs(loglikelihood - expected))
    assert max(differences) < LOGLIKELIHOOD_TOLERANCE, differences
    assert evaluation["results"]["tandem_tiny_mc"]["acc,none"] >= 2 / 3


def test_generate_until_task_runs_and_stops_at_its_stop_string(evaluation: dict[str, Any]) -> None:
    samples = evaluation["samples"]["tandem_tiny_gen"]
    assert len(samples) == len(QUESTIONS)
    for sample in samples:
        generated = sample["filtered_resps"][0]
        assert isinstance(generated, str) and generated.strip(), sample
        assert "\n" not in generated
    assert "exact_match,none" in evaluation["results"]["tandem_tiny_gen"]


def test_prompt_only_echo_scores_every_prompt_token_but_the_first(tandem: TandemServer) -> None:
    body = {"prompt": "The capital of France is Paris", "max_tokens": 0, "echo": True, "logprobs": 2}
    reply = requests.post(f"{tandem.base_url}/v1/completions", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    choice = reply.json()["choices"][0]
    logprobs = choice["logprobs"]
    assert choice["text"] == body["prompt"]
    assert "".join(logprobs["tokens"]) == body["prompt"]
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    assert all(lp <= 0 for lp in logprobs["token_logprobs"][1:])
    assert [len(top) for top in logprobs["top_logprobs"][1:]] == [2] * (len(logprobs["tokens"]) - 1)
    assert reply.json()["usage"]["completion_tokens"] == 0
