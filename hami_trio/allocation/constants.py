"""The fixed paths of the allocation integration and Go's path canonicalisation.

How this works: HAMi-core looks for its lock files under ``/tmp/vgpulock`` and for the broker
socket in ``/tmp/vgpulock/hostpid``, and the device plugin finds the broker's directory on the
host at ``/var/run/hami/hostpid``; those paths are compiled into HAMi-core, so they are
constants, not settings.  Two mounts target the same path when their container paths are
equal after ``path.Clean(path.Join("/", p))``; :func:`go_clean` is Go's ``path.Clean``
exactly, not :func:`posixpath.normpath`, which keeps a leading ``//`` that Go (and so the
container runtime) drops.  Pure.  docs/allocation.md (The merge).
"""

from __future__ import annotations

__all__ = [
    "BROKER_CONTAINER_DIR",
    "BROKER_HOST_DIR",
    "LOCK_PARENT",
    "container_target",
    "go_clean",
]

#: The shared lock parent: the host directory prepared by ``prepare_lock_parent`` and the
#: container path of the writable mount every HAMi-core allocation gets.
LOCK_PARENT = "/tmp/vgpulock"

#: Where HAMi-core looks for the broker's socket directory inside the container.
BROKER_CONTAINER_DIR = "/tmp/vgpulock/hostpid"

#: The broker's socket directory on the host (the chart mounts it into the agent).
BROKER_HOST_DIR = "/var/run/hami/hostpid"


def go_clean(path: str) -> str:
    """Return the shortest path equivalent to ``path`` by Go's ``path.Clean`` rules.

    Applied repeatedly until nothing changes (Go's documented algorithm): collapse runs of
    slashes into one; drop each ``.`` element; drop each ``..`` element together with the
    non-``..`` element before it; drop ``..`` elements right after the root (``/..`` is
    ``/``).  A trailing slash is removed unless the result is ``/``, and an empty result
    becomes ``.``.  No file system is consulted: symlinks are not resolved.

    Args:
        path: any slash-separated path, absolute or relative.

    Returns:
        The cleaned path, e.g. ``go_clean("//tmp/./x/../vgpulock/") == "/tmp/vgpulock"``,
        ``go_clean("a/../../b") == "../b"``, ``go_clean("") == "."``.
    """
    rooted = path.startswith("/")
    stack: list[str] = []
    # How many leading ".." elements of a relative path are kept (they cannot be cancelled).
    kept_dotdots = 0
    for element in path.split("/"):
        if element in ("", "."):
            continue
        if element == "..":
            if len(stack) > kept_dotdots:
                stack.pop()
            elif not rooted:
                stack.append("..")
                kept_dotdots += 1
            # rooted: ".." at the root stays at the root.
            continue
        stack.append(element)
    body = "/".join(stack)
    if rooted:
        return "/" + body
    return body or "."


def container_target(container_path: str) -> str:
    """The path a mount's ``container_path`` really targets: ``go_clean(join("/", path))``.

    Go's ``path.Join("/", p)`` is ``Clean("/" + "/" + p)`` (or ``/`` for an empty ``p``), and
    extra leading slashes collapse, so this is ``go_clean("/" + p)``: always absolute.

    Args:
        container_path: a mount's container path as a device plugin wrote it.

    Returns:
        The canonical absolute path, e.g. ``container_target("tmp//vgpulock/.") ==
        "/tmp/vgpulock"`` and ``container_target("../../tmp/vgpulock") == "/tmp/vgpulock"``.
    """
    return go_clean("/" + container_path)
