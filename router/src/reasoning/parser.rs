//! The reasoning formats Tandem reads (vLLM's `--reasoning-parser` names), how one is chosen
//! from the model, and where a generation starts relative to its markers.

use clap::ValueEnum;

use crate::harmony;

/// Gemma 4's channel opening, one token.
const GEMMA4_CHANNEL: &str = "<|channel>";
/// Gemma 4's reasoning opening: the channel and its name.
const GEMMA4_START: &str = "<|channel>thought";
/// Gemma 4's channel end.
const GEMMA4_END: &str = "<channel|>";

/// A family's reasoning format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReasoningParser {
    /// DeepSeek-R1 and its distills: `<think>…</think>`; the template opens `<think>` itself,
    /// so output without an opening marker starts inside the reasoning.
    DeepseekR1,
    /// Qwen3: `<think>…</think>`, switched by the template's `enable_thinking`; output without
    /// an opening marker is all answer.
    Qwen3,
    /// DeepSeek-V3.1: the template's `thinking` (or `enable_thinking`) switch ends the prompt
    /// with `<think>` or `</think>`.
    DeepseekV3,
    /// Kimi K2 Thinking: the model opens `<think>` itself; output without it is all answer.
    KimiK2,
    /// Gemma 4: a `<|channel>thought` … `<channel|>` channel before the answer, switched by the
    /// template's `enable_thinking` (which otherwise ends the prompt with an empty channel).
    Gemma4,
    /// gpt-oss's harmony channels: the `analysis` channel is the reasoning (`crate::harmony`);
    /// the template's `reasoning_effort` sets its level.
    Harmony,
}

/// `--reasoning-parser`: a format by vLLM's name, the one the model's template shows, or none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ReasoningParserFlag {
    /// The format the chat template's markers and the model type show; none without markers.
    Auto,
    /// Output is never split.
    None,
    #[value(name = "deepseek_r1")]
    DeepseekR1,
    #[value(name = "qwen3")]
    Qwen3,
    #[value(name = "deepseek_v3")]
    DeepseekV3,
    #[value(name = "kimi_k2")]
    KimiK2,
    /// GLM-4.5 and GLM-4.6: Qwen3's markers and `enable_thinking` switch.
    #[value(name = "glm45")]
    Glm45,
    /// Gemma 4's `<|channel>thought` channel.
    #[value(name = "gemma4")]
    Gemma4,
    /// gpt-oss's harmony channels.
    #[value(name = "openai_gptoss")]
    OpenaiGptoss,
}

impl ReasoningParserFlag {
    /// The format to serve with the chat template `template` and `config.json`'s `model_type`.
    pub fn resolve(
        self,
        template: Option<&str>,
        model_type: Option<&str>,
    ) -> Option<ReasoningParser> {
        match self {
            Self::Auto => ReasoningParser::detect(template, model_type),
            Self::None => None,
            Self::DeepseekR1 => Some(ReasoningParser::DeepseekR1),
            Self::Qwen3 | Self::Glm45 => Some(ReasoningParser::Qwen3),
            Self::DeepseekV3 => Some(ReasoningParser::DeepseekV3),
            Self::KimiK2 => Some(ReasoningParser::KimiK2),
            Self::Gemma4 => Some(ReasoningParser::Gemma4),
            Self::OpenaiGptoss => Some(ReasoningParser::Harmony),
        }
    }
}

/// Where the first generated character stands relative to the reasoning markers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReasoningStart {
    /// The prompt opened the reasoning: output is reasoning until the end marker.
    Inside,
    /// The prompt closed it (thinking switched off): output is all answer.
    Closed,
    /// The model may open it: an opening marker first starts reasoning, anything else is
    /// answer, unless the format's output starts inside the reasoning by default.
    Undecided { reasoning_by_default: bool },
}

impl ReasoningParser {
    /// The marker that opens reasoning.
    pub fn start_marker(self) -> &'static str {
        match self {
            Self::Gemma4 => GEMMA4_START,
            _ => "<think>",
        }
    }

    /// The start marker's first token's text: all of it, but Gemma 4's `<|channel>`, which
    /// `thought` follows.
    pub fn start_token(self) -> &'static str {
        match self {
            Self::Gemma4 => GEMMA4_CHANNEL,
            _ => self.start_marker(),
        }
    }

    /// The marker that ends reasoning; the answer follows it.
    pub fn end_marker(self) -> &'static str {
        match self {
            Self::Gemma4 => GEMMA4_END,
            _ => "</think>",
        }
    }

    /// The format of a model whose chat template `template` (and `config.json` `model_type`)
    /// shows reasoning markers; `None` when it shows none.
    pub fn detect(template: Option<&str>, model_type: Option<&str>) -> Option<Self> {
        let template = template?;
        if template.contains(harmony::CHANNEL) {
            return Some(Self::Harmony);
        }
        if template.contains(GEMMA4_START) {
            return Some(Self::Gemma4);
        }
        if !template.contains("</think>") {
            return None;
        }
        let qwen3 = model_type.is_some_and(|kind| kind.starts_with("qwen3"));
        if template.contains("<|im_assistant|>") {
            Some(Self::KimiK2)
        } else if template.contains("<｜Assistant｜>") && template.contains("enable_thinking") {
            Some(Self::DeepseekV3)
        } else if qwen3 || template.contains("enable_thinking") {
            Some(Self::Qwen3)
        } else {
            Some(Self::DeepseekR1)
        }
    }

    /// The special tokens the splitter reads as text.
    pub fn chat_markers(self) -> &'static [&'static str] {
        match self {
            Self::Harmony => &harmony::MARKERS,
            Self::Gemma4 => &[GEMMA4_CHANNEL, GEMMA4_END],
            Self::DeepseekR1 | Self::Qwen3 | Self::DeepseekV3 | Self::KimiK2 => {
                &["<think>", "</think>"]
            }
        }
    }

    /// Where generation starts after the rendered `prompt_tail` (the prompt's last characters):
    /// inside the reasoning when the prompt's last marker opens it, closed when its last marker
    /// ends it and only blanks follow.
    pub fn start_after(self, prompt_tail: &str) -> ReasoningStart {
        let tail = prompt_tail.trim_end();
        if tail.ends_with(self.start_marker()) {
            ReasoningStart::Inside
        } else if tail.ends_with(self.end_marker()) {
            ReasoningStart::Closed
        } else {
            ReasoningStart::Undecided {
                reasoning_by_default: self == Self::DeepseekR1,
            }
        }
    }

    /// Whether a request's `thinking: false` switches reasoning off through the template's
    /// `enable_thinking` (Qwen3, DeepSeek-V3.1, Gemma 4), rather than through a budget of 0.
    pub fn has_template_switch(self) -> bool {
        matches!(self, Self::Qwen3 | Self::DeepseekV3 | Self::Gemma4)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detection_reads_the_template_markers_and_the_model_type() {
        let r1 = "{% if add_generation_prompt %}<｜Assistant｜><think>\n{% endif %}{{ c.split('</think>')[-1] }}";
        let qwen3 = "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}";
        assert_eq!(
            ReasoningParser::detect(Some(r1), Some("qwen2")),
            Some(ReasoningParser::DeepseekR1)
        );
        assert_eq!(
            ReasoningParser::detect(Some(qwen3), Some("qwen3")),
            Some(ReasoningParser::Qwen3)
        );
        assert_eq!(
            ReasoningParser::detect(Some(r1), Some("qwen3_moe")),
            Some(ReasoningParser::Qwen3)
        );
        let v31 = "{%- if not thinking is defined -%}{%- if enable_thinking is defined -%}{%- set thinking = enable_thinking -%}{%- endif -%}{%- endif -%}{{'<｜Assistant｜>'}}{%- if not thinking -%}{{'</think>'}}{%- else -%}{{'<think>'}}{%- endif -%}";
        assert_eq!(
            ReasoningParser::detect(Some(v31), Some("deepseek_v3")),
            Some(ReasoningParser::DeepseekV3)
        );
        let kimi = "<|im_assistant|>assistant<|im_middle|><think>{{rc}}</think>";
        assert_eq!(
            ReasoningParser::detect(Some(kimi), Some("kimi_k2")),
            Some(ReasoningParser::KimiK2)
        );
        assert_eq!(
            ReasoningParser::detect(Some("<|im_start|>"), Some("qwen3")),
            None
        );
        assert_eq!(ReasoningParser::detect(None, Some("qwen3")), None);
        let harmony = "{{- '<|start|>assistant<|channel|>analysis<|message|>' + m.thinking }}";
        assert_eq!(
            ReasoningParser::detect(Some(harmony), Some("gpt_oss")),
            Some(ReasoningParser::Harmony)
        );
        for (template, model_type) in [
            (
                include_str!("../../python/tests/chat_templates/glm-4.6.jinja"),
                "glm4_moe",
            ),
            (
                include_str!("../../python/tests/chat_templates/qwen3.5.jinja"),
                "qwen3_5",
            ),
            (
                include_str!("../../python/tests/chat_templates/smollm3.jinja"),
                "smollm3",
            ),
        ] {
            assert_eq!(
                ReasoningParser::detect(Some(template), Some(model_type)),
                Some(ReasoningParser::Qwen3)
            );
        }
        assert_eq!(
            ReasoningParserFlag::Glm45.resolve(None, None),
            Some(ReasoningParser::Qwen3)
        );
    }

    #[test]
    fn deepseek_v31_is_switched_by_its_template_and_kimi_opens_its_own_reasoning() {
        let v3 = ReasoningParser::DeepseekV3;
        assert_eq!(
            v3.start_after("<｜Assistant｜><think>"),
            ReasoningStart::Inside
        );
        assert_eq!(
            v3.start_after("<｜Assistant｜></think>"),
            ReasoningStart::Closed
        );
        assert!(v3.has_template_switch());
        let kimi = ReasoningParser::KimiK2;
        assert_eq!(
            kimi.start_after("<|im_assistant|>assistant<|im_middle|>"),
            ReasoningStart::Undecided {
                reasoning_by_default: false
            }
        );
        assert!(!kimi.has_template_switch());
        for (name, parser) in [("deepseek_v3", v3), ("kimi_k2", kimi)] {
            let flag = <ReasoningParserFlag as ValueEnum>::from_str(name, false).expect("a name");
            assert_eq!(flag.resolve(None, None), Some(parser));
        }
    }

    #[test]
    fn gemma4_is_found_by_its_thought_channel_and_switched_by_its_template() {
        let template = "{{- '<|turn>model\\n' -}}{%- if not enable_thinking | default(false) -%}{{- '<|channel>thought\\n<channel|>' -}}{%- endif -%}";
        let gemma = ReasoningParser::Gemma4;
        assert_eq!(
            ReasoningParser::detect(Some(template), Some("gemma4")),
            Some(gemma)
        );
        assert_eq!(ReasoningParserFlag::Gemma4.resolve(None, None), Some(gemma));
        assert_eq!(
            gemma.start_after("<|turn>model\n<|channel>thought\n<channel|>"),
            ReasoningStart::Closed
        );
        assert_eq!(
            gemma.start_after("<|turn>model\n"),
            ReasoningStart::Undecided {
                reasoning_by_default: false
            }
        );
        assert!(gemma.has_template_switch());
        assert!(gemma.start_marker().starts_with(gemma.start_token()));
        assert_eq!(
            gemma.chat_markers(),
            [gemma.start_token(), gemma.end_marker()]
        );
    }

    #[test]
    fn the_prompt_tail_says_whether_generation_starts_inside_the_reasoning() {
        let r1 = ReasoningParser::DeepseekR1;
        assert_eq!(
            r1.start_after("<｜Assistant｜><think>\n"),
            ReasoningStart::Inside
        );
        let qwen3 = ReasoningParser::Qwen3;
        assert_eq!(
            qwen3.start_after("assistant\n<think>\n\n</think>\n\n"),
            ReasoningStart::Closed
        );
        assert_eq!(
            qwen3.start_after("<|im_start|>assistant\n"),
            ReasoningStart::Undecided {
                reasoning_by_default: false
            }
        );
        assert_eq!(
            r1.start_after("<｜Assistant｜>"),
            ReasoningStart::Undecided {
                reasoning_by_default: true
            }
        );
    }
}
