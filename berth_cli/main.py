"""The ``berth`` entry point: the root group with every command module registered."""

from __future__ import annotations

from berth_cli.app import cli
from berth_cli.commands import auth, avail, bookings, jobs

for module in (auth, avail, bookings, jobs):
    module.register(cli)


def main() -> None:
    cli.main(prog_name="berth")
