//! Publishes KV-event batches the way vLLM's `ZmqEventPublisher` does: a PUB socket sends
//! `[topic, sequence (8 bytes, big-endian), msgpack batch]`; an optional ROUTER socket
//! replays kept batches to a client that sends `[empty, start sequence (8 bytes)]`, each
//! as `[empty, sequence, batch]`, then the end marker `[empty, -1 (8 bytes), empty]`.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use tracing::{info, warn};
use zeromq::{PubSocket, RouterSocket, Socket, SocketRecv, SocketSend, ZmqError, ZmqMessage};

use super::block_hash::BlockHasher;
use super::event_log::{KvEvent, KvEventLog, KvEventQueue, QUEUE_CAPACITY};
use super::wire;

/// Batches kept for replay (vLLM's default `buffer_steps`).
const REPLAY_CAPACITY: usize = 10_000;
/// The sequence number that ends a replay.
const END_OF_REPLAY: i64 = -1;

/// KV-cache events: off unless an endpoint is given. Flags named as vLLM's `--kv-events-config`
/// fields, each also read from an upper-case environment variable.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct KvEventsConfig {
    /// Publish KV-cache events (vLLM's format) on a ZMQ PUB socket bound to this endpoint,
    /// e.g. `tcp://*:5557`; off when absent.
    #[arg(long = "kv-events-endpoint", env = "KV_EVENTS_ENDPOINT")]
    pub endpoint: Option<String>,
    /// Also bind a ZMQ ROUTER socket here that replays recent batches from a sequence number,
    /// e.g. `tcp://*:5558`.
    #[arg(
        long = "kv-events-replay-endpoint",
        env = "KV_EVENTS_REPLAY_ENDPOINT",
        requires = "endpoint"
    )]
    pub replay_endpoint: Option<String>,
    /// Topic (first frame) of every published batch.
    #[arg(
        long = "kv-events-topic",
        env = "KV_EVENTS_TOPIC",
        default_value = "kv-events"
    )]
    pub topic: String,
    /// Seed of the block-hash chain: set it to the `PYTHONHASHSEED` (vLLM) or `hashSeed`
    /// (llm-d's scorer) the consumers use.
    #[arg(
        long = "kv-events-hash-seed",
        env = "KV_EVENTS_HASH_SEED",
        default_value = "0"
    )]
    pub hash_seed: String,
}

#[derive(Debug, thiserror::Error)]
pub enum PublisherError {
    #[error("cannot bind the KV events socket to {endpoint}: {source}")]
    Bind {
        endpoint: String,
        #[source]
        source: ZmqError,
    },
}

/// Binds the sockets and starts the publishing task; the log the prefix cache records into,
/// or `None` when events are off.
pub async fn start(config: &KvEventsConfig) -> Result<Option<KvEventLog>, PublisherError> {
    let Some(endpoint) = &config.endpoint else {
        return Ok(None);
    };
    let mut events = PubSocket::new();
    bind(&mut events, endpoint).await?;
    let replay = match &config.replay_endpoint {
        Some(replay_endpoint) => {
            let mut socket = RouterSocket::new();
            bind(&mut socket, replay_endpoint).await?;
            Some(socket)
        }
        None => None,
    };
    info!(
        endpoint = %endpoint,
        replay = config.replay_endpoint.as_deref().unwrap_or("off"),
        topic = %config.topic,
        "publishing KV-cache events"
    );
    let queue = KvEventQueue::new(QUEUE_CAPACITY);
    let publisher = Publisher {
        events,
        replay,
        topic: Bytes::from(config.topic.clone().into_bytes()),
        next_sequence: 0,
        kept: VecDeque::new(),
        queue: Arc::clone(&queue),
    };
    tokio::spawn(publisher.run());
    Ok(Some(KvEventLog::new(
        BlockHasher::new(&config.hash_seed),
        queue,
    )))
}

/// ZMQ's `*` wildcard host is `0.0.0.0` for the socket library.
async fn bind(socket: &mut impl Socket, endpoint: &str) -> Result<(), PublisherError> {
    let address = endpoint.replacen("tcp://*:", "tcp://0.0.0.0:", 1);
    socket
        .bind(&address)
        .await
        .map(drop)
        .map_err(|source| PublisherError::Bind {
            endpoint: endpoint.to_owned(),
            source,
        })
}

struct Publisher {
    events: PubSocket,
    replay: Option<RouterSocket>,
    topic: Bytes,
    next_sequence: u64,
    /// (sequence, payload) of the latest batches, oldest first.
    kept: VecDeque<(u64, Bytes)>,
    queue: Arc<KvEventQueue>,
}

enum Work {
    Publish(Vec<KvEvent>),
    Replay(Result<ZmqMessage, ZmqError>),
}

impl Publisher {
    async fn run(mut self) {
        loop {
            let work = tokio::select! {
                batch = self.queue.next_batch() => Work::Publish(batch),
                request = next_replay_request(self.replay.as_mut()) => Work::Replay(request),
            };
            match work {
                Work::Publish(batch) => self.publish(&batch).await,
                Work::Replay(Ok(request)) => self.serve_replay(request).await,
                Work::Replay(Err(error)) => warn!(%error, "KV events replay socket failed"),
            }
        }
    }

    async fn publish(&mut self, batch: &[KvEvent]) {
        let payload = Bytes::from(wire::encode_batch(unix_seconds(), batch));
        let sequence = self.next_sequence;
        self.next_sequence += 1;
        let frames = vec![
            self.topic.clone(),
            Bytes::copy_from_slice(&sequence.to_be_bytes()),
            payload.clone(),
        ];
        if let Err(error) = self.events.send(message(frames)).await {
            warn!(%error, sequence, "KV events batch not published");
        }
        if self.kept.len() == REPLAY_CAPACITY {
            self.kept.pop_front();
        }
        self.kept.push_back((sequence, payload));
    }

    /// Answers `[identity, empty, start]` with every kept batch from `start` on, then the end marker.
    async fn serve_replay(&mut self, request: ZmqMessage) {
        let frames = request.into_vec();
        let Some(start) = replay_start(&frames) else {
            warn!(
                frames = frames.len(),
                "malformed KV events replay request ignored"
            );
            return;
        };
        let Some(socket) = self.replay.as_mut() else {
            return;
        };
        let identity = frames[0].clone();
        let replies = self
            .kept
            .iter()
            .filter(|(sequence, _)| *sequence >= start)
            .map(|(sequence, payload)| (sequence.to_be_bytes(), payload.clone()))
            .chain([(END_OF_REPLAY.to_be_bytes(), Bytes::new())]);
        for (sequence, payload) in replies {
            let frames = vec![
                identity.clone(),
                Bytes::new(),
                Bytes::copy_from_slice(&sequence),
                payload,
            ];
            if let Err(error) = socket.send(message(frames)).await {
                warn!(%error, "KV events replay reply not sent");
                return;
            }
        }
    }
}

/// The start sequence of a replay request `[identity, empty, start (8 bytes, big-endian)]`.
fn replay_start(frames: &[Bytes]) -> Option<u64> {
    match frames {
        [_, delimiter, start] if delimiter.is_empty() => {
            Some(u64::from_be_bytes(start.as_ref().try_into().ok()?))
        }
        _ => None,
    }
}

async fn next_replay_request(replay: Option<&mut RouterSocket>) -> Result<ZmqMessage, ZmqError> {
    match replay {
        Some(socket) => socket.recv().await,
        None => std::future::pending().await,
    }
}

fn message(frames: Vec<Bytes>) -> ZmqMessage {
    ZmqMessage::try_from(frames).expect("invariant: every message has frames")
}

fn unix_seconds() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |elapsed| elapsed.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(endpoint: Option<&str>) -> KvEventsConfig {
        KvEventsConfig {
            endpoint: endpoint.map(str::to_owned),
            replay_endpoint: None,
            topic: "kv-events".to_owned(),
            hash_seed: "0".to_owned(),
        }
    }

    #[tokio::test]
    async fn events_are_off_without_an_endpoint() {
        assert!(start(&config(None))
            .await
            .expect("nothing to bind")
            .is_none());
    }

    #[tokio::test]
    async fn an_endpoint_already_in_use_fails_start_up_naming_it() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        let endpoint = format!(
            "tcp://127.0.0.1:{}",
            taken.local_addr().expect("bound").port()
        );
        let error = start(&config(Some(&endpoint)))
            .await
            .expect_err("the port is taken");
        assert!(error.to_string().contains(&endpoint), "{error}");
    }

    #[test]
    fn replay_request_is_identity_empty_delimiter_and_big_endian_start() {
        let start = Bytes::copy_from_slice(&7u64.to_be_bytes());
        let identity = Bytes::from_static(b"client");
        assert_eq!(
            replay_start(&[identity.clone(), Bytes::new(), start.clone()]),
            Some(7)
        );
        assert_eq!(replay_start(&[identity.clone(), start.clone()]), None);
        assert_eq!(
            replay_start(&[identity.clone(), Bytes::from_static(b"x"), start]),
            None
        );
        assert_eq!(
            replay_start(&[identity, Bytes::new(), Bytes::from_static(b"short")]),
            None
        );
    }
}
