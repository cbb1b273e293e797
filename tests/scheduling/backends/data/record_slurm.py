"""Re-record the slurmrestd v0.0.38 answers the Slurm parser tests read (needs `scripts/slurm.sh start`).

    .venv/bin/python tests/scheduling/backends/data/record_slurm.py

Sets up one of each job state Berth maps (running, multi-node, pending, held after a requeue, completed,
failed, cancelled, plus a job that is not Berth's), drains n2, and saves the raw answers next to this file.
Also saves a refused submission and the answer while slurmctld is stopped.  Cancels what it made.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import requests

HERE = Path(__file__).parent
ROOT = HERE.parents[3]
URL = "http://127.0.0.1:46820/slurm/v0.0.38"


def token() -> str:
    argv = [str(ROOT / "scripts/slurm.sh"), "token"]
    out = subprocess.run(argv, capture_output=True, text=True, check=True)
    return out.stdout.strip()


HEADERS = {"X-SLURM-USER-NAME": "berth", "X-SLURM-USER-TOKEN": token()}


def submit(name: str, script: str, **job: object) -> int:
    body = {
        "script": "#!/bin/bash\n" + script + "\n",
        "job": {
            "name": name,
            "partition": "gpu",
            "current_working_directory": "/tmp",
            "standard_output": "/dev/null",
            "environment": {"PATH": "/usr/bin:/bin"},
            "time_limit": 10,
            **job,
        },
    }
    resp = requests.post(f"{URL}/job/submit", json=body, headers=HEADERS, timeout=20)
    data = resp.json()
    assert not data["errors"], data["errors"]
    return int(data["job_id"])


def save(name: str, text: str) -> None:
    (HERE / name).write_text(text if text.endswith("\n") else text + "\n")
    print("wrote", name)


def wait_state(job_id: int, state: str, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = requests.get(f"{URL}/job/{job_id}", headers=HEADERS, timeout=20).json()["jobs"][0]
        if job["job_state"] == state:
            return
        time.sleep(0.3)
    raise TimeoutError(f"job {job_id} never reached {state}")


def main() -> None:
    made = [
        submit("berth-done1", "true", nodelist="n1", gres="gpu:a100:1"),
        submit("berth-fail1", "exit 3", nodelist="n1", gres="gpu:a100:1"),
        submit("berth-run1", "sleep 60", nodelist="n3", gres="gpu:h100:2"),
        submit("berth-multi1", "sleep 60", nodelist="n3,n4", gres="gpu:h100:1"),
        submit("other-job", "sleep 60", nodelist="n4", gres="gpu:h100:1"),
        submit("berth-canc1", "sleep 60", nodelist="n1", gres="gpu:a100:1"),
        submit("berth-pre1", "sleep 60", nodelist="n1", gres="gpu:a100:2"),
    ]
    for job_id in made[2:]:
        wait_state(job_id, "RUNNING")
    made.append(submit("berth-pend1", "sleep 60", nodelist="n3", gres="gpu:h100:8"))
    requests.delete(f"{URL}/job/{made[5]}", headers=HEADERS, timeout=20)
    subprocess.run(["scontrol", "requeuehold", str(made[6])], check=True)
    subprocess.run(["scontrol", "update", "nodename=n2", "state=drain", "reason=recording"], check=True)
    wait_state(made[6], "PENDING")
    time.sleep(1)
    save("slurm_nodes.json", requests.get(f"{URL}/nodes", headers=HEADERS, timeout=20).text)
    save("slurm_jobs.json", requests.get(f"{URL}/jobs", headers=HEADERS, timeout=20).text)
    subprocess.run(["scontrol", "update", "nodename=n2", "state=resume"], check=True)
    bad = {"script": "#!/bin/bash\ntrue\n", "job": {"name": "x", "environment": {}, "no_such_key": 1}}
    resp = requests.post(f"{URL}/job/submit", json=bad, headers=HEADERS, timeout=20)
    save("slurm_submit_rejected.json", resp.text)
    for job_id in made:
        requests.delete(f"{URL}/job/{job_id}", headers=HEADERS, timeout=20)
    subprocess.run([str(ROOT / "scripts/slurm.sh"), "stop-controller"], check=True)
    try:
        save("slurm_jobs_controller_down.json", requests.get(f"{URL}/jobs", headers=HEADERS, timeout=30).text)
    finally:
        subprocess.run([str(ROOT / "scripts/slurm.sh"), "start-controller"], check=True)
    print(json.dumps({"slurm_job_ids": made}))


if __name__ == "__main__":
    main()
