"""The dead letters, for admins: what a service gave up on (its error, where it came
from, how many deliveries) and a replay that sends one back to that service's consumer
(``yard.replay.<durable>.…``), whose idempotent handlers finish what was half done."""

from __future__ import annotations

import base64
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Path, Query

from trainyard_common.auth import Identity
from trainyard_common.bus import DeadLetter, DeadLetters


def letter_view(letter: DeadLetter) -> dict[str, Any]:
    text = letter.data.decode("utf-8", "replace")
    return {
        "seq": letter.seq,
        "durable": letter.durable,
        "subject": letter.subject,
        "error": letter.error,
        "deliveries": letter.deliveries,
        "original_seq": letter.original_seq,
        # The message as it was (secrets of a spec are never in clear on the bus).
        "data": text if "\ufffd" not in text else None,
        "data_base64": base64.b64encode(letter.data).decode() if "\ufffd" in text else None,
    }


def router(letters: DeadLetters, current: Any) -> APIRouter:
    api = APIRouter()

    def admin_only(identity: Identity) -> None:
        if not identity.admin:
            raise HTTPException(403, "only an admin can see or replay dead letters")

    @api.get("/v1/admin/dead-letters")
    async def list_dead_letters(
        identity: Identity = Depends(current), limit: int = Query(100, ge=1, le=1000)
    ) -> dict[str, Any]:
        admin_only(identity)
        items = [letter_view(letter) for letter in await letters.list(limit)]
        return {"items": items, "count": len(items)}

    @api.post("/v1/admin/dead-letters/{seq}/replay", status_code=202)
    async def replay_dead_letter(
        seq: int = Path(ge=1, le=2**63 - 1), identity: Identity = Depends(current)
    ) -> dict[str, Any]:
        admin_only(identity)
        letter = await letters.replay(seq)
        if letter is None:
            raise HTTPException(404, f"no dead letter {seq} (replayed already?)")
        return {"replayed": seq, "durable": letter.durable, "subject": letter.subject}

    return api
