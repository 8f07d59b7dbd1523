//! What a request asks of the reasoning, from OpenAI's `reasoning_effort` and Responses'
//! `reasoning.effort`, or Anthropic's `thinking`, and how that maps onto a format.

use serde_json::Value;

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
            effort: Some(self),
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
    /// The effort level asked for, for templates that take one (harmony's `reasoning_effort`).
    pub effort: Option<ReasoningEffort>,
    /// The request parameter these came from, for messages.
    pub param: &'static str,
}

impl ReasoningRequest {
    /// The template variables this request sets: Qwen3's, DeepSeek-V3.1's and Gemma 4's `enable_thinking`, harmony's
    /// `reasoning_effort` (`low`, `medium` or `high`; an effort of `none` is a budget of 0).
    pub fn template_switches(self, parser: ReasoningParser) -> Vec<(&'static str, Value)> {
        match parser {
            ReasoningParser::Qwen3 | ReasoningParser::DeepseekV3 | ReasoningParser::Gemma4 => self
                .enabled
                .map(|enabled| ("enable_thinking", Value::Bool(enabled)))
                .into_iter()
                .collect(),
            ReasoningParser::Harmony => self
                .harmony_effort()
                .map(|level| ("reasoning_effort", Value::String(level.to_owned())))
                .into_iter()
                .collect(),
            ReasoningParser::DeepseekR1 | ReasoningParser::KimiK2 => Vec::new(),
        }
    }

    /// Harmony's level: the effort asked for, or the one a token budget stands for.
    fn harmony_effort(self) -> Option<&'static str> {
        let level = match (self.effort, self.budget_tokens) {
            (Some(ReasoningEffort::None | ReasoningEffort::Minimal | ReasoningEffort::Low), _) => {
                "low"
            }
            (Some(ReasoningEffort::Medium), _) => "medium",
            (Some(ReasoningEffort::High), _) => "high",
            (None, Some(budget)) if budget <= 1024 => "low",
            (None, Some(budget)) if budget <= 4096 => "medium",
            (None, Some(_)) => "high",
            (None, None) => return None,
        };
        Some(level)
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
        assert_eq!(
            off.template_switches(ReasoningParser::Qwen3),
            vec![("enable_thinking", Value::Bool(false))]
        );
        assert_eq!(off.budget(ReasoningParser::Qwen3), None);
        assert!(off
            .template_switches(ReasoningParser::DeepseekR1)
            .is_empty());
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

    #[test]
    fn harmony_takes_the_effort_through_its_template_as_well_as_a_budget() {
        let harmony = ReasoningParser::Harmony;
        let high = ReasoningEffort::High.request("reasoning_effort");
        assert_eq!(
            high.template_switches(harmony),
            vec![("reasoning_effort", Value::String("high".into()))]
        );
        assert_eq!(
            ReasoningEffort::Low.request("r").budget(harmony),
            Some(1024)
        );
        assert_eq!(ReasoningEffort::None.request("r").budget(harmony), Some(0));
        let budget = ReasoningRequest {
            enabled: Some(true),
            budget_tokens: Some(2000),
            effort: None,
            param: "thinking",
        };
        assert_eq!(budget.budget(harmony), Some(2000));
        assert_eq!(
            budget.template_switches(harmony),
            vec![("reasoning_effort", Value::String("medium".into()))]
        );
        assert!(budget
            .template_switches(ReasoningParser::DeepseekR1)
            .is_empty());
        assert!(ReasoningRequest::default()
            .template_switches(harmony)
            .is_empty());
    }
}
