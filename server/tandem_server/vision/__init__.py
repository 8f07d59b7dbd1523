"""Vision-language models' image side: preprocessing, vision towers, projectors and the encoder cache."""
