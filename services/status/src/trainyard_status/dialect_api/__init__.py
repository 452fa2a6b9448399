"""Each dialect's own read API: a job's status in the shape that dialect's users know
(a DLC GetJob, an OpenPAI job status, a T9k resource with its status). A dialect module
exposes ``router(ctx: StatusContext) -> APIRouter`` and is listed in ROUTERS."""

from __future__ import annotations

from collections.abc import Callable

from fastapi import APIRouter

from . import dlc, k8s_resources, openpai, ti
from .context import StatusContext

ROUTERS: list[Callable[[StatusContext], APIRouter]] = [
    dlc.router,
    ti.router,
    openpai.router,
    k8s_resources.router,
]

__all__ = ["ROUTERS", "StatusContext"]
