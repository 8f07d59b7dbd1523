//! The reasoning formats Tandem reads (vLLM's `--reasoning-parser` names), how one is chosen
//! from the model, and where a generation starts relative to its markers.

use clap::ValueEnum;

use crate::harmony;

/// A family's reasoning format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReasoningParser {
    /// DeepSeek-R1 and its distills: `<think>…</think>`; the template opens `<think>` itself,
    /// so output without an opening marker starts inside the reasoning.
    DeepseekR1,
    /// Qwen3: `<think>…</think>`, switched by the template's `enable_thinking`; output without
    /// an opening marker is all answer.
    Qwen3,
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
            Self::Qwen3 => Some(ReasoningParser::Qwen3),
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
        "<think>"
    }

    /// The marker that ends reasoning; the answer follows it.
    pub fn end_marker(self) -> &'static str {
        "</think>"
    }

    /// The format of a model whose chat template `template` (and `config.json` `model_type`)
    /// shows reasoning markers; `None` when it shows none.
    pub fn detect(template: Option<&str>, model_type: Option<&str>) -> Option<Self> {
        let template = template?;
        if template.contains(harmony::CHANNEL) {
            return Some(Self::Harmony);
        }
        if !template.contains("</think>") {
            return None;
        }
        let qwen3 = model_type.is_some_and(|kind| kind.starts_with("qwen3"));
        if qwen3 || template.contains("enable_thinking") {
            Some(Self::Qwen3)
        } else {
            Some(Self::DeepseekR1)
        }
    }

    /// The special tokens the splitter reads as text.
    pub fn chat_markers(self) -> &'static [&'static str] {
        match self {
            Self::Harmony => &harmony::MARKERS,
            Self::DeepseekR1 | Self::Qwen3 => &["<think>", "</think>"],
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
    /// `enable_thinking` (Qwen3), rather than through a budget of 0.
    pub fn has_template_switch(self) -> bool {
        self == Self::Qwen3
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
