"""int4 groupwise weights: the CPU and CUDA kernels, and GPTQ and AWQ checkpoints."""
