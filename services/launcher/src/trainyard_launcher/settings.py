"""The launcher's settings: every ``YARD_*`` variable it reads, parsed in one place at
start. A bad value stops the service with a message naming the variable."""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass

from trainyard_common.config import SettingError, choice_setting, number_setting

from .adapters.uids import DEFAULT_BASE
from .domain.failure import BACKOFF_BASE_S
from .logs import DEFAULT_MAX_BYTES

BACKENDS = ("local", "kubernetes")
ISOLATION_MODES = ("auto", "on", "off")


@dataclass(frozen=True)
class LauncherSettings:
    # YARD_LAUNCHER: processes on this machine, or pods on Kubernetes.
    backend: str = "local"
    # YARD_CGROUP_ROOT: where task cgroups go (None: found from /proc/self/cgroup).
    cgroup_root: str | None = None
    # YARD_LOG_MAX_BYTES: each task log stream's cap (0: none).
    log_max_bytes: int = DEFAULT_MAX_BYTES
    # YARD_PIP_ARGS: extra pip arguments for a job's pip_packages (an index, a proxy).
    pip_args: tuple[str, ...] = ()
    # YARD_TASK_ISOLATION: auto (each user's own uid when the launcher is root), on, off.
    task_isolation: str = "auto"
    # YARD_TASK_UID_BASE: the first uid given to a platform user's tasks.
    task_uid_base: int = DEFAULT_BASE
    # YARD_DEFAULT_FS_URI: the file system a job's relative paths mean (DLC, T9k).
    default_fs_uri: str = ""
    # YARD_LAUNCHER_KILL_GRACE_S: SIGTERM, then this long, then SIGKILL.
    kill_grace_s: float = 10.0
    # YARD_LAUNCHER_MINUTE_S: seconds in a minute of max_running_minutes (tests shorten it).
    minute_s: float = 60.0
    # YARD_RETRY_BACKOFF_S: the first wait between attempts (doubling per attempt).
    retry_backoff_s: float = BACKOFF_BASE_S
    # YARD_START_DEADLINE_S: every task must start its command this soon after placement
    # (0: no deadline).
    start_deadline_s: float = 600.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> LauncherSettings:
        env = os.environ if env is None else env
        try:
            pip_args = tuple(shlex.split(env.get("YARD_PIP_ARGS", "")))
        except ValueError as exc:
            raise SettingError(f"YARD_PIP_ARGS: {exc}") from None
        return cls(
            backend=choice_setting(env, "YARD_LAUNCHER", "local", BACKENDS),
            cgroup_root=env.get("YARD_CGROUP_ROOT") or None,
            log_max_bytes=int(
                number_setting(env, "YARD_LOG_MAX_BYTES", DEFAULT_MAX_BYTES, whole=True)
            ),
            pip_args=pip_args,
            task_isolation=choice_setting(env, "YARD_TASK_ISOLATION", "auto", ISOLATION_MODES),
            task_uid_base=int(
                number_setting(env, "YARD_TASK_UID_BASE", DEFAULT_BASE, whole=True, minimum=1000)
            ),
            default_fs_uri=env.get("YARD_DEFAULT_FS_URI", ""),
            kill_grace_s=number_setting(env, "YARD_LAUNCHER_KILL_GRACE_S", 10.0),
            minute_s=number_setting(env, "YARD_LAUNCHER_MINUTE_S", 60.0, above=True),
            retry_backoff_s=number_setting(env, "YARD_RETRY_BACKOFF_S", BACKOFF_BASE_S),
            start_deadline_s=number_setting(env, "YARD_START_DEADLINE_S", 600.0),
        )
