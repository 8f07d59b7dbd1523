//! Which tool-call syntax the served model writes, decided once at start-up from its chat
//! template (or `--tool-call-parser`), and the spellings each syntax uses.

use clap::ValueEnum;
use tokenizers::Tokenizer;

use super::gemma;
use super::section::{Marker, SectionSyntax, SectionTokens, DEEPSEEK_V31, KIMI_K2};
use super::xml_syntax::{
    MarkerTokens, XmlSyntax, DEEPSEEK_V32, GLM45, QWEN3_CODER, XML_CLOSING, XML_TRIGGER,
};
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
    /// `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}...` (DeepSeek-V3.1).
    #[value(name = "deepseek_v31")]
    DeepseekV31,
    /// `<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX...` (Kimi K2).
    #[value(name = "kimi_k2")]
    KimiK2,
    /// `<tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>...` (Qwen3-Coder,
    /// Qwen3.5, Qwen3.6).
    #[value(name = "qwen3_coder")]
    Qwen3Coder,
    /// `<tool_call>NAME\n<arg_key>KEY</arg_key>\n<arg_value>VALUE</arg_value>...` (GLM-4.5, 4.6).
    #[value(name = "glm45")]
    Glm45,
    /// `<|tool_call>call:NAME{key:<|"|>text<|"|>,n:1}<tool_call|>...` (Gemma 4).
    Gemma4,
    /// `<｜DSML｜function_calls>\n<｜DSML｜invoke name="NAME">\n<｜DSML｜parameter name="KEY"
    /// string="true">VALUE</｜DSML｜parameter>...` (DeepSeek-V3.2).
    #[value(name = "deepseek_v32")]
    DeepseekV32,
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
    DeepseekV31,
    KimiK2,
    Qwen3Coder,
    Glm45,
    /// Gemma 4's `<|tool_call>` calls (`gemma.rs`).
    Gemma4,
    /// DeepSeek-V3.2's DSML calls, an XML-style syntax (`xml_syntax.rs`).
    DeepseekV32,
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
    /// The ids of a sectioned family's markers (`section.rs`) held as single tokens.
    pub section_tokens: SectionTokens,
    /// The XML families' inner markers the tokenizer holds as added tokens that decode to
    /// their text (`XmlSyntax::token_markers` order).
    pub marker_tokens: MarkerTokens,
    /// The id of Gemma 4's `<|"|>` string quote when the tokenizer holds it as one added token.
    pub quote_token: Option<u32>,
}

/// Hermes's call opening: the text before it is the answer's content.
pub const HERMES_TRIGGER: &str = XML_TRIGGER;
/// Hermes's call closing.
pub const HERMES_CLOSING: &str = XML_CLOSING;
/// GLM-4.5's call markers: Hermes's tags around its argument tags.
const GLM45_MARKERS: [&str; 6] = [
    HERMES_TRIGGER,
    HERMES_CLOSING,
    GLM45.token_markers[0],
    GLM45.token_markers[1],
    GLM45.token_markers[2],
    GLM45.token_markers[3],
];
/// DeepSeek-V3.2's tags, kept as text where its tokenizer holds them as special tokens.
const DSML_MARKERS: [&str; 6] = [
    "<｜DSML｜function_calls>",
    "</｜DSML｜function_calls>",
    "<｜DSML｜invoke",
    "</｜DSML｜invoke>",
    "<｜DSML｜parameter",
    "</｜DSML｜parameter>",
];
/// Mistral's call opening.
pub const MISTRAL_TRIGGER: &str = "[TOOL_CALLS]";

impl ToolFamily {
    /// The family whose call syntax `template` writes; Tandem's own when it writes none.
    pub fn of_template(template: &str) -> Self {
        if template.contains(harmony::CHANNEL) {
            Self::Harmony
        } else if template.contains(gemma::CALL_OPEN) {
            Self::Gemma4
        } else if template.contains(DEEPSEEK_V32.opening) {
            Self::DeepseekV32
        } else if template.contains(DEEPSEEK_V31.marker(Marker::ArgumentsBegin))
            && !template.contains("```json")
        {
            Self::DeepseekV31
        } else if template.contains(KIMI_K2.marker(Marker::SectionBegin))
            || template.contains("<|im_system|>tool_declare")
        {
            Self::KimiK2
        // Both XML syntaxes open calls with Hermes's `<tool_call>`: their inner markers decide.
        } else if template.contains("<function=") && template.contains("<parameter=") {
            Self::Qwen3Coder
        } else if template.contains("<arg_key>") {
            Self::Glm45
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
            Self::DeepseekV31 => "deepseek_v31",
            Self::KimiK2 => "kimi_k2",
            Self::Qwen3Coder => "qwen3_coder",
            Self::Glm45 => "glm45",
            Self::Gemma4 => "gemma4",
            Self::DeepseekV32 => "deepseek_v32",
        }
    }

    /// The syntax of an XML-style family.
    pub fn xml_syntax(self) -> Option<&'static XmlSyntax> {
        match self {
            Self::Qwen3Coder => Some(&QWEN3_CODER),
            Self::Glm45 => Some(&GLM45),
            Self::DeepseekV32 => Some(&DEEPSEEK_V32),
            _ => None,
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
            Self::DeepseekV31 => &DEEPSEEK_V31.markers,
            Self::KimiK2 => &KIMI_K2.markers,
            Self::Qwen3Coder => &[HERMES_TRIGGER, HERMES_CLOSING],
            Self::Glm45 => &GLM45_MARKERS,
            Self::Harmony => &harmony::MARKERS,
            Self::Gemma4 => &gemma::MARKERS,
            Self::DeepseekV32 => &DSML_MARKERS,
            Self::Tandem | Self::Llama3Json | Self::Mistral => &[],
        }
    }

    /// The section syntax of families whose calls sit between marker tokens.
    pub fn section(self) -> Option<&'static SectionSyntax> {
        match self {
            Self::DeepseekV31 => Some(&DEEPSEEK_V31),
            Self::KimiK2 => Some(&KIMI_K2),
            _ => None,
        }
    }

    /// Whether past calls reach the template with `arguments` as the client's JSON text
    /// (DeepSeek-V3.1's template concatenates it) rather than as an object.
    pub fn arguments_as_text(self) -> bool {
        self.section().is_some()
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
            ToolCallParser::DeepseekV31 => Self::DeepseekV31,
            ToolCallParser::KimiK2 => Self::KimiK2,
            ToolCallParser::Qwen3Coder => Self::Qwen3Coder,
            ToolCallParser::Glm45 => Self::Glm45,
            ToolCallParser::Gemma4 => Self::Gemma4,
            ToolCallParser::DeepseekV32 => Self::DeepseekV32,
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
            ToolFamily::Qwen3Coder | ToolFamily::Glm45 => (
                visible_token(tokenizer, HERMES_TRIGGER),
                visible_token(tokenizer, HERMES_CLOSING),
            ),
            ToolFamily::Gemma4 => (
                visible_token(tokenizer, gemma::CALL_OPEN),
                visible_token(tokenizer, gemma::CALL_CLOSE),
            ),
            _ => (None, None),
        };
        let section_tokens = family
            .section()
            .map(|syntax| syntax.tokens(tokenizer))
            .unwrap_or_default();
        let marker_tokens = family
            .xml_syntax()
            .map(|syntax| syntax.marker_tokens(|marker| visible_token(tokenizer, marker)))
            .unwrap_or_default();
        let quote_token = match family {
            ToolFamily::Gemma4 => visible_token(tokenizer, gemma::QUOTE),
            _ => None,
        };
        Self {
            family,
            trigger_token,
            closing_token,
            section_tokens,
            marker_tokens,
            quote_token,
        }
    }

    /// A format of `family` with every trigger written as text.
    pub fn text(family: ToolFamily) -> Self {
        Self {
            family,
            trigger_token: None,
            closing_token: None,
            section_tokens: SectionTokens::default(),
            marker_tokens: MarkerTokens::default(),
            quote_token: None,
        }
    }
}

/// The id of `marker` when the tokenizer holds it as one added token. A special one reaches the
/// parsers as text too: every marker these families' grammars name is one of their
/// `chat_markers`, which chat output keeps.
fn visible_token(tokenizer: &Tokenizer, marker: &str) -> Option<u32> {
    let id = tokenizer.token_to_id(marker)?;
    tokenizer
        .get_added_tokens_decoder()
        .contains_key(&id)
        .then_some(id)
}

#[cfg(test)]
#[path = "format_tests.rs"]
mod tests;
