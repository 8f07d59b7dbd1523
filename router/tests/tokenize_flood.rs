//! Resident memory of a `/tokenize` flood: 24 concurrent 2 MB inputs through the router's
//! tokenization with the budget the server sets by default. Needs a real model's tokenizer
//! (`TANDEM_TOKENIZER_JSON`), so it runs only when asked:
//! `TANDEM_TOKENIZER_JSON=.../tokenizer.json cargo test --test tokenize_flood -- --ignored --nocapture`.

use std::sync::Arc;
use std::time::Duration;

use tandem_router::http::tokenize_answer;
use tandem_router::validation::{ChatUnavailable, Limits, Validator, DEFAULT_TOKENIZATION_BUDGET};
use tokenizers::Tokenizer;

/// The router binary's allocator.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const REQUESTS: usize = 24;
const INPUT_BYTES: usize = 2_000_000;

/// `VmRSS` and `VmHWM` (peak) of this process, in MiB.
fn resident_mib() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next()?.parse::<u64>().ok())
            .map_or(0, |kib| kib / 1024)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
#[ignore = "needs TANDEM_TOKENIZER_JSON, a real model's tokenizer"]
async fn a_tokenize_flood_stays_within_the_budget_and_gives_memory_back() {
    let path = std::env::var("TANDEM_TOKENIZER_JSON").expect("TANDEM_TOKENIZER_JSON");
    let tokenizer = Tokenizer::from_file(&path).expect("tokenizer.json");
    let limits = Limits {
        max_input_tokens: usize::MAX,
        max_total_tokens: usize::MAX,
        max_stop_sequences: 4,
    };
    let validator = Arc::new(
        Validator::new(
            Arc::new(tokenizer),
            Err(ChatUnavailable::NoTemplate),
            limits,
        )
        .with_tokenization_budget(DEFAULT_TOKENIZATION_BUDGET),
    );
    let sample = "The quick brown fox jumps over the lazy dog; café, naïve, 😀 {\"k\": [1, 2.5]}\n";
    let text = sample.repeat(INPUT_BYTES / sample.len());
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (idle, _) = resident_mib();
    let flood: Vec<_> = (0..REQUESTS)
        .map(|_| {
            let (validator, text) = (Arc::clone(&validator), text.clone());
            tokio::spawn(async move {
                let answer = tokenize_answer(&validator, text).await.expect("tokenizes");
                // The answer is held as long as a slow client takes to read it.
                tokio::time::sleep(Duration::from_millis(100)).await;
                answer.json.len()
            })
        })
        .collect();
    for request in flood {
        request.await.expect("a tokenize task");
    }
    let (_, peak) = resident_mib();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (soon_after, _) = resident_mib();
    // Past the blocking pool's 10 s keep-alive, its idle threads have exited.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let (after, _) = resident_mib();
    println!(
        "idle {idle} MiB, peak {peak} MiB, 2 s after {soon_after} MiB, 12 s after {after} MiB"
    );
    assert!(peak <= 1024, "peak {peak} MiB");
    assert!(
        after <= 2 * idle,
        "{after} MiB after the flood, {idle} MiB idle"
    );
}
