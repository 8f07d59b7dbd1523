//! The reasoning side of validation: the template switch a request sets, where its output
//! starts relative to the reasoning markers, and the grammar that bounds the reasoning and
//! applies the request's own grammar to the answer after it.

use super::error::ValidationError;
use super::params::GenerationParams;
use super::requested_grammar::RequestedGrammar;
use super::requested_grammar::TOOLS_PARAM;
use super::{Prompt, Validator};
use crate::harmony::{harmony_grammar, Analysis, Tail};
use crate::reasoning::{
    answer_rule, reasoning_grammar, MarkerTokens, ReasoningParser, ReasoningSplitter,
    ReasoningStart,
};
use crate::scheduler::Grammar;

/// Prompt tokens read back to find the reasoning marker the prompt ends with: enough for a
/// marker and its blanks spelled one byte per token.
const PROMPT_TAIL_TOKENS: usize = 32;

/// What reasoning adds to a validated request.
pub(super) struct ReasoningPlan {
    /// A fresh splitter for each choice's output; `None` when the output is not split.
    pub splitter: Option<ReasoningSplitter>,
    /// The grammar to run under: the request's, or the request's wrapped after the reasoning.
    pub grammar: Option<RequestedGrammar>,
}

impl Validator {
    /// Uses `parser` to split reasoning models' chat output; `None` leaves output unchanged.
    #[must_use]
    pub fn with_reasoning_parser(mut self, parser: Option<ReasoningParser>) -> Self {
        self.reasoning = parser;
        self
    }

    /// The reasoning format that applies to `prompt`: chat prompts of a reasoning model.
    pub(super) fn reasoning_for(&self, prompt: &Prompt) -> Option<ReasoningParser> {
        self.reasoning
            .filter(|_| matches!(prompt, Prompt::Chat(..)))
    }

    /// The splitter and grammar for a request whose prompt tokenized to `input_ids`.
    pub(super) async fn reasoning_plan(
        &self,
        parser: Option<ReasoningParser>,
        input_ids: &[u32],
        params: &GenerationParams,
    ) -> Result<ReasoningPlan, ValidationError> {
        let Some(parser) = parser else {
            return Ok(ReasoningPlan {
                splitter: None,
                grammar: params.grammar.clone(),
            });
        };
        if parser == ReasoningParser::Harmony {
            return self.harmony_plan(params).await;
        }
        let tail_ids = &input_ids[input_ids.len().saturating_sub(PROMPT_TAIL_TOKENS)..];
        let tail = self
            .tokenizer
            .decode(tail_ids, false)
            .map_err(|e| ValidationError::Tokenizer(e.to_string()))?;
        let start = parser.start_after(&tail);
        let budget = params.reasoning.budget(parser);
        let answer = params.grammar.as_ref();
        let tokens = MarkerTokens {
            start: self.tokenizer.token_to_id(parser.start_token()),
            end: self.tokenizer.token_to_id(parser.end_marker()),
        };
        let grammar = reasoning_grammar(parser, start, budget, answer.map(|g| &g.grammar), tokens);
        let grammar = match (grammar, answer) {
            (None, _) => None,
            (Some(wrapped), Some(answer)) if wrapped == answer.grammar => Some(answer.clone()),
            (Some(wrapped), requested) => {
                let wrapped = RequestedGrammar {
                    grammar: wrapped,
                    param: requested.map_or(params.reasoning.param, |g| g.param),
                };
                self.check_grammar(&wrapped).await?;
                Some(wrapped)
            }
        };
        Ok(ReasoningPlan {
            splitter: Some(ReasoningSplitter::new(parser, start)),
            grammar,
        })
    }

    /// Harmony's plan: the analysis message (bounded by the request's budget) in front of the
    /// tools' calls grammar, or of a final message under the request's own grammar.
    async fn harmony_plan(
        &self,
        params: &GenerationParams,
    ) -> Result<ReasoningPlan, ValidationError> {
        let parser = ReasoningParser::Harmony;
        let splitter = Some(ReasoningSplitter::new(parser, ReasoningStart::Inside));
        let budget = params.reasoning.budget(parser);
        let requested = params.grammar.as_ref();
        if budget.is_none() && requested.is_none() {
            return Ok(ReasoningPlan {
                splitter,
                grammar: None,
            });
        }
        let tail = match requested {
            Some(tools) if tools.param == TOOLS_PARAM => match &tools.grammar {
                Grammar::Lark(lark) => Tail::Grammar(lark.clone()),
                other => Tail::Final(Some(answer_rule(Some(other)))),
            },
            other => Tail::Final(other.map(|g| answer_rule(Some(&g.grammar)))),
        };
        let analysis = budget.map_or(Analysis::Free, Analysis::Budget);
        let wrapped = RequestedGrammar {
            grammar: Grammar::Lark(harmony_grammar(analysis, &tail)),
            param: requested.map_or(params.reasoning.param, |g| g.param),
        };
        self.check_grammar(&wrapped).await?;
        Ok(ReasoningPlan {
            splitter,
            grammar: Some(wrapped),
        })
    }
}
