//! When the step loop sends the next step while one runs.
//!
//! Sent at once, step N+1 is fixed while step N has barely started, so a request that
//! arrives during step N waits for N+1 to run before its own step: a whole step more than
//! with one step in flight. Sent too late, the shards idle while it is planned and carried.
//! The pacer sends it `lead` before step N is expected to end: a request arriving before
//! then joins step N+1, and the planning, the transport and the shards' preparation stay
//! hidden behind step N's forward pass.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

/// The back-to-back steps whose durations the estimate keeps.
const RECENT_STEPS: usize = 8;
/// The least time before a step's expected end at which the next one is sent: planning
/// and the transport of a step take a millisecond or two.
const MIN_LEAD: Duration = Duration::from_millis(3);
/// The lead is also at least this share of the expected step, so a misjudged end costs
/// the shards little idle time.
const LEAD_DIVISOR: u32 = 8;
/// And at least this many times the longest recent planning plus the shards' preparation.
const LEAD_OVER_PREPARATION: u32 = 2;
/// Holds shorter than this gain a new request little and are not taken: a single stream's
/// steps of a few milliseconds are sent at once, as a hold measurably slowed them.
const MIN_HOLD: Duration = Duration::from_millis(10);

/// Measures the shards' steps from the step loop's side. Owned by the step loop.
#[derive(Debug, Default)]
pub(crate) struct StepPacer {
    last_answer: Option<Instant>,
    /// Durations of recent steps that were queued at the shards before the previous one
    /// ended, oldest first: for those the time between two answers is the step itself.
    recent: VecDeque<Duration>,
    /// The router's planning plus the shards' preparation of the recent steps, oldest first.
    preparation: VecDeque<Duration>,
}

impl StepPacer {
    /// Notes an answer that arrived `at` for the step sent at `sent`, which took
    /// `preparation` to plan and for the shards to prepare.
    pub fn answered(&mut self, sent: Instant, at: Instant, preparation: Duration) {
        if let Some(previous) = self.last_answer {
            if sent <= previous {
                keep_recent(&mut self.recent, at.saturating_duration_since(previous));
            }
        }
        keep_recent(&mut self.preparation, preparation);
        self.last_answer = Some(at);
    }

    /// When to send the step after the one in flight, which was sent at `running_sent`;
    /// `None`: now. The shortest recent step is the estimate, so a wrong guess sends early
    /// (a request arriving late waits a step more) rather than idling the shards.
    pub fn send_at(&self, running_sent: Instant, now: Instant) -> Option<Instant> {
        let expected = *self.recent.iter().min()?;
        // Sent before the last answer, it started as that step ended; else once it arrived.
        let started = self
            .last_answer
            .map_or(running_sent, |answer| answer.max(running_sent));
        let preparation = self.preparation.iter().max().copied().unwrap_or_default();
        let lead = MIN_LEAD
            .max(expected / LEAD_DIVISOR)
            .max(preparation * LEAD_OVER_PREPARATION);
        let hold = expected
            .checked_sub(lead)
            .filter(|&hold| hold >= MIN_HOLD)?;
        let at = started + hold;
        (at > now).then_some(at)
    }
}

fn keep_recent(recent: &mut VecDeque<Duration>, value: Duration) {
    if recent.len() == RECENT_STEPS {
        recent.pop_front();
    }
    recent.push_back(value);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(value: u64) -> Duration {
        Duration::from_millis(value)
    }

    /// A pacer that saw `steps` back to back, each `step` long, the last answered at `end`.
    fn after_steps(start: Instant, step: Duration, steps: u32) -> StepPacer {
        let mut pacer = StepPacer::default();
        for index in 0..steps {
            // Each step was sent while the one before it ran.
            let sent = start + step * index.saturating_sub(1);
            pacer.answered(sent, start + step * (index + 1), ms(1));
        }
        pacer
    }

    #[test]
    fn without_a_measured_step_the_next_is_sent_at_once() {
        let start = Instant::now();
        let pacer = after_steps(start, ms(40), 1);
        assert_eq!(pacer.send_at(start + ms(40), start + ms(41)), None);
    }

    #[test]
    fn the_next_step_leaves_an_eighth_of_the_expected_step_as_lead() {
        let start = Instant::now();
        let pacer = after_steps(start, ms(40), 4);
        let last_answer = start + ms(160);
        // The running step was sent while the last one ran, so it started at its answer.
        let running_sent = last_answer - ms(20);
        assert_eq!(
            pacer.send_at(running_sent, last_answer + ms(1)),
            Some(last_answer + ms(35))
        );
        assert_eq!(pacer.send_at(running_sent, last_answer + ms(35)), None);
    }

    #[test]
    fn a_step_sent_after_the_last_answer_is_timed_from_its_sending() {
        let start = Instant::now();
        let pacer = after_steps(start, ms(40), 4);
        let sent = start + ms(500);
        assert_eq!(pacer.send_at(sent, sent), Some(sent + ms(35)));
    }

    #[test]
    fn short_steps_are_not_held() {
        let start = Instant::now();
        for step in [9, 12] {
            let pacer = after_steps(start, ms(step), 4);
            let last = start + ms(step) * 4;
            assert_eq!(pacer.send_at(last, last), None);
        }
    }

    #[test]
    fn the_shortest_recent_step_is_the_estimate() {
        let start = Instant::now();
        let mut pacer = after_steps(start, ms(40), 4);
        let last = start + ms(160);
        pacer.answered(last - ms(1), last + ms(20), ms(1));
        let now = last + ms(20);
        assert_eq!(pacer.send_at(now, now), Some(now + ms(17)));
    }

    #[test]
    fn a_slow_preparation_lengthens_the_lead() {
        let start = Instant::now();
        let mut pacer = after_steps(start, ms(40), 4);
        let last = start + ms(160);
        // 8 ms to plan and prepare a step: sent 16 ms ahead instead of 5.
        pacer.answered(last - ms(20), last + ms(40), ms(8));
        let now = last + ms(40);
        assert_eq!(pacer.send_at(now, now), Some(now + ms(24)));
        // 20 ms: too slow to hold a 40 ms step at all.
        pacer.answered(now - ms(20), now + ms(40), ms(20));
        let later = now + ms(40);
        assert_eq!(pacer.send_at(later, later), None);
    }

    #[test]
    fn steps_sent_after_an_answer_are_not_measured() {
        let start = Instant::now();
        let mut pacer = StepPacer::default();
        pacer.answered(start, start + ms(40), ms(1));
        // Sent after the first answer: the gap includes idle time, not only the step.
        pacer.answered(start + ms(100), start + ms(140), ms(1));
        assert_eq!(pacer.send_at(start + ms(141), start + ms(141)), None);
    }
}
