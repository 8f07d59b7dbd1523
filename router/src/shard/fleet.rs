//! Fans every RPC out to all ranks at once and fails if any rank fails.

use std::future::Future;
use std::time::Duration;

use futures::future::join_all;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use super::address::ShardAddress;
use super::cluster_secret::ClusterAuth;
use super::connect::connect;
use super::convert::{KvCacheSize, LoraAdapterInfo, ModelInfo, WarmupPlan};
use super::error::ShardError;
use super::step::Step;
use super::step_answer::StepAnswer;
use crate::pb;
use crate::pb::shard_service_client::ShardServiceClient;

type Client = ShardServiceClient<InterceptedService<Channel, ClusterAuth>>;

/// Clients for every rank, in rank order. Cloning is cheap (channels are shared).
#[derive(Debug, Clone)]
pub struct ShardFleet {
    clients: Vec<Client>,
}

impl ShardFleet {
    /// Connects to every rank (rank order), each retried until `timeout`; every call carries
    /// `auth`'s cluster secret, if any.
    pub async fn connect(
        addresses: &[ShardAddress],
        timeout: Duration,
        auth: ClusterAuth,
    ) -> Result<Self, ShardError> {
        if addresses.is_empty() {
            return Err(ShardError::NoShards);
        }
        let connections = addresses
            .iter()
            .enumerate()
            .map(|(rank, address)| connect(rank, address, timeout));
        let channels = join_all(connections)
            .await
            .into_iter()
            .collect::<Result<Vec<_>, _>>()?;
        let clients = channels
            .into_iter()
            .map(|channel| {
                ShardServiceClient::with_interceptor(channel, auth.clone())
                    .max_decoding_message_size(usize::MAX)
            })
            .collect();
        Ok(Self { clients })
    }

    pub fn num_shards(&self) -> usize {
        self.clients.len()
    }

    /// Rank 0's model facts, after checking that every rank serves the same model.
    pub async fn info(&self) -> Result<ModelInfo, ShardError> {
        let mut answers = self
            .fan_out(|mut client| async move { client.info(pb::InfoRequest {}).await })
            .await?;
        same_model_on_every_rank(&answers)?;
        let first = answers.swap_remove(0);
        Ok(ModelInfo::from(first))
    }

    pub async fn health(&self, deep: bool) -> Result<(), ShardError> {
        self.fan_out(|mut client| async move { client.health(pb::HealthRequest { deep }).await })
            .await
            .map(drop)
    }

    /// Allocates the KV cache on every rank; the usable blocks and state checkpoints are the
    /// smallest rank's.
    pub async fn warmup(&self, plan: WarmupPlan) -> Result<KvCacheSize, ShardError> {
        let request = pb::WarmupRequest::from(plan);
        let answers = self
            .fan_out(|mut client| async move { client.warmup(request).await })
            .await?;
        let fewest_checkpoints = answers
            .iter()
            .map(|answer| answer.num_state_checkpoints)
            .min();
        let mut size = answers
            .into_iter()
            .min_by_key(|answer| answer.num_blocks)
            .map(KvCacheSize::from)
            .ok_or(ShardError::NoShards)?;
        size.state_checkpoints = fewest_checkpoints
            .and_then(|count| usize::try_from(count).ok())
            .unwrap_or(0);
        Ok(size)
    }

    /// Runs one step on every rank; returns rank 0's outputs (every rank samples the same tokens).
    /// A traced step (`shard::traced`) carries its span's `traceparent` to every rank.
    pub async fn step(&self, step: Step) -> Result<StepAnswer, ShardError> {
        let request = pb::StepRequest::from(step);
        let traceparent = crate::telemetry::current_traceparent();
        let mut answers = self
            .fan_out(|mut client| {
                let mut call = tonic::Request::new(request.clone());
                if let Some(traceparent) = &traceparent {
                    call.metadata_mut()
                        .insert(crate::telemetry::TRACEPARENT, traceparent.clone());
                }
                async move { client.step(call).await }
            })
            .await?;
        Ok(StepAnswer::from(answers.swap_remove(0)))
    }

    pub async fn reset(&self) -> Result<(), ShardError> {
        self.fan_out(|mut client| async move { client.reset(pb::ResetRequest {}).await })
            .await
            .map(drop)
    }

    pub async fn load_lora_adapter(
        &self,
        name: &str,
        path: &str,
    ) -> Result<LoraAdapterInfo, ShardError> {
        let request = pb::LoadLoraAdapterRequest {
            name: name.to_owned(),
            path: path.to_owned(),
        };
        let answers = self
            .each_rank(|mut client| {
                let request = request.clone();
                async move { client.load_lora_adapter(request).await }
            })
            .await;
        let loaded: Vec<usize> = answers
            .iter()
            .enumerate()
            .filter_map(|(rank, answer)| answer.is_ok().then_some(rank))
            .collect();
        match answers.into_iter().collect::<Result<Vec<_>, _>>() {
            Ok(mut answers) => Ok(answers
                .swap_remove(0)
                .adapter
                .map(LoraAdapterInfo::from)
                .unwrap_or_else(|| LoraAdapterInfo::named(name))),
            Err(error) => {
                for rank in loaded {
                    // Best effort: a rank that cannot unload keeps an adapter nobody selects.
                    let _ = self.clients[rank]
                        .clone()
                        .unload_lora_adapter(pb::UnloadLoraAdapterRequest {
                            name: name.to_owned(),
                        })
                        .await;
                }
                Err(error)
            }
        }
    }

    pub async fn unload_lora_adapter(&self, name: &str) -> Result<(), ShardError> {
        let request = pb::UnloadLoraAdapterRequest {
            name: name.to_owned(),
        };
        self.fan_out(|mut client| {
            let request = request.clone();
            async move { client.unload_lora_adapter(request).await }
        })
        .await
        .map(drop)
    }

    /// Sends one call to every rank concurrently; the answers come back in rank order.
    async fn fan_out<T, F, Fut>(&self, call: F) -> Result<Vec<T>, ShardError>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        self.each_rank(call).await.into_iter().collect()
    }

    /// Each rank's answer to one call sent to all of them concurrently, in rank order.
    async fn each_rank<T, F, Fut>(&self, call: F) -> Vec<Result<T, ShardError>>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let calls = self.clients.iter().cloned().map(&call);
        join_all(calls)
            .await
            .into_iter()
            .enumerate()
            .map(|(rank, answer)| {
                answer
                    .map(tonic::Response::into_inner)
                    .map_err(|status| ShardError::Rpc {
                        rank,
                        code: status.code(),
                        message: status.message().to_string(),
                    })
            })
            .collect()
    }
}

/// Every rank must serve rank 0's model and draft model: a Step runs the same on all of them.
fn same_model_on_every_rank(answers: &[pb::InfoResponse]) -> Result<(), ShardError> {
    let Some((first, others)) = answers.split_first() else {
        return Ok(());
    };
    for (offset, other) in others.iter().enumerate() {
        let rank = offset + 1;
        if other.architecture != first.architecture || other.vocab_size != first.vocab_size {
            return Err(ShardError::Inconsistent(format!(
                "rank {rank} serves {} (vocab {}), rank 0 serves {} (vocab {})",
                other.architecture, other.vocab_size, first.architecture, first.vocab_size
            )));
        }
        // A Step asking for model drafts would fail on a rank without the draft model.
        if other.draft_model != first.draft_model {
            return Err(ShardError::Inconsistent(format!(
                "rank {rank} drafts with {:?}, rank 0 with {:?}",
                other.draft_model, first.draft_model
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod same_model_tests {
    use super::*;

    fn info(architecture: &str, draft_model: &str) -> pb::InfoResponse {
        pb::InfoResponse {
            architecture: architecture.to_owned(),
            vocab_size: 96,
            draft_model: draft_model.to_owned(),
            ..Default::default()
        }
    }

    #[test]
    fn ranks_that_serve_the_same_model_and_draft_model_agree() {
        let draft = "LlamaForCausalLM, 4 layers";
        let answers = [
            info("LlamaForCausalLM", draft),
            info("LlamaForCausalLM", draft),
        ];
        assert!(same_model_on_every_rank(&answers).is_ok());
    }

    #[test]
    fn a_rank_with_another_model_or_draft_model_is_named() {
        let other_model = [info("LlamaForCausalLM", ""), info("Qwen2ForCausalLM", "")];
        let error = same_model_on_every_rank(&other_model).expect_err("another model");
        assert!(
            error.to_string().contains("rank 1 serves Qwen2ForCausalLM"),
            "{error}"
        );
        let no_draft = [
            info("LlamaForCausalLM", "LlamaForCausalLM, 4 layers"),
            info("LlamaForCausalLM", ""),
        ];
        let error = same_model_on_every_rank(&no_draft).expect_err("no draft model on rank 1");
        assert!(
            error.to_string().contains("rank 1 drafts with \"\""),
            "{error}"
        );
    }
}
