//! Function tools, planned and parsed in one place: `plan.rs` validates a request's tools and
//! tool choice and derives the preamble and the grammar that make every call well-formed;
//! `calls.rs` reads the calls back out of what the grammar let the model write, whole or
//! while it streams.
//!
//! Calls are one JSON document, `{"tool_calls": [{"name": ..., "arguments": {...}}, ...]}`,
//! whose arguments follow each tool's schema. `required` and a named choice constrain the
//! whole output to it; `auto` lets the output be either that document or plain text not
//! starting with `{`, so the first character decides and any model works.

mod calls;
mod plan;

pub use calls::{
    call_id, parse, route_text, ChoiceOutput, DeltaBody, FunctionCall, ToolCall, ToolCallStream,
};
pub use plan::{history_calls, plan, FunctionTool, ToolChoice, ToolPlan};
