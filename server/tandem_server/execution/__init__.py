"""How a step's forward pass runs: eager, CUDA graphs or compiled decode graphs, tried in order (`chain.py`), over
the step batch and the KV cache they share."""
