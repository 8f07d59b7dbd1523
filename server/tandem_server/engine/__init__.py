"""The execution engine: request state, the model runner, Warmup and the draft model."""
