"""``python -m kvretention`` runs the CLI."""

from kvretention.cli import main

main()
