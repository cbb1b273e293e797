"""``manage.py webhook_receiver``: the demo lab's webhook receiver on loopback (notifications.receiver)."""

from __future__ import annotations

import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from notifications.receiver import Received, server_make, webhooks_ensure
from portal.accounts.models import Project


class Command(BaseCommand):
    help = (
        "Receive Berth's webhooks on loopback, check each signature and log the call; with --project "
        "(or --all-projects) first point a webhook of those projects here."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8098)
        parser.add_argument("--project", action="append", default=[], help="Project slug (repeat).")
        parser.add_argument("--all-projects", action="store_true", help="Every project with a manager.")

    def handle(self, *args: Any, **options: Any) -> None:
        host, port = options["host"], options["port"]
        url = f"http://{host}:{port}/hook"
        projects = (
            Project.objects.all()
            if options["all_projects"]
            else Project.objects.filter(slug__in=options["project"])
        )
        missing = set(options["project"]) - set(projects.values_list("slug", flat=True))
        if missing:
            raise CommandError(f"No such project: {', '.join(sorted(missing))}")
        hooks = webhooks_ensure(url=url, projects=projects.order_by("slug"))

        def log(line: str) -> None:
            self.stdout.write(line)
            sys.stdout.flush()

        server = server_make(host, port, Received(), log=log)
        log(f"webhook receiver on {url}: {len(hooks)} project webhook(s) point here")
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            server.server_close()
