//! Drafts for speculative decoding. The router proposes tokens without a model, so a proposal
//! costs microseconds: from the request's own tokens (prompt lookup) or from what an earlier
//! request computed after the same tokens (the prefix cache's radix tree). Or it asks the shards'
//! draft model for a number of them. The shards keep a draft only where it equals the token the
//! request draws itself, so drafts change how fast tokens come, never which.

use std::fmt;
use std::str::FromStr;

use crate::kv::{self, AdapterKey, BlockPool};

/// Where a server's drafts come from (`--speculative-method`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DraftMethod {
    /// The continuation of the latest earlier occurrence of the request's last tokens.
    Ngram,
    /// The continuation an earlier request computed after the request's whole context, from the
    /// prefix cache; prompt lookup where the cache holds none.
    Radix,
    /// The shards' draft model proposes them (`num_model_drafts`); the router sends a count.
    Model,
}

impl DraftMethod {
    pub const ALL: [Self; 3] = [Self::Ngram, Self::Radix, Self::Model];

    /// The value of the `method` label on the speculative decoding metrics.
    pub fn label(self) -> &'static str {
        match self {
            Self::Ngram => "ngram",
            Self::Radix => "radix",
            Self::Model => "draft",
        }
    }
}

impl fmt::Display for DraftMethod {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(self.label())
    }
}

impl FromStr for DraftMethod {
    type Err = String;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        match value {
            "ngram" => Ok(Self::Ngram),
            "radix" => Ok(Self::Radix),
            "draft" => Ok(Self::Model),
            other => Err(format!(
                "unknown speculative method {other:?}: use ngram, radix or draft"
            )),
        }
    }
}

/// One step's drafts for one request. Never empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Drafts {
    /// Tokens the router proposed, and the method that found them (`ngram` or `radix`).
    Tokens {
        tokens: Vec<u32>,
        method: DraftMethod,
    },
    /// This many tokens, proposed by the shards' draft model: it always proposes them all.
    FromModel(usize),
}

impl Drafts {
    /// Draft tokens the step runs after the request's last token.
    pub fn count(&self) -> usize {
        match self {
            Self::Tokens { tokens, .. } => tokens.len(),
            Self::FromModel(count) => *count,
        }
    }

    /// The method the drafts are counted under.
    pub fn method(&self) -> DraftMethod {
        match self {
            Self::Tokens { method, .. } => *method,
            Self::FromModel(_) => DraftMethod::Model,
        }
    }
}

/// Up to `max_drafts` drafts after `tokens` (as the prefix cache keys them) by `method`; `None`
/// when no method has any. The draft model always has `max_drafts`. Drafts stop before an image
/// position: only a prompt places images.
pub fn propose(
    method: DraftMethod,
    tokens: &[u32],
    max_drafts: usize,
    pool: &BlockPool,
    adapter: Option<&AdapterKey>,
) -> Option<Drafts> {
    if max_drafts == 0 {
        return None;
    }
    if method == DraftMethod::Model {
        return Some(Drafts::FromModel(max_drafts));
    }
    if method == DraftMethod::Radix {
        let cached = before_images(pool.cached_continuation(adapter, tokens, max_drafts));
        if !cached.is_empty() {
            return Some(Drafts::Tokens {
                tokens: cached,
                method: DraftMethod::Radix,
            });
        }
    }
    let looked_up = before_images(propose_from_context(tokens, max_drafts));
    (!looked_up.is_empty()).then_some(Drafts::Tokens {
        tokens: looked_up,
        method: DraftMethod::Ngram,
    })
}

/// `drafts` up to the first image position.
fn before_images(mut drafts: Vec<u32>) -> Vec<u32> {
    if let Some(image) = drafts.iter().position(|&key| kv::is_image_key(key)) {
        drafts.truncate(image);
    }
    drafts
}

/// The longest and shortest suffix looked up in the request's earlier tokens.
const MAX_NGRAM: usize = 3;
const MIN_NGRAM: usize = 1;

/// Up to `max_drafts` tokens that followed the latest earlier occurrence of the last `n` tokens
/// of `tokens`, trying the longest `n` first; empty when no suffix occurred before.
fn propose_from_context(tokens: &[u32], max_drafts: usize) -> Vec<u32> {
    if max_drafts == 0 {
        return Vec::new();
    }
    for n in (MIN_NGRAM..=MAX_NGRAM).rev() {
        if tokens.len() <= n {
            continue;
        }
        let suffix = &tokens[tokens.len() - n..];
        // Latest occurrence first: recent context predicts the continuation best. One close to
        // the end has few tokens after it, so an earlier one with `max_drafts` of them wins.
        let mut best: &[u32] = &[];
        for start in (0..tokens.len() - n).rev() {
            if &tokens[start..start + n] != suffix {
                continue;
            }
            let follow = start + n;
            let continuation = &tokens[follow..(follow + max_drafts).min(tokens.len())];
            if continuation.len() > best.len() {
                best = continuation;
            }
            if best.len() == max_drafts {
                break;
            }
        }
        if !best.is_empty() {
            return best.to_vec();
        }
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_suffix_seen_before_proposes_what_followed_it() {
        // "7 8 9" occurred before, followed by 10 11; "9" alone occurred later, followed by 4.
        let tokens = [1, 7, 8, 9, 10, 11, 9, 4, 2, 7, 8, 9];
        assert_eq!(propose_from_context(&tokens, 2), vec![10, 11]);
        assert_eq!(
            propose_from_context(&tokens, 8),
            vec![10, 11, 9, 4, 2, 7, 8, 9]
        );
    }

    #[test]
    fn the_latest_occurrence_wins_and_shorter_suffixes_are_tried() {
        let tokens = [5, 6, 1, 5, 6, 2, 3, 6];
        // No "2 3 6" or "3 6" before; "6" last occurred before 2.
        assert_eq!(propose_from_context(&tokens, 3), vec![2, 3, 6]);
    }

    #[test]
    fn an_earlier_occurrence_with_a_full_continuation_beats_a_latest_one_near_the_end() {
        // "4 4 4" last occurred just before the end (one token after it); earlier, three.
        assert_eq!(propose_from_context(&[4, 4, 4, 4, 4, 4], 3), vec![4, 4, 4]);
        assert_eq!(propose_from_context(&[1, 2, 1, 2, 1, 2, 1], 2), vec![2, 1]);
    }

    #[test]
    fn radix_drafts_come_from_the_cache_and_fall_back_to_prompt_lookup() {
        let pool = BlockPool::with_prefix_cache(8, Some(2));
        let mut earlier = pool.new_table();
        let computed = [1, 2, 3, 4, 5, 6];
        earlier.grow(3).expect("free blocks");
        earlier.publish(&computed, computed.len());
        let proposed = |tokens: &[u32]| propose(DraftMethod::Radix, tokens, 3, &pool, None);
        assert_eq!(
            proposed(&[1, 2, 3]),
            Some(Drafts::Tokens {
                tokens: vec![4, 5, 6],
                method: DraftMethod::Radix
            })
        );
        assert_eq!(
            proposed(&[9, 8, 9]),
            Some(Drafts::Tokens {
                tokens: vec![8, 9],
                method: DraftMethod::Ngram
            })
        );
        assert_eq!(
            propose(DraftMethod::Ngram, &[1, 2, 3], 3, &pool, None),
            None,
            "prompt lookup never reads the cache"
        );
        assert_eq!(
            propose(DraftMethod::Radix, &[1, 2, 3], 0, &pool, None),
            None
        );
    }

    #[test]
    fn the_draft_model_is_asked_for_every_draft_the_room_allows_whatever_the_text() {
        let pool = BlockPool::with_prefix_cache(8, None);
        let drafts = propose(DraftMethod::Model, &[1, 2, 3, 4], 3, &pool, None);
        assert_eq!(drafts, Some(Drafts::FromModel(3)));
        let drafts = drafts.expect("three drafts");
        assert_eq!((drafts.count(), drafts.method()), (3, DraftMethod::Model));
        assert_eq!(
            propose(DraftMethod::Model, &[1, 2, 3, 4], 0, &pool, None),
            None
        );
    }

    #[test]
    fn methods_parse_from_their_labels_and_unknown_ones_are_refused() {
        for method in DraftMethod::ALL {
            assert_eq!(method.label().parse::<DraftMethod>(), Ok(method));
        }
        assert_eq!("draft".parse::<DraftMethod>(), Ok(DraftMethod::Model));
        let error = "eagle".parse::<DraftMethod>().expect_err("not a method");
        assert!(error.contains("ngram, radix or draft"), "{error}");
    }

    #[test]
    fn nothing_is_proposed_for_new_text_or_when_drafting_is_off() {
        assert!(propose_from_context(&[1, 2, 3, 4], 4).is_empty());
        assert!(propose_from_context(&[1, 2, 1, 2], 0).is_empty());
        assert!(propose_from_context(&[1], 4).is_empty());
    }
}
