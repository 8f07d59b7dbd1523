//! The order in which waiting requests are admitted and running requests are served and
//! preempted (`--scheduling-policy`).

use std::fmt;
use std::str::FromStr;

/// How the scheduler orders requests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SchedulingPolicy {
    /// Arrival order: the oldest waiting request is admitted first, the newest running one is
    /// preempted first, and a preempted request waits at the head of the queue.
    #[default]
    Fcfs,
    /// A request's `priority` first (lower values first, vLLM's convention), then arrival
    /// order: waiting and running requests are kept in that order, so admission serves the
    /// most urgent first and preemption takes the least urgent.
    Priority,
    /// Weighted fair sharing between API keys (start-time fair queuing): each key's virtual
    /// time advances by the tokens served to it divided by its weight; admission serves the
    /// key with the lowest virtual time (then arrival) and preemption takes the latest request
    /// of the key with the highest. Requests without a key share one tenant.
    Fair,
}

impl SchedulingPolicy {
    pub fn label(self) -> &'static str {
        match self {
            Self::Fcfs => "fcfs",
            Self::Priority => "priority",
            Self::Fair => "fair",
        }
    }
}

impl fmt::Display for SchedulingPolicy {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(self.label())
    }
}

impl FromStr for SchedulingPolicy {
    type Err = String;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        match value {
            "fcfs" => Ok(Self::Fcfs),
            "priority" => Ok(Self::Priority),
            "fair" => Ok(Self::Fair),
            other => Err(format!(
                "unknown scheduling policy {other:?}: use fcfs, priority or fair"
            )),
        }
    }
}
