"""One launch from a validated config: resolve the model, derive limits, run the supervisor."""

from __future__ import annotations

from tandem_launcher.config import LauncherConfig
from tandem_launcher.limits import TokenLimitError, derive_token_limits
from tandem_launcher.logs import LOGGER, configure_logging, phase
from tandem_launcher.model_resolution import ModelResolutionError, resolve_configured_model
from tandem_launcher.signals import (
    ShutdownFlag,
    ShutdownRequested,
    flag_on_shutdown_signal,
    forward_hangup,
    raise_on_shutdown_signal,
)
from tandem_launcher.supervisor import LaunchPlan, Supervisor


def launch(config: LauncherConfig) -> int:
    """The process exit status: 0 after a requested shutdown, 1 when anything fails."""
    configure_logging(config.log_level, config.json_output)
    raise_on_shutdown_signal()
    try:
        with phase(f"resolve model {config.model_id}"):
            model = resolve_configured_model(config)
        LOGGER.info("model directory: %s", model.path)
        if model.draft_path is not None:
            LOGGER.info("draft model directory: %s", model.draft_path)
        limits = derive_token_limits(config, model.max_position_embeddings)
    except (ModelResolutionError, TokenLimitError) as error:
        LOGGER.error("%s", error)
        return 1
    except ShutdownRequested as request:
        LOGGER.info("%s before start-up finished", request)
        return 0
    LOGGER.info("token limits: max input %d, max total %d", limits.max_input_tokens, limits.max_total_tokens)
    LOGGER.info("KV cache blocks of %d tokens (%s)", config.block_size, config.block_size_reason)
    shutdown = ShutdownFlag()
    flag_on_shutdown_signal(shutdown)
    supervisor = Supervisor(LaunchPlan(config, model, limits), shutdown)
    forward_hangup(supervisor.reload_router_keys)
    return supervisor.run()
