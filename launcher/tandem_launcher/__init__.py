"""Tandem launcher: resolves the model, spawns shards then the router, supervises them."""
