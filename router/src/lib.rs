//! Tandem's router: validates, tokenizes, schedules and streams; talks gRPC to the model shards.

pub mod pb {
    //! Generated from `proto/tandem/shard/v1/shard.proto`.
    #![allow(clippy::all, clippy::pedantic)]
    tonic::include_proto!("tandem.shard.v1");
}

pub mod config;
pub mod error;
pub mod generation;
pub mod harmony;
pub mod http;
pub mod images;
pub mod kv;
pub mod limits;
pub mod metrics;
pub mod reasoning;
pub mod scheduler;
pub mod server;
pub mod shard;
pub mod stream;
pub mod telemetry;
pub mod tenant;
#[cfg(test)]
pub mod test_tokenizer;
pub mod tools;
pub mod validation;

#[cfg(feature = "python")]
mod python;

use clap::Parser;

/// Parses `argv`, runs the router until shutdown and returns the process exit status.
pub fn main_with_args(argv: Vec<String>) -> i32 {
    let args = match config::RouterArgs::try_parse_from(argv) {
        Ok(args) => args,
        Err(error) => {
            // `--help` and `--version` also arrive here, with exit status 0.
            let _ = error.print();
            return error.exit_code();
        }
    };
    server::init_tracing(args.json_output);
    // Dropped last, after the runtime: flushes the spans still queued.
    let _telemetry = match telemetry::init(&args.otlp) {
        Ok(telemetry) => telemetry,
        Err(error) => {
            tracing::error!("{error}");
            return 1;
        }
    };
    let config = match config::RouterConfig::try_from(args) {
        Ok(config) => config,
        Err(error) => {
            tracing::error!("invalid configuration: {error}");
            return 1;
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            tracing::error!("cannot start the async runtime: {error}");
            return 1;
        }
    };
    let outcome = runtime.block_on(server::run(config));
    // Background loops (scheduler, metrics upkeep) never end on their own.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    match outcome {
        Ok(()) => 0,
        Err(error) => {
            tracing::error!("{error}");
            1
        }
    }
}
