//! The prompt text a `/v1/chat/completions` body becomes under a chat template, without a
//! model: what the route would tokenize. Tests hold it to `transformers`' rendering.

use super::ChatRequest;
use crate::limits::RequestLimits;
use crate::reasoning::ReasoningParser;
use crate::tools::{ToolFamily, ToolFormat};
use crate::validation::{ChatTemplate, Prompt, SamplingDefaults};

/// Renders the chat request `body` (JSON) with the Jinja `template`, tool calls in the
/// syntax the template writes; an error says what was wrong with the template or the body.
pub fn render_chat_request(
    template: &str,
    bos_token: Option<String>,
    eos_token: Option<String>,
    body: &str,
) -> Result<String, String> {
    let chat =
        ChatTemplate::new(template.to_owned(), bos_token, eos_token).map_err(|e| e.to_string())?;
    let request: ChatRequest = serde_json::from_str(body).map_err(|e| e.to_string())?;
    let format = ToolFormat::text(ToolFamily::of_template(template));
    let plan = request
        .into_plan(
            &RequestLimits::default(),
            &SamplingDefaults::default(),
            format,
        )
        .map_err(|e| e.to_string())?;
    let reasoning = ReasoningParser::detect(Some(template), None);
    match plan.prompt {
        Prompt::Chat(messages, ending, mut extras) => {
            // As the validator does: the request's reasoning setting sets the template's switch
            // unless its own `chat_template_kwargs` set it.
            let switches = reasoning.map(|parser| plan.params.reasoning.template_switches(parser));
            for (name, value) in switches.unwrap_or_default() {
                extras.kwargs.entry(name).or_insert(value);
            }
            chat.render(&messages, ending, &extras)
                .map_err(|e| e.to_string())
        }
        _ => Err("a chat request renders a conversation".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HERMES: &str = "{% if tools %}{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}{% endif %}\
        {% for m in messages %}{{ m.role }}: {{ m.content }}\
        {% for call in m.tool_calls or [] %}<tool_call>{{ call.function | tojson }}</tool_call>{% endfor %}\n{% endfor %}";

    #[test]
    fn tools_and_past_calls_reach_the_template_and_the_tandem_preamble_does_not() {
        let body = r#"{"messages": [{"role": "user", "content": "Hi"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
              "function": {"name": "now", "arguments": "{\"tz\": \"UTC\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "noon"}],
            "tools": [{"type": "function", "function": {"name": "now", "description": "The time"}}]}"#;
        let rendered = render_chat_request(HERMES, None, None, body).unwrap();
        assert_eq!(
            rendered,
            "{\"type\": \"function\", \"function\": {\"name\": \"now\", \"description\": \"The time\"}}\n\
             user: Hiassistant: <tool_call>{\"name\": \"now\", \"arguments\": {\"tz\": \"UTC\"}}</tool_call>\
             tool: noon"
        );
    }

    #[test]
    fn template_kwargs_outside_the_allow_list_are_refused() {
        let body = r#"{"messages": [{"role": "user", "content": "Hi"}], "chat_template_kwargs": {"bos_token": "x"}}"#;
        let error = render_chat_request(HERMES, None, None, body).unwrap_err();
        assert!(error.contains("chat_template_kwargs.bos_token"), "{error}");
    }
}
