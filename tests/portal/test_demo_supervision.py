"""scripts/demo.sh supervision: a crashed process is restarted with backoff, the others stay up,
its log is appended to (never emptied) and rotated above a size.

Runs the script's own launch/supervise functions (cut out of demo.sh) in bash on real processes.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _functions() -> str:
    text = (ROOT / "scripts" / "demo.sh").read_text()
    start = text.index("LOG_MAX_BYTES=")
    end = text.index("wait_for_web() {")
    return text[start:end]


def test_a_crashed_process_restarts_with_backoff_and_keeps_its_log(tmp_path):
    (tmp_path / "f.sh").write_text(_functions())
    (tmp_path / "crash.log").write_text("from before\n")
    (tmp_path / "big.log").write_text("x" * 2000)
    script = f"""
RUN={tmp_path}; DEMO_LOG_MAX_BYTES=1000; set -u
is_running() {{ local p="$RUN/$1.pid"; [ -s "$p" ] && kill -0 "$(cat "$p")" 2>/dev/null; }}
source {tmp_path}/f.sh
launch crash bash -c 'echo ran; exit 3'
launch steady sleep 30
launch big true
for i in $(seq 9); do sleep 1; is_running crash || supervise crash 2>/dev/null; done
is_running steady && echo steady-up
kill "$(cat $RUN/steady.pid)"
"""
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    assert "steady-up" in out.stdout, out.stderr
    log = (tmp_path / "crash.log").read_text()
    assert log.startswith("from before\n")  # appended, not emptied
    assert log.count("ran\n") >= 3  # started, restarted after 2 s, again after 4 s
    assert "restarting in 2 s" in log
    assert "restarting in 4 s" in log
    # A log above the limit was rotated when its process started, not cut.
    assert (tmp_path / "big.log.1").read_text() == "x" * 2000
