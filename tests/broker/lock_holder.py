"""A hostile workload: flock every file it can open through its broker mount, and hold them.

Run as a separate process, as root: ``python lock_holder.py setup HOST_DIR`` builds the
workload's view and then re-executes itself as ``hold``:

1. ``setup`` moves into a private mount namespace (``unshare(CLONE_NEWNS)``, every mount made
   private: nothing reaches the machine), mounts a tmpfs on ``/tmp`` and bind-mounts
   ``HOST_DIR`` (the broker's host directory) **read-only** at ``/tmp/vgpulock/hostpid``, the
   device plugin's mount; then it execs ``setpriv --inh-caps=-all --bounding-set=-all`` to run
   ``hold`` as uid 0 with *no capability at all*: the weakest root a container can be, which
   is still the owner of the broker's root-owned files.
2. ``hold DIR`` (stdlib only) opens ``DIR`` itself and every entry in it (``O_RDONLY |
   O_NOFOLLOW | O_NONBLOCK``: a read-only mount refuses writes, not reads, and flock needs no
   write access) and takes ``flock(LOCK_EX)`` on each.  One it cannot lock at once (the
   running broker holds it) gets a thread that waits in a blocking ``flock`` - the attack
   waits for the agent's next exit.  It prints one JSON line ``{"cap_eff": <hex>, "held":
   [names], "waiting": [names], "refused": {name: reason}}``, then ``{"took": name}`` for each
   lock it gets later, and rescans ``DIR`` every 20 ms for new entries, until its stdin
   closes; then it releases everything and exits.
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import subprocess
import sys
import threading

MOUNT_POINT = "/tmp/vgpulock/hostpid"
_OUT = threading.Lock()


def setup(host_dir: str) -> None:
    """Build the workload's mount view, then exec ``hold`` without capabilities."""
    from hami_trio.demo.sandbox import bind_mount, enter_namespaces

    enter_namespaces(pid=False, mount=True)
    source = os.open(host_dir, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    # The tmpfs hides whatever lives under /tmp, which may be this checkout and its venv (CI
    # clones anywhere): keep the base interpreter (``hold`` needs only the standard library)
    # and this file's text from before the mount.
    python = os.path.realpath(sys.executable)
    with open(os.path.abspath(__file__), encoding="utf-8") as own:
        code = own.read()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755,size=1m", "tmpfs", "/tmp"], check=True)
    os.makedirs(MOUNT_POINT, mode=0o755)
    os.chmod(os.path.dirname(MOUNT_POINT), 0o1777)
    # Through /proc/self/fd: the host path itself is hidden under the tmpfs now.
    bind_mount(f"/proc/self/fd/{source}", MOUNT_POINT, read_only=True)
    os.close(source)
    drop = ["setpriv", "--inh-caps=-all", "--bounding-set=-all", "--"]
    os.execvp("setpriv", [*drop, python, "-I", "-c", code, "hold", MOUNT_POINT])


def _cap_eff() -> str:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("CapEff:"):
                return line.split()[1]
    raise RuntimeError("/proc/self/status has no CapEff line")


def _say(doc: dict[str, object]) -> None:
    with _OUT:
        print(json.dumps(doc), flush=True)


def _wait_for(fd: int, name: str) -> None:
    fcntl.flock(fd, fcntl.LOCK_EX)  # blocks until the holder (the broker) lets go
    _say({"took": name})


def hold(directory: str) -> int:
    seen: set[str] = set()
    fds: list[int] = []
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC

    def scan() -> tuple[list[str], list[str], dict[str, str]]:
        held: list[str] = []
        waiting: list[str] = []
        refused: dict[str, str] = {}
        for name in [".", *sorted(os.listdir(directory))]:
            if name in seen:
                continue
            seen.add(name)
            try:
                fd = os.open(os.path.join(directory, name), flags)
            except OSError as exc:
                refused[name] = f"open: {exc.strerror}"
                continue
            fds.append(fd)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                waiting.append(name)
                threading.Thread(target=_wait_for, args=(fd, name), daemon=True).start()
                continue
            except OSError as exc:
                refused[name] = f"flock: {exc.strerror}"
                continue
            held.append(name)
        return held, waiting, refused

    held, waiting, refused = scan()
    _say({"cap_eff": _cap_eff(), "held": held, "waiting": waiting, "refused": refused})
    while not select.select([sys.stdin], [], [], 0.02)[0]:
        for name in scan()[0]:
            _say({"took": name})
    sys.stdin.read()
    for fd in fds:
        os.close(fd)
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "setup":
        setup(sys.argv[2])
    sys.exit(hold(sys.argv[2]))
