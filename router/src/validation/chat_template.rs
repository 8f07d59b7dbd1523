//! Renders a model's Jinja chat template the way `transformers`' `apply_chat_template` does.

use bytes::Bytes;
use minijinja::{Environment, ErrorKind};
use serde::Serialize;
use serde_json::{json, Map, Value};

use super::error::ValidationError;
use super::template_clock::strftime_now;
use super::template_json::tojson;
use super::template_python::{is_python_iterable, python_string, without_generation_blocks};

const TEMPLATE_NAME: &str = "chat";

/// One chat message as the template sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// An assistant's calls, for templates that render them (`tools::history`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Value>,
    /// An assistant turn's reasoning, under the names templates read it by: Qwen3's
    /// `reasoning_content` and gpt-oss's `thinking`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub thinking: Option<String>,
    /// A message with images: its text and images in order, which the template sees as its
    /// `content` list (`content` keeps the text alone).
    #[serde(skip)]
    pub parts: Option<Vec<ContentPart>>,
}

/// A piece of a message's content, as a multimodal chat template iterates them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ContentPart {
    Text(String),
    /// An image, unchecked; the template sees `{"type": "image"}`.
    Image(ImageData),
}

/// Where an image of a message is: its encoded bytes, or a URL to fetch them from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageData {
    Inline(Bytes),
    Remote(String),
}

impl ImageData {
    /// Bytes the message holds for it.
    pub fn held_bytes(&self) -> usize {
        match self {
            Self::Inline(data) => data.len(),
            Self::Remote(url) => url.len(),
        }
    }
}

impl ContentPart {
    fn template_value(&self) -> Value {
        match self {
            Self::Text(text) => json!({"type": "text", "text": text}),
            Self::Image(_) => json!({"type": "image"}),
        }
    }
}

impl ChatMessage {
    /// A message with just a role and text.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
            name: None,
            tool_call_id: None,
            tool_calls: None,
            reasoning_content: None,
            thinking: None,
            parts: None,
        }
    }

    /// The message's images, in order.
    pub fn images(&self) -> impl Iterator<Item = &ImageData> {
        self.parts.iter().flatten().filter_map(|part| match part {
            ContentPart::Image(data) => Some(data),
            ContentPart::Text(_) => None,
        })
    }
}

/// The messages as the template reads them: as they are, or with the content of messages
/// that hold images as a list of parts.
#[derive(Serialize)]
#[serde(untagged)]
enum TemplateMessages<'a> {
    Plain(&'a [ChatMessage]),
    WithParts(Vec<Value>),
}

impl<'a> TemplateMessages<'a> {
    fn new(messages: &'a [ChatMessage]) -> Result<Self, ValidationError> {
        if messages.iter().all(|message| message.parts.is_none()) {
            return Ok(Self::Plain(messages));
        }
        messages
            .iter()
            .map(|message| {
                let mut value = serde_json::to_value(message)
                    .map_err(|error| ValidationError::Template(error.to_string()))?;
                if let Some(parts) = &message.parts {
                    value["content"] = parts.iter().map(ContentPart::template_value).collect();
                }
                Ok(value)
            })
            .collect::<Result<_, _>>()
            .map(Self::WithParts)
    }
}

/// What a chat prompt hands the template besides its messages.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TemplateExtras {
    /// The template's `tools` (none when absent, as `transformers` passes them).
    pub tools: Option<Value>,
    /// `chat_template_kwargs`, already held to the allow-list: more template variables.
    pub kwargs: Map<String, Value>,
}

/// How the rendered conversation ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChatEnding {
    /// The assistant's generation prompt follows the last message (`add_generation_prompt`).
    GenerationPrompt,
    /// Nothing follows the last message.
    Closed,
    /// The last message, an assistant's, is left open so the model continues its text
    /// (`continue_final_message`): the rendering is cut right after that message's content.
    ContinueFinal,
}

impl ChatEnding {
    /// How the conversation ends: `continue_final_message` needs a last assistant message and
    /// excludes an explicit `add_generation_prompt: true`.
    pub fn from_flags(
        add_generation_prompt: Option<bool>,
        continue_final_message: Option<bool>,
        messages: &[ChatMessage],
    ) -> Result<Self, ValidationError> {
        if continue_final_message != Some(true) {
            return Ok(match add_generation_prompt {
                Some(false) => Self::Closed,
                _ => Self::GenerationPrompt,
            });
        }
        if add_generation_prompt == Some(true) {
            return Err(ValidationError::OutOfRange {
                param: "continue_final_message".to_owned(),
                expected: "false when `add_generation_prompt` is true",
                value: "true".to_owned(),
            });
        }
        match messages.last() {
            Some(last) if last.role == "assistant" => Ok(Self::ContinueFinal),
            _ => Err(ValidationError::OutOfRange {
                param: "continue_final_message".to_owned(),
                expected: "true only when the last message is the assistant's",
                value: "true".to_owned(),
            }),
        }
    }
}

/// A compiled chat template plus the special-token strings it may reference.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

#[derive(Serialize)]
struct TemplateInput<'a> {
    messages: TemplateMessages<'a>,
    tools: Option<&'a Value>,
    /// The tools again under the name SmolLM3's template reads them by.
    #[serde(skip_serializing_if = "Option::is_none")]
    xml_tools: Option<&'a Value>,
    add_generation_prompt: bool,
    bos_token: &'a str,
    eos_token: &'a str,
    #[serde(flatten)]
    kwargs: &'a Map<String, Value>,
}

impl ChatTemplate {
    /// Compiles `source` with Jinja settings matching `transformers` (trim and lstrip
    /// blocks, Python string methods and `str()`, `raise_exception`, `strftime_now`,
    /// `{% generation %}` blocks).
    pub fn new(
        source: String,
        bos_token: Option<String>,
        eos_token: Option<String>,
    ) -> Result<Self, minijinja::Error> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_filter("string", python_string);
        env.add_test("iterable", is_python_iterable);
        env.add_template_owned(TEMPLATE_NAME, without_generation_blocks(&source))?;
        Ok(Self {
            env,
            bos_token: bos_token.unwrap_or_default(),
            eos_token: eos_token.unwrap_or_default(),
        })
    }

    /// Renders the conversation, ending it as `ending` says.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        ending: ChatEnding,
        extras: &TemplateExtras,
    ) -> Result<String, ValidationError> {
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| ValidationError::Template(e.to_string()))?;
        let input = TemplateInput {
            messages: TemplateMessages::new(messages)?,
            tools: extras.tools.as_ref(),
            xml_tools: extras.tools.as_ref(),
            kwargs: &extras.kwargs,
            add_generation_prompt: ending == ChatEnding::GenerationPrompt,
            bos_token: &self.bos_token,
            eos_token: &self.eos_token,
        };
        let rendered = template.render(input).map_err(|e| {
            let message = match e.kind() {
                ErrorKind::InvalidOperation => e.detail().unwrap_or("invalid operation").to_owned(),
                _ => e.to_string(),
            };
            ValidationError::Template(message)
        })?;
        if ending != ChatEnding::ContinueFinal {
            return Ok(rendered);
        }
        let last = messages.last().map_or("", |message| message.content.trim());
        match rendered.rfind(last).filter(|_| !last.is_empty()) {
            Some(start) => Ok(rendered[..start + last.len()].to_owned()),
            None => Err(ValidationError::Template(
                "cannot continue the final message: it is empty or the template does not reproduce its content".to_owned(),
            )),
        }
    }
}

/// Templates call `raise_exception("...")` to reject conversations they cannot format.
fn raise_exception(message: String) -> Result<String, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validation::testing::CHATML_TEMPLATE;

    fn template(source: &str) -> ChatTemplate {
        ChatTemplate::new(source.to_owned(), Some("<s>".into()), Some("</s>".into())).unwrap()
    }

    #[test]
    fn renders_messages_with_generation_prompt_and_python_methods() {
        let rendered = template(CHATML_TEMPLATE)
            .render(
                &[
                    ChatMessage::new("system", "  Be brief. "),
                    ChatMessage::new("user", "Hi"),
                ],
                ChatEnding::GenerationPrompt,
                &TemplateExtras::default(),
            )
            .unwrap();
        assert_eq!(rendered, "<|system|>Be brief.\n<|user|>Hi\n<|assistant|>");
    }

    #[test]
    fn special_tokens_and_block_trimming_follow_transformers() {
        let source = "{{ bos_token }}\n{% for m in messages %}\n  {{ m['content'] }}{{ eos_token }}\n{% endfor %}";
        let rendered = template(source)
            .render(
                &[ChatMessage::new("user", "x")],
                ChatEnding::GenerationPrompt,
                &TemplateExtras::default(),
            )
            .unwrap();
        assert_eq!(rendered, "<s>\n  x</s>\n");
    }

    #[test]
    fn raise_exception_becomes_a_validation_error_with_its_message() {
        let source = "{% if messages[0].role != 'user' %}{{ raise_exception('Conversation must start with user') }}{% endif %}";
        let error = template(source)
            .render(
                &[ChatMessage::new("assistant", "x")],
                ChatEnding::GenerationPrompt,
                &TemplateExtras::default(),
            )
            .unwrap_err();
        assert!(
            error
                .to_string()
                .contains("Conversation must start with user"),
            "{error}"
        );
    }

    #[test]
    fn a_continued_final_message_stays_open_and_a_closed_one_has_no_generation_prompt() {
        let messages = [
            ChatMessage::new("user", "Count"),
            ChatMessage::new("assistant", "1, 2, "),
        ];
        let chat = template(CHATML_TEMPLATE);
        let none = TemplateExtras::default();
        let open = chat
            .render(&messages, ChatEnding::ContinueFinal, &none)
            .unwrap();
        assert_eq!(open, "<|user|>Count\n<|assistant|>1, 2,");
        let closed = chat.render(&messages, ChatEnding::Closed, &none).unwrap();
        assert_eq!(closed, "<|user|>Count\n<|assistant|>1, 2,\n");
        let empty = [
            ChatMessage::new("user", "Hi"),
            ChatMessage::new("assistant", ""),
        ];
        let error = chat
            .render(&empty, ChatEnding::ContinueFinal, &none)
            .unwrap_err();
        assert!(error.to_string().contains("final message"), "{error}");
    }

    #[test]
    fn syntax_errors_are_reported_at_load() {
        let result = ChatTemplate::new("{% for %}".to_owned(), None, None);
        assert!(result.is_err());
    }
}
