"""How to get on a booking's GPUs, per backend: what the booking page, the API and the start
notification show (read only; nothing here changes state).

* Slurm: bookings are reservations named ``<reservation_prefix>booking-<id>`` (the Slurm backend
  names them so), so a ready ``srun --reservation=… --gres=gpu:<n> --pty bash`` line lands the
  owner on the booked node(s).
* Kubernetes: Berth keeps the GPUs free itself (no reservation object), so the owner runs a pod
  pinned to the booked node, in Berth's namespace, with the GPU limit; the template is given.
* Simulator: there are no real GPUs; the text says so and names the GPUs the demo holds.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from scheduling.models import Allocation, Booking, Cluster


@dataclass(frozen=True, slots=True)
class Access:
    """``backend`` kind, one-line ``summary``, ready ``commands`` (copy-paste), optional ``template``
    (a file to apply) and the ``nodes`` holding the booked GPUs (name -> GPU indices)."""

    backend: str
    summary: str
    commands: tuple[str, ...] = ()
    template: str = ""
    reservation: str = ""
    namespace: str = ""
    nodes: dict[str, list[int]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, object]:
        return {
            "backend": self.backend,
            "summary": self.summary,
            "commands": list(self.commands),
            "template": self.template,
            "reservation": self.reservation,
            "namespace": self.namespace,
            "nodes": self.nodes,
        }

    def as_text(self) -> str:
        lines = [self.summary, *("  " + c for c in self.commands)]
        if self.template:
            lines += ["", self.template]
        return "\n".join(lines)


def _booked_nodes(booking: Booking) -> dict[str, list[int]]:
    nodes: dict[str, list[int]] = defaultdict(list)
    rows = (
        Allocation.objects.filter(booking=booking)
        .exclude(state=Allocation.State.RELEASED)
        .values_list("gpu__node__name", "gpu__index")
        .order_by("gpu__node__name", "gpu__index")
    )
    for name, index in rows:
        if index not in nodes[name]:
            nodes[name].append(index)
    return dict(nodes)


def _slurm(booking: Booking, nodes: dict[str, list[int]]) -> Access:
    from scheduling.backends.slurm import SlurmConfig, reservation_name

    raw = booking.cluster.settings or {}
    base = SlurmConfig.from_env()
    prefix = str(raw.get("reservation_prefix") or base.reservation_prefix)
    partition = str(raw.get("partition") or base.partition)
    name = reservation_name(f"booking-{booking.pk}", prefix=prefix)
    per_node = max((len(v) for v in nodes.values()), default=booking.gpu_count)
    # Untyped: the reservation and the node list already fix the node, hence the GPU type, and
    # Slurm's GRES type names (``a100``) need not match Berth's (``A100``).
    gres = f"gpu:{per_node}"
    parts = ["srun", f"--reservation={name}", f"--partition={partition}"]
    if len(nodes) > 1:
        parts.append(f"--nodes={len(nodes)}")
    if nodes:
        parts.append(f"--nodelist={','.join(nodes)}")
    parts += [f"--gres={gres}", "--pty", "bash"]
    return Access(
        backend=Cluster.Backend.SLURM,
        summary=(
            f"Slurm reservation {name} on {', '.join(nodes) or 'the booked nodes'} "
            f"({booking.gpu_count} × {booking.gpu_type.name}). From a login node:"
        ),
        commands=(" ".join(parts), f"sbatch --reservation={name} --gres={gres} job.sh"),
        reservation=name,
        nodes=nodes,
    )


def _kubernetes(booking: Booking, nodes: dict[str, list[int]]) -> Access:
    from scheduling.backends.k8s import KubernetesConfig

    raw = booking.cluster.settings or {}
    base = KubernetesConfig.from_env()
    namespace = str(raw.get("namespace") or base.namespace)
    node_names = list(nodes) or ["<booked node>"]
    per_node = max((len(v) for v in nodes.values()), default=booking.gpu_count)
    pod = f"berth-booking-{booking.pk}"
    template = "\n".join(
        [
            "apiVersion: v1",
            "kind: Pod",
            "metadata:",
            f"  name: {pod}",
            f"  namespace: {namespace}",
            "  labels:",
            f'    berth.dev/booking-id: "{booking.pk}"',
            "spec:",
            "  restartPolicy: Never",
            "  affinity:",
            "    nodeAffinity:",
            "      requiredDuringSchedulingIgnoredDuringExecution:",
            "        nodeSelectorTerms:",
            "        - matchFields:",
            "          - key: metadata.name",
            "            operator: In",
            f"            values: [{', '.join(node_names)}]",
            "  tolerations:",
            "  - key: nvidia.com/gpu",
            "    operator: Exists",
            "  containers:",
            "  - name: main",
            "    image: <your image>",
            '    command: ["sleep", "infinity"]',
            "    resources:",
            "      limits:",
            f'        {base.gpu_resource}: "{per_node}"',
        ]
    )
    return Access(
        backend=Cluster.Backend.KUBERNETES,
        summary=(
            f"Kubernetes namespace {namespace}, node {', '.join(node_names)} "
            f"({booking.gpu_count} × {booking.gpu_type.name}). Save the pod template as pod.yaml, then:"
        ),
        commands=("kubectl apply -f pod.yaml", f"kubectl exec -it -n {namespace} {pod} -- bash"),
        template=template,
        namespace=namespace,
        nodes=nodes,
    )


def _simulator(booking: Booking, nodes: dict[str, list[int]]) -> Access:
    held = "; ".join(f"{n} GPU {','.join(map(str, i))}" for n, i in nodes.items()) or "no GPUs yet"
    return Access(
        backend=Cluster.Backend.SIMULATOR,
        summary=(
            f"Simulated cluster {booking.cluster.name}: there are no real GPUs. The demo holds {held} "
            f"for you; on a Slurm cluster this would be an srun line into your reservation."
        ),
        commands=(f"echo 'pretend: ssh {next(iter(nodes), 'node')} and use CUDA_VISIBLE_DEVICES'",),
        nodes=nodes,
    )


def booking_access(booking: Booking) -> Access:
    """How the owner gets on ``booking``'s GPUs on its cluster's backend."""
    nodes = _booked_nodes(booking)
    if booking.cluster.backend == Cluster.Backend.SLURM:
        return _slurm(booking, nodes)
    if booking.cluster.backend == Cluster.Backend.KUBERNETES:
        return _kubernetes(booking, nodes)
    return _simulator(booking, nodes)
