//! Function tools, planned and parsed in one place, in the syntax the served model was tuned
//! on: `format.rs` picks the family's syntax at start-up; `plan.rs` validates a request's
//! tools and tool choice; `grammar.rs` derives the grammar that makes every call well-formed
//! in that syntax; `history.rs` writes past calls back for the template; `calls.rs` and
//! `output.rs` read calls out of what the grammar let the model write, whole or streaming.
//!
//! Families with a native syntax (Hermes/Qwen `<tool_call>`, Llama 3 JSON, Mistral
//! `[TOOL_CALLS]`, DeepSeek-V3.1's and Kimi K2's call sections in `section.rs`, the XML-style
//! Qwen3-Coder, GLM-4.5 and DeepSeek-V3.2 DSML calls of `xml_*.rs`, and Gemma 4's
//! `<|tool_call>` calls of `gemma*.rs`) see the tools through their chat template's `tools`;
//! other models are taught Tandem's `{"tool_calls": [...]}` document in a system message.

mod calls;
mod format;
mod gemma;
mod gemma_calls;
mod grammar;
mod history;
mod lark;
mod output;
mod plan;
mod section;
mod section_stream;
mod xml_calls;
mod xml_grammar;
mod xml_syntax;

pub use calls::{FunctionCall, ToolCall};
pub use format::{ToolCallParser, ToolFamily, ToolFormat};
pub use history::{history, HistoryCalls};
pub use output::{parse_output, route_text, ChoiceOutput, DeltaBody, ParsedOutput};
pub use plan::{plan, FunctionTool, ToolChoice, ToolPlan};
