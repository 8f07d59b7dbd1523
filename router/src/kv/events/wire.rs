//! The msgpack payload of one published batch, byte for byte as vLLM's msgspec structs
//! (`array_like=True`, `omit_defaults=True`, `tag=True`) encode a `KVEventBatch`:
//!
//! - batch: `[ts, [event...], data_parallel_rank]`
//! - `["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, lora_name]`,
//!   for a model with recurrent state followed by `extra_keys, group_idx, kv_cache_spec_kind`
//! - `["BlockRemoved", block_hashes, medium]`, for such a model followed by `group_idx,
//!   kv_cache_spec_kind`
//! - `["AllBlocksCleared"]`
//!
//! Fields with a default that holds their value are omitted at the end, as msgspec does.

use rmp::encode::{self, RmpWrite, ValueWriteError};

use super::block_hash::external;
use super::event_log::{CacheGroup, KvEvent};
use crate::kv::offload::Medium;

/// Tandem runs one scheduler per replica: data-parallel rank 0.
const DATA_PARALLEL_RANK: u64 = 0;

type WriteError = ValueWriteError<<Vec<u8> as RmpWrite>::Error>;

/// Encodes `events` as one batch stamped `ts` (seconds since the Unix epoch).
pub(crate) fn encode_batch(ts: f64, events: &[KvEvent]) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + events.len() * 32);
    write_batch(&mut out, ts, events).expect("invariant: writing to a Vec cannot fail");
    out
}

fn write_batch(out: &mut Vec<u8>, ts: f64, events: &[KvEvent]) -> Result<(), WriteError> {
    encode::write_array_len(out, 3)?;
    encode::write_f64(out, ts)?;
    encode::write_array_len(out, len32(events.len()))?;
    for event in events {
        write_event(out, event)?;
    }
    encode::write_uint(out, DATA_PARALLEL_RANK)?;
    Ok(())
}

fn write_event(out: &mut Vec<u8>, event: &KvEvent) -> Result<(), WriteError> {
    match event {
        KvEvent::TierStored { medium, block } => {
            let stored = KvEvent::BlockStored {
                block_hashes: vec![external(&block.digest)],
                parent_block_hash: block.parent.as_ref().map(external),
                token_ids: block.tokens.clone(),
                block_size: block.tokens.len(),
                lora: block.lora.clone(),
                group: None,
            };
            write_event_in(out, &stored, *medium)
        }
        KvEvent::TierRemoved { medium, digest } => {
            let removed = KvEvent::BlockRemoved {
                block_hashes: vec![external(digest)],
                group: None,
            };
            write_event_in(out, &removed, *medium)
        }
        _ => write_event_in(out, event, Medium::Device),
    }
}

/// Writes a KV-cache event as held in `medium`.
fn write_event_in(out: &mut Vec<u8>, event: &KvEvent, medium: Medium) -> Result<(), WriteError> {
    match event {
        KvEvent::BlockStored {
            block_hashes,
            parent_block_hash,
            token_ids,
            block_size,
            lora,
            group,
        } => {
            encode::write_array_len(out, if group.is_some() { 11 } else { 8 })?;
            encode::write_str(out, "BlockStored")?;
            write_hashes(out, block_hashes)?;
            match parent_block_hash {
                Some(parent) => encode::write_uint(out, *parent).map(drop)?,
                None => write_nil(out)?,
            }
            encode::write_array_len(out, len32(token_ids.len()))?;
            for &token in token_ids {
                encode::write_uint(out, u64::from(token))?;
            }
            encode::write_uint(out, *block_size as u64)?;
            match lora {
                Some(adapter) => encode::write_uint(out, u64::from(adapter.id)).map(drop)?,
                None => write_nil(out)?,
            }
            encode::write_str(out, medium.label())?;
            match lora {
                Some(adapter) => encode::write_str(out, &adapter.name)?,
                None => write_nil(out)?,
            }
            if let Some(group) = group {
                // No extra keys, then the group.
                write_nil(out)?;
                write_group(out, *group)?;
            }
        }
        KvEvent::BlockRemoved {
            block_hashes,
            group,
        } => {
            encode::write_array_len(out, if group.is_some() { 5 } else { 3 })?;
            encode::write_str(out, "BlockRemoved")?;
            write_hashes(out, block_hashes)?;
            encode::write_str(out, medium.label())?;
            if let Some(group) = group {
                write_group(out, *group)?;
            }
        }
        KvEvent::AllBlocksCleared => {
            encode::write_array_len(out, 1)?;
            encode::write_str(out, "AllBlocksCleared")?;
        }
        KvEvent::TierStored { .. } | KvEvent::TierRemoved { .. } => {
            unreachable!("invariant: write_event writes tier events as block events")
        }
    }
    Ok(())
}

fn write_group(out: &mut Vec<u8>, group: CacheGroup) -> Result<(), WriteError> {
    encode::write_uint(out, group.index())?;
    encode::write_str(out, group.kind())
}

fn write_hashes(out: &mut Vec<u8>, hashes: &[u64]) -> Result<(), WriteError> {
    encode::write_array_len(out, len32(hashes.len()))?;
    for &hash in hashes {
        encode::write_uint(out, hash)?;
    }
    Ok(())
}

fn write_nil(out: &mut Vec<u8>) -> Result<(), WriteError> {
    encode::write_nil(out).map_err(ValueWriteError::InvalidMarkerWrite)
}

fn len32(len: usize) -> u32 {
    u32::try_from(len).expect("invariant: a batch holds fewer than 2^32 items")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_encodes_as_msgspec_array_like_tagged_structs() {
        let events = [
            KvEvent::BlockStored {
                lora: None,
                block_hashes: vec![1, 0xffff_ffff_ffff_ffff],
                parent_block_hash: None,
                token_ids: vec![7, 300],
                block_size: 1,
                group: None,
            },
            KvEvent::BlockRemoved {
                block_hashes: vec![2],
                group: None,
            },
            KvEvent::AllBlocksCleared,
        ];
        let encoded = encode_batch(1.5, &events);
        let mut expected = vec![0x93, 0xcb];
        expected.extend_from_slice(&1.5f64.to_be_bytes());
        expected.push(0x93);
        expected.extend_from_slice(&[0x98, 0xab]);
        expected.extend_from_slice(b"BlockStored");
        expected.extend_from_slice(&[0x92, 0x01, 0xcf]);
        expected.extend_from_slice(&[0xff; 8]);
        expected.extend_from_slice(&[0xc0, 0x92, 0x07, 0xcd, 0x01, 0x2c, 0x01, 0xc0, 0xa3]);
        expected.extend_from_slice(b"GPU");
        expected.push(0xc0);
        expected.extend_from_slice(&[0x93, 0xac]);
        expected.extend_from_slice(b"BlockRemoved");
        expected.extend_from_slice(&[0x91, 0x02, 0xa3]);
        expected.extend_from_slice(b"GPU");
        expected.extend_from_slice(&[0x91, 0xb0]);
        expected.extend_from_slice(b"AllBlocksCleared");
        expected.push(0x00);
        assert_eq!(encoded, expected);
    }

    #[test]
    fn a_lora_blocks_stored_event_names_the_adapters_id_and_name() {
        let events = [KvEvent::BlockStored {
            lora: Some(crate::kv::AdapterKey {
                id: 3,
                name: "sql".into(),
            }),
            block_hashes: vec![1],
            parent_block_hash: None,
            token_ids: vec![7],
            block_size: 1,
            group: None,
        }];
        let encoded = encode_batch(0.0, &events);
        let mut expected = vec![0x93, 0xcb];
        expected.extend_from_slice(&0.0f64.to_be_bytes());
        expected.push(0x91);
        expected.extend_from_slice(&[0x98, 0xab]);
        expected.extend_from_slice(b"BlockStored");
        expected.extend_from_slice(&[0x91, 0x01, 0xc0, 0x91, 0x07, 0x01, 0x03, 0xa3]);
        expected.extend_from_slice(b"GPU");
        expected.push(0xa3);
        expected.extend_from_slice(b"sql");
        expected.push(0x00);
        assert_eq!(encoded, expected);
    }

    #[test]
    fn a_hybrids_events_name_their_cache_group_after_the_lora_name() {
        let events = [
            KvEvent::BlockStored {
                lora: None,
                block_hashes: vec![1],
                parent_block_hash: Some(3),
                token_ids: vec![7],
                block_size: 1,
                group: Some(CacheGroup::State),
            },
            KvEvent::BlockRemoved {
                block_hashes: vec![2],
                group: Some(CacheGroup::Attention),
            },
        ];
        let encoded = encode_batch(0.0, &events);
        let mut expected = vec![0x93, 0xcb];
        expected.extend_from_slice(&0.0f64.to_be_bytes());
        expected.push(0x92);
        expected.extend_from_slice(&[0x9b, 0xab]);
        expected.extend_from_slice(b"BlockStored");
        expected.extend_from_slice(&[0x91, 0x01, 0x03, 0x91, 0x07, 0x01, 0xc0, 0xa3]);
        expected.extend_from_slice(b"GPU");
        expected.extend_from_slice(&[0xc0, 0xc0, 0x01, 0xa5]);
        expected.extend_from_slice(b"mamba");
        expected.extend_from_slice(&[0x95, 0xac]);
        expected.extend_from_slice(b"BlockRemoved");
        expected.extend_from_slice(&[0x91, 0x02, 0xa3]);
        expected.extend_from_slice(b"GPU");
        expected.extend_from_slice(&[0x00, 0xae]);
        expected.extend_from_slice(b"full_attention");
        expected.push(0x00);
        assert_eq!(encoded, expected);
    }
}
