"""float8 e4m3 weights: the scaled GEMM, and FP8 checkpoints in the layouts published on the Hub."""
