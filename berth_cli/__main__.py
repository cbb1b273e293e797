"""``python -m berth_cli`` runs the same command line as the ``berth`` script."""

from berth_cli.main import main

main()
