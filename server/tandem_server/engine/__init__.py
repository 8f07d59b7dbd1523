"""The execution engine: request state, step tensors, the paged KV cache, the model runner."""
