"""Tandem's model shard: tensors, forward passes, sampling; never HTTP or text."""
