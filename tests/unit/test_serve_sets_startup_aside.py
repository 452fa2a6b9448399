"""A service sets what it made to start aside from the cyclic collector before it
serves (runtime.serve): a full collection walked all of it with the event loop
stopped, 40-240 ms every few seconds under load (bench/README.md)."""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path

from fastapi import FastAPI

from trainyard_common.config import Settings
from trainyard_common.runtime import serve


def test_what_was_made_before_serving_is_frozen_and_later_garbage_still_collected(
    tmp_path: Path,
) -> None:
    seen: dict[str, int] = {}

    class Cycle:
        def __init__(self) -> None:
            self.me = self

    async def worker(stop: asyncio.Event) -> None:
        seen["frozen"] = gc.get_freeze_count()
        Cycle()  # garbage in a cycle, made while serving
        seen["collected"] = gc.collect()
        stop.set()

    gc.unfreeze()
    try:
        asyncio.run(serve(Settings(service="t", data_dir=tmp_path, port=0), FastAPI(), [worker]))
        assert seen["frozen"] > 1000
        assert seen["collected"] >= 1
    finally:
        gc.unfreeze()
