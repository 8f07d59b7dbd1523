//! Grammars compiled with llguidance before admission: a schema or regex the shard could
//! not compile is the client's 4xx, never a shard error, and no grammar can stall the router.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use llguidance::api::{ParserLimits, TopLevelGrammar};
use llguidance::toktrie::{ApproximateTokEnv, TokRxInfo, TokTrie};
use llguidance::{CancellationHandle, Matcher, ParserFactory};
use serde_json::Value;
use tokio::sync::Semaphore;

use super::error::ValidationError;
use super::grammar_refusal::{GrammarRefusal, GrammarSource};
use super::requested_grammar::RequestedGrammar;
use crate::scheduler::Grammar;

/// Wall-clock bound on one compilation, waiting for a compile slot included; llguidance's
/// fuel limits end the work well before, and a compilation given up on is cancelled.
pub const COMPILE_TIMEOUT: Duration = Duration::from_secs(2);
/// Compilations running at once. A compilation given up on keeps its slot until it has
/// really stopped, so abandoned work can never pile up on the blocking pool.
const MAX_CONCURRENT_COMPILES: usize = 4;
/// Lexer fuel for building a grammar (llguidance: ~50k units per ms, so ~20 ms).
const INITIAL_LEXER_FUEL: u64 = 1_000_000;
/// Lexer fuel for one token mask (llguidance: ~14k units per ms, so ~15 ms).
const STEP_LEXER_FUEL: u64 = 200_000;

/// Why the grammar engine could not be set up from the model's tokenizer.
#[derive(Debug, thiserror::Error)]
#[error("cannot prepare grammar support from {path}: {message}")]
pub struct GrammarSetupError {
    path: String,
    message: String,
}

/// Compiles grammars against the model's vocabulary (built once at start-up).
pub struct GrammarCompiler {
    factory: Arc<ParserFactory>,
    /// Largest grammar source accepted, in bytes (`--max-grammar-bytes`).
    max_bytes: usize,
    compile_slots: Arc<Semaphore>,
}

/// Lets the side waiting for a compilation stop it once it gives up.
#[derive(Debug, Default)]
struct Abandon {
    abandoned: AtomicBool,
    mask: Mutex<Option<CancellationHandle>>,
}

impl Abandon {
    /// Stops the compilation: before its mask computation starts, or while it runs.
    fn abandon(&self) {
        self.abandoned.store(true, Ordering::SeqCst);
        if let Ok(mask) = self.mask.lock() {
            if let Some(handle) = mask.as_ref() {
                handle.cancel();
            }
        }
    }

    fn is_abandoned(&self) -> bool {
        self.abandoned.load(Ordering::SeqCst)
    }

    /// Registers the mask computation's cancellation; cancels it at once if already abandoned.
    fn watch(&self, handle: CancellationHandle) {
        if let Ok(mut mask) = self.mask.lock() {
            *mask = Some(handle.clone());
        }
        if self.is_abandoned() {
            handle.cancel();
        }
    }
}

impl std::fmt::Debug for GrammarCompiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarCompiler").finish_non_exhaustive()
    }
}

impl GrammarCompiler {
    /// Reads the token bytes from `tokenizer.json`; tokenization inside the grammar engine is
    /// approximate (greedy), which only matters for literal-token grammar features.
    pub fn load(tokenizer_json: &Path, eos_token_ids: &[u32]) -> Result<Self, GrammarSetupError> {
        let fail = |message: String| GrammarSetupError {
            path: tokenizer_json.display().to_string(),
            message,
        };
        let text = std::fs::read_to_string(tokenizer_json).map_err(|e| fail(e.to_string()))?;
        let value: Value = serde_json::from_str(&text).map_err(|e| fail(e.to_string()))?;
        Self::from_tokenizer_json(&value, eos_token_ids).map_err(fail)
    }

    /// The compiler for a parsed `tokenizer.json`.
    pub fn from_tokenizer_json(value: &Value, eos_token_ids: &[u32]) -> Result<Self, String> {
        let fail = |message: String| message;
        let words =
            llguidance::token_bytes_from_tokenizer_json(value).map_err(|e| fail(e.to_string()))?;
        let vocab_size = u32::try_from(words.len()).map_err(|e| fail(e.to_string()))?;
        let eos = eos_token_ids.first().copied().unwrap_or(0);
        let trie =
            TokTrie::from(&TokRxInfo::new(vocab_size, eos), &words).with_eos_tokens(eos_token_ids);
        let env: llguidance::toktrie::TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| fail(e.to_string()))?;
        factory.quiet();
        let limits: &mut ParserLimits = factory.limits_mut();
        limits.initial_lexer_fuel = INITIAL_LEXER_FUEL;
        limits.step_lexer_fuel = STEP_LEXER_FUEL;
        limits.verbose_errors = false;
        Ok(Self {
            factory: Arc::new(factory),
            max_bytes: 128 * 1024,
            compile_slots: Arc::new(Semaphore::new(MAX_CONCURRENT_COMPILES)),
        })
    }

    /// Accepts grammar sources of at most `max_bytes` bytes.
    #[must_use]
    pub fn with_max_bytes(mut self, max_bytes: usize) -> Self {
        self.max_bytes = max_bytes;
        self
    }

    /// Compiles `requested` and computes its first token mask, on a blocking worker, within
    /// `COMPILE_TIMEOUT`; any failure names the request parameter.
    pub async fn check(&self, requested: &RequestedGrammar) -> Result<(), ValidationError> {
        let invalid = |refusal: GrammarRefusal| ValidationError::InvalidGrammar {
            param: requested.param,
            refusal,
        };
        let source = GrammarSource::of(&requested.grammar);
        let source_len = match &requested.grammar {
            Grammar::JsonSchema(text) | Grammar::Regex(text) | Grammar::Lark(text) => text.len(),
        };
        if source_len > self.max_bytes {
            return Err(invalid(GrammarRefusal::TooLarge {
                kind: source,
                got: source_len,
                max: self.max_bytes,
            }));
        }
        let deadline = tokio::time::Instant::now() + COMPILE_TIMEOUT;
        let timed_out = || {
            invalid(GrammarRefusal::TimedOut {
                kind: source,
                ms: COMPILE_TIMEOUT.as_millis(),
            })
        };
        let slots = Arc::clone(&self.compile_slots).acquire_owned();
        let Ok(Ok(slot)) = tokio::time::timeout_at(deadline, slots).await else {
            return Err(timed_out());
        };
        let (factory, grammar) = (Arc::clone(&self.factory), requested.grammar.clone());
        let abandon = Arc::new(Abandon::default());
        let compiling = Arc::clone(&abandon);
        let job = tokio::task::spawn_blocking(move || {
            let _slot = slot;
            compile(&factory, &grammar, &compiling)
        });
        match tokio::time::timeout_at(deadline, job).await {
            // Only a compilation given up on is cancelled.
            Err(_) | Ok(Ok(Err(Compile::Cancelled))) => {
                abandon.abandon();
                Err(timed_out())
            }
            Ok(Err(_panicked)) => Err(invalid(GrammarRefusal::Failed(source))),
            Ok(Ok(Err(Compile::Refused(refusal)))) => Err(invalid(refusal)),
            Ok(Ok(Ok(()))) => Ok(()),
        }
    }
}

#[cfg(test)]
impl GrammarCompiler {
    /// Whether `grammar` lets a model write exactly `tokens` and then end.
    pub fn accepts(&self, grammar: &Grammar, tokens: &[u32]) -> bool {
        let top = match grammar {
            Grammar::JsonSchema(text) => {
                TopLevelGrammar::from_json_schema(serde_json::from_str(text).expect("JSON"))
            }
            Grammar::Regex(regex) => TopLevelGrammar::from_regex(regex),
            Grammar::Lark(lark) => TopLevelGrammar::from_lark(lark.clone()),
        };
        let mut matcher = Matcher::new(self.factory.create_parser(top));
        assert_eq!(matcher.get_error(), None, "the grammar compiles");
        matcher.validate_tokens(tokens).ok() == Some(tokens.len())
            && matcher.consume_tokens(tokens).is_ok()
            && matcher.is_accepting().unwrap_or(false)
    }
}

impl GrammarSource {
    fn of(grammar: &Grammar) -> Self {
        match grammar {
            Grammar::JsonSchema(_) => Self::JsonSchema,
            Grammar::Regex(_) => Self::Regex,
            Grammar::Lark(_) => Self::Lark,
        }
    }
}

/// Why a compilation produced no grammar.
#[derive(Debug, PartialEq)]
enum Compile {
    Refused(GrammarRefusal),
    Cancelled,
}

/// Builds the parser (bounded by llguidance's fuel and grammar-size limits) and its first
/// mask (cancellable through `abandon`): errors that only show lazily surface here too.
fn compile(factory: &ParserFactory, grammar: &Grammar, abandon: &Abandon) -> Result<(), Compile> {
    let source = GrammarSource::of(grammar);
    let refused = |engine: String| Compile::Refused(GrammarRefusal::from_engine(source, &engine));
    let top = match grammar {
        Grammar::JsonSchema(text) => {
            let schema: Value = serde_json::from_str(text)
                .map_err(|e| Compile::Refused(GrammarRefusal::NotJson(e.to_string())))?;
            TopLevelGrammar::from_json_schema(schema)
        }
        Grammar::Regex(regex) => TopLevelGrammar::from_regex(regex),
        Grammar::Lark(lark) => TopLevelGrammar::from_lark(lark.clone()),
    };
    let parser = factory.create_parser(top);
    if abandon.is_abandoned() {
        return Err(Compile::Cancelled);
    }
    let mut matcher = Matcher::new(parser).into_cancellable();
    if let Some(handle) = matcher.cancellation_handle() {
        abandon.watch(handle);
    }
    if let Some(error) = matcher.get_error() {
        return Err(refused(error));
    }
    let mask = matcher.compute_mask();
    if matcher.is_cancelled() {
        return Err(Compile::Cancelled);
    }
    mask.map(|_| ()).map_err(|e| refused(e.to_string()))
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use serde_json::json;

    use super::*;
    use crate::validation::testing::{tokenizer_json, EOS_ID};

    fn compiler() -> GrammarCompiler {
        GrammarCompiler::from_tokenizer_json(&tokenizer_json(), &[EOS_ID]).expect("test vocabulary")
    }

    fn regex(source: &str) -> RequestedGrammar {
        RequestedGrammar {
            grammar: Grammar::Regex(source.to_owned()),
            param: "parameters.grammar.value",
        }
    }

    async fn message(requested: RequestedGrammar) -> String {
        match compiler().check(&requested).await {
            Err(ValidationError::InvalidGrammar { param, refusal }) => {
                assert_eq!(param, requested.param);
                refusal.to_string()
            }
            other => panic!("expected an invalid grammar, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn valid_schemas_regexes_and_lark_compile() {
        let schema =
            json!({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]});
        let compiler = compiler();
        for requested in [
            RequestedGrammar::json_schema(schema, "response_format"),
            regex("[0-9]{3}-[a-z]+"),
            RequestedGrammar {
                grammar: Grammar::Lark("start: \"yes\" | \"no\"".to_owned()),
                param: "tools",
            },
        ] {
            assert_eq!(compiler.check(&requested).await, Ok(()), "{requested:?}");
        }
    }

    #[tokio::test]
    async fn bad_regexes_and_schemas_are_rejected_with_their_parameter() {
        assert!(!message(regex("(unclosed")).await.is_empty());
        assert!(!message(regex("a(?=b)")).await.is_empty());
        let unknown_type = json!({"type": "objekt"});
        assert!(!message(RequestedGrammar::json_schema(
            unknown_type,
            "response_format"
        ))
        .await
        .is_empty());
        let not_json = RequestedGrammar {
            grammar: Grammar::JsonSchema("{not json".to_owned()),
            param: "response_format",
        };
        assert!(message(not_json).await.contains("not valid JSON"));
    }

    #[tokio::test]
    async fn oversized_sources_are_rejected_before_compiling() {
        let huge = regex(&"a".repeat(128 * 1024 + 1));
        assert!(message(huge).await.contains("at most"));
        let small = compiler().with_max_bytes(8);
        let error = small.check(&regex("[a-z]{1,9}")).await.unwrap_err();
        assert!(error.to_string().contains("at most 8"), "{error}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_compile_waits_for_a_slot_no_longer_than_the_bound() {
        let compiler = compiler();
        let held = Arc::clone(&compiler.compile_slots)
            .acquire_many_owned(u32::try_from(MAX_CONCURRENT_COMPILES).unwrap())
            .await
            .unwrap();
        let error = compiler.check(&regex("[a-z]+")).await.unwrap_err();
        assert!(
            error.to_string().contains("did not compile within"),
            "{error}"
        );
        drop(held);
        assert_eq!(compiler.check(&regex("[a-z]+")).await, Ok(()));
    }

    #[test]
    fn an_abandoned_compilation_stops_before_its_mask_or_during_it() {
        let compiler = compiler();
        let abandon = Abandon::default();
        abandon.abandon();
        let error = compile(
            &compiler.factory,
            &Grammar::Regex("[a-z]+".into()),
            &abandon,
        );
        assert_eq!(error, Err(Compile::Cancelled));
        let watched = Abandon::default();
        let handle = CancellationHandle::default();
        watched.watch(handle.clone());
        watched.abandon();
        assert!(handle.is_cancelled());
    }

    /// An object schema nesting `levels` objects, each under `properties` (two JSON levels each).
    fn nested_schema(levels: usize) -> Value {
        (0..levels).fold(
            json!({"type": "integer"}),
            |inner, _| json!({"type": "object", "properties": {"k": inner}, "required": ["k"]}),
        )
    }

    #[tokio::test]
    async fn a_pathological_regex_compiles_within_the_compile_bound() {
        // The engine builds its automaton lazily: the first mask does not expand the repeats.
        let nested = "((a|b|c|d|e|f|g|h){1,200}){1,200}[0-9]{1,1000}(x{1,500}|y{1,500}){1,50}";
        let started = Instant::now();
        assert_eq!(compiler().check(&regex(nested)).await, Ok(()));
        assert!(started.elapsed() <= COMPILE_TIMEOUT + Duration::from_millis(100));
    }

    #[tokio::test]
    async fn the_deepest_schema_a_request_can_carry_reaches_the_grammar_engine_and_compiles() {
        // serde_json parses 128 levels: a request body holds at most about 60 schema levels.
        let deepest = RequestedGrammar::json_schema(nested_schema(60), "response_format");
        let started = Instant::now();
        assert_eq!(compiler().check(&deepest).await, Ok(()));
        assert!(started.elapsed() <= COMPILE_TIMEOUT + Duration::from_millis(100));
    }

    #[tokio::test]
    async fn a_schema_deeper_than_the_json_parser_allows_is_refused_as_such() {
        let too_deep = RequestedGrammar::json_schema(nested_schema(200), "response_format");
        let message = compiler().check(&too_deep).await.unwrap_err().to_string();
        assert!(message.contains("recursion limit exceeded"), "{message}");
    }
}
