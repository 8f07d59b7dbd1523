"""tandem-bench: streaming load generator for OpenAI-compatible servers (TTFT, ITL, TPOT, throughput)."""
