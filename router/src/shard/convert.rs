//! The contract's start-up messages (`Info`, `Warmup`) as the router's own types, so the
//! generated `pb` types stop at the shard module.

use crate::pb;

/// What the shards report about the model they serve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelInfo {
    pub architecture: String,
    pub dtype: String,
    pub device: String,
    pub attention_backend: String,
    /// How the GEMM weights are stored, by role; empty when the shard did not say.
    pub weights_format: String,
    /// Bytes one rank's weights take; 0 when the shard did not say.
    pub weight_bytes: u64,
    /// Rows of the model's embedding; 0 when the shard did not say.
    pub vocab_size: usize,
    /// Positions the model holds; 0 when the shard did not say.
    pub max_position_embeddings: usize,
    pub eos_token_ids: Vec<u32>,
}

impl From<pb::InfoResponse> for ModelInfo {
    fn from(info: pb::InfoResponse) -> Self {
        Self {
            architecture: info.architecture,
            dtype: info.dtype,
            device: info.device,
            attention_backend: info.attention_backend,
            weights_format: info.weights_format,
            weight_bytes: info.weight_bytes,
            vocab_size: usize::try_from(info.vocab_size).unwrap_or(usize::MAX),
            max_position_embeddings: usize::try_from(info.max_position_embeddings)
                .unwrap_or(usize::MAX),
            eos_token_ids: info.eos_token_ids,
        }
    }
}

/// How the shards size their KV cache; sent at start-up and again after every restart.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WarmupPlan {
    pub block_size: usize,
    /// Tokens one step may hold (the profiling run's size).
    pub max_batch_tokens: usize,
    /// Requests one step may hold.
    pub max_batch_requests: usize,
}

impl From<WarmupPlan> for pb::WarmupRequest {
    /// Sizes beyond the contract's `u32` saturate.
    fn from(plan: WarmupPlan) -> Self {
        let to_u32 = |value: usize| u32::try_from(value).unwrap_or(u32::MAX);
        Self {
            block_size: to_u32(plan.block_size),
            max_batch_tokens: to_u32(plan.max_batch_tokens),
            max_batch_requests: to_u32(plan.max_batch_requests),
        }
    }
}

/// The KV cache the shards allocated (the smallest rank's).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KvCacheSize {
    pub num_blocks: usize,
    pub bytes: u64,
}

impl From<pb::WarmupResponse> for KvCacheSize {
    fn from(answer: pb::WarmupResponse) -> Self {
        Self {
            num_blocks: usize::try_from(answer.num_blocks).unwrap_or(usize::MAX),
            bytes: answer.kv_cache_bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warmup_sizes_beyond_the_contract_saturate() {
        let plan = WarmupPlan {
            block_size: 16,
            max_batch_tokens: usize::MAX,
            max_batch_requests: 8,
        };
        let request = pb::WarmupRequest::from(plan);
        assert_eq!(
            (
                request.block_size,
                request.max_batch_tokens,
                request.max_batch_requests
            ),
            (16, u32::MAX, 8)
        );
    }

    #[test]
    fn model_facts_and_the_kv_cache_keep_their_values() {
        let info = ModelInfo::from(pb::InfoResponse {
            architecture: "LlamaForCausalLM".to_owned(),
            vocab_size: 32_000,
            max_position_embeddings: 4096,
            eos_token_ids: vec![2],
            ..pb::InfoResponse::default()
        });
        assert_eq!(info.architecture, "LlamaForCausalLM");
        assert_eq!(
            (info.vocab_size, info.max_position_embeddings),
            (32_000, 4096)
        );
        assert_eq!(info.eos_token_ids, vec![2]);
        let cache = KvCacheSize::from(pb::WarmupResponse {
            num_blocks: 7,
            kv_cache_bytes: 1 << 20,
        });
        assert_eq!(
            cache,
            KvCacheSize {
                num_blocks: 7,
                bytes: 1 << 20
            }
        );
    }
}
