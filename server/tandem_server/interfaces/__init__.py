"""Declarations the shard makes for its launcher: importable without torch or any kernel package."""
