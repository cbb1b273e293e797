"""`SlurmBackend`: the `ClusterBackend` that carries out a plan on Slurm (see the package docstring)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

from scheduling.backends.base import (
    ActionResult,
    ObservedCluster,
    ObservedState,
    natural_key,
)
from scheduling.backends.slurm.client import SlurmClient
from scheduling.backends.slurm.config import SIGNAL_MARK, SlurmJobPayload, SlurmRejectedError
from scheduling.backends.slurm.parse import (
    NodeInventory,
    expand_hostlist,
    reservation_name,
    slurm_time,
    tres_gpu_types,
)
from scheduling.backends.slurm.states import _is_live, job_state, observe_job, signalled_at
from scheduling.engine.types import (
    Plan,
    PreemptAction,
    ReleaseAction,
    ReserveAction,
    StartAction,
)


class SlurmBackend(SlurmClient):
    """`ClusterBackend` for a Slurm cluster reached through slurmrestd (see the package docstring)."""

    def snapshot(self) -> ObservedCluster:
        """What really runs: GPU nodes and Berth's jobs.  Raises `BackendError` when Slurm is unreachable."""
        inventory = self.inventory()
        raw = self._raw_jobs()
        jobs = tuple(observe_job(raw[j], job_id=j, gpu_ids=inventory.gpu_ids) for j in sorted(raw))
        return ObservedCluster(at=self._clock(), nodes=inventory.nodes, jobs=jobs)

    # -- writes --

    def apply(
        self,
        plan: Plan,
        *,
        payloads: Mapping[str, SlurmJobPayload | Mapping[str, Any]] | None = None,
    ) -> list[ActionResult]:
        """Carry out the plan's starts, preemptions, reservations and releases, one result each.

        Idempotent: call it every round with the current plan.  Raises `BackendError` when Slurm is
        unreachable (nothing after that point was attempted); per-action refusals are failed results.
        """
        results: list[ActionResult] = []
        if not (plan.starts or plan.preemptions or plan.reservations or plan.releases):
            return results
        inventory = self.inventory()
        jobs = self._raw_jobs()
        reservations = self.reservations() if (plan.starts or plan.reservations or plan.releases) else {}
        for release in plan.releases:
            results.append(self._guard("release", release.holder_id, partial(self._release, release)))
        for reserve in plan.reservations:
            do_reserve = partial(self._reserve, reserve, inventory=inventory, existing=reservations)
            results.append(self._guard("reserve", reserve.holder_id, do_reserve))
        if plan.reservations:
            reservations = self.reservations()  # starts below may go into the ones just made
        for preempt in plan.preemptions:
            do_preempt = partial(self._preempt, preempt, jobs.get(preempt.job_id))
            results.append(self._guard("preempt", preempt.job_id, do_preempt))
        for start in plan.starts:
            payload = (payloads or {}).get(start.job_id)
            if payload is None and self._payload_source is not None:
                payload = self._payload_source(start.job_id)
            do_start = partial(
                self._start,
                start,
                payload,
                inventory=inventory,
                existing=jobs.get(start.job_id),
                reservations=reservations,
            )
            results.append(self._guard("start", start.job_id, do_start))
        return results

    def cancel(self, job_id: str) -> ActionResult:
        """Cancel Berth job ``job_id``; a job that is gone or already ended counts as cancelled."""

        def do() -> tuple[str, str]:
            raw = self._raw_jobs().get(job_id)
            if raw is None or not _is_live(raw):
                return "nothing to cancel: " + ("not in Slurm" if raw is None else str(raw["job_state"])), ""
            ref = str(raw["job_id"])
            if self.config.dry_run:
                return f"dry-run: would cancel Slurm job {ref}", ref
            self._request("DELETE", f"/job/{ref}", doing=f"cancel job {ref}")
            return f"cancelled Slurm job {ref}", ref

        return self._guard("cancel", job_id, do)

    def _guard(self, action: str, target: str, do: Callable[[], tuple[str, str]]) -> ActionResult:
        """Run one action: refusals become a failed result, unreachable Slurm propagates."""
        try:
            message, ref = do()
        except SlurmRejectedError as exc:
            return ActionResult(action, target, is_ok=False, message=str(exc))
        return ActionResult(action, target, is_ok=True, message=message, backend_ref=ref)

    def _start(
        self,
        action: StartAction,
        payload: SlurmJobPayload | Mapping[str, Any] | None,
        *,
        inventory: NodeInventory,
        existing: Mapping[str, Any] | None,
        reservations: Mapping[str, Mapping[str, Any]],
    ) -> tuple[str, str]:
        placement = self._placement(action, inventory)
        gres = ",".join(
            f"gpu:{kind}:{count}" if kind else f"gpu:{count}"
            for kind, count in sorted(set(placement.values()))
        )
        nodelist = ",".join(placement)
        resv = self._covering_reservation(list(placement), reservations)
        replaced = ""
        if existing is not None and job_state(existing) is ObservedState.PREEMPTED and _is_live(existing):
            if str(existing.get("job_state", "")).upper() == "COMPLETING":
                # Still being killed by the requeue: released now it would look running while it is
                # stopping.  Refuse this round; the next one finds it pending and held.
                raise SlurmRejectedError(
                    f"Slurm job {existing['job_id']} is still stopping after its preemption; retry"
                )
            held_types = tres_gpu_types(str(existing.get("tres_per_node") or ""))
            if held_types == {kind or "gpu" for kind, _ in placement.values()}:
                return self._release_held(existing, nodelist=nodelist, gres=gres, reservation=resv)
            # Slurm 22.05 leaves a pending job whose GRES *type* is updated never runnable
            # (BadConstraints), so a move to another GPU type is a fresh submission.
            if payload is None:
                raise SlurmRejectedError("moving a requeued job to another GPU type needs its payload")
            replaced = str(existing["job_id"])
        elif existing is not None and _is_live(existing):
            return f"already submitted as Slurm job {existing['job_id']}", str(existing["job_id"])
        if payload is None:
            raise SlurmRejectedError("no payload for this job")
        spec = payload if isinstance(payload, SlurmJobPayload) else SlurmJobPayload.from_mapping(payload)
        limit_s = spec.time_limit_s or self.config.default_time_limit_s
        job: dict[str, Any] = {
            "name": self.config.job_name_prefix + action.job_id,
            "partition": self.config.partition,
            "nodelist": nodelist,  # accepted by v0.0.38 though its spec omits it
            "gres": gres,
            "requeue": True,
            "time_limit": max(1, math.ceil(limit_s / 60)),
            "current_working_directory": spec.working_directory or self.config.working_directory,
            "standard_output": spec.standard_output or self.config.standard_output,
            "environment": {"PATH": "/usr/local/bin:/usr/bin:/bin", **spec.environment},
        }
        if resv:
            job["reservation"] = resv
        if spec.cpus_per_task:
            job["cpus_per_task"] = spec.cpus_per_task
        if spec.memory_per_node_mib:
            job["memory_per_node"] = spec.memory_per_node_mib
        if self.config.dry_run:
            return f"dry-run: would submit on {nodelist} with gres {gres}", ""
        if replaced:
            self._request("DELETE", f"/job/{replaced}", doing=f"cancel held job {replaced}")
        data = self._request("POST", "/job/submit", doing="submit", body={"script": spec.script, "job": job})
        ref = str(data.get("job_id", ""))
        message = f"submitted on {nodelist} with gres {gres}" + (f" in {resv}" if resv else "")
        if replaced:
            message += f", replacing requeued Slurm job {replaced} (other GPU type)"
        return message, ref

    def _placement(self, action: StartAction, inventory: NodeInventory) -> dict[str, tuple[str, int]]:
        """Planned node -> (GPU type, GPU count) from the action's GPU ids."""
        counts: dict[str, int] = {}
        for gpu in action.gpu_ids:
            where = inventory.node_of_gpu(gpu)
            if where is None:
                raise SlurmRejectedError(f"GPU id {gpu} is on no Slurm node")
            counts[where[0]] = counts.get(where[0], 0) + 1
        for node in action.node_ids:
            counts.setdefault(node, 0)
        if not counts or set(counts) != set(action.node_ids or counts):
            raise SlurmRejectedError(
                f"GPU ids {action.gpu_ids} are not on the planned nodes {action.node_ids}"
            )
        if len(set(counts.values())) > 1:
            raise SlurmRejectedError("Slurm's gres is per node: every planned node needs the same GPU count")
        out: dict[str, tuple[str, int]] = {}
        for node in sorted(counts, key=natural_key):
            if node not in inventory.gres_types:
                raise SlurmRejectedError(f"node {node} has no GPUs in Slurm")
            out[node] = (inventory.gres_types[node], counts[node])
        return out

    def _covering_reservation(
        self, nodes: Sequence[str], reservations: Mapping[str, Mapping[str, Any]]
    ) -> str | None:
        now = self._clock()
        for name in sorted(reservations):
            resv = reservations[name]
            if (resv.get("end_time") or 0) <= now:
                continue
            if set(nodes) <= set(expand_hostlist(str(resv.get("node_list") or ""))):
                return name
        return None

    def _release_held(
        self, raw: Mapping[str, Any], *, nodelist: str, gres: str, reservation: str | None
    ) -> tuple[str, str]:
        ref = str(raw["job_id"])
        if self.config.dry_run:
            return f"dry-run: would release held Slurm job {ref} on {nodelist}", ref
        # begin_time "now": a requeue pushes BeginTime ~2 min ahead; the comment loses the signal mark.
        update: dict[str, Any] = {"nodelist": nodelist, "gres": gres, "begin_time": "now", "comment": ""}
        if reservation:
            update["reservation"] = reservation
        self._request("POST", f"/job/{ref}", doing=f"place job {ref}", body=update)
        self._request("POST", f"/job/{ref}", doing=f"release job {ref}", body={"hold": False})
        return f"released requeued Slurm job {ref} on {nodelist} with gres {gres}", ref

    def _preempt(self, action: PreemptAction, raw: Mapping[str, Any] | None) -> tuple[str, str]:
        if raw is None:
            raise SlurmRejectedError("no Slurm job for this Berth id")
        ref = str(raw["job_id"])
        state = job_state(raw)
        if state is ObservedState.PREEMPTED:
            return "already requeued and held", ref
        if not _is_live(raw):
            return f"already ended ({raw.get('job_state')})", ref
        if state is ObservedState.PENDING:
            # Never started: nothing to signal or requeue (Slurm refuses both); hold it for Berth.
            if self.config.dry_run:
                return f"dry-run: would hold pending Slurm job {ref}", ref
            self._request("POST", f"/job/{ref}", doing=f"hold job {ref}", body={"hold": True})
            return "held before it started", ref
        now = self._clock()
        if now < action.signal_at:
            return f"signal due at {slurm_time(action.signal_at)}", ref
        notes: list[str] = []
        if signalled_at(raw) is None:
            if self.config.dry_run:
                notes.append(f"dry-run: would send SIG{self.config.preempt_signal}")
            else:
                self._request(
                    "DELETE",
                    f"/job/{ref}",
                    doing=f"signal job {ref}",
                    params={"signal": self.config.preempt_signal},
                )
                self._request(
                    "POST",
                    f"/job/{ref}",
                    doing=f"mark job {ref}",
                    body={"comment": f"{SIGNAL_MARK}{math.ceil(now)}"},
                )
                notes.append(f"sent SIG{self.config.preempt_signal}")
                if now >= action.kill_at:
                    notes.append("the grace period had already passed")
        else:
            notes.append("already signalled")
        if now >= action.kill_at:
            if self.config.dry_run:
                notes.append("dry-run: would requeue and hold")
            else:
                self._requeue_hold(ref)
                notes.append("requeued and held")
        return ", ".join(notes), ref

    def _requeue_hold(self, ref: str) -> None:
        try:
            self._scontrol("requeuehold", ref)
        except SlurmRejectedError:
            # Lost a race (it ended or was requeued meanwhile): fine if it is now held or over.
            data = self._request("GET", f"/job/{ref}", doing=f"show job {ref}")
            raw = (data.get("jobs") or [{}])[0]
            if job_state(raw) is not ObservedState.PREEMPTED and _is_live(raw):
                raise

    def _reserve(
        self,
        action: ReserveAction,
        *,
        inventory: NodeInventory,
        existing: Mapping[str, Mapping[str, Any]],
    ) -> tuple[str, str]:
        name = reservation_name(action.holder_id, prefix=self.config.reservation_prefix)
        now = self._clock()
        if action.end_at <= now:
            return "window already over: nothing to reserve", name
        nodes: set[str] = set()
        for gpu in action.gpu_ids:
            where = inventory.node_of_gpu(gpu)
            if where is None:
                raise SlurmRejectedError(f"GPU id {gpu} is on no Slurm node")
            nodes.add(where[0])
        if not nodes:
            raise SlurmRejectedError("a reservation needs GPU ids")
        node_list = ",".join(sorted(nodes, key=natural_key))
        end = slurm_time(action.end_at)
        current = existing.get(name)
        if current is not None:
            same_nodes = set(expand_hostlist(str(current.get("node_list") or ""))) == nodes
            if same_nodes and abs(float(current.get("end_time") or 0) - math.floor(action.end_at)) < 1:
                return "already reserved", name
            args = [
                "update",
                "reservation",
                f"ReservationName={name}",
                f"Nodes={node_list}",
                f"EndTime={end}",
            ]
            if float(current.get("start_time") or 0) > now and action.start_at > now:
                args.append(f"StartTime={slurm_time(action.start_at)}")
            verb = "updated"
        else:
            start = "now" if action.start_at <= now else slurm_time(action.start_at)
            args = [
                "create",
                "reservation",
                f"ReservationName={name}",
                f"StartTime={start}",
                f"EndTime={end}",
                f"Nodes={node_list}",
                f"Users={self.config.user}",
                "Flags=FLEX,IGNORE_JOBS,OVERLAP",
            ]
            verb = "created"
        if self.config.dry_run:
            return f"dry-run: would run scontrol {' '.join(args)}", name
        self._scontrol(*args)
        return f"{verb} reservation on {node_list} until {end}", name

    def _release(self, action: ReleaseAction) -> tuple[str, str]:
        name = reservation_name(action.holder_id, prefix=self.config.reservation_prefix)
        if name not in self.reservations():
            return "no such reservation: nothing to release", name
        if self.config.dry_run:
            return f"dry-run: would delete reservation {name}", name
        try:
            self._scontrol("delete", f"ReservationName={name}")
        except SlurmRejectedError:
            if name in self.reservations():
                raise
        return "deleted reservation", name
