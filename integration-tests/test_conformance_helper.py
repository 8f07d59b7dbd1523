"""The conformance helper leaves out only the schema validation when the published schemas are absent."""

from __future__ import annotations

import conformance
import pytest


def test_absent_schemas_skip_only_the_validation_with_a_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(conformance, "schema_dir", lambda: None)
    conformance._definitions.cache_clear()
    try:
        with pytest.warns(conformance.SchemaValidationSkipped, match="CreateChatCompletionResponse not validated"):
            conformance.openai("CreateChatCompletionResponse", {"not": "a completion"})
    finally:
        conformance._definitions.cache_clear()
