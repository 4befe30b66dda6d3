"""``hami-trio prepare-lock-dir`` and ``hami-trio allocate``: integration for Go plugins.

How this works: HAMi's device plugin is written in Go and cannot import this package, but
it can run a command.  ``prepare-lock-dir [PATH]`` runs ``prepare_lock_parent`` (``--broker``
or ``LIBVGPU_HOSTPID_BROKER=1``: the ``hostpid`` mount point too, made immutable; ``--repair``:
the operator's explicit recovery): exit 0 and no output when it is safe (one warning line on
stderr when the flag cannot be set), else one line with the reason and the recovery command
and exit 1.  ``allocate`` is ``allocate()`` as a filter:
one ContainerAllocateResponse as JSON on stdin, the merged one on stdout; nothing is written
on a refusal (exit 1) or on malformed input (exit 2).  docs/allocation.md (A Go device
plugin, Repair).
"""

from __future__ import annotations

import argparse
import os
import sys

from hami_trio.allocation.constants import BROKER_HOST_DIR, LOCK_PARENT
from hami_trio.allocation.integration import allocate
from hami_trio.allocation.lockdir import MOUNT_POINT_NAME, prepare_lock_parent
from hami_trio.allocation.response import ContainerAllocateResponse
from hami_trio.errors import ConfigError
from hami_trio.goparse import BROKER_SWITCH_ENV, broker_switch_from_env

__all__ = ["register"]

# A response is a few kilobytes; anything this large is not one.
_MAX_INPUT = 4 * 1024 * 1024


def _uid(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a numeric UID")
    return int(text)


def _cmd_prepare_lock_dir(args: argparse.Namespace) -> int:
    broker = args.broker or broker_switch_from_env(os.environ)
    prepared = prepare_lock_parent(args.path, args.owner, broker=broker, repair=args.repair)
    if args.repair:
        what = f", {MOUNT_POINT_NAME} a directory of UID {args.owner}, mode 0755" if broker else ""
        sys.stdout.write(
            f"{prepared}: repaired: a directory of UID {args.owner}, mode 1777{what}\n"
        )
    return 0


def _cmd_allocate(args: argparse.Namespace) -> int:
    data = sys.stdin.buffer.read(_MAX_INPUT + 1)
    if len(data) > _MAX_INPUT:
        raise ConfigError(f"stdin: response larger than {_MAX_INPUT} bytes")
    response = ContainerAllocateResponse.from_json(data)
    merged = allocate(
        response,
        broker_enabled=broker_switch_from_env(os.environ),
        lock_parent=args.lock_parent,
        owner=args.owner,
        broker_host_dir=args.broker_host_dir,
    )
    sys.stdout.write(merged.to_json() + "\n")
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``prepare-lock-dir`` and ``allocate`` to the ``hami-trio`` command line."""
    prep = subparsers.add_parser(
        "prepare-lock-dir",
        help="create or repair the lock parent (/tmp/vgpulock) as root-owned, mode 01777",
        description="Prepare the shared lock parent safely (descriptor-based, no symlinks, "
        "trusted owner, exact mode 01777). Exit 0 when done, 1 with the reason when refused.",
    )
    prep.add_argument(
        "path", nargs="?", default=LOCK_PARENT, metavar="PATH", help=f"default {LOCK_PARENT}"
    )
    prep.add_argument(
        "--owner",
        type=_uid,
        default=0,
        metavar="UID",
        help="trusted UID of the directory and its parent (0)",
    )
    prep.add_argument(
        "--broker",
        action="store_true",
        help="the host PID broker is on: also make the nested mount point PATH/hostpid a "
        "directory of the trusted UID, mode 0755, immutable (chattr +i; a warning on stderr "
        f"where the filesystem cannot) (default: on when {BROKER_SWITCH_ENV}=1)",
    )
    prep.add_argument(
        "--repair",
        action="store_true",
        help="operator recovery: give a directory another UID took over back to the trusted "
        "UID (fchown/fchmod on the opened directory) and, with the broker on, remove a "
        "symlink or file planted at PATH/hostpid; never follows a symlink",
    )
    prep.set_defaults(func=_cmd_prepare_lock_dir)

    alloc = subparsers.add_parser(
        "allocate",
        help="prepare the lock parent and merge broker mounts/env into a response (JSON filter)",
        description="Read a kubelet ContainerAllocateResponse as JSON on stdin, prepare the lock "
        "parent, apply the host PID broker mounts and env (switch: "
        f"{BROKER_SWITCH_ENV}=1 in this command's environment) and write the result on stdout.",
    )
    alloc.add_argument(
        "--lock-parent", default=LOCK_PARENT, metavar="DIR", help=f"default {LOCK_PARENT}"
    )
    alloc.add_argument("--owner", type=_uid, default=0, help="trusted UID of the lock parent (0)")
    alloc.add_argument(
        "--broker-host-dir",
        default=BROKER_HOST_DIR,
        metavar="DIR",
        help=f"default {BROKER_HOST_DIR}",
    )
    alloc.set_defaults(func=_cmd_allocate)
