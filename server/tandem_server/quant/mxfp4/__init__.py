"""MXFP4 expert weights as gpt-oss publishes them, kept packed and dequantized one expert at a time."""
