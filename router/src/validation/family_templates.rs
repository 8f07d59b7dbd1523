//! Chat templates of the model families whose turn format is known, for models that ship
//! none (base checkpoints, mostly): chat then renders in the format the family's instruct
//! models were tuned on, as llama.cpp and vLLM fall back to it.

use tokenizers::Tokenizer;

/// A family's chat format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FamilyTemplate {
    /// The family, as the start-up log names it.
    pub family: &'static str,
    /// The `model_type`s (config.json) of the family.
    model_types: &'static [&'static str],
    /// The special tokens the template writes: a tokenizer without them does not speak it.
    markers: &'static [&'static str],
    /// The Jinja source, rendered like any model's own template.
    pub source: &'static str,
}

/// Gemma 3: a system message opens the first user turn, the assistant is `model`.
const GEMMA: FamilyTemplate = FamilyTemplate {
    family: "Gemma",
    model_types: &["gemma3", "gemma3_text"],
    markers: &["<start_of_turn>", "<end_of_turn>"],
    source: concat!(
        "{{ bos_token }}",
        "{% if messages[0]['role'] == 'system' %}",
        "{% set first_user_prefix = messages[0]['content'] + '\\n\\n' %}",
        "{% set loop_messages = messages[1:] %}",
        "{% else %}",
        "{% set first_user_prefix = '' %}",
        "{% set loop_messages = messages %}",
        "{% endif %}",
        "{% for message in loop_messages %}",
        "{% if message['role'] == 'assistant' %}{% set role = 'model' %}",
        "{% else %}{% set role = message['role'] %}{% endif %}",
        "{{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else '') ",
        "+ message['content'] | trim + '<end_of_turn>\\n' }}",
        "{% endfor %}",
        "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}",
    ),
};

/// Llama 3 (Meta-Llama-3-8B-Instruct's template).
const LLAMA_3: FamilyTemplate = FamilyTemplate {
    family: "Llama 3",
    model_types: &["llama"],
    markers: &["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
    source: concat!(
        "{% for message in messages %}",
        "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' ",
        "+ message['content'] | trim + '<|eot_id|>' %}",
        "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}",
        "{{ content }}",
        "{% endfor %}",
        "{% if add_generation_prompt %}",
        "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}",
        "{% endif %}",
    ),
};

/// ChatML without a default system message: Qwen2, Qwen3, and Llama-architecture models with
/// ChatML tokens such as SmolLM.
const CHATML: FamilyTemplate = FamilyTemplate {
    family: "ChatML (Qwen2, Qwen3, SmolLM)",
    model_types: &["qwen2", "qwen3", "llama"],
    markers: &["<|im_start|>", "<|im_end|>"],
    source: concat!(
        "{% for message in messages %}",
        "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}",
        "{% endfor %}",
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}",
    ),
};

const KNOWN: [FamilyTemplate; 3] = [GEMMA, LLAMA_3, CHATML];

/// The known template of a `model_type` whose `tokenizer` holds the template's special
/// tokens; `None` for any other model.
pub fn family_template(model_type: &str, tokenizer: &Tokenizer) -> Option<FamilyTemplate> {
    KNOWN.into_iter().find(|known| {
        known.model_types.contains(&model_type)
            && known
                .markers
                .iter()
                .all(|marker| tokenizer.token_to_id(marker).is_some())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validation::testing::tokenizer_with_special_tokens;
    use crate::validation::{ChatEnding, ChatMessage, ChatTemplate, TemplateExtras};

    fn render(known: FamilyTemplate, messages: &[ChatMessage]) -> String {
        let template =
            ChatTemplate::new(known.source.to_owned(), Some("<bos>".into()), None).unwrap();
        template
            .render(
                messages,
                ChatEnding::GenerationPrompt,
                &TemplateExtras::default(),
            )
            .unwrap()
    }

    fn conversation() -> Vec<ChatMessage> {
        vec![
            ChatMessage::new("system", "Be brief."),
            ChatMessage::new("user", " Hi "),
            ChatMessage::new("assistant", "Hello!"),
            ChatMessage::new("user", "Bye"),
        ]
    }

    #[test]
    fn gemma_folds_the_system_message_into_the_first_user_turn() {
        assert_eq!(
            render(GEMMA, &conversation()),
            "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n\
             <start_of_turn>model\nHello!<end_of_turn>\n\
             <start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"
        );
        let no_system = [ChatMessage::new("user", "Hi")];
        assert_eq!(
            render(GEMMA, &no_system),
            "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
        );
    }

    #[test]
    fn llama_3_writes_a_header_per_message() {
        assert_eq!(
            render(LLAMA_3, &conversation()),
            "<bos><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>\
             <|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>\
             <|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>\
             <|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>\
             <|start_header_id|>assistant<|end_header_id|>\n\n"
        );
    }

    #[test]
    fn chatml_wraps_every_message_in_im_tokens() {
        assert_eq!(
            render(CHATML, &conversation()[..2]),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n Hi <|im_end|>\n\
             <|im_start|>assistant\n"
        );
    }

    #[test]
    fn a_family_is_known_only_with_the_tokens_its_template_writes() {
        let gemma = tokenizer_with_special_tokens(&["<start_of_turn>", "<end_of_turn>"]);
        assert_eq!(family_template("gemma3_text", &gemma), Some(GEMMA));
        assert_eq!(family_template("mistral", &gemma), None);
        let plain = tokenizer_with_special_tokens(&[]);
        assert_eq!(family_template("gemma3_text", &plain), None);
        assert_eq!(
            family_template("llama", &plain),
            None,
            "Llama 2 has no chat tokens"
        );
        let chatml = tokenizer_with_special_tokens(&["<|im_start|>", "<|im_end|>"]);
        assert_eq!(family_template("llama", &chatml), Some(CHATML));
        let llama_3 = tokenizer_with_special_tokens(&[
            "<|start_header_id|>",
            "<|end_header_id|>",
            "<|eot_id|>",
        ]);
        assert_eq!(family_template("llama", &llama_3), Some(LLAMA_3));
    }
}
