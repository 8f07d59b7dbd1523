//! What a request asks of the reasoning, from OpenAI's `reasoning_effort` and Responses'
//! `reasoning.effort`, or Anthropic's `thinking`, and how that maps onto a format.

use super::parser::ReasoningParser;

/// OpenAI's effort levels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReasoningEffort {
    None,
    Minimal,
    Low,
    Medium,
    High,
}

impl ReasoningEffort {
    /// The accepted values, for messages.
    pub const NAMES: &'static str = "none, minimal, low, medium or high";

    /// Reads an effort name.
    pub fn parse(name: &str) -> Option<Self> {
        serde_json::from_value(serde_json::Value::String(name.to_owned())).ok()
    }

    /// `none` switches reasoning off; the other levels bound it (`high` leaves it unbounded);
    /// `param` names where the effort came from.
    pub fn request(self, param: &'static str) -> ReasoningRequest {
        let (enabled, budget_tokens) = match self {
            Self::None => (false, None),
            Self::Minimal => (true, Some(256)),
            Self::Low => (true, Some(1024)),
            Self::Medium => (true, Some(4096)),
            Self::High => (true, None),
        };
        ReasoningRequest {
            enabled: Some(enabled),
            budget_tokens,
            param,
        }
    }
}

/// Reasoning asked of one request; the default leaves it to the model and its template.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReasoningRequest {
    /// `Some(false)`: no reasoning; `Some(true)`: reasoning on; `None`: the template's default.
    pub enabled: Option<bool>,
    /// Most reasoning tokens before the end marker is forced.
    pub budget_tokens: Option<u32>,
    /// The request parameter these came from, for messages.
    pub param: &'static str,
}

impl ReasoningRequest {
    /// The template's `enable_thinking`, for formats switched by it (Qwen3).
    pub fn template_switch(self, parser: ReasoningParser) -> Option<bool> {
        self.enabled.filter(|_| parser.has_template_switch())
    }

    /// The budget to enforce: switching off a format without a template switch is a budget of
    /// 0 (the end marker is forced at once).
    pub fn budget(self, parser: ReasoningParser) -> Option<u32> {
        match self.enabled {
            Some(false) if parser.has_template_switch() => None,
            Some(false) => Some(0),
            _ => self.budget_tokens,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn effort_none_uses_the_template_switch_where_there_is_one_and_a_zero_budget_elsewhere() {
        let off = ReasoningEffort::None.request("reasoning_effort");
        assert_eq!(off.template_switch(ReasoningParser::Qwen3), Some(false));
        assert_eq!(off.budget(ReasoningParser::Qwen3), None);
        assert_eq!(off.template_switch(ReasoningParser::DeepseekR1), None);
        assert_eq!(off.budget(ReasoningParser::DeepseekR1), Some(0));
    }

    #[test]
    fn effort_levels_are_budgets_and_high_is_unbounded() {
        assert_eq!(
            ReasoningEffort::parse("low").map(|e| e.request("reasoning_effort").budget_tokens),
            Some(Some(1024))
        );
        assert_eq!(
            ReasoningEffort::High
                .request("reasoning_effort")
                .budget(ReasoningParser::Qwen3),
            None
        );
        assert_eq!(ReasoningEffort::parse("max"), None);
    }
}
