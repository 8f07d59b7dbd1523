//! Renders a model's Jinja chat template the way `transformers`' `apply_chat_template` does.

use minijinja::{Environment, ErrorKind};
use serde::Serialize;

use super::ValidationError;

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
}

impl ChatMessage {
    /// A message with just a role and text.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
            name: None,
            tool_call_id: None,
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
    messages: &'a [ChatMessage],
    add_generation_prompt: bool,
    bos_token: &'a str,
    eos_token: &'a str,
}

impl ChatTemplate {
    /// Compiles `source` with Jinja settings matching `transformers` (trim and lstrip
    /// blocks, Python string methods, `raise_exception`).
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
        env.add_template_owned(TEMPLATE_NAME, source)?;
        Ok(Self {
            env,
            bos_token: bos_token.unwrap_or_default(),
            eos_token: eos_token.unwrap_or_default(),
        })
    }

    /// Renders the conversation followed by the assistant's generation prompt.
    pub fn render(&self, messages: &[ChatMessage]) -> Result<String, ValidationError> {
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| ValidationError::Template(e.to_string()))?;
        let input = TemplateInput {
            messages,
            add_generation_prompt: true,
            bos_token: &self.bos_token,
            eos_token: &self.eos_token,
        };
        template.render(input).map_err(|e| {
            let message = match e.kind() {
                ErrorKind::InvalidOperation => e.detail().unwrap_or("invalid operation").to_owned(),
                _ => e.to_string(),
            };
            ValidationError::Template(message)
        })
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
            .render(&[
                ChatMessage::new("system", "  Be brief. "),
                ChatMessage::new("user", "Hi"),
            ])
            .unwrap();
        assert_eq!(rendered, "<|system|>Be brief.\n<|user|>Hi\n<|assistant|>");
    }

    #[test]
    fn special_tokens_and_block_trimming_follow_transformers() {
        let source = "{{ bos_token }}\n{% for m in messages %}\n  {{ m['content'] }}{{ eos_token }}\n{% endfor %}";
        let rendered = template(source)
            .render(&[ChatMessage::new("user", "x")])
            .unwrap();
        assert_eq!(rendered, "<s>\n  x</s>\n");
    }

    #[test]
    fn raise_exception_becomes_a_validation_error_with_its_message() {
        let source = "{% if messages[0].role != 'user' %}{{ raise_exception('Conversation must start with user') }}{% endif %}";
        let error = template(source)
            .render(&[ChatMessage::new("assistant", "x")])
            .unwrap_err();
        assert!(
            error
                .to_string()
                .contains("Conversation must start with user"),
            "{error}"
        );
    }

    #[test]
    fn syntax_errors_are_reported_at_load() {
        let result = ChatTemplate::new("{% for %}".to_owned(), None, None);
        assert!(result.is_err());
    }
}
