//! Load shedding: two limits, checked together in one step once a request is validated (its
//! prompt tokenized, so its size is known) and before anything is queued, so the queue is never
//! unbounded and a refused request costs nothing but its validation:
//!
//! - requests: every admitted request that has not finished (queued or running, streams
//!   included) holds one permit; each `n` choice and each `best_of` candidate counts as one;
//! - queued tokens: every admitted request that has not produced its first token yet (waiting
//!   in the scheduler's queue or in prefill) reserves its prompt tokens plus its
//!   `max_new_tokens`; the reservation is released with its first token.
//!
//! Beyond either limit the request is answered 429 at once. Health probes never pass through
//! here.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::AppError;

/// The limits and what is held against them. Cloning shares the counters.
#[derive(Debug, Clone)]
pub struct LoadShedder {
    requests: Arc<Semaphore>,
    max_requests: usize,
    queued_tokens: Arc<AtomicUsize>,
    max_queued_tokens: Option<usize>,
}

/// Tokens reserved by one request until its first token; released on drop.
#[derive(Debug)]
pub struct TokenReservation {
    queued_tokens: Arc<AtomicUsize>,
    tokens: usize,
}

/// What one admitted request holds: a permit until it ends, its queued tokens until its first
/// token.
#[derive(Debug)]
pub struct AdmissionTicket {
    _permit: OwnedSemaphorePermit,
    queued: Option<TokenReservation>,
}

impl AdmissionTicket {
    /// The request produced a token (or failed): it no longer waits in the queue.
    pub fn leave_queue(&mut self) {
        self.queued = None;
    }
}

impl Drop for TokenReservation {
    fn drop(&mut self) {
        self.queued_tokens.fetch_sub(self.tokens, Ordering::SeqCst);
    }
}

impl LoadShedder {
    /// At most `max_requests` requests in flight and, when set, `max_queued_tokens` tokens
    /// reserved by requests waiting for their first token.
    pub fn new(max_requests: usize, max_queued_tokens: Option<usize>) -> Self {
        Self {
            requests: Arc::new(Semaphore::new(max_requests)),
            max_requests,
            queued_tokens: Arc::new(AtomicUsize::new(0)),
            max_queued_tokens,
        }
    }

    /// Admits `count` requests of `tokens` queued tokens each, or refuses them all: `Overloaded`
    /// or `QueueFull`, with nothing held.
    pub fn admit(&self, count: usize, tokens: usize) -> Result<Vec<AdmissionTicket>, AppError> {
        let permits = self.admit_requests(count)?;
        let reservations = self.reserve_tokens(tokens, count)?;
        Ok(permits
            .into_iter()
            .zip(reservations)
            .map(|(permit, queued)| AdmissionTicket {
                _permit: permit,
                queued: Some(queued),
            })
            .collect())
    }

    /// One permit per request of `count`, or `Overloaded` with none taken.
    pub fn admit_requests(&self, count: usize) -> Result<Vec<OwnedSemaphorePermit>, AppError> {
        if count == 0 {
            return Ok(Vec::new());
        }
        let count_u32 =
            u32::try_from(count).map_err(|_| AppError::Overloaded(self.max_requests))?;
        let mut permits = Arc::clone(&self.requests)
            .try_acquire_many_owned(count_u32)
            .map_err(|_| AppError::Overloaded(self.max_requests))?;
        let mut split = Vec::with_capacity(count);
        for _ in 1..count {
            if let Some(one) = permits.split(1) {
                split.push(one);
            }
        }
        split.push(permits);
        Ok(split)
    }

    /// Reserves `tokens` for each of `count` requests, or `QueueFull` with nothing reserved.
    fn reserve_tokens(
        &self,
        tokens: usize,
        count: usize,
    ) -> Result<Vec<TokenReservation>, AppError> {
        let total = tokens.saturating_mul(count);
        if let Some(limit) = self.max_queued_tokens {
            self.queued_tokens
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |queued| {
                    queued.checked_add(total).filter(|sum| *sum <= limit)
                })
                .map_err(|queued| AppError::QueueFull {
                    needed: total,
                    queued,
                    limit,
                })?;
        } else {
            self.queued_tokens.fetch_add(total, Ordering::SeqCst);
        }
        Ok((0..count)
            .map(|_| TokenReservation {
                queued_tokens: Arc::clone(&self.queued_tokens),
                tokens,
            })
            .collect())
    }

    /// Requests admitted and not finished.
    pub fn requests_in_flight(&self) -> usize {
        self.max_requests
            .saturating_sub(self.requests.available_permits())
    }

    /// Tokens reserved by requests still waiting for their first token.
    #[cfg(test)]
    pub fn queued_tokens(&self) -> usize {
        self.queued_tokens.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn siblings_take_one_permit_each_or_none_at_all() {
        let shedder = LoadShedder::new(3, None);
        let two = shedder.admit_requests(2).unwrap();
        assert_eq!(two.len(), 2);
        assert_eq!(shedder.requests_in_flight(), 2);
        assert!(matches!(
            shedder.admit_requests(2),
            Err(AppError::Overloaded(3))
        ));
        assert_eq!(shedder.requests_in_flight(), 2, "a refusal takes nothing");
        drop(two);
        assert_eq!(shedder.requests_in_flight(), 0);
    }

    #[test]
    fn queued_tokens_are_bounded_and_released_on_drop() {
        let shedder = LoadShedder::new(8, Some(100));
        let first = shedder.reserve_tokens(30, 2).unwrap();
        assert_eq!(shedder.queued_tokens(), 60);
        match shedder.reserve_tokens(41, 1) {
            Err(AppError::QueueFull {
                needed: 41,
                queued: 60,
                limit: 100,
            }) => {}
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(shedder.queued_tokens(), 60, "a refusal reserves nothing");
        let fits = shedder.reserve_tokens(40, 1).unwrap();
        drop(first);
        assert_eq!(shedder.queued_tokens(), 40);
        drop(fits);
        assert_eq!(shedder.queued_tokens(), 0);
    }

    #[test]
    fn a_request_whose_tokens_do_not_fit_holds_no_permit_either() {
        let shedder = LoadShedder::new(4, Some(100));
        assert!(matches!(
            shedder.admit(2, 60),
            Err(AppError::QueueFull { needed: 120, .. })
        ));
        assert_eq!(shedder.requests_in_flight(), 0);
        assert_eq!(shedder.queued_tokens(), 0);
        let mut tickets = shedder.admit(2, 50).unwrap();
        assert_eq!(
            (shedder.requests_in_flight(), shedder.queued_tokens()),
            (2, 100)
        );
        tickets[0].leave_queue();
        assert_eq!(
            (shedder.requests_in_flight(), shedder.queued_tokens()),
            (2, 50)
        );
        drop(tickets);
        assert_eq!(
            (shedder.requests_in_flight(), shedder.queued_tokens()),
            (0, 0)
        );
    }

    #[test]
    fn without_a_token_limit_tokens_are_only_counted() {
        let shedder = LoadShedder::new(1, None);
        let held = shedder.reserve_tokens(usize::MAX / 2, 1).unwrap();
        assert_eq!(shedder.queued_tokens(), usize::MAX / 2);
        drop(held);
        assert_eq!(shedder.queued_tokens(), 0);
    }
}
