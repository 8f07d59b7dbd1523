//! Drafts for speculative decoding, proposed from the request's own tokens (prompt lookup): no
//! model runs, so a proposal costs microseconds. The shards keep a draft only where it equals the
//! token the request draws itself, so drafts change how fast tokens come, never which.

/// The longest and shortest suffix looked up in the request's earlier tokens.
const MAX_NGRAM: usize = 3;
const MIN_NGRAM: usize = 1;

/// Up to `max_drafts` tokens that followed the latest earlier occurrence of the last `n` tokens
/// of `tokens`, trying the longest `n` first; empty when no suffix occurred before.
pub fn propose_from_context(tokens: &[u32], max_drafts: usize) -> Vec<u32> {
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
    fn nothing_is_proposed_for_new_text_or_when_drafting_is_off() {
        assert!(propose_from_context(&[1, 2, 3, 4], 4).is_empty());
        assert!(propose_from_context(&[1, 2, 1, 2], 0).is_empty());
        assert!(propose_from_context(&[1], 4).is_empty());
    }
}
