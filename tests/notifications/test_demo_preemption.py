"""The demo's notification path: a preemption on the simulated cluster mails its owner through Django's
console backend (what the demo's worker log shows) and POSTs a signed webhook to the demo's receiver
(`notifications.receiver`, run by ``manage.py webhook_receiver`` in scripts/demo.sh), which verifies the
signature against the webhook's secret and refuses a tampered call.

Real PostgreSQL, Redis (simulator state) and HTTP on loopback; the sending task's body is run in
order for every delivery the rounds wrote, as the Celery worker would after the commits."""

from __future__ import annotations

import io
import threading
from typing import Any

import httpx
import pytest

from notifications.models import Delivery, EventKind
from notifications.receiver import Received, server_make, webhooks_ensure
from notifications.tasks import delivery_attempt
from portal.accounts.models import Membership
from scheduling.models import GpuType, Preemption
from scheduling.services import booking_create
from tests.factories import MembershipFactory
from tests.integration import loop
from tests.integration.loop import later, make_cluster, make_member, submit

engine_redis_url = loop.engine_redis_url
run_round = loop.run_round
t0 = loop.t0

pytestmark = [pytest.mark.django_db(transaction=True)]


@pytest.fixture
def demo_receiver() -> Any:
    received = Received()
    lines: list[str] = []
    server = server_make("127.0.0.1", 0, received, log=lines.append)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook", received, lines
    server.shutdown()
    server.server_close()


def test_a_demo_preemption_mails_on_the_console_and_sends_a_verified_webhook(
    engine_redis_url, run_round, t0, demo_receiver, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, received, receiver_log = demo_receiver
    console = io.StringIO()
    settings.EMAIL_BACKEND = "django.core.mail.backends.console.EmailBackend"
    monkeypatch.setattr("sys.stdout", console)  # the console backend writes to sys.stdout at send time

    cluster = make_cluster(nodes=1, gpus_per_node=4)
    owner, project = make_member()
    MembershipFactory(project=project, role=Membership.Role.MANAGER)
    borrower = MembershipFactory(
        project=project, role=Membership.Role.MEMBER, user__email="ada@berth.example"
    ).user
    [hook] = webhooks_ensure(url=url, projects=[project])
    assert webhooks_ensure(url=url, projects=[project]) == [hook]  # the demo restarts: no second webhook
    booking_start = later(t0, 1800)
    booking_create(
        owner,
        project=project,
        gpu_type=GpuType.objects.get(name="A100"),
        gpu_count=4,
        start_at=booking_start,
        end_at=later(booking_start, 3600),
        cluster=cluster,
        now=t0,
    )
    lent = submit(
        borrower,
        project,
        cluster,
        gpus=4,
        runtime_s=7200,
        now=t0,
        is_preemptible=True,
        is_checkpointable=True,
        checkpoint_interval_s=700,
        name="llm-7b-sft",
    )
    run_round(cluster, t0)
    at = later(booking_start, -120)
    while at < booking_start:
        at = later(at, 15)
        run_round(cluster, at)
    assert Preemption.objects.filter(job=lent).exists()

    for delivery in Delivery.objects.order_by("id"):
        delivery_attempt(delivery.pk)

    mail = Delivery.objects.get(event=EventKind.JOB_PREEMPTED, channel=Delivery.Channel.EMAIL)
    assert mail.status == Delivery.Status.SENT
    printed = console.getvalue()
    assert "To: ada@berth.example" in printed
    assert f"Subject: Berth: job {lent.pk} (llm-7b-sft) will be preempted in" in printed
    assert "It checkpoints, so it resumes from its last checkpoint." in printed
    hook_call = Delivery.objects.get(event=EventKind.JOB_PREEMPTED, channel=Delivery.Channel.WEBHOOK)
    assert hook_call.status == Delivery.Status.SENT
    assert hook_call.response_status == 200
    assert (hook_call.pk, "job.preempted", True) in received.calls
    assert all(ok for _, _, ok in received.calls)  # every call the project's webhook got was verified
    line = next(x for x in receiver_log if f"delivery={hook_call.pk} " in x)
    assert line.startswith("webhook verified")
    assert '"lost_gpu_s"' in line

    # A forged call (right delivery id, body changed after signing) is refused.
    forged = httpx.post(
        url,
        content=b'{"event":"job.preempted","forged":true}',
        headers={"X-Berth-Delivery": str(hook_call.pk), "X-Berth-Signature": "sha256=" + "0" * 64},
    )
    assert forged.status_code == 401
    assert received.calls[-1] == (hook_call.pk, "?", False)
    assert receiver_log[-1].startswith("webhook REFUSED")
