"""factory_boy factories for the portal's models (typed, no shared personas)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import factory
from django.contrib.auth import get_user_model
from django.contrib.postgres.fields.ranges import DateTimeTZRange
from django.utils import timezone

from portal.accounts.models import Membership, Project, Quota
from scheduling.models import Allocation, Booking, Cluster, Gpu, GpuType, Job, Node

User = get_user_model()


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = User
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"user{n}")
    email = factory.LazyAttribute(lambda u: f"{u.username}@lab.example")
    password = factory.django.Password("pw-not-secret")


class GpuTypeFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = GpuType
        django_get_or_create = ("name",)

    name = factory.Sequence(lambda n: f"GPU{n}")
    memory_gib = 80.0
    precisions = factory.LazyFunction(lambda: ["fp32", "tf32", "bf16", "fp16"])
    relative_speed = 1.0
    value = 1.0


class ClusterFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Cluster

    name = factory.Sequence(lambda n: f"cluster{n}")
    backend = Cluster.Backend.SIMULATOR


class NodeFactory(factory.django.DjangoModelFactory):
    """A node and its ``gpu_count`` GPU rows (indexes 0..gpu_count-1)."""

    class Meta:
        model = Node
        skip_postgeneration_save = True

    cluster = factory.SubFactory(ClusterFactory)
    name = factory.Sequence(lambda n: f"node{n:03d}")
    gpu_type = factory.SubFactory(GpuTypeFactory)
    gpu_count = 4
    status = Node.Status.UP

    @factory.post_generation
    def gpus(self, create: bool, extracted: Any, **kwargs: Any) -> None:
        if create:
            Gpu.objects.bulk_create(Gpu(node=self, index=i) for i in range(self.gpu_count))


class ProjectFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Project

    name = factory.Sequence(lambda n: f"Project {n}")
    slug = factory.Sequence(lambda n: f"project-{n}")
    fair_share_weight = 1.0


class MembershipFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Membership

    user = factory.SubFactory(UserFactory)
    project = factory.SubFactory(ProjectFactory)
    role = Membership.Role.MEMBER


class QuotaFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Quota

    project = factory.SubFactory(ProjectFactory)
    gpu_type = factory.SubFactory(GpuTypeFactory)
    guaranteed_gpus = 4
    borrow_limit_gpus = 4


class BookingFactory(factory.django.DjangoModelFactory):
    """A booking row only (no allocations): use ``booking_create`` for a placed booking."""

    class Meta:
        model = Booking

    user = factory.SubFactory(UserFactory)
    project = factory.SubFactory(ProjectFactory)
    cluster = factory.SubFactory(ClusterFactory)
    gpu_type = factory.SubFactory(GpuTypeFactory)
    gpu_count = 1
    start_at = factory.LazyFunction(lambda: timezone.now() + timedelta(hours=1))
    end_at = factory.LazyAttribute(lambda b: b.start_at + timedelta(hours=2))
    status = Booking.Status.CONFIRMED


class JobFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Job

    user = factory.SubFactory(UserFactory)
    project = factory.SubFactory(ProjectFactory)
    cluster = factory.SubFactory(ClusterFactory)
    name = factory.Sequence(lambda n: f"train-{n}")
    gpu_count = 1
    requested_s = 3600
    submitted_at = factory.LazyFunction(timezone.now)
    status = Job.Status.PENDING


class AllocationFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Allocation

    gpu = factory.LazyFunction(lambda: Gpu.objects.order_by("id").first())
    job = factory.SubFactory(JobFactory)
    booking = None
    period = factory.LazyFunction(
        lambda: DateTimeTZRange(timezone.now(), timezone.now() + timedelta(hours=1), "[)")
    )
    state = Allocation.State.ACTIVE
