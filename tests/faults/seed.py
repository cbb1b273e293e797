"""Seed the fault suite's database (run as ``python -m tests.faults.seed`` with its DATABASE_URL).

Prints one JSON line: the cluster id, the GPU type, the project, API tokens of three members
and the username/password of one of them for the login form.
"""

from __future__ import annotations

import json
import os
import sys


def main() -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token

    from portal.accounts.models import Membership, Project
    from scheduling.models import Cluster, Gpu, GpuType, Node

    gpu_type = GpuType.objects.create(
        name="A100", memory_gib=80.0, precisions=["fp64", "tf32", "bf16", "fp16"]
    )
    cluster = Cluster.objects.create(
        name="fault",
        backend=Cluster.Backend.SIMULATOR,
        settings={"speedup": 1.0, "policy": {"name": "berth", "grace_s": 30.0, "min_runtime_s": 60.0}},
    )
    for i in range(4):
        node = Node.objects.create(cluster=cluster, name=f"n{i}", gpu_type=gpu_type, gpu_count=4)
        Gpu.objects.bulk_create(Gpu(node=node, index=k) for k in range(4))
    project = Project.objects.create(slug="faults", name="Faults")
    tokens = []
    password = "fault-suite-password-1"
    for i in range(3):
        user = get_user_model().objects.create_user(username=f"member{i}", password=password)
        Membership.objects.create(user=user, project=project, role=Membership.Role.MEMBER)
        tokens.append(Token.objects.create(user=user).key)
    json.dump(
        {
            "cluster_id": cluster.pk,
            "cluster": cluster.name,
            "gpu_type": gpu_type.name,
            "project": project.slug,
            "tokens": tokens,
            "username": "member0",
            "password": password,
        },
        sys.stdout,
    )
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
