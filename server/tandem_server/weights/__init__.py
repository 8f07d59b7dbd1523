"""Checkpoint loading: safetensors through mmap, sliced per rank by each parameter's weight loader."""
