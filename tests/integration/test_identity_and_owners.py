"""Token store, intake's owner registry and name claims against both real stores, and the
same contract run against the in-memory registry so the fake cannot drift."""

from __future__ import annotations

import uuid

import pytest

from trainyard_common.auth import (
    AccessKeyStore,
    Identity,
    TokenStore,
    parse_access_keys,
    tokens_collection,
)
from trainyard_common.events import JobResourceChanged, PauseJob
from trainyard_intake.adapters.names import DocNameClaims, InMemoryNameClaims
from trainyard_intake.adapters.owners import DocOwnerRegistry, InMemoryOwnerRegistry


@pytest.fixture
async def client(doc_client):
    return doc_client


async def test_tokens_issue_resolve_and_refuse(client, db_prefix: str) -> None:
    store = TokenStore(tokens_collection(client, db_prefix), admin_token="bootstrap-admin-xyz")
    assert await store.resolve("bootstrap-admin-xyz") == Identity("admin", admin=True)
    token = await store.issue("alice")
    assert await store.resolve(token) == Identity("alice", admin=False)
    # Another process with the same store (another service) resolves it too.
    other = TokenStore(tokens_collection(client, db_prefix), admin_token=None)
    assert await other.resolve(token) == Identity("alice")
    assert await other.resolve("bootstrap-admin-xyz") is None
    assert await store.resolve("guess") is None
    assert await store.resolve("\N{GRINNING FACE}") is None  # not ASCII: refused, no error
    # Only a hash is stored.
    doc = await tokens_collection(client, db_prefix).find_one({"user": "alice"})
    assert token not in str(doc)
    with pytest.raises(ValueError):
        await store.issue("bad~name")


async def test_tokens_list_their_users_and_revoke(client, db_prefix: str) -> None:
    store = TokenStore(tokens_collection(client, db_prefix), admin_token="bootstrap-admin-xyz")
    first = await store.issue("bob")
    await store.issue("bob")
    await store.issue("carol", admin=True)
    assert await store.users() == {"admin": True, "bob": False, "carol": True}
    assert (await store.count("bob"), await store.count("nobody")) == (2, 0)
    other = TokenStore(tokens_collection(client, db_prefix), admin_token=None)
    assert await other.resolve(first) == Identity("bob")
    assert await store.revoke(first)
    assert await store.resolve(first) is None  # here at once
    assert not await store.revoke(first)
    assert not await store.revoke("bootstrap-admin-xyz")  # not in the store
    assert await store.users() == {"admin": True, "bob": False, "carol": True}  # bob has one


async def test_every_credential_of_a_user_is_revoked_at_once(client, db_prefix: str) -> None:
    store = TokenStore(tokens_collection(client, db_prefix), admin_token="bootstrap-admin-xyz")
    keys = AccessKeyStore.beside(store, environ={})
    dave = [await store.issue("dave") for _ in range(3)]
    kept = await store.issue("erin")
    key = await keys.issue("dave")
    other_key = await keys.issue("erin")
    assert all([await store.resolve(token) == Identity("dave") for token in dave])  # cached
    assert await store.revoke_user("dave") == 3
    assert [await store.resolve(token) for token in dave] == [None, None, None]
    assert await keys.revoke_user("dave") == 1
    assert await keys.lookup(key.id) is None
    assert await store.resolve(kept) == Identity("erin")  # another user's stay
    assert await keys.lookup(other_key.id) == other_key
    assert await store.revoke_user("dave") == 0


async def test_the_token_cache_lets_expired_answers_go(client, db_prefix: str) -> None:
    # Each token ever presented stayed in every service's cache (revoked ones too).
    store = TokenStore(tokens_collection(client, db_prefix), admin_token=None)
    store.CACHE_S, store._sweep_at = 0.0, 3  # every answer expired at once
    tokens = [await store.issue(f"u{i}") for i in range(6)]
    for token in tokens:
        assert await store.resolve(token) is not None
    assert len(store._cache) <= 3
    # Answers all still good are kept, and not swept again before the cache has doubled
    # (each sweep a pass over all of it, at every miss otherwise).
    kept = TokenStore(tokens_collection(client, db_prefix), admin_token=None)
    kept.CACHE_SWEEP = kept._sweep_at = 2
    for token in tokens:
        assert await kept.resolve(token) is not None
    assert len(kept._cache) == 6 and kept._sweep_at == 8


async def test_no_credential_acts_as_the_bootstrap_admin_without_its_rights(
    client, db_prefix: str
) -> None:
    # can_see compares names: a plain "admin" would see every job the bootstrap made.
    store = TokenStore(tokens_collection(client, db_prefix), admin_token="bootstrap-admin-xyz")
    with pytest.raises(ValueError, match="bootstrap admin"):
        await store.issue("admin")
    # Minted by the bootstrap admin for itself (OpenPAI's application token): its own.
    assert await store.resolve(await store.issue("admin", own=True)) == Identity("admin")
    assert await store.resolve(await store.issue("admin", admin=True)) == Identity("admin", True)
    with pytest.raises(ValueError, match="bootstrap admin"):
        await AccessKeyStore.beside(store, environ={}).issue("admin")
    # The operator's own configuration may name it (an upgrade must not stop on it).
    assert parse_access_keys("LTAI2:s2:admin")["LTAI2"].user == "admin"


@pytest.fixture(params=["store", "memory"])
async def owners(request, client, db_prefix: str):
    if request.param == "store":
        return DocOwnerRegistry(client[f"{db_prefix}_intake"]["owners"])
    return InMemoryOwnerRegistry()


async def test_owner_registry_contract(owners) -> None:
    job = uuid.uuid4().hex
    assert await owners.owner(job) is None
    assert await owners.record(job, "alice") is True
    assert await owners.record(job, "mallory") is False  # the first owner stays
    assert await owners.owner(job) == "alice"
    assert not await owners.rejected(job)
    await owners.mark_rejected(job)
    await owners.mark_rejected(job)  # delivered again
    assert await owners.rejected(job) and await owners.entry(job) == ("alice", None)
    assert not await owners.rejected(uuid.uuid4().hex)


async def test_owner_registry_finds_every_job_submitted_under_a_dialect_name(owners) -> None:
    first, second, other = (uuid.uuid4().hex for _ in range(3))
    key = f"ns/genericjobs/{uuid.uuid4().hex[:6]}"
    assert await owners.record(first, "alice", key)
    assert await owners.record(second, "alice", key)  # a resubmission under the same name
    assert await owners.record(other, "bob", key)  # another user's job of that name
    assert sorted(await owners.job_ids("alice", key)) == sorted([first, second])
    assert await owners.job_ids("alice", "ns/genericjobs/none") == []


@pytest.fixture(params=["store", "memory"])
async def names(request, client, db_prefix: str):
    if request.param == "store":
        claims = DocNameClaims(client[f"{db_prefix}_intake"]["names"])
        await claims.ensure_indexes()
        return claims
    return InMemoryNameClaims()


async def test_name_claims_contract(names) -> None:
    first, second = uuid.uuid4().hex, uuid.uuid4().hex
    ns = f"ns-{uuid.uuid4().hex[:6]}"
    key = f"{ns}/pytorchjobs/a"
    resource = {"metadata": {"name": "a", "labels": {"nvidia.com/x": "1"}}}
    assert await names.claim("alice", key, first, resource) == first
    assert await names.claim("alice", key, first, resource) == first  # a retry finds its own
    assert await names.claim("alice", key, second, None) == first  # the name is taken
    assert await names.claim("bob", key, second, None) == second  # per user
    held = await names.get("alice", key)
    assert held is not None and (held.job_id, held.resource, held.generation) == (
        first,
        resource,
        1,
    )
    # Only the holder changes or frees it.
    assert not await names.update("alice", key, second, {"x": 1}, 2, revision=0, pending=())
    assert await names.update("alice", key, first, {"x": 1}, 2, revision=0, pending=())
    assert (await names.get("alice", key)).generation == 2
    await names.claim("alice", f"{ns}/pytorchjobs/b", second, None)
    await names.claim("alice", f"{ns}/tfjobs/c", second, None)
    assert [c.key for c in await names.within("alice", f"{ns}/pytorchjobs")] == [
        key,
        f"{ns}/pytorchjobs/b",
    ]
    assert not await names.release("alice", key, second)
    assert await names.release("alice", key, first)
    assert await names.get("alice", key) is None
    assert await names.claim("alice", key, second, None) == second  # free again


async def test_a_claims_change_keeps_what_it_has_to_send_until_sent(names) -> None:
    job = uuid.uuid4().hex
    key = f"ns-{uuid.uuid4().hex[:6]}/pytorchjobs/a"
    await names.claim("alice", key, job, {"spec": {}})
    held = await names.get("alice", key)
    assert (held.revision, held.pending) == (0, ())
    pause = PauseJob(job_id=job, requested_by="alice", reason="paused")
    changed = JobResourceChanged(job_id=job, resource={"a.b/c": 1}, generation=2)
    assert await names.update("alice", key, job, {"v": 1}, 2, revision=0, pending=[pause, changed])
    # A change made from what it read before that one is refused: it must read again.
    assert not await names.update("alice", key, job, {"v": 2}, 2, revision=0, pending=[])
    held = await names.get("alice", key)
    assert (held.resource, held.revision, held.pending) == ({"v": 1}, 1, (pause, changed))
    assert not await names.sent("alice", key, job, 0, [pause, changed])  # moved on since
    assert (await names.get("alice", key)).pending == (pause, changed)
    # The pause went out (the messages as read back from the store: they compare).
    read = (await names.get("alice", key)).pending
    assert await names.sent("alice", key, job, 1, read, [changed])
    assert (await names.get("alice", key)).pending == (changed,)
    # Found in review: a writer whose answer comes late (it failed after the pause, and
    # another sent everything meanwhile) must not bring back what was sent since.
    assert await names.sent("alice", key, job, 1, [changed])
    assert not await names.sent("alice", key, job, 1, [pause, changed], [changed])
    held = await names.get("alice", key)
    assert (held.resource, held.revision, held.pending) == ({"v": 1}, 1, ())


async def test_a_claim_stored_without_a_revision_is_at_revision_zero(client, db_prefix) -> None:
    # As an earlier version stored it: no revision, no pending messages.
    collection = client[f"{db_prefix}_intake"]["names"]
    claims = DocNameClaims(collection)
    await collection.insert_one(
        {"_id": "alice\nns/tfjobs/t", "user": "alice", "key": "ns/tfjobs/t", "scope": "ns/tfjobs",
         "job_id": "j", "resource_json": "{}", "generation": 3}
    )  # fmt: skip
    held = await claims.get("alice", "ns/tfjobs/t")
    assert (held.generation, held.revision, held.pending) == (3, 0, ())
    assert await claims.update("alice", "ns/tfjobs/t", "j", {"v": 1}, 3, revision=0, pending=())
    assert (await claims.get("alice", "ns/tfjobs/t")).revision == 1


async def test_a_token_revoked_elsewhere_cannot_make_a_credential(client, db_prefix: str) -> None:
    # Two intake replicas: bob's token cached on one (for CACHE_S) was revoked on the
    # other, and the first minted bob a new token on it, which outlived the revocation
    # (found by an audit of authorization).
    import httpx

    from trainyard_intake.adapters.owners import InMemoryOwnerRegistry
    from trainyard_intake.app import create_app
    from trainyard_intake.handlers import Deps

    replica_a = TokenStore(tokens_collection(client, db_prefix), admin_token=None)
    replica_b = TokenStore(tokens_collection(client, db_prefix), admin_token=None)
    token = await replica_a.issue("bob")
    assert await replica_b.resolve(token) == Identity("bob")  # cached on b
    assert await replica_a.revoke_user("bob") == 1
    assert await replica_b.resolve(token) == Identity("bob")  # b's cache: within CACHE_S
    assert await replica_b.resolve(token, fresh=True) is None

    async def publish(event: object) -> int:
        return 1

    app = create_app(Deps(publish=publish, owners=InMemoryOwnerRegistry()), replica_b)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://intake",
        headers={"Authorization": f"Bearer {token}"},
    ) as http:  # fmt: skip
        minted = await http.post("/api/v2/tokens/application")
        assert minted.status_code == 401, minted.text
        # What only reads may still answer from the cache, as documented.
        assert (await http.get("/api/v2/tokens")).status_code == 200
    assert await replica_a.count("bob") == 0


async def test_a_token_minted_while_a_user_is_revoked_is_revoked_too(
    client, db_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainyard_common import auth

    store = TokenStore(tokens_collection(client, db_prefix), admin_token=None)
    minter = TokenStore(tokens_collection(client, db_prefix), admin_token=None)
    await store.issue("frank")
    delete_all = auth._delete_all
    late: list[str] = []

    async def minted_meanwhile(collection, user: str) -> int:  # type: ignore[no-untyped-def]
        deleted = await delete_all(collection, user)
        if not late:  # another replica's check passed just before the first pass
            late.append(await minter.issue("frank", own=True))
        return deleted

    monkeypatch.setattr(auth, "_delete_all", minted_meanwhile)
    assert await store.revoke_user("frank") == 2
    assert await store.count("frank") == 0 and await store.resolve(late[0], fresh=True) is None
