"""Run ``hami-trio hostpid`` as uid 65534 inside the sandbox (started as root).

uid 65534 cannot read the virtual environment under /root, so this child imports everything
first (the CLI parser imports every command module), then drops to 65534 (groups, gid, uid),
proves it cannot go back, and only then does the ready/go handshake of
tests/clients/harness.py and runs the command with the arguments it was given::

    python py_client_child.py [hostpid options...]

Its exit status and stdout are the CLI's: the PID, or the reason name with exit 1.  It adds
``client_elapsed=SECONDS`` on stderr: the time of the CLI call alone, without the
interpreter's exit, which the timing tests use.
"""

from __future__ import annotations

import os
import sys
import time

from hami_trio.cli.main import build_parser, main

NOBODY = 65534


def drop_privileges() -> None:
    """Become uid/gid 65534 with no supplementary groups, irreversibly."""
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)
    try:
        os.setuid(0)
    except PermissionError:
        return
    raise SystemExit("py_client_child: could regain root after dropping privileges")


if __name__ == "__main__":
    build_parser()  # import every command module while we can still read the venv
    drop_privileges()
    print("ready", flush=True)
    sys.stdin.readline()
    start = time.monotonic()
    status = main(["hostpid", *sys.argv[1:]])
    # The interpreter's own exit is not the client's doing; report the query's time.
    print(f"client_elapsed={time.monotonic() - start:.6f}", file=sys.stderr)
    sys.exit(status)
