//! `/health?deep=true` as one shared probe: at most one deep probe runs at a time, its answer
//! is reused for `DEEP_HEALTH_FRESH_FOR`, and callers arriving meanwhile wait for it and share
//! it. However many clients ask, the shards run at most one extra forward pass per interval.

use std::time::Duration;

use tokio::sync::Mutex;
use tokio::time::Instant;

use crate::scheduler::{Backend, SchedulerError};

/// Deep probes that ran (the shards' extra forward passes), however many callers shared them.
pub const DEEP_PROBES_METRIC: &str = "tandem_health_deep_probes_total";

/// How long a deep probe's answer is served to later callers.
pub const DEEP_HEALTH_FRESH_FOR: Duration = Duration::from_secs(1);

/// The last deep probe's answer and when it came back.
#[derive(Debug, Default)]
pub struct DeepProbe {
    /// Held for the whole probe: callers queue here instead of starting probes of their own.
    last: Mutex<Option<(Instant, Result<(), SchedulerError>)>>,
}

impl DeepProbe {
    /// The answer of a probe that ended within `DEEP_HEALTH_FRESH_FOR`, else of a new one.
    pub async fn check(&self, backend: &dyn Backend) -> Result<(), SchedulerError> {
        let mut last = self.last.lock().await;
        if let Some((answered_at, answer)) = last.as_ref() {
            if answered_at.elapsed() < DEEP_HEALTH_FRESH_FOR {
                return answer.clone();
            }
        }
        metrics::counter!(DEEP_PROBES_METRIC).increment(1);
        let answer = backend.deep_health().await;
        *last = Some((Instant::now(), answer.clone()));
        answer
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use async_trait::async_trait;

    use super::*;
    use crate::scheduler::{GenerationRequest, GenerationStream, LoadSnapshot};

    /// Counts deep probes; each takes `probe_time` of (paused) time.
    struct CountingBackend {
        probes: AtomicUsize,
        probe_time: Duration,
    }

    #[async_trait]
    impl Backend for CountingBackend {
        fn submit(&self, _: GenerationRequest) -> Result<GenerationStream, SchedulerError> {
            Err(SchedulerError::ShuttingDown)
        }
        fn submit_siblings(
            &self,
            _: Vec<GenerationRequest>,
        ) -> Result<Vec<GenerationStream>, SchedulerError> {
            Err(SchedulerError::ShuttingDown)
        }
        fn load(&self) -> LoadSnapshot {
            LoadSnapshot::default()
        }
        async fn health(&self) -> Result<(), SchedulerError> {
            Ok(())
        }
        async fn deep_health(&self) -> Result<(), SchedulerError> {
            self.probes.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(self.probe_time).await;
            Ok(())
        }
    }

    fn backend() -> Arc<CountingBackend> {
        Arc::new(CountingBackend {
            probes: AtomicUsize::new(0),
            probe_time: Duration::from_millis(300),
        })
    }

    #[tokio::test(start_paused = true)]
    async fn concurrent_callers_share_one_probe() {
        let backend = backend();
        let probe = Arc::new(DeepProbe::default());
        let callers = (0..200).map(|_| {
            let (probe, backend) = (Arc::clone(&probe), Arc::clone(&backend));
            tokio::spawn(async move { probe.check(backend.as_ref()).await })
        });
        for answer in futures::future::join_all(callers).await {
            assert!(matches!(answer, Ok(Ok(()))));
        }
        assert_eq!(backend.probes.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_is_reused_while_fresh_then_probed_again() {
        let backend = backend();
        let probe = DeepProbe::default();
        probe.check(backend.as_ref()).await.unwrap();
        tokio::time::advance(DEEP_HEALTH_FRESH_FOR / 2).await;
        probe.check(backend.as_ref()).await.unwrap();
        assert_eq!(backend.probes.load(Ordering::SeqCst), 1);
        tokio::time::advance(DEEP_HEALTH_FRESH_FOR).await;
        probe.check(backend.as_ref()).await.unwrap();
        assert_eq!(backend.probes.load(Ordering::SeqCst), 2);
    }
}
