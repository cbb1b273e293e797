"""Celery task for the staff pages: a thin caller of `ops.services.whatif_execute`."""

from __future__ import annotations

from typing import Any

from celery import shared_task


@shared_task(acks_late=True, soft_time_limit=900, time_limit=960)
def whatif_run(whatif_id: str) -> dict[str, Any]:
    from ops.services import whatif_execute

    state = whatif_execute(whatif_id=whatif_id)
    return {"id": whatif_id, "status": state["status"]}
