"""The `tandem-router` command: hands argv to the Rust router."""

import sys

from tandem_router._native import run


def main() -> None:
    """Run the router until it shuts down; exit with its status."""
    sys.exit(run(sys.argv))
