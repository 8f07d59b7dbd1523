//! The `cache_control` blocks of a Messages request, wherever Anthropic allows them: system
//! blocks, tools, and content blocks of the turns (tool results' inner blocks included).

use std::time::Duration;

use serde_json::{Map, Value};

use super::request::{MessagesRequest, SystemPrompt, TypedTextBlock};
use crate::validation::cache_hints::anthropic_retention;
use crate::validation::ValidationError;

/// The longest `cache_control` TTL the request sets, checked; `None` without any.
pub fn cache_retention(request: &MessagesRequest) -> Result<Option<Duration>, ValidationError> {
    let mut controls: Vec<(String, &Map<String, Value>)> = Vec::new();
    if let Some(SystemPrompt::Blocks(blocks)) = &request.system {
        for (index, TypedTextBlock::Text(block)) in blocks.iter().enumerate() {
            if let Some(control) = &block.cache_control {
                controls.push((format!("system[{index}].cache_control"), control));
            }
        }
    }
    for (index, tool) in request.tools.iter().flatten().enumerate() {
        if let Some(control) = &tool.cache_control {
            controls.push((format!("tools[{index}].cache_control"), control));
        }
    }
    for (index, message) in request.messages.iter().flatten().enumerate() {
        content_controls(
            &message.content,
            &format!("messages[{index}].content"),
            &mut controls,
        );
    }
    anthropic_retention(controls)
}

/// The `cache_control` objects of `content`'s blocks and of their own inner `content` blocks.
/// Other shapes are left to the block parser, which refuses them by position.
fn content_controls<'a>(
    content: &'a Value,
    path: &str,
    controls: &mut Vec<(String, &'a Map<String, Value>)>,
) {
    let Value::Array(blocks) = content else {
        return;
    };
    for (index, block) in blocks.iter().enumerate() {
        let block_path = format!("{path}[{index}]");
        if let Some(Value::Object(control)) = block.get("cache_control") {
            controls.push((format!("{block_path}.cache_control"), control));
        }
        if let Some(inner) = block.get("content") {
            content_controls(inner, &format!("{block_path}.content"), controls);
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::validation::cache_hints::{EPHEMERAL_TTL, LONG_EPHEMERAL_TTL};

    fn request(body: Value) -> MessagesRequest {
        serde_json::from_value(body).unwrap_or_else(|error| panic!("a valid body: {error}"))
    }

    #[test]
    fn the_longest_ttl_of_system_tool_and_turn_blocks_is_the_requests() {
        let none =
            request(json!({"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}));
        assert_eq!(cache_retention(&none).ok(), Some(None));
        let system = request(json!({
            "max_tokens": 8,
            "system": [{"type": "text", "text": "rules", "cache_control": {"type": "ephemeral"}}],
            "messages": [{"role": "user", "content": "hi"}],
        }));
        assert_eq!(cache_retention(&system).ok(), Some(Some(EPHEMERAL_TTL)));
        let nested = request(json!({
            "max_tokens": 8,
            "tools": [{"name": "f", "input_schema": {"type": "object"}, "cache_control": {"type": "ephemeral"}}],
            "messages": [{"role": "user", "content": [{
                "type": "tool_result", "tool_use_id": "t",
                "content": [{"type": "text", "text": "out", "cache_control": {"type": "ephemeral", "ttl": "1h"}}],
            }]}],
        }));
        assert_eq!(
            cache_retention(&nested).ok(),
            Some(Some(LONG_EPHEMERAL_TTL))
        );
    }

    #[test]
    fn a_refused_block_is_named_by_its_position() {
        let body = request(json!({
            "max_tokens": 8,
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "yes"},
                {"role": "user", "content": [{"type": "text", "text": "x", "cache_control": {"type": "ephemeral", "ttl": "7d"}}]},
            ],
        }));
        let refused = cache_retention(&body).err().map(|error| error.to_string());
        assert_eq!(
            refused.as_deref(),
            Some("`messages[2].content[0].cache_control.ttl` must be `5m` or `1h`, got `7d`")
        );
    }
}
