"""int8 weights: per output channel, and in groups of 32 inputs (GGUF's Q8_0)."""
