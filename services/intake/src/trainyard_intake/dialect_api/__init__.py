"""Each dialect's own API for submitting and controlling jobs, at the paths and in the
shapes that dialect's users already call (the gateway sends writes here). A dialect
module exposes ``router(ctx: IntakeContext) -> APIRouter`` and is listed in ROUTERS."""

from __future__ import annotations

from collections.abc import Callable

from fastapi import APIRouter

from . import dlc, k8s_resources, openpai, openpai_accounts, ti
from .context import IntakeContext

ROUTERS: list[Callable[[IntakeContext], APIRouter]] = [
    dlc.router,
    ti.router,
    openpai.router,
    openpai_accounts.router,
    k8s_resources.router,
]

__all__ = ["ROUTERS", "IntakeContext"]
