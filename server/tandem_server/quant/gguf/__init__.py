"""GGUF models' kept quantized blocks (Q4_0, Q4_1, Q8_0)."""
