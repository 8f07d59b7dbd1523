//! Which tool-call syntax the served model writes, decided once at start-up from its chat
//! template (or `--tool-call-parser`), and the spellings each syntax uses.

use clap::ValueEnum;
use tokenizers::Tokenizer;

use crate::harmony;

/// `--tool-call-parser`: a family's syntax by vLLM's parser name, or Tandem's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ToolCallParser {
    /// `<tool_call>{"name", "arguments"}</tool_call>` (Hermes, Qwen2.5, Qwen3).
    Hermes,
    /// `{"name", "parameters"}` (Llama 3.1 to 3.3).
    #[value(name = "llama3_json")]
    Llama3Json,
    /// `[TOOL_CALLS] [{"name", "arguments"}, ...]` (Mistral).
    Mistral,
    /// Harmony's `<|channel|>commentary to=functions.NAME` messages (gpt-oss).
    Openai,
    /// Tandem's own `{"tool_calls": [...]}` document, taught in a system message.
    Tandem,
}

/// A model family's tool-call syntax.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ToolFamily {
    /// Tandem's calls document, for templates without tools support.
    #[default]
    Tandem,
    Hermes,
    Llama3Json,
    Mistral,
    /// gpt-oss's harmony channels (`crate::harmony`).
    Harmony,
}

/// The syntax the router renders, constrains and parses tool calls in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ToolFormat {
    pub family: ToolFamily,
    /// The id of the call opening (Mistral's `[TOOL_CALLS]`, Hermes's `<tool_call>`) when the
    /// tokenizer holds it as one added token: the grammar then lets the model write that token
    /// (grammars treat added tokens as special, so the literal text alone would refuse it).
    pub trigger_token: Option<u32>,
    /// The id of Hermes's `</tool_call>` when the tokenizer holds it as one added token.
    pub closing_token: Option<u32>,
}

/// Hermes's call opening: the text before it is the answer's content.
pub const HERMES_TRIGGER: &str = "<tool_call>";
/// Hermes's call closing.
pub const HERMES_CLOSING: &str = "</tool_call>";
/// Mistral's call opening.
pub const MISTRAL_TRIGGER: &str = "[TOOL_CALLS]";

impl ToolFamily {
    /// The family whose call syntax `template` writes; Tandem's own when it writes none.
    pub fn of_template(template: &str) -> Self {
        if template.contains(harmony::CHANNEL) {
            Self::Harmony
        } else if template.contains(HERMES_TRIGGER) {
            Self::Hermes
        } else if template.contains(MISTRAL_TRIGGER) {
            Self::Mistral
        } else if template.contains("<|python_tag|>")
            || template.contains("\"parameters\": dictionary of argument name")
        {
            Self::Llama3Json
        } else {
            Self::Tandem
        }
    }

    /// How `--tool-call-parser` names the family.
    pub fn parser_name(self) -> &'static str {
        match self {
            Self::Tandem => "tandem",
            Self::Hermes => "hermes",
            Self::Llama3Json => "llama3_json",
            Self::Mistral => "mistral",
            Self::Harmony => "openai",
        }
    }

    /// Whether tools go to the chat template's own `tools` variable (all but Tandem's).
    pub fn is_native(self) -> bool {
        self != Self::Tandem
    }

    /// The family's special tokens that its parser reads as text. Mistral's `[TOOL_CALLS]`
    /// and Llama's `<|python_tag|>` are not among them: their parsers take the calls from
    /// the output's first character, so those tokens decode to no text.
    pub fn chat_markers(self) -> &'static [&'static str] {
        match self {
            Self::Hermes => &[HERMES_TRIGGER, HERMES_CLOSING],
            Self::Harmony => &harmony::MARKERS,
            Self::Tandem | Self::Llama3Json | Self::Mistral => &[],
        }
    }

    /// The key the call object holds its arguments under.
    pub fn arguments_key(self) -> &'static str {
        match self {
            Self::Llama3Json => "parameters",
            _ => "arguments",
        }
    }
}

impl From<ToolCallParser> for ToolFamily {
    fn from(parser: ToolCallParser) -> Self {
        match parser {
            ToolCallParser::Hermes => Self::Hermes,
            ToolCallParser::Llama3Json => Self::Llama3Json,
            ToolCallParser::Mistral => Self::Mistral,
            ToolCallParser::Openai => Self::Harmony,
            ToolCallParser::Tandem => Self::Tandem,
        }
    }
}

impl ToolFormat {
    /// `parser` when given, else the family `template` writes (none without a template).
    pub fn choose(
        parser: Option<ToolCallParser>,
        template: Option<&str>,
        tokenizer: &Tokenizer,
    ) -> Self {
        let family = match (parser, template) {
            (Some(parser), _) => parser.into(),
            (None, Some(template)) => ToolFamily::of_template(template),
            (None, None) => ToolFamily::Tandem,
        };
        let (trigger_token, closing_token) = match family {
            ToolFamily::Mistral => (tokenizer.token_to_id(MISTRAL_TRIGGER), None),
            ToolFamily::Hermes => (
                tokenizer.token_to_id(HERMES_TRIGGER),
                tokenizer.token_to_id(HERMES_CLOSING),
            ),
            _ => (None, None),
        };
        Self {
            family,
            trigger_token,
            closing_token,
        }
    }

    /// A format of `family` with every trigger written as text.
    pub fn text(family: ToolFamily) -> Self {
        Self {
            family,
            trigger_token: None,
            closing_token: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validation::testing::tokenizer_with_special_tokens;

    #[test]
    fn the_template_decides_the_family_and_the_flag_overrides_it() {
        let hermes = "{{- '<tool_call>\\n' }}{{ tools | tojson }}";
        let mistral = "{{- \"[TOOL_CALLS] [\" }}";
        let llama = "{{- \"<|python_tag|>\" + tool_call.name }}";
        let plain = "{% for m in messages %}{{ m.content }}{% endfor %}";
        let harmony = "{{- '<|start|>assistant<|channel|>final<|message|>' + m.content }}";
        assert_eq!(ToolFamily::of_template(hermes), ToolFamily::Hermes);
        assert_eq!(ToolFamily::of_template(mistral), ToolFamily::Mistral);
        assert_eq!(ToolFamily::of_template(llama), ToolFamily::Llama3Json);
        assert_eq!(ToolFamily::of_template(plain), ToolFamily::Tandem);
        assert_eq!(ToolFamily::of_template(harmony), ToolFamily::Harmony);
        assert_eq!(
            ToolFamily::from(ToolCallParser::Openai).parser_name(),
            "openai"
        );
        let tokenizer = tokenizer_with_special_tokens(&[]);
        let forced = ToolFormat::choose(Some(ToolCallParser::Hermes), Some(plain), &tokenizer);
        assert_eq!(forced.family, ToolFamily::Hermes);
        let own = ToolFormat::choose(Some(ToolCallParser::Tandem), Some(hermes), &tokenizer);
        assert_eq!(own.family, ToolFamily::Tandem);
        assert_eq!(
            ToolFormat::choose(None, None, &tokenizer),
            ToolFormat::default()
        );
    }

    #[test]
    fn mistral_asks_for_its_trigger_token_when_the_tokenizer_has_one() {
        let with = tokenizer_with_special_tokens(&[MISTRAL_TRIGGER]);
        let format = ToolFormat::choose(None, Some("[TOOL_CALLS]"), &with);
        assert_eq!(format.trigger_token, with.token_to_id(MISTRAL_TRIGGER));
        assert!(format.trigger_token.is_some());
        let without = tokenizer_with_special_tokens(&[]);
        let format = ToolFormat::choose(None, Some("[TOOL_CALLS]"), &without);
        assert_eq!(format, ToolFormat::text(ToolFamily::Mistral));
    }
}
