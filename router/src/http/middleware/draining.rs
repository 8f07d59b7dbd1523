//! Draining: the flag SIGTERM sets so new inference requests are refused while in-flight
//! ones finish.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Set once on SIGTERM/SIGINT; never cleared. Cloning shares the flag.
#[derive(Debug, Clone, Default)]
pub struct Draining(Arc<AtomicBool>);

impl Draining {
    /// From now on new inference requests get 503 and `/ready` turns 503.
    pub fn start(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    pub fn is_set(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}
