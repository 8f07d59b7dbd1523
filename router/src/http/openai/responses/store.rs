//! The responses `/v1/responses` keeps for `previous_response_id`, `GET` and `DELETE`: in the
//! router's memory, bounded by entries and by bytes, the oldest evicted first. It records its
//! own series (`tandem_responses_stored`, `tandem_responses_stored_bytes`,
//! `tandem_responses_evicted_total`).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};

use metrics::{counter, describe_counter, describe_gauge, gauge};
use serde_json::Value;

use crate::http::middleware::api_keys::KeyId;
use crate::validation::{ChatMessage, ImageData};

/// How much the store may keep (`--responses-store-max-entries`, `--responses-store-max-bytes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::Args)]
pub struct ResponseStoreLimits {
    /// Most responses kept for `previous_response_id`, `GET` and `DELETE /v1/responses/{id}`;
    /// past it the oldest is evicted. 0 keeps none.
    #[arg(
        long = "responses-store-max-entries",
        env = "RESPONSES_STORE_MAX_ENTRIES",
        default_value_t = 1024
    )]
    pub max_entries: usize,
    /// Most bytes the kept responses may take (each response's JSON plus its conversation's
    /// text); past it the oldest are evicted. A larger response is not kept.
    #[arg(
        long = "responses-store-max-bytes",
        env = "RESPONSES_STORE_MAX_BYTES",
        default_value_t = 64 << 20
    )]
    pub max_bytes: usize,
}

impl Default for ResponseStoreLimits {
    fn default() -> Self {
        Self {
            max_entries: 1024,
            max_bytes: 64 << 20,
        }
    }
}

/// One kept response.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredResponse {
    /// The response object as it was answered.
    pub body: Value,
    /// The conversation the response ends: every earlier input item and output, then its own,
    /// as chat messages. Instructions are not part of it: they do not carry over.
    pub conversation: Vec<ChatMessage>,
    /// The API key that created the response, alone able to read, delete or continue it;
    /// `None` when no keys are configured.
    pub owner: Option<KeyId>,
}

impl StoredResponse {
    /// What the entry counts against `max_bytes`.
    pub fn bytes(&self) -> usize {
        let body = serde_json::to_vec(&self.body).map_or(0, |json| json.len());
        let conversation: usize = self
            .conversation
            .iter()
            .map(|message| {
                message.role.len()
                    + message.content.len()
                    + message.name.as_ref().map_or(0, String::len)
                    + message.tool_call_id.as_ref().map_or(0, String::len)
                    + message.images().map(ImageData::held_bytes).sum::<usize>()
            })
            .sum();
        body + conversation
    }
}

/// Entries by id, and the ids from oldest to newest.
#[derive(Debug, Default)]
struct Entries {
    by_id: HashMap<String, (Arc<StoredResponse>, usize)>,
    /// Invariant: holds exactly the ids of `by_id`, oldest first.
    order: VecDeque<String>,
    /// Invariant: the sum of the sizes in `by_id`.
    bytes: usize,
}

impl Entries {
    fn remove(&mut self, id: &str) -> Option<Arc<StoredResponse>> {
        let (stored, bytes) = self.by_id.remove(id)?;
        self.bytes -= bytes;
        self.order.retain(|kept| kept != id);
        Some(stored)
    }

    fn evict_oldest(&mut self) -> bool {
        match self.order.pop_front() {
            Some(oldest) => {
                if let Some((_, bytes)) = self.by_id.remove(&oldest) {
                    self.bytes -= bytes;
                }
                true
            }
            None => false,
        }
    }
}

/// The store every `/v1/responses` request shares.
#[derive(Debug)]
pub struct ResponseStore {
    limits: ResponseStoreLimits,
    entries: Mutex<Entries>,
}

impl ResponseStore {
    /// An empty store; its series start at 0.
    pub fn new(limits: ResponseStoreLimits) -> Self {
        describe_gauge!("tandem_responses_stored", "Responses kept by /v1/responses");
        describe_gauge!(
            "tandem_responses_stored_bytes",
            "Bytes the kept responses count against --responses-store-max-bytes"
        );
        describe_counter!(
            "tandem_responses_evicted_total",
            "Kept responses evicted, oldest first, to make room for newer ones"
        );
        counter!("tandem_responses_evicted_total").absolute(0);
        Self::record(&Entries::default());
        Self {
            limits,
            entries: Mutex::default(),
        }
    }

    #[allow(clippy::cast_precision_loss)]
    fn record(entries: &Entries) {
        gauge!("tandem_responses_stored").set(entries.by_id.len() as f64);
        gauge!("tandem_responses_stored_bytes").set(entries.bytes as f64);
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, Entries> {
        // Every update leaves the entries consistent, so a panic elsewhere poisons nothing.
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Keeps `stored` under `id`, evicting the oldest entries until it fits; the ids evicted.
    /// A response larger than the whole store (or any response when it keeps none) is not
    /// kept: `Err` with its size.
    pub fn insert(&self, id: String, stored: StoredResponse) -> Result<Vec<String>, usize> {
        let bytes = stored.bytes();
        if self.limits.max_entries == 0 || bytes > self.limits.max_bytes {
            return Err(bytes);
        }
        let mut entries = self.entries();
        let mut evicted = Vec::new();
        while entries.by_id.len() >= self.limits.max_entries
            || entries.bytes + bytes > self.limits.max_bytes
        {
            let oldest = entries.order.front().cloned();
            if !entries.evict_oldest() {
                break;
            }
            evicted.extend(oldest);
        }
        entries.bytes += bytes;
        entries.order.push_back(id.clone());
        entries.by_id.insert(id, (Arc::new(stored), bytes));
        Self::record(&entries);
        counter!("tandem_responses_evicted_total").increment(evicted.len() as u64);
        Ok(evicted)
    }

    /// The response kept under `id` for `owner`; another owner's response is as absent as one
    /// never kept.
    pub fn get(&self, id: &str, owner: Option<KeyId>) -> Option<Arc<StoredResponse>> {
        self.entries()
            .by_id
            .get(id)
            .filter(|(stored, _)| stored.owner == owner)
            .map(|(stored, _)| Arc::clone(stored))
    }

    /// Forgets the response kept under `id` for `owner`; whether there was one. Another
    /// owner's response stays.
    pub fn remove(&self, id: &str, owner: Option<KeyId>) -> bool {
        let mut entries = self.entries();
        let owned = entries
            .by_id
            .get(id)
            .is_some_and(|(stored, _)| stored.owner == owner);
        let removed = owned && entries.remove(id).is_some();
        Self::record(&entries);
        removed
    }

    /// Responses kept and the bytes they count.
    #[cfg(test)]
    pub fn usage(&self) -> (usize, usize) {
        let entries = self.entries();
        (entries.by_id.len(), entries.bytes)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn stored(text: &str) -> StoredResponse {
        StoredResponse {
            body: json!({"text": text}),
            conversation: vec![ChatMessage::new("user", text)],
            owner: None,
        }
    }

    fn store(max_entries: usize, max_bytes: usize) -> ResponseStore {
        ResponseStore::new(ResponseStoreLimits {
            max_entries,
            max_bytes,
        })
    }

    #[test]
    fn an_entry_counts_its_json_and_its_conversation_text() {
        let entry = StoredResponse {
            body: json!({"a": 1}),
            conversation: vec![ChatMessage {
                tool_call_id: Some("call_1".into()),
                ..ChatMessage::new("tool", "sunny")
            }],
            owner: None,
        };
        assert_eq!(
            entry.bytes(),
            r#"{"a":1}"#.len() + "tool".len() + "sunny".len() + 6
        );
    }

    #[test]
    fn past_max_entries_the_oldest_is_evicted_first() {
        let store = store(2, 1 << 20);
        assert_eq!(store.insert("a".into(), stored("1")), Ok(vec![]));
        assert_eq!(store.insert("b".into(), stored("2")), Ok(vec![]));
        assert_eq!(store.insert("c".into(), stored("3")), Ok(vec!["a".into()]));
        assert!(store.get("a", None).is_none());
        assert_eq!(store.get("b", None).unwrap().conversation[0].content, "2");
        assert_eq!(store.usage().0, 2);
    }

    #[test]
    fn past_max_bytes_as_many_oldest_as_needed_are_evicted() {
        let size = stored("xxxx").bytes();
        let store = store(10, size * 3);
        for id in ["a", "b", "c"] {
            store.insert(id.into(), stored("xxxx")).unwrap();
        }
        assert_eq!(store.usage(), (3, size * 3));
        let big = stored(&"y".repeat(10));
        let evicted = store.insert("d".into(), big.clone()).unwrap();
        assert_eq!(evicted, ["a", "b"]);
        assert_eq!(store.usage(), (2, size + big.bytes()));
        assert!(store.get("c", None).is_some() && store.get("d", None).is_some());
    }

    #[test]
    fn a_response_larger_than_the_store_is_not_kept_and_evicts_nothing() {
        let store = store(10, 100);
        store.insert("a".into(), stored("small")).unwrap();
        let huge = stored(&"z".repeat(200));
        assert_eq!(store.insert("b".into(), huge.clone()), Err(huge.bytes()));
        assert!(store.get("a", None).is_some() && store.get("b", None).is_none());
        let none = self::store(0, 100);
        assert!(none.insert("a".into(), stored("x")).is_err());
        assert_eq!(none.usage(), (0, 0));
    }

    #[test]
    fn removing_frees_its_bytes_and_its_place_in_the_eviction_order() {
        let store = store(2, 1 << 20);
        store.insert("a".into(), stored("1")).unwrap();
        store.insert("b".into(), stored("2")).unwrap();
        assert!(store.remove("a", None));
        assert!(!store.remove("a", None));
        assert_eq!(store.usage(), (1, stored("2").bytes()));
        assert_eq!(store.insert("c".into(), stored("3")), Ok(vec![]));
        assert_eq!(store.insert("d".into(), stored("4")), Ok(vec!["b".into()]));
    }

    #[test]
    fn another_owners_response_is_neither_read_nor_removed() {
        let store = store(2, 1 << 20);
        let (first, second) = (KeyId::of(b"sk-first"), KeyId::of(b"sk-second"));
        let owned = StoredResponse {
            owner: Some(first),
            ..stored("mine")
        };
        store.insert("a".into(), owned).unwrap();
        assert!(store.get("a", Some(second)).is_none());
        assert!(store.get("a", None).is_none());
        assert!(!store.remove("a", Some(second)));
        assert_eq!(store.usage().0, 1);
        assert!(store.get("a", Some(first)).is_some());
        assert!(store.remove("a", Some(first)));
    }
}
