//! Which tool-call syntax the served model writes, decided once at start-up from its chat
//! template (or `--tool-call-parser`), and the spellings each syntax uses.

use clap::ValueEnum;
use tokenizers::Tokenizer;

use super::xml_syntax::{MarkerTokens, XmlSyntax, GLM45, QWEN3_CODER, XML_CLOSING, XML_TRIGGER};

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
    /// `<tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>...` (Qwen3-Coder,
    /// Qwen3.5, Qwen3.6).
    #[value(name = "qwen3_coder")]
    Qwen3Coder,
    /// `<tool_call>NAME\n<arg_key>KEY</arg_key>\n<arg_value>VALUE</arg_value>...` (GLM-4.5, 4.6).
    #[value(name = "glm45")]
    Glm45,
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
    Qwen3Coder,
    Glm45,
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
    /// The XML families' inner markers the tokenizer holds as added tokens that decode to
    /// their text (`XmlSyntax::token_markers` order).
    pub marker_tokens: MarkerTokens,
}

/// Hermes's call opening: the text before it is the answer's content.
pub const HERMES_TRIGGER: &str = XML_TRIGGER;
/// Hermes's call closing.
pub const HERMES_CLOSING: &str = XML_CLOSING;
/// Mistral's call opening.
pub const MISTRAL_TRIGGER: &str = "[TOOL_CALLS]";

impl ToolFamily {
    /// The family whose call syntax `template` writes; Tandem's own when it writes none.
    pub fn of_template(template: &str) -> Self {
        // Both XML syntaxes open calls with Hermes's `<tool_call>`: their inner markers decide.
        if template.contains("<function=") && template.contains("<parameter=") {
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
            Self::Qwen3Coder => "qwen3_coder",
            Self::Glm45 => "glm45",
        }
    }

    /// The syntax of an XML-style family.
    pub fn xml_syntax(self) -> Option<&'static XmlSyntax> {
        match self {
            Self::Qwen3Coder => Some(&QWEN3_CODER),
            Self::Glm45 => Some(&GLM45),
            _ => None,
        }
    }

    /// Whether tools go to the chat template's own `tools` variable (all but Tandem's).
    pub fn is_native(self) -> bool {
        self != Self::Tandem
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
            ToolCallParser::Qwen3Coder => Self::Qwen3Coder,
            ToolCallParser::Glm45 => Self::Glm45,
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
            _ => (None, None),
        };
        let marker_tokens = family
            .xml_syntax()
            .map(|syntax| syntax.marker_tokens(|marker| visible_token(tokenizer, marker)))
            .unwrap_or_default();
        Self {
            family,
            trigger_token,
            closing_token,
            marker_tokens,
        }
    }

    /// A format of `family` with every trigger written as text.
    pub fn text(family: ToolFamily) -> Self {
        Self {
            family,
            trigger_token: None,
            closing_token: None,
            marker_tokens: MarkerTokens::default(),
        }
    }
}

/// The id of `marker` when the tokenizer holds it as one added token that decodes to its text.
/// A special token is left out: the detokenizer skips special tokens, so a marker written as
/// one would vanish from the text the parsers read (the grammar then has it spelled out).
fn visible_token(tokenizer: &Tokenizer, marker: &str) -> Option<u32> {
    let id = tokenizer.token_to_id(marker)?;
    let decoder = tokenizer.get_added_tokens_decoder();
    let added = decoder.get(&id)?;
    (!added.special).then_some(id)
}

#[cfg(test)]
mod tests {
    use clap::ValueEnum;

    use super::*;
    use crate::validation::testing::tokenizer_with_special_tokens;

    #[test]
    fn the_template_decides_the_family_and_the_flag_overrides_it() {
        let hermes = "{{- '<tool_call>\\n' }}{{ tools | tojson }}";
        let mistral = "{{- \"[TOOL_CALLS] [\" }}";
        let llama = "{{- \"<|python_tag|>\" + tool_call.name }}";
        let plain = "{% for m in messages %}{{ m.content }}{% endfor %}";
        assert_eq!(ToolFamily::of_template(hermes), ToolFamily::Hermes);
        assert_eq!(ToolFamily::of_template(mistral), ToolFamily::Mistral);
        assert_eq!(ToolFamily::of_template(llama), ToolFamily::Llama3Json);
        assert_eq!(ToolFamily::of_template(plain), ToolFamily::Tandem);
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
    fn the_xml_families_are_told_apart_from_hermes_by_their_real_templates() {
        let templates = [
            (
                include_str!("../../python/tests/chat_templates/qwen3-coder.jinja"),
                ToolFamily::Qwen3Coder,
            ),
            (
                include_str!("../../python/tests/chat_templates/qwen3.5.jinja"),
                ToolFamily::Qwen3Coder,
            ),
            (
                include_str!("../../python/tests/chat_templates/glm-4.6.jinja"),
                ToolFamily::Glm45,
            ),
            (
                include_str!("../../python/tests/chat_templates/qwen3.jinja"),
                ToolFamily::Hermes,
            ),
            (
                include_str!("../../python/tests/chat_templates/qwen2.5.jinja"),
                ToolFamily::Hermes,
            ),
        ];
        for (template, family) in templates {
            assert_eq!(ToolFamily::of_template(template), family);
        }
        let tokenizer = tokenizer_with_special_tokens(&[]);
        for parser in [ToolCallParser::Qwen3Coder, ToolCallParser::Glm45] {
            let family = ToolFormat::choose(Some(parser), None, &tokenizer).family;
            assert_eq!(
                ToolCallParser::from_str(family.parser_name(), false),
                Ok(parser)
            );
        }
    }

    #[test]
    fn only_markers_that_decode_to_their_text_are_offered_as_tokens() {
        let json = crate::validation::testing::tokenizer_json_with_special_tokens(&[
            HERMES_TRIGGER,
            "<arg_key>",
        ]);
        let mut tokenizer = Tokenizer::from_bytes(json.to_string()).expect("test vocabulary");
        let trigger = tokenizer.token_to_id(HERMES_TRIGGER);
        let glm = ToolFormat::choose(Some(ToolCallParser::Glm45), None, &tokenizer);
        assert_eq!((glm.trigger_token, glm.marker_tokens[0]), (None, None));
        tokenizer
            .add_tokens([tokenizers::AddedToken::from("<arg_value>", false)])
            .expect("a plain added token");
        let visible = ToolFormat::choose(Some(ToolCallParser::Glm45), None, &tokenizer);
        assert!(visible.marker_tokens[2].is_some());
        assert_eq!(visible.marker_tokens[0], None);
        assert!(trigger.is_some());
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
