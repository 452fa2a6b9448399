"""The web console in a real browser (Debian's Chromium driven by Playwright) against
the whole platform: sign in, submit through the form (with a dry run whose error shows
beside its field), watch the job succeed in the live list, open its page and its log,
and the cluster page. Screenshots of each page go to build/test-artifacts/console/."""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Locator, expect

from trainyard_stack.platform import Platform

from .conftest import Api, unique

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = (
    Path(os.environ.get("YARD_TEST_ARTIFACTS", ROOT / "build" / "test-artifacts")) / "console"
)
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (make setup installs Debian's as root)"
)

LAPTOP = {"width": 1366, "height": 768}


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield browser
        browser.close()


@pytest.fixture
def page(browser, platform: Platform):  # type: ignore[no-untyped-def]
    context = browser.new_context(viewport=LAPTOP, base_url=platform.url)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))

    def console(msg) -> None:  # type: ignore[no-untyped-def]
        # An answer of 4xx (a refused token, another user's job) is the browser's to
        # report and the page's to show: not an error of the page itself.
        if msg.type == "error" and "the server responded with a status of 4" not in msg.text:
            errors.append(msg.text)

    page.on("console", console)
    yield page
    context.close()
    # No script error and nothing the CSP refused on any page the test saw.
    assert errors == [], errors


def sign_in(page, token: str) -> None:  # type: ignore[no-untyped-def]
    page.goto("/")
    page.get_by_label("Access token").fill(token)
    page.get_by_role("button", name="Sign in").click()
    page.get_by_role("heading", name="Jobs").wait_for()


def test_the_console_is_served_with_headers_that_keep_it_to_itself(platform: Platform) -> None:
    home = httpx.get(f"{platform.url}/", follow_redirects=True)
    assert home.status_code == 200 and "<title>Trainyard</title>" in home.text
    # The console's own name without its slash leads there too.
    bare = httpx.get(f"{platform.url}/console")
    assert bare.status_code == 302 and bare.headers["location"] == "/console/"
    policy = home.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
    assert home.headers["x-content-type-options"] == "nosniff"
    script = httpx.get(f"{platform.url}/console/app.js")
    assert script.status_code == 200 and "javascript" in script.headers["content-type"]
    # The API behind it still answers as before.
    assert httpx.get(f"{platform.url}/v1/me").status_code == 401


def test_a_wrong_token_is_refused_with_a_message(page) -> None:  # type: ignore[no-untyped-def]
    page.goto("/")
    page.get_by_label("Access token").fill("not-a-token")
    page.get_by_role("button", name="Sign in").click()
    page.get_by_text("That token is not valid.").wait_for()


def test_submit_through_the_form_watch_it_succeed_and_read_its_log(
    page,
    platform: Platform,
    api: Api,  # type: ignore[no-untyped-def]
) -> None:
    sign_in(page, platform.token)
    page.screenshot(path=str(ARTIFACTS / "jobs.png"), full_page=True)

    page.get_by_role("link", name="Submit").click()
    page.get_by_role("heading", name="Submit a job").wait_for()
    name = unique("console")
    page.get_by_label("Job name").fill(name)
    page.get_by_label("Command").fill("echo hello from the console")
    # A dry run first, with a memory too small: the error is shown beside its field.
    page.get_by_label("Memory (MB)").fill("1")
    page.get_by_role("button", name="Check (dry run)").click()
    memory = page.get_by_label("Memory (MB)")
    error = page.locator(".field-error").first
    error.wait_for()
    assert "$.roles[0].resources.memory_mb" in error.inner_text()
    assert memory.get_attribute("aria-invalid") == "true"
    page.screenshot(path=str(ARTIFACTS / "submit-error.png"), full_page=True)
    memory.fill("256")
    page.get_by_role("button", name="Submit", exact=True).click()

    # The job's page, live: it turns SUCCEEDED without a reload.
    page.get_by_role("heading", name=name).wait_for()
    job_id = page.url.rsplit("/", 1)[-1]
    page.locator(".card .state.SUCCEEDED").wait_for(timeout=60_000)
    assert api.job(job_id)["state"] == "SUCCEEDED"
    page.get_by_role("button", name="Show log").click()
    page.get_by_label("Task log").get_by_text("hello from the console").wait_for()
    page.get_by_text("JobFinished").first.wait_for()
    page.screenshot(path=str(ARTIFACTS / "job.png"), full_page=True)

    # The list shows it, and a job submitted meanwhile appears and goes on by itself.
    page.get_by_role("link", name="Jobs").click()
    row = page.locator(f'tr[data-job="{job_id}"]')
    row.locator(".state.SUCCEEDED").wait_for()
    other = api.submit(
        {
            "name": unique("live"),
            "roles": [
                {"name": "w", "command": "sleep 1", "resources": {"cpu": 1, "memory_mb": 128}}
            ],
        }
    )
    page.locator(f'tr[data-job="{other}"] .state.SUCCEEDED').wait_for(timeout=60_000)

    # Filters: by name prefix, and by state.
    page.get_by_label("Name starts with").fill(name)
    page.get_by_role("button", name="Filter").click()
    page.wait_for_url(f"**name={name}*")
    # Only that job, once the filtered page has loaded (Playwright retries the count).
    expect(page.locator("tbody tr[data-job]")).to_have_count(1)
    expect(page.locator(f'tr[data-job="{job_id}"]')).to_have_count(1)


def test_the_cluster_page_shows_nodes_gpus_and_queues(page, platform: Platform) -> None:  # type: ignore[no-untyped-def]
    sign_in(page, platform.token)
    page.get_by_role("link", name="Cluster").click()
    page.get_by_role("heading", name="Nodes").wait_for()
    page.get_by_role("cell", name="node-gpu (TITANX)").wait_for()
    assert page.locator(".gpu").count() == 2  # node-gpu's two GPUs
    figures = page.locator("#figures")
    figures.get_by_text("GPUs in use").wait_for()
    assert "of 2" in figures.inner_text() and "Jobs succeeded" in figures.inner_text()
    page.get_by_role("link", name="default").wait_for()
    page.screenshot(path=str(ARTIFACTS / "cluster.png"), full_page=True)


def test_the_console_can_be_used_from_the_keyboard(page, platform: Platform) -> None:  # type: ignore[no-untyped-def]
    page.goto("/")
    # The sign-in page puts the cursor in the token's field; in the page's order the
    # skip link comes first.
    page.get_by_label("Access token").wait_for()
    assert page.evaluate("document.activeElement.id") == "token"
    first = page.evaluate(
        "document.querySelector('a[href], button:not([hidden]), input, select, textarea').outerHTML"
    )
    assert 'class="skip"' in first and 'href="#view"' in first
    page.get_by_label("Access token").focus()
    page.keyboard.type(platform.token)
    page.keyboard.press("Enter")
    page.get_by_role("heading", name="Jobs").wait_for()
    # Every form control on the list and submit pages has a label.
    for where in ("#/jobs", "#/submit"):
        page.goto(f"/console/{where}")
        page.locator("main h1").wait_for()
        unlabeled = page.evaluate(
            """() => [...document.querySelectorAll('main input, main select, main textarea')]
                .filter((e) => !(e.labels && e.labels.length) && !e.getAttribute('aria-label'))
                .map((e) => e.outerHTML)"""
        )
        assert unlabeled == [], (where, unlabeled)


def test_a_user_sees_only_their_own_jobs_and_others_gpus_as_taken(  # type: ignore[no-untyped-def]
    page, platform: Platform, api: Api
) -> None:
    carol = api.as_token(api.http.post("/v1/tokens", json={"user": "carol"}).json()["token"])
    hers = carol.submit(
        {
            "name": unique("carols"),
            "roles": [{"name": "w", "command": "true", "resources": {"cpu": 1, "memory_mb": 128}}],
        }
    )
    admins = api.submit(
        {
            "name": unique("admins"),
            "roles": [
                {
                    "name": "w",
                    "command": "sleep 30",
                    "resources": {"cpu": 1, "memory_mb": 128, "gpu": 1},
                }
            ],
        }
    )
    api.wait(admins, {"RUNNING"})
    carol.wait(hers)
    sign_in(page, carol.http.headers["Authorization"].removeprefix("Bearer "))
    page.get_by_text("carol", exact=True).first.wait_for()
    page.locator(f'tr[data-job="{hers}"]').wait_for()
    assert page.locator(f'tr[data-job="{admins}"]').count() == 0
    assert page.get_by_label("User").count() == 0  # only an admin filters by user
    # Another user's job page answers as if it did not exist.
    page.goto(f"/console/#/jobs/{admins}")
    page.get_by_text("Error: no job").wait_for()
    # On the cluster page, the admin's GPU shows as taken by someone else, without who.
    page.goto("/console/#/cluster")
    page.get_by_role("heading", name="Nodes").wait_for()
    taken = page.locator(".gpu.other")
    assert taken.count() == 1
    assert taken.get_attribute("title") == "another user's job (default)"
    assert page.get_by_text(admins).count() == 0
    api.stop(admins)


def test_a_double_click_an_earlier_attempts_log_and_a_revoked_token(  # type: ignore[no-untyped-def]
    page, platform: Platform, api: Api
) -> None:
    dave = api.as_token(api.http.post("/v1/tokens", json={"user": "dave"}).json()["token"])
    # A job whose first attempt fails: its log is where the failure is.
    retried = dave.submit(
        {
            "name": unique("retried"),
            "retry_limit": 1,
            "roles": [
                {
                    "name": "w",
                    "command": 'echo "try $TRAINYARD_ATTEMPT"; test "$TRAINYARD_ATTEMPT" -ge 2',
                    "restart_policy": "OnFailure",
                    "resources": {"cpu": 0.5, "memory_mb": 128},
                }
            ],
        }
    )
    assert dave.wait(retried, timeout=90)["state"] == "SUCCEEDED"
    sign_in(page, dave.http.headers["Authorization"].removeprefix("Bearer "))
    page.goto(f"/console/#/jobs/{retried}")
    picker = page.get_by_label("Task", exact=True)
    picker.wait_for()
    assert picker.locator("option").all_inner_texts() == ["w[0] attempt 2", "w[0] attempt 1"]
    picker.select_option(label="w[0] attempt 1")
    page.get_by_role("button", name="Show log").click()
    page.get_by_label("Task log").get_by_text("try 1").wait_for()

    # Submit clicked twice: one job (it made two).
    page.goto("/console/#/submit")
    name = unique("once")
    page.get_by_label("Job name").fill(name)
    page.get_by_label("Command").fill("true")
    page.get_by_role("button", name="Submit", exact=True).dblclick()
    page.get_by_role("heading", name=name).wait_for()
    page.wait_for_timeout(1000)  # a second submission would be in by now
    mine = dave.http.get("/v1/jobs", params={"name": name}).json()["items"]
    assert [job["name"] for job in mine] == [name]

    # A token no longer good (revoked, a platform started again), the page reloaded:
    # the sign-in page says why (it was blank, the navigation hidden).
    page.evaluate("sessionStorage.setItem('trainyard.token', 'revoked-' + 'x'.repeat(20))")
    page.reload()
    # (Asserted on the view's text, so that a failure shows what the page said instead:
    # it failed twice in full runs, 30 s without the message, and passed alone.)
    expect(page.locator("#view")).to_contain_text(
        "Your token was refused: sign in again.", timeout=30_000
    )
    page.get_by_label("Access token").wait_for()


def test_a_long_log_keeps_only_its_newest_part_on_the_page(  # type: ignore[no-untyped-def]
    page, platform: Platform, api: Api
) -> None:
    # A log of hundreds of MB took some 20 times its size in the browser, and the tab.
    job_id = api.submit(
        {
            "name": unique("chatty"),
            "roles": [
                {
                    "name": "w",
                    # Lines, then one line longer than all the page keeps.
                    "command": "head -c 3000000 /dev/zero | tr '\\0' a | fold -w 99; "
                    "head -c 2500000 /dev/zero | tr '\\0' b; echo; echo last",
                    "resources": {"cpu": 0.5, "memory_mb": 128},
                }
            ],
        }
    )
    assert api.wait(job_id, timeout=90)["state"] == "SUCCEEDED"
    sign_in(page, platform.token)
    page.goto(f"/console/#/jobs/{job_id}")
    page.get_by_role("button", name="Show log").click()
    log = page.get_by_label("Task log")
    log.get_by_text("(end of log)").wait_for(timeout=60_000)
    text = log.evaluate("e => e.textContent")
    assert text.startswith("(earlier output not shown here)")
    assert len(text) < 2_100_000 and "last\n" in text
    # The newest kept, the long line's end (it was dropped whole, the page blank).
    assert text.count("b") > 1_900_000 and "a" * 99 not in text


def test_a_log_shows_what_a_terminal_would_colours_and_progress_bars(  # type: ignore[no-untyped-def]
    page, platform: Platform, api: Api
) -> None:
    # Followed while it is written: a colour cut in two by the reads showed as "[32m",
    # and each of a progress bar's "\r" rewrites ran on after the one before it.
    script = (
        "sleep 3; printf 'step \\033[3'; sleep 1; printf '2mgreen\\033[0m\\n'; "
        "for i in 1 2 3; do printf '\\rprogress %d/3' $i; sleep 1; done; "
        "printf '\\ndone\\r\\r\\n'"
    )
    job_id = api.submit(
        {
            "name": unique("bars"),
            "roles": [
                {"name": "w", "command": script, "resources": {"cpu": 0.5, "memory_mb": 128}}
            ],
        }
    )
    sign_in(page, platform.token)
    page.goto(f"/console/#/jobs/{job_id}")
    page.get_by_role("button", name="Show log").click(timeout=30_000)
    log = page.get_by_label("Task log")
    log.get_by_text("progress 2/3").wait_for(timeout=30_000)
    assert "progress 1/3" not in log.evaluate("e => e.textContent")  # rewritten in place
    log.get_by_text("(end of log)").wait_for(timeout=60_000)
    text = log.evaluate("e => e.textContent")
    assert text == "step green\nprogress 3/3\ndone\n\n(end of log)", repr(text)


def test_an_endpoint_on_an_ipv6_address_is_a_working_link(  # type: ignore[no-untyped-def]
    page, platform: Platform, api: Api
) -> None:
    job_id = api.submit({"name": unique("v6"), "roles": [{"name": "w", "command": "true"}]})
    api.wait(job_id)

    def on_ipv6(route) -> None:  # type: ignore[no-untyped-def]
        answer = route.fetch()
        job = answer.json()
        for task in job["tasks"]:
            task.update(host_ip="fd00::5", ports=[{"label": "http", "ports": [8080]}])
        route.fulfill(response=answer, json=job)

    page.route(f"**/v1/jobs/{job_id}", on_ipv6)
    sign_in(page, platform.token)
    page.goto(f"/console/#/jobs/{job_id}")
    link = page.get_by_role("link", name="http [fd00::5]:8080")
    link.wait_for()
    assert link.get_attribute("href") == "http://[fd00::5]:8080/"  # "http://fd00::5:8080/"


def test_a_mangled_link_says_so_instead_of_a_blank_page(  # type: ignore[no-untyped-def]
    page, platform: Platform, api: Api
) -> None:
    api.submit({"name": unique("listed"), "roles": [{"name": "w", "command": "true"}]})
    sign_in(page, platform.token)
    # A time that is none, a page that is no number: the list as if they were not there
    # (the time threw in the list's load, a blank list and a script error).
    page.goto("/console/#/jobs?after=garbage&before=&page=abc&anchor=nope")
    page.get_by_role("heading", name="Jobs").wait_for()
    page.locator("tbody tr[data-job]").first.wait_for()
    page.goto("/console/#/jobs/%E0%A4%A")  # no URI at all: decodeURIComponent threw
    page.get_by_text("that link names no job").wait_for()


def a_user(api: Api, prefix: str) -> Api:
    """A new user of its own (a list no other test adds to), as a test client."""
    return api.as_token(api.http.post("/v1/tokens", json={"user": unique(prefix)}).json()["token"])


def token_of(client: Api) -> str:
    return client.http.headers["Authorization"].removeprefix("Bearer ")


def rejected(client: Api, name: str) -> str:
    """A job validation refuses (too little memory): listed like any other, nothing runs."""
    return client.submit(
        {"name": name, "roles": [{"name": "w", "command": "true", "resources": {"memory_mb": 1}}]}
    )


def showing(page, ids: list[str]) -> None:  # type: ignore[no-untyped-def]
    """Wait until the list shows exactly these jobs, in this order."""
    page.wait_for_function(
        """ids => [...document.querySelectorAll('tbody tr[data-job]')]
            .map((r) => r.dataset.job).join() === ids.join()""",
        arg=ids,
        timeout=15_000,
    )


def test_older_goes_on_from_the_last_row_shown_when_jobs_arrived_meanwhile(  # type: ignore[no-untyped-def]
    page, platform: Platform, api: Api
) -> None:
    erin = a_user(api, "erin")
    for job_id in [rejected(erin, unique(f"old{i:02d}")) for i in range(40)]:
        erin.seen(job_id)
    sign_in(page, token_of(erin))
    rows = page.locator("tbody tr[data-job]")
    expect(rows).to_have_count(20)
    # Five more arrive while page 0 is open: it shows them on top, live.
    for job_id in [rejected(erin, unique(f"new{i}")) for i in range(5)]:
        erin.seen(job_id)
    listed = erin.http.get("/v1/jobs", params={"limit": 100}).json()
    assert listed["total"] == 45
    ids = [job["id"] for job in listed["items"]]
    showing(page, ids[:20])
    # Older: the next twenty after the last row shown (old15–old19 were skipped: the page
    # was counted from the time the list opened, before the five arrived).
    page.get_by_role("button", name="Older").click()
    showing(page, ids[20:40])
    expect(page.locator("caption")).to_have_text("45 job(s); 21–40 shown")
    page.get_by_role("button", name="Older").click()
    showing(page, ids[40:])
    expect(page.get_by_role("button", name="Older")).to_be_disabled()
    # And back again, page by page.
    page.get_by_role("button", name="Newer").click()
    showing(page, ids[20:40])
    page.get_by_role("button", name="Newer").click()
    showing(page, ids[:20])
    expect(page.get_by_role("button", name="Newer")).to_be_disabled()


# The live feed cut as a network drop cuts it: window.__feed.cut() errors every feed
# open now and makes each new one fail to connect until window.__feed.down is false.
FEED_CUTTER = """
(() => {
  const real = window.fetch;
  const feed = { down: false, opened: [], open: [] };
  feed.cut = () => {
    feed.down = true;
    for (const [control, reader] of feed.open.splice(0)) {
      try { control.error(new TypeError("network error")); } catch {}
      reader.cancel().catch(() => {});
    }
  };
  window.__feed = feed;
  window.fetch = async (url, options) => {
    if (!String(url).includes("/v1/watch/jobs")) return real(url, options);
    if (feed.down) throw new TypeError("Failed to fetch");
    const answer = await real(url, options);
    if (!answer.ok) return answer;
    const reader = answer.body.getReader();
    const body = new ReadableStream({
      start(control) { feed.open.push([control, reader]); feed.opened.push(String(url)); },
      async pull(control) {
        try {
          const { value, done } = await reader.read();
          if (done) control.close(); else control.enqueue(value);
        } catch (err) { try { control.error(err); } catch {} }
      },
      cancel(reason) { return reader.cancel(reason); },
    });
    return new Response(body, { status: answer.status, headers: answer.headers });
  };
})();
"""


def test_a_job_page_reads_again_what_changed_while_its_feed_was_down(  # type: ignore[no-untyped-def]
    page, platform: Platform, api: Api
) -> None:
    job_id = api.submit(
        {
            "name": unique("feed"),
            "roles": [
                {"name": "w", "command": "sleep 60", "resources": {"cpu": 0.5, "memory_mb": 128}}
            ],
        }
    )
    api.wait(job_id, {"RUNNING"})
    page.add_init_script(FEED_CUTTER)
    sign_in(page, platform.token)
    page.goto(f"/console/#/jobs/{job_id}")
    page.locator(".card .state.RUNNING").wait_for()
    page.wait_for_function("id => window.__feed.opened.some((u) => u.includes(id))", arg=job_id)
    page.evaluate("window.__feed.cut()")
    # It ends while the page hears nothing (the feed sends it to this listener, not
    # again to the page when it is back): a finished job stayed RUNNING, Stop and all.
    with api.http.stream("GET", "/v1/watch/jobs", params={"job_id": job_id}) as feed:
        lines = feed.iter_lines()
        assert next(lines).startswith("retry:")
        api.stop(job_id)
        for line in lines:
            if line.startswith("data:") and '"state": "STOPPED"' in line:
                break
    page.evaluate("window.__feed.down = false")
    page.locator(".card .state.STOPPED").wait_for(timeout=15_000)
    expect(page.get_by_role("button", name="Stop")).to_have_count(0)


def test_refusals_read_as_sentences_not_json(page, platform: Platform, api: Api) -> None:  # type: ignore[no-untyped-def]
    sign_in(page, platform.token)
    # FastAPI's 422 (a name past 256 characters) showed as [{"type":"string_too_long",...}].
    page.goto(f"/console/#/jobs?name={'x' * 300}")
    error = page.locator("tbody .error")
    expect(error).to_have_text("Error: name: String should have at most 256 characters")
    # A log the launcher does not have showed as (404) {"detail":...}.
    job_id = api.submit({"name": unique("nolog"), "roles": [{"name": "w", "command": "true"}]})
    api.wait(job_id)
    page.route(
        f"**/v1/jobs/{job_id}/logs?*",
        lambda route: route.fulfill(
            status=404, json={"detail": f"no job {job_id} with tasks here (not placed yet?)"}
        ),
    )
    page.goto(f"/console/#/jobs/{job_id}")
    page.get_by_role("button", name="Show log").click()
    expect(page.get_by_label("Task log")).to_have_text(
        f"Error: no job {job_id} with tasks here (not placed yet?)"
    )


# A followed log cut after its first read, as a network drop cuts it; the URL of every
# log read is kept in window.__logs.
LOG_CUTTER = """
(() => {
  const real = window.fetch;
  window.__logs = [];
  window.fetch = async (url, options) => {
    if (!String(url).includes("/logs?")) return real(url, options);
    window.__logs.push(String(url));
    const answer = await real(url, options);
    if (window.__logs.length > 1 || !answer.ok) return answer;
    const reader = answer.body.getReader();
    const body = new ReadableStream({
      async pull(control) {
        const { value, done } = await reader.read();
        if (done) { control.close(); return; }
        control.enqueue(value);
        reader.cancel().catch(() => {});
        control.error(new TypeError("network error"));
      },
    });
    return new Response(body, { status: answer.status, headers: answer.headers });
  };
})();
"""


def test_a_dropped_log_goes_on_from_where_it_was(page, platform: Platform, api: Api) -> None:  # type: ignore[no-untyped-def]
    job_id = api.submit(
        {
            "name": unique("resumed"),
            "roles": [
                {
                    "name": "w",
                    "command": "echo héllo; sleep 6; echo two",
                    "resources": {"cpu": 0.5, "memory_mb": 128},
                }
            ],
        }
    )
    api.wait(job_id, {"RUNNING"})
    deadline = time.monotonic() + 30
    while "héllo" not in api.http.get(f"/v1/jobs/{job_id}/logs").text:
        assert time.monotonic() < deadline, "no first line"
        time.sleep(0.2)
    page.add_init_script(LOG_CUTTER)
    sign_in(page, platform.token)
    page.goto(f"/console/#/jobs/{job_id}")
    page.get_by_role("button", name="Show log").click()
    log = page.get_by_label("Task log")
    # Neither the line read twice nor a byte lost ("é" is two of them).
    expect(log).to_have_text("héllo\ntwo\n\n(end of log)", timeout=30_000)
    again = page.evaluate("window.__logs")[1]
    assert "offset=7" in again, again


def test_an_interrupted_attempt_says_why_it_ended(page, platform: Platform, api: Api) -> None:  # type: ignore[no-untyped-def]
    job_id = api.submit(
        {
            "name": unique("paused"),
            "roles": [
                {"name": "w", "command": "sleep 60", "resources": {"cpu": 0.5, "memory_mb": 128}}
            ],
        }
    )
    api.wait(job_id, {"RUNNING"})
    assert api.http.post(f"/v1/jobs/{job_id}/pause").status_code == 202
    api.wait(job_id, {"PAUSED"})
    try:
        sign_in(page, platform.token)
        page.goto(f"/console/#/jobs/{job_id}")
        first = page.locator("h2:text-is('Attempts') + table tbody tr").first
        # A pause, a preemption and a scale all showed as a bare STOPPED.
        expect(first.locator("td").nth(1)).to_have_text("STOPPED (paused)")
    finally:
        api.stop(job_id)


# The commands a job's page offers in each state: those docs/lifecycle.md gives an
# effect there (the API takes every command in every state and does nothing with most).
ACTIONS = {
    "SUBMITTED": ["Stop", "Clone"],
    "ACCEPTED": ["Stop", "Pause", "Clone"],
    "QUEUED": ["Stop", "Pause", "Clone"],
    "PLACED": ["Stop", "Pause", "Restart", "Clone"],
    "RUNNING": ["Stop", "Pause", "Restart", "Clone"],
    "PAUSED": ["Stop", "Resume", "Restart", "Clone"],
    "SUCCEEDED": ["Clone"],
    "FAILED": ["Clone"],
    "STOPPED": ["Clone"],
    "REJECTED": ["Clone"],
}


def test_a_job_page_offers_what_each_state_allows_and_shows_labels_and_tags(  # type: ignore[no-untyped-def]
    page, platform: Platform, api: Api
) -> None:
    name = unique("labelled")
    job_id = api.submit(
        {
            "name": name,
            "labels": [{"name": "team", "value": "vision"}],
            "roles": [{"name": "w", "command": "true"}],
        }
    )
    api.wait(job_id)
    tagged = api.http.put(f"/api/v2/jobs/admin~{name}/tag", json={"value": "nightly"})
    assert tagged.status_code == 200, tagged.text
    state = {"now": ""}

    def as_state(route) -> None:  # type: ignore[no-untyped-def]
        answer = route.fetch()
        route.fulfill(response=answer, json={**answer.json(), "state": state["now"]})

    sign_in(page, platform.token)
    page.goto(f"/console/#/jobs/{job_id}")
    card = page.locator("#view .card").first
    expect(card).to_contain_text("team=vision")
    expect(card).to_contain_text("nightly")
    page.route(f"**/v1/jobs/{job_id}", as_state)
    actions = page.get_by_role("group", name="Actions").get_by_role("button")
    for job_state, offered in ACTIONS.items():
        state["now"] = job_state
        page.goto(f"/console/#/jobs/{job_id}?as={job_state}")
        card.locator(f".state.{job_state}").wait_for()
        assert actions.all_inner_texts() == offered, job_state


def test_the_cluster_pages_jobs_waiting_are_the_callers_own(  # type: ignore[no-untyped-def]
    page, platform: Platform, api: Api
) -> None:
    frank = a_user(api, "frank")

    def on_gpus(client: Api, gpus: int) -> str:
        return client.submit(
            {
                "name": unique("gpus"),
                "roles": [
                    {
                        "name": "w",
                        "command": "sleep 60",
                        "resources": {"cpu": 0.5, "memory_mb": 128, "gpu": gpus},
                    }
                ],
            }
        )

    # Both GPUs held, and two jobs waiting for one: the admin's and frank's.
    holder = on_gpus(api, 2)
    jobs = [holder]
    try:
        api.wait(holder, {"RUNNING"})
        jobs.append(on_gpus(api, 1))
        jobs.append(on_gpus(frank, 1))
        api.wait(jobs[1], {"QUEUED"})
        api.wait(jobs[2], {"QUEUED"})
        sign_in(page, token_of(frank))
        page.goto("/console/#/cluster")
        figure = page.locator("#figures div").filter(has=page.get_by_text("Jobs waiting"))
        # Every user's were counted, beside frank's own jobs by state.
        expect(figure.locator("dd")).to_have_text("1")
    finally:
        for job_id in jobs:
            api.stop(job_id)


def test_the_cluster_pages_counts_past_their_bound_say_so(  # type: ignore[no-untyped-def]
    page, platform: Platform
) -> None:
    # Each state is counted up to 10,000 (the API's 10,001: more than that): the page
    # said "10001". A state the counts ran out of time before is not there: not a 0.
    counts = {"QUEUED": 10_001, "SUCCEEDED": 10_001, "FAILED": 7}

    def many(route) -> None:  # type: ignore[no-untyped-def]
        answer = route.fetch()
        route.fulfill(
            response=answer, json={**answer.json(), "counts": counts, "counts_exact": False}
        )

    sign_in(page, platform.token)
    page.route(re.compile(r".*/v1/jobs\?limit=1&counts=true$"), many)
    page.goto("/console/#/cluster")
    figures = page.locator("#figures")

    def shown(term: str) -> Locator:
        return figures.locator("div").filter(has=page.get_by_text(f"Jobs {term}")).locator("dd")

    for term, text in [("waiting", "over 10,000"), ("succeeded", "over 10,000"), ("failed", "7")]:
        expect(shown(term)).to_have_text(text)
    del counts["QUEUED"]
    page.reload()
    expect(shown("failed")).to_have_text("7")
    expect(shown("waiting")).to_have_text("not counted in time")


def test_only_a_small_status_region_is_read_out_as_it_changes(  # type: ignore[no-untyped-def]
    page, platform: Platform, api: Api
) -> None:
    sign_in(page, platform.token)
    # The whole view was a live region: each live reload read the table out again.
    live = page.evaluate(
        """() => [...document.querySelectorAll('[aria-live]')].map((e) => ({
            id: e.id, tables: e.querySelectorAll('table').length, main: e.tagName === 'MAIN' }))"""
    )
    assert live == [{"id": "announce", "tables": 0, "main": False}], live
    job_id = api.submit(
        {
            "name": unique("told"),
            "roles": [
                {"name": "w", "command": "sleep 5", "resources": {"cpu": 0.5, "memory_mb": 128}}
            ],
        }
    )
    page.goto(f"/console/#/jobs/{job_id}")
    page.locator(".card .state").first.wait_for()
    # What changes is said there, once, in a sentence.
    expect(page.locator("#announce")).to_have_text(re.compile(r"is now SUCCEEDED"), timeout=60_000)


def test_signing_out_leaves_nothing_of_the_user_in_the_tab(  # type: ignore[no-untyped-def]
    page, platform: Platform, api: Api
) -> None:
    name = unique("cloned")
    job_id = api.submit({"name": name, "roles": [{"name": "w", "command": "true"}]})
    api.seen(job_id)
    sign_in(page, platform.token)
    page.goto(f"/console/#/jobs/{job_id}")
    page.get_by_role("button", name="Clone").click()
    expect(page.get_by_label("Job (JSON or YAML, in any dialect)")).to_have_value(re.compile(name))
    page.get_by_role("button", name="Sign out").click()
    page.get_by_label("Access token").wait_for()
    assert page.evaluate("Object.keys(sessionStorage)") == []
    # The next user of the tab: the admin's cloned spec was there at #/submit?clone=1.
    sign_in(page, token_of(a_user(api, "gina")))
    page.goto("/console/#/submit?clone=1")
    page.get_by_label("Job name").wait_for()  # the form: no clone to paste
    page.get_by_role("tab", name="Paste or import").click()
    expect(page.get_by_label("Job (JSON or YAML, in any dialect)")).to_have_value("")


def test_an_empty_list_says_there_are_no_jobs(page, platform: Platform, api: Api) -> None:  # type: ignore[no-untyped-def]
    sign_in(page, token_of(a_user(api, "hana")))
    # It said "0 job(s); 1–0 shown".
    expect(page.locator("caption")).to_have_text("No jobs yet.")
    page.goto(f"/console/#/jobs?name={unique('nothing')}")
    expect(page.locator("caption")).to_have_text("No jobs match.")
    expect(page.locator("tbody")).to_have_text("No jobs.")


def test_the_timeline_reads_a_long_history_page_by_page(  # type: ignore[no-untyped-def]
    page, platform: Platform, api: Api
) -> None:
    # Found in review: the history comes a page at a time and the timeline read only
    # the first page, the oldest events: a job of many tasks lost its end (its failures,
    # JobFinished). Here each page the API answers holds one event.
    job_id = api.submit({"name": unique("history"), "roles": [{"name": "w", "command": "true"}]})
    api.wait(job_id)
    whole = api.http.get(f"/v1/jobs/{job_id}/events").json()["items"]
    assert whole[-1]["type"] == "JobFinished"

    def one_at_a_time(route) -> None:  # type: ignore[no-untyped-def]
        found = re.search(r"after_seq=(\d+)", route.request.url)
        after = int(found.group(1)) if found else 0
        rest = [e for e in whole if e["seq"] > after]
        more = len(rest) > 1
        route.fulfill(json={"items": rest[:1], "next_after_seq": rest[0]["seq"] if more else None})

    page.route(re.compile(rf".*/v1/jobs/{job_id}/events(\?.*)?$"), one_at_a_time)
    sign_in(page, platform.token)
    page.goto(f"/console/#/jobs/{job_id}")
    timeline = page.locator("#view").get_by_role("table").last
    expect(timeline).to_contain_text("JobFinished")
    assert timeline.locator("tbody tr").count() == len(whole)
