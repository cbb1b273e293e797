"""Where a Slurm job's output is and how much of it to read (Slurm's filename patterns, exit codes)."""

from __future__ import annotations

import os
from typing import Any

from scheduling.backends.base import (
    BackendError,
    tail,
)

# Bytes read from the end of an output file: the tail of a huge log costs no more than this.
_OUTPUT_READ_BYTES = 256 * 1024


def expand_output_path(pattern: str, *, job_ref: str, name: str, user: str, working_directory: str) -> str:
    """Slurm's output filename pattern (``%j``, ``%x``, ``%u``, ``%%``) for one job, made absolute."""
    out = []
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "%" and i + 1 < len(pattern):
            code = pattern[i + 1]
            out.append(
                {"j": job_ref, "J": job_ref, "A": job_ref, "x": name, "u": user, "%": "%"}.get(
                    code, "%" + code
                )
            )
            i += 2
            continue
        out.append(ch)
        i += 1
    path = "".join(out)
    if not path.startswith("/"):
        path = working_directory.rstrip("/") + "/" + path
    return path


def exit_code_of(raw: Any) -> int | None:
    """A job's exit code from slurmrestd's wait status (v0.0.38: exit code << 8 | signal);
    a job killed by a signal gets 128 + the signal, as shells report it."""
    if isinstance(raw, dict):  # newer plugins: {"return_code": n, "signal": {...}}
        raw = raw.get("return_code")
    if isinstance(raw, bool) or not isinstance(raw, int):
        return None
    status = int(raw)
    if status & 0x7F:
        return 128 + (status & 0x7F)
    return status >> 8


def read_tail(path: str, *, lines: int) -> tuple[str, bool] | None:
    """The last ``lines`` lines of a file (reading at most its last 256 KiB), None if it is absent."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - _OUTPUT_READ_BYTES))
            data = fh.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise BackendError(f"read {path}: {exc}") from exc
    text, cut = tail(data.decode("utf-8", errors="replace"), lines)
    return text, cut or size > _OUTPUT_READ_BYTES
