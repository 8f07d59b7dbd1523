//! Which LoRA adapter a request runs under: OpenAI routes name it as their `model`, TGI's
//! routes as `parameters.adapter_id`.

use std::sync::{Arc, RwLock, RwLockReadGuard};

use super::error::ValidationError;
use crate::kv::AdapterKey;

/// How a request names the model or adapter it wants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdapterChoice {
    /// An OpenAI-style `model`: the base model's id or an adapter's name.
    Model(String),
    /// TGI's `adapter_id`: an adapter's name (empty: the base model).
    AdapterId(String),
    /// Anthropic's and the Responses API's `model`: an adapter when it names one, else the base model
    /// (their clients send model names of their own).
    ModelIfAdapter(String),
}

/// The LoRA adapters the shards hold, by name, in the order they were loaded. Clones share one
/// set, which loads and unloads at run time change. Ids count up from 1 and are never reused, so
/// an adapter loaded again under an old name never meets the blocks its predecessor computed, and
/// none collides with the base model's cache namespace (no adapter).
#[derive(Debug, Clone, Default)]
pub struct LoraAdapters {
    base_model: Arc<str>,
    set: Arc<RwLock<AdapterSet>>,
}

#[derive(Debug, Default)]
struct AdapterSet {
    adapters: Vec<AdapterKey>,
    last_id: u32,
}

impl LoraAdapters {
    pub fn new(base_model: &str, names: impl IntoIterator<Item = String>) -> Self {
        let adapters = Self {
            base_model: Arc::from(base_model),
            set: Arc::default(),
        };
        for name in names {
            adapters.add(&name);
        }
        adapters
    }

    fn read(&self) -> RwLockReadGuard<'_, AdapterSet> {
        // Every critical section leaves the set whole, so a poisoned lock is still valid.
        self.set
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Adds `name` under a new id; `None` when it is taken.
    pub fn add(&self, name: &str) -> Option<AdapterKey> {
        let mut set = self
            .set
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if set.adapters.iter().any(|adapter| *adapter.name == *name) {
            return None;
        }
        set.last_id += 1;
        let key = AdapterKey {
            id: set.last_id,
            name: Arc::from(name),
        };
        set.adapters.push(key.clone());
        Some(key)
    }

    /// Removes `name`: requests can no longer select it. `None` when it is not in the set.
    pub fn remove(&self, name: &str) -> Option<AdapterKey> {
        let mut set = self
            .set
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let index = set
            .adapters
            .iter()
            .position(|adapter| *adapter.name == *name)?;
        Some(set.adapters.remove(index))
    }

    /// Puts back an adapter `remove` took out, under its old id.
    pub fn restore(&self, key: AdapterKey) {
        let mut set = self
            .set
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if !set.adapters.iter().any(|adapter| adapter.name == key.name) {
            set.adapters.push(key);
        }
    }

    pub fn names(&self) -> Vec<String> {
        self.read()
            .adapters
            .iter()
            .map(|adapter| adapter.name.to_string())
            .collect()
    }

    /// The adapter `choice` selects: `None` for the base model. Without adapters any `model`
    /// selects the base model, as before; with some, `model` must name the base model or one
    /// of them. An `adapter_id` must name a loaded adapter.
    pub fn select(
        &self,
        choice: Option<&AdapterChoice>,
    ) -> Result<Option<AdapterKey>, ValidationError> {
        let (param, name) = match choice {
            None => return Ok(None),
            Some(AdapterChoice::ModelIfAdapter(name)) => return Ok(self.find(name)),
            Some(AdapterChoice::AdapterId(name)) if name.is_empty() => return Ok(None),
            Some(AdapterChoice::Model(name))
                if self.read().adapters.is_empty() || **name == *self.base_model =>
            {
                return Ok(None)
            }
            Some(AdapterChoice::Model(name)) => ("model", name),
            Some(AdapterChoice::AdapterId(name)) => ("adapter_id", name),
        };
        self.find(name)
            .map(Some)
            .ok_or_else(|| self.unknown(param, name))
    }

    fn find(&self, name: &str) -> Option<AdapterKey> {
        self.read()
            .adapters
            .iter()
            .find(|adapter| *adapter.name == *name)
            .cloned()
    }

    /// The name answers report as their `model`: the adapter `choice` names when it is one, else
    /// `base`.
    pub fn answering(&self, choice: Option<&AdapterChoice>, base: &str) -> String {
        match choice {
            Some(
                AdapterChoice::Model(name)
                | AdapterChoice::AdapterId(name)
                | AdapterChoice::ModelIfAdapter(name),
            ) if self.names().contains(name) => name.clone(),
            _ => base.to_owned(),
        }
    }

    fn unknown(&self, param: &'static str, name: &str) -> ValidationError {
        let mut served: Vec<String> = Vec::new();
        if param == "model" {
            served.push(self.base_model.to_string());
        }
        served.extend(self.names());
        ValidationError::UnknownAdapter {
            param,
            name: name.chars().take(MAX_ECHOED_CHARS).collect(),
            served: if served.is_empty() {
                "none (no LoRA adapters are loaded)".to_owned()
            } else {
                served.join(", ")
            },
        }
    }
}

/// A name echoed in an error message is cut to this many characters.
const MAX_ECHOED_CHARS: usize = 128;

#[cfg(test)]
mod tests {
    use super::*;

    fn adapters() -> LoraAdapters {
        LoraAdapters::new("org/base", ["sql".to_owned(), "chat".to_owned()])
    }

    fn model(name: &str) -> Option<AdapterChoice> {
        Some(AdapterChoice::Model(name.to_owned()))
    }

    fn adapter_id(name: &str) -> Option<AdapterChoice> {
        Some(AdapterChoice::AdapterId(name.to_owned()))
    }

    #[test]
    fn model_and_adapter_id_select_an_adapter_by_name() {
        let adapters = adapters();
        let chat = adapters.select(model("chat").as_ref()).expect("loaded");
        assert_eq!(
            chat.map(|key| (key.id, key.name.to_string())),
            Some((2, "chat".to_owned()))
        );
        let sql = adapters.select(adapter_id("sql").as_ref()).expect("loaded");
        assert_eq!(sql.map(|key| key.id), Some(1));
        assert_eq!(
            adapters.answering(model("chat").as_ref(), "org/base"),
            "chat"
        );
        assert_eq!(
            adapters.answering(model("other").as_ref(), "org/base"),
            "org/base"
        );
        for base in [None, model("org/base"), adapter_id("")] {
            assert_eq!(
                adapters.select(base.as_ref()).expect("the base model"),
                None
            );
        }
    }

    #[test]
    fn an_anthropic_or_responses_model_selects_an_adapter_only_when_it_names_one() {
        let adapters = adapters();
        let lenient = |name: &str| Some(AdapterChoice::ModelIfAdapter(name.to_owned()));
        let chat = adapters
            .select(lenient("chat").as_ref())
            .expect("never refused");
        assert_eq!(chat.map(|key| key.id), Some(2));
        assert_eq!(
            adapters
                .select(lenient("claude-sonnet-4").as_ref())
                .expect("never refused"),
            None
        );
        assert_eq!(
            adapters.answering(lenient("chat").as_ref(), "org/base"),
            "chat"
        );
    }

    #[test]
    fn an_unknown_name_is_refused_naming_what_is_served() {
        let adapters = adapters();
        let error = adapters.select(model("sq1").as_ref()).expect_err("unknown");
        assert_eq!(
            error.to_string(),
            "`model` is `sq1`, which this server does not serve; it serves org/base, sql, chat"
        );
        let error = adapters
            .select(adapter_id("org/base").as_ref())
            .expect_err("not an adapter");
        assert_eq!(
            error.to_string(),
            "`adapter_id` is `org/base`, which this server does not serve; it serves sql, chat"
        );
    }

    #[test]
    fn an_adapter_loaded_again_gets_a_new_id_and_a_taken_name_is_refused() {
        let adapters = adapters();
        assert!(adapters.add("sql").is_none(), "the name is taken");
        let old = adapters.remove("sql").expect("loaded");
        assert_eq!(
            adapters
                .select(model("sql").as_ref())
                .map_err(|e| e.param().map(str::to_owned)),
            Err(Some("model".to_owned()))
        );
        let new = adapters.add("sql").expect("free again");
        assert_eq!((old.id, new.id), (1, 3));
        assert_eq!(adapters.names(), ["chat", "sql"]);
    }

    #[test]
    fn without_adapters_any_model_is_the_base_model_and_no_adapter_id_is_accepted() {
        let none = LoraAdapters::new("org/base", []);
        assert_eq!(
            none.select(model("gpt-4o").as_ref()).expect("as before"),
            None
        );
        let error = none
            .select(adapter_id("sql").as_ref())
            .expect_err("nothing loaded");
        assert!(
            error
                .to_string()
                .ends_with("none (no LoRA adapters are loaded)"),
            "{error}"
        );
    }
}
