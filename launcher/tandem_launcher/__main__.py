"""`python -m tandem_launcher`."""

from tandem_launcher.cli import main

main()
