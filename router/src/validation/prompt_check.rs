//! A prompt's own checks, before it is rendered or tokenized.

use super::{Prompt, ValidationError, Validator, CHAT_ROLES};

impl Validator {
    /// The prompt's own checks (non-empty, known token ids, valid roles), without tokenizing;
    /// lets a route refuse a list of prompts before submitting any of them.
    pub fn check_prompt(&self, prompt: &Prompt) -> Result<(), ValidationError> {
        match prompt {
            Prompt::Text(text) if text.is_empty() => Err(ValidationError::Empty("prompt")),
            Prompt::Tokens(ids) if ids.is_empty() => Err(ValidationError::Empty("prompt")),
            Prompt::Text(_) => Ok(()),
            Prompt::Tokens(ids) if ids.len() > self.limits.max_input_tokens => {
                Err(ValidationError::InputTooLong {
                    input_tokens: ids.len(),
                    max_input_tokens: self.limits.max_input_tokens,
                })
            }
            Prompt::Tokens(ids) => {
                let vocab_size = self.vocab_size;
                match ids
                    .iter()
                    .find(|&&id| usize::try_from(id).map_or(true, |id| id >= vocab_size))
                {
                    Some(&id) => Err(ValidationError::UnknownToken {
                        param: "prompt",
                        id,
                        vocab_size,
                    }),
                    None => Ok(()),
                }
            }
            Prompt::Chat(messages, ..) => {
                if let Err(reason) = &self.chat_template {
                    return Err(ValidationError::NoChat(*reason));
                }
                if messages.is_empty() {
                    return Err(ValidationError::Empty("messages"));
                }
                match messages
                    .iter()
                    .position(|m| !CHAT_ROLES.contains(&m.role.as_str()))
                {
                    Some(index) => Err(ValidationError::InvalidRole {
                        index,
                        role: messages[index].role.clone(),
                    }),
                    None => Ok(()),
                }
            }
        }
    }
}
