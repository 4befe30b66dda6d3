"""The demo's agent: the real ``hami-trio run`` agent, in the demo's own process.

How this works: :func:`agent_argv` is the ``hami-trio run`` command line the demo stands for
(``--no-kubernetes``, the demo's paths and interval, ``/metrics`` on the loopback interface)
and :data:`AGENT_ENV` its environment (the broker switch).  :func:`serve_demo_agent` resolves
them with :func:`~hami_trio.agent.config.config_from_flags` (the ``run`` command's rules,
without its parser), checks the host like the command does and runs
:func:`~hami_trio.agent.service.serve_agent` in the demo's nursery, its log in a file of the
demo's root.  Why in-process, and the price: docs/demo.md (The agent).
"""

from __future__ import annotations

import logging
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, TextIO, cast

import trio

from hami_trio.agent.config import check_host, config_from_flags, flag_argv
from hami_trio.demo.runner import AgentSettings
from hami_trio.goparse import BROKER_SWITCH_ENV, BindAddress
from hami_trio.logs import configure_logging

if TYPE_CHECKING:
    from hami_trio.agent.service import AgentHandle

__all__ = [
    "AGENT_ENV",
    "DemoAgent",
    "agent_argv",
    "agent_command",
    "agent_flags",
    "serve_demo_agent",
]

logger = logging.getLogger(__name__)
#: The agent's environment: the broker's switch, and nothing from the caller's.
AGENT_ENV: Final = {BROKER_SWITCH_ENV: "1"}


def agent_flags(settings: AgentSettings) -> dict[str, str | bool]:
    """The demo agent's settings by name (:func:`~hami_trio.agent.config.config_from_flags`)."""
    paths = settings.paths
    return {
        "no_kubernetes": True,
        "hook_path": str(paths.hook_path),
        "broker_socket_path": str(paths.socket_path),
        "mig_lock_path": str(paths.mig_lock),
        "interval": f"{settings.interval:g}",
        "metrics_bind_address": str(settings.metrics_bind),
        "debug_bind_address": str(settings.debug_bind),
    }


def agent_argv(settings: AgentSettings) -> list[str]:
    """The ``hami-trio run`` arguments of the demo's agent (the subcommand included)."""
    return ["run", *flag_argv(agent_flags(settings))]


def agent_command(settings: AgentSettings) -> str:
    """The shell command that would start the same agent on its own."""
    env = " ".join(f"{key}={value}" for key, value in AGENT_ENV.items())
    return f"{env} hami-trio {shlex.join(agent_argv(settings))}"


def _url(address: BindAddress) -> str:
    host = address.host or "127.0.0.1"  # "" = every interface, the loopback included
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{address.port}/metrics"


@dataclass(frozen=True, slots=True)
class DemoAgent:
    """The running agent as the demo sees it.

    Attributes:
        metrics_url: where its ``/metrics`` is (the real port when port 0 was asked for).
        command: the equivalent ``hami-trio run`` command line.
        request_stop: drain and stop it (the broker removes its socket).
        debug_address: where its debug view listens (``hami-trio status --address``).
    """

    metrics_url: str
    command: str
    request_stop: Callable[[], None]
    debug_address: BindAddress | None = None


class _Relay:
    """Turns the agent's handle into a :class:`DemoAgent` for the demo's ``nursery.start``."""

    def __init__(self, settings: AgentSettings, outer: trio.TaskStatus[DemoAgent]) -> None:
        self._settings = settings
        self._outer = outer

    def started(self, value: Any = None) -> None:
        handle = cast("AgentHandle", value)
        self._outer.started(
            DemoAgent(
                _url(handle.metrics_address),
                agent_command(self._settings),
                handle.request_stop,
                handle.debug_address,
            )
        )


def _open_log(settings: AgentSettings) -> TextIO:
    return open(settings.log_file, "a", encoding="utf-8")  # closed by the caller


async def serve_demo_agent(
    settings: AgentSettings, *, task_status: trio.TaskStatus[DemoAgent] = trio.TASK_STATUS_IGNORED
) -> None:
    """Run the agent until :attr:`DemoAgent.request_stop`; report it once every task is ready.

    Raises:
        ConfigError: the resolved configuration is unusable (a path the agent refuses).
        HamiTrioError: a task of the agent could not start, or failed after the start (see
            :func:`~hami_trio.agent.service.serve_agent`).
    """
    from hami_trio.agent.service import serve_agent

    config = config_from_flags(agent_flags(settings), AGENT_ENV)
    check_host(config)
    log = _open_log(settings)
    try:
        configure_logging(config.log_format, config.log_level, stream=log)
        for warning in config.warnings:
            logger.warning("%s", warning)
        await serve_agent(config, task_status=_Relay(settings, task_status))
    finally:
        package = logging.getLogger("hami_trio")  # where configure_logging put its handler
        for handler in list(package.handlers):
            package.removeHandler(handler)
        log.close()
