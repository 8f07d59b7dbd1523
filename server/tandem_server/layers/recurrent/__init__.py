"""Layers that keep a fixed-size recurrent state per sequence, and the pool that holds it."""
