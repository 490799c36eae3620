"""Runs a LocalProcessJob's command and writes how it ended (run by path: imports nothing of treadle).

    python _wrapper.py STATE_DIR -- ARGV...

Started in a session of its own by `LocalProcessJob.submit`; the command runs in the same
process group. Writes `pid` (the command's pid) when it starts and `exit` (JSON: exit_code,
signal, cancelled) when it ends, each atomically (a temporary file renamed). SIGTERM (a cancel)
is passed to the command, which is still waited for, so its pid is gone once `exit` exists.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys


def _write(directory: str, name: str, text: str) -> None:
    tmp = os.path.join(directory, f".{name}.tmp")
    with open(tmp, "w") as out:
        out.write(text)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, os.path.join(directory, name))


def main() -> int:
    directory, separator, argv = sys.argv[1], sys.argv[2], sys.argv[3:]
    if separator != "--" or not argv:
        _write(directory, "exit", json.dumps({"exit_code": 2, "error": "usage: _wrapper.py DIR -- ARGV..."}))
        return 2
    cancelled = False

    def on_term(_signum: int, _frame: object) -> None:
        nonlocal cancelled
        cancelled = True

    signal.signal(signal.SIGTERM, on_term)
    try:
        with (
            open(os.path.join(directory, "stdout"), "wb") as out,
            open(os.path.join(directory, "stderr"), "wb") as err,
        ):
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err)
    except OSError as exc:
        _write(directory, "exit", json.dumps({"exit_code": 127, "error": f"{type(exc).__name__}: {exc}"}))
        return 127
    _write(directory, "pid", str(proc.pid))
    if cancelled:  # a cancel came before the command existed: it never gets to work
        proc.terminate()
    code = proc.wait()
    result = {"exit_code": code if code >= 0 else 128 - code, "signal": -code if code < 0 else None}
    _write(directory, "exit", json.dumps({**result, "cancelled": cancelled}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
