"""Model families composed from `layers/`, one file per family, looked up through `registry`."""
