"""The web UI in Debian's Chromium, driven by Playwright, against `treadle standalone` (API,
scheduler and worker in one process) on a SQLite file with a small DAG folder.

Nothing downloads a browser: Chromium comes from apt (/usr/bin/chromium; .ci/run installs it).
Every test fails on a console error or a CSP violation in any page it opened, and saves a
screenshot of each page at 1280 px and 390 px under TREADLE_SCREENSHOTS (default build/screenshots).
"""

from __future__ import annotations

import re
import shutil
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.helpers.processes import start, stop, treadle_env
from tests.helpers.wait import wait_for
from tests.web.dags_for_web import MARKER_ENV
from treadle.domain.access import ALL_TEAMS, Role
from treadle.domain.states import TERMINAL_RUN_STATES
from treadle.engine import accounts, dead_letters, pausing, queries
from treadle.engine.accounts import Caller
from treadle.engine.runs import trigger_run
from treadle.store.database import Database

playwright_api = pytest.importorskip("playwright.sync_api")
from playwright.sync_api import Browser, BrowserContext, ConsoleMessage, Page, Playwright, expect  # noqa: E402

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"]
ADMIN_FIRST = "the first admin password 1"
ADMIN_NEW = "a much better admin passphrase 2"
PASSWORD = "correct horse battery staple"
BY = Caller(actor="test")
HERE = Path(__file__).parent
SHOTS = Path(__import__("os").environ.get("TREADLE_SCREENSHOTS", "build/screenshots"))
BROKEN_DAG = "from treadle import dag\n\n@dag(dag_id='broken_feed'\ndef broken_feed(:\n    pass\n"

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        not CHROMIUM.exists(), reason="Debian's chromium is not installed (apt-get install chromium)"
    ),
]


@dataclass
class Treadle:
    """The running `treadle standalone`: its URL, database, marker file and process log."""

    url: str
    db: Database
    marker: Path
    log: Path

    def run_state(self, run_id: str) -> str:
        return queries.run_detail(self.db, run_id).run.state

    def wait_run(self, run_id: str, timeout: float = 45) -> str:
        def done() -> str | None:
            state = self.run_state(run_id)
            return state if state in TERMINAL_RUN_STATES else None

        return wait_for(done, timeout=timeout, interval=0.2, message=f"run {run_id} to end")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def treadle(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Treadle]:
    """`treadle standalone` on a fresh SQLite file, with the test DAG, a broken DAG file and users."""
    root = tmp_path_factory.mktemp("web")
    dags, home = root / "dags", root / "home"
    dags.mkdir()
    shutil.copy(HERE / "dags_for_web.py", dags / "web_pipeline.py")
    (dags / "broken_feed.py").write_text(BROKEN_DAG)
    url, port, marker = f"sqlite:///{root / 'treadle.db'}", _free_port(), root / "feed-is-back"
    env = treadle_env(
        database_url=url,
        dags_folder=dags,
        home=home,
        TREADLE_ADMIN_PASSWORD=ADMIN_FIRST,
        **{MARKER_ENV: str(marker)},
    )
    log = root / "standalone.log"
    proc = start(
        ["standalone", "--api-port", str(port), "--concurrency", "4", "--poll-interval", "0.2"], env, log
    )
    db: Database | None = None
    try:
        db = Database(url, application_name="treadle-web-test")
        wait_for(
            lambda: _registered(db),
            timeout=60,
            interval=0.2,
            message="the standalone to register web_pipeline",
        )
        wait_for(lambda: _listening(port), timeout=30, interval=0.1, message="the web UI to listen")
        for team in ("finance", "ops"):
            accounts.create_team(db, team, by=BY)
        accounts.create_user(db, "fin_operator", PASSWORD, team="finance", role=Role.OPERATOR, by=BY)
        accounts.create_user(db, "fin_viewer", PASSWORD, team="finance", role=Role.VIEWER, by=BY)
        accounts.create_user(db, "ops_viewer", PASSWORD, team="ops", role=Role.VIEWER, by=BY)
        accounts.create_user(db, "chief", PASSWORD, team=ALL_TEAMS, role=Role.ADMIN, by=BY)
        yield Treadle(url=f"http://127.0.0.1:{port}", db=db, marker=marker, log=log)
    finally:
        stop(proc)
        if db is not None:
            db.dispose()


def _registered(db: Database) -> bool:
    try:
        return queries.get_dag(db, "web_pipeline") is not None
    except Exception:  # the standalone may still be creating the schema
        return False


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Debian's Chromium (never a downloaded one)."""
    with playwright_api.sync_playwright() as p:
        yield _launch(p)


def _launch(p: Playwright) -> Browser:
    return p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS, headless=True)


@dataclass
class Tab:
    """One browser page and what went wrong in it (console errors, page errors, CSP reports)."""

    page: Page
    base: str
    problems: list[str] = field(default_factory=list)
    #: Pages visited on purpose for their error status (the browser logs that status).
    refused: set[str] = field(default_factory=set)

    def go(self, path: str, *, status: int = 200) -> Page:
        if status != 200:
            self.refused.add(self.base + path)
        response = self.page.goto(self.base + path)
        assert response is not None and response.status == status, (path, response and response.status)
        return self.page

    def login(self, username: str, password: str = PASSWORD) -> None:
        self.go("/login")
        self.page.get_by_label("User name").fill(username)
        self.page.get_by_label("Password").fill(password)
        self.page.get_by_role("button", name="Sign in").click()
        self.page.wait_for_load_state()

    def shoot(self, name: str) -> None:
        """Screenshots of the current page at desktop and phone width."""
        SHOTS.mkdir(parents=True, exist_ok=True)
        for width in (1280, 390):
            self.page.set_viewport_size({"width": width, "height": 900})
            self.page.screenshot(path=str(SHOTS / f"{name}-{width}.png"), full_page=True)
            # Wide content (tables, the grid, the graph) scrolls inside its card; the page never
            # scrolls sideways.
            scroll_width = self.page.evaluate("document.documentElement.scrollWidth")
            wide = self.page.evaluate(_WIDEST) if scroll_width > width else []
            assert scroll_width <= width, f"{name} is {scroll_width} px wide at {width} px: {wide}"
        self.page.set_viewport_size({"width": 1280, "height": 900})


#: The outermost elements reaching past the viewport's right edge (to name them in a failure).
_WIDEST = """() => [...document.querySelectorAll('body *')]
  .filter(e => e.getBoundingClientRect().right > window.innerWidth + 1
    && e.parentElement.getBoundingClientRect().right <= window.innerWidth + 1)
  .slice(0, 5).map(e => e.tagName + '.' + e.className + ' ' + Math.round(e.getBoundingClientRect().right))"""


@pytest.fixture
def tab(browser: Browser, treadle: Treadle, tmp_path: Path) -> Iterator[Tab]:
    """A fresh browser context (no cookies) with a page; fails the test on any console error."""
    context: BrowserContext = browser.new_context(
        viewport={"width": 1280, "height": 900}, base_url=treadle.url
    )
    page = context.new_page()
    found = Tab(page=page, base=treadle.url)
    page.on("console", lambda m: _console(found, m))
    page.on("pageerror", lambda e: found.problems.append(f"page error: {e}"))
    page.on("dialog", lambda d: d.accept())
    page.set_default_timeout(20_000)
    expect.set_options(timeout=20_000)
    try:
        yield found
        assert found.problems == [], "console errors or CSP violations:\n" + "\n".join(found.problems)
    finally:
        context.close()


def _console(tab: Tab, message: ConsoleMessage) -> None:
    if message.text.startswith("Failed to load resource") and message.location.get("url") in tab.refused:
        return
    if message.type in ("error", "warning") and (
        message.type == "error" or "Content Security Policy" in message.text
    ):
        tab.problems.append(f"{message.type} on {tab.page.url}: {message.text}")


def test_login_and_forced_password_change(tab: Tab, treadle: Treadle) -> None:
    page = tab.go("/")
    expect(page).to_have_url(re.compile(r"/login\?next=/$"))
    tab.shoot("login")
    page.get_by_label("User name").fill("admin")
    page.get_by_label("Password").fill("not the password")
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("alert")).to_contain_text("wrong user name or password")
    page.get_by_label("Password").fill(ADMIN_FIRST)
    page.get_by_role("button", name="Sign in").click()
    expect(page).to_have_url(re.compile(r"/password$"))
    expect(page.get_by_text("Choose your own before anything else")).to_be_visible()
    tab.shoot("password-change")
    # Every other page sends the account back here until the password is changed.
    tab.go("/dead-letters")
    expect(page).to_have_url(re.compile(r"/password$"))
    page.get_by_label("Current password").fill(ADMIN_FIRST)
    page.get_by_label("New password", exact=True).fill(ADMIN_NEW)
    page.get_by_label("New password again").fill(ADMIN_NEW + " typo")
    page.get_by_role("button", name="Change password").click()
    expect(page.locator("#confirm_password-error")).to_have_text("the two new passwords differ")
    page.get_by_label("Current password").fill(ADMIN_FIRST)
    page.get_by_label("New password", exact=True).fill(ADMIN_NEW)
    page.get_by_label("New password again").fill(ADMIN_NEW)
    page.get_by_role("button", name="Change password").click()
    expect(page).to_have_url(treadle.url + "/")
    expect(page.get_by_role("link", name="web_pipeline")).to_be_visible()
    expect(page.get_by_role("alert")).to_contain_text("1 DAG file failed to load")
    page.locator(".banner summary").click()
    expect(page.locator(".banner pre.trace")).to_contain_text("SyntaxError")
    tab.shoot("dags")
    assert not accounts.has_unchanged_bootstrap_password(treadle.db)


def test_trigger_with_bad_then_good_params_and_watch_the_grid(tab: Tab, treadle: Treadle) -> None:
    treadle.marker.touch()
    tab.login("fin_operator")
    page = tab.go("/dags/web_pipeline")
    limit = page.get_by_label(re.compile(r"^limit"))
    limit.fill("0")
    page.get_by_role("button", name="Trigger run").click()
    expect(page.locator("#param-limit-error")).to_contain_text("minimum")
    expect(page.get_by_label(re.compile(r"^limit"))).to_have_value("0")
    page.get_by_label(re.compile(r"^limit")).fill("three")
    page.get_by_role("button", name="Trigger run").click()
    expect(page.locator("#param-limit-error")).to_have_text("not an integer: 'three'")
    tab.shoot("dag-trigger-errors")
    assert queries.list_runs(treadle.db, dag_id="web_pipeline") == []
    page.get_by_label(re.compile(r"^limit")).fill("3")
    page.get_by_role("button", name="Trigger run").click()
    expect(page).to_have_url(re.compile(r"\?run="))
    run_id = page.url.split("?run=")[1].split("#")[0]
    assert queries.run_detail(treadle.db, run_id).run.conf == {"limit": 3}
    page.evaluate("window.__sameDocument = true")
    header = page.locator(f'.grid .runheads a[href="/runs/{run_id}"]')
    expect(header).to_have_class(re.compile(r"s-success"), timeout=45_000)
    expect(page.locator(f'.grid a.cell[href="/runs/{run_id}/tasks/publish"]')).to_have_class(
        re.compile("s-success")
    )
    expect(page.locator(f'.grid a.cell.mapped[href="/runs/{run_id}/tasks/square"]')).to_have_text("3")
    assert page.evaluate("window.__sameDocument") is True, "the page reloaded"
    page.reload()
    tab.shoot("dag")
    tab.go(f"/runs/{run_id}")
    expect(page.locator("h1 .badge")).to_have_text("success")
    expect(page.locator("svg.gantt rect.bar")).to_have_count(6)
    tab.shoot("run")
    tab.go(f"/runs/{run_id}/tasks/square?map_index=1")
    expect(page.locator("pre.json").first).to_have_text("1")
    tab.shoot("task-mapped")


def test_dead_letter_traceback_log_and_requeue_group(tab: Tab, treadle: Treadle) -> None:
    treadle.marker.unlink(missing_ok=True)
    runs = [
        trigger_run(treadle.db, "web_pipeline", conf={"limit": 2}, triggered_by="test").run_id
        for _ in range(2)
    ]
    for run_id in runs:
        assert treadle.wait_run(run_id) == "failed"
    tab.login("fin_operator")
    page = tab.go("/dead-letters")
    group = page.locator("section.group")
    expect(group).to_have_count(1)
    expect(group).to_contain_text("ConnectionError")
    expect(group.locator(".count")).to_have_text("2")
    tab.shoot("dead-letters")
    group.get_by_role("link", name=re.compile(r"web_pipeline\.flaky")).first.click()
    expect(page.locator("h1 .badge")).to_have_text("dead letter")
    expect(page.locator("pre.trace").first).to_contain_text(
        "ConnectionError: the upstream feed refused the connection"
    )
    expect(page.locator("pre.log")).to_contain_text("checking the upstream feed, 3 values")
    tab.shoot("task-dead-letter")
    treadle.marker.touch()
    tab.go("/dead-letters")
    page.get_by_role("button", name="Requeue all 2").click()
    expect(page.get_by_text("No dead letters.")).to_be_visible()
    for run_id in runs:
        assert treadle.wait_run(run_id) == "success"
    assert dead_letters.list_dead_letters(treadle.db) == []
    tab.go(f"/runs/{runs[0]}")
    expect(page.locator("h1 .badge")).to_have_text("success")


def test_pause_a_dag(tab: Tab, treadle: Treadle) -> None:
    tab.login("fin_operator")
    page = tab.go("/")
    switch = page.get_by_role("switch", name="web_pipeline active")
    expect(switch).to_have_attribute("aria-checked", "true")
    switch.click()
    expect(page.get_by_role("switch", name="web_pipeline active")).to_have_attribute("aria-checked", "false")
    dag = queries.get_dag(treadle.db, "web_pipeline")
    assert dag is not None and dag.is_paused
    page.get_by_role("switch", name="web_pipeline active").click()
    expect(page.get_by_role("switch", name="web_pipeline active")).to_have_attribute("aria-checked", "true")


def test_a_viewer_sees_no_mutating_control_and_a_forged_post_is_refused(tab: Tab, treadle: Treadle) -> None:
    tab.login("fin_viewer")
    run_id = queries.list_runs(treadle.db, dag_id="web_pipeline")[0].run_id
    for path in (
        "/",
        "/dags/web_pipeline",
        f"/runs/{run_id}",
        f"/runs/{run_id}/tasks/flaky",
        "/dead-letters",
        "/pools",
    ):
        page = tab.go(path)
        expect(page.locator("main")).to_be_visible()
        posts = page.locator("form[method=post]")
        assert [posts.nth(i).get_attribute("action") for i in range(posts.count())] == ["/logout"], path
        assert page.get_by_role("switch").count() == 0
    page = tab.go("/")
    expect(page.get_by_role("link", name="web_pipeline")).to_be_visible()
    expect(page.get_by_role("link", name="ops_cleanup")).to_have_count(0)
    expect(page.get_by_role("link", name="Audit")).to_have_count(0)
    before = len(queries.list_runs(treadle.db, dag_id="web_pipeline"))
    csrf = page.locator("form[action='/logout'] input[name=csrf_token]").get_attribute("value")
    assert csrf
    forged = page.request.post(treadle.url + "/dags/web_pipeline/pause", form={"csrf_token": csrf})
    assert forged.status == 403
    assert "pause_dag needs the role operator" in forged.text()
    no_token = page.request.post(treadle.url + "/dags/web_pipeline/pause", form={"x": "1"})
    assert no_token.status == 403 and "CSRF" in no_token.text()
    trigger = page.request.post(
        treadle.url + "/dags/web_pipeline/trigger", form={"csrf_token": csrf, "limit": "5"}
    )
    assert trigger.status == 403
    dag = queries.get_dag(treadle.db, "web_pipeline")
    assert dag is not None and not dag.is_paused
    assert len(queries.list_runs(treadle.db, dag_id="web_pipeline")) == before
    tab.go("/dags/ops_cleanup", status=403)
    expect(page.locator("h1")).to_have_text("Forbidden")
    expect(page.get_by_role("link", name="Users")).to_have_count(0)
    tab.go("/users", status=403)
    expect(page.locator("main")).to_contain_text("the role admin on every team")
    forged_user = page.request.post(
        treadle.url + "/users",
        form={"csrf_token": csrf, "username": "intruder", "password": PASSWORD, "team": "*", "role": "admin"},
    )
    assert forged_user.status == 403
    assert all(u.username != "intruder" for u in accounts.list_users(treadle.db))


def test_every_page_at_desktop_and_phone_width(tab: Tab, treadle: Treadle) -> None:
    tab.login("chief")
    # The module's other tests leave runs and a pause behind, but under xdist another process
    # (with its own standalone) may have run them: this test makes what it shows.
    runs = queries.list_runs(treadle.db, dag_id="web_pipeline") or [
        trigger_run(treadle.db, "web_pipeline", conf={"limit": 2}, triggered_by="test")
    ]
    run_id = runs[0].run_id
    for paused in (True, False):
        pausing.set_paused(treadle.db, "web_pipeline", paused=paused, actor="user:fin_operator")
    pages = {
        "operations": "/operations",
        "audit": "/audit",
        "audit-filtered": "/audit?action=dag.pause",
        "task": f"/runs/{run_id}/tasks/flaky",
        "dag-other": "/dags/ops_cleanup",
        "not-found": "/dags/nope",
    }
    for name, path in pages.items():
        page = tab.go(path, status=404 if name == "not-found" else 200)
        expect(page.locator("main")).to_be_visible()
        tab.shoot(name)
    (scheduled,) = queries.list_runs(treadle.db, dag_id="ops_cleanup")[-1:]
    treadle.wait_run(scheduled.run_id)
    page = tab.go(f"/runs/{scheduled.run_id}")
    expect(page.locator("#prov-h + dl")).to_contain_text("warehouse.cleanup_report")
    tab.shoot("run-scheduled")
    page = tab.go("/operations")
    expect(page.get_by_text("Scheduler leadership")).to_be_visible()
    expect(page.locator("#scheduler dd").first).not_to_have_text("none (handing over)")
    page = tab.go("/audit?action=dag.pause")
    expect(page.locator("tbody tr").first).to_contain_text("user:fin_operator")


def test_an_admin_manages_users_tokens_and_pools_from_the_keyboard(tab: Tab, treadle: Treadle) -> None:
    tab.login("chief")
    page = tab.go("/")
    page.get_by_role("link", name="Users").click()
    expect(page.locator("h1")).to_have_text("Users")
    form = page.locator("#new-user")
    form.get_by_label("User name").fill("erin")
    form.get_by_label("Password", exact=True).fill("short")
    form.get_by_label("Password", exact=True).press("Enter")
    expect(page.get_by_role("alert")).to_contain_text("12")
    form = page.locator("#new-user")
    expect(form.get_by_label("User name")).to_have_value("erin")
    form.get_by_label("Password", exact=True).fill(PASSWORD)
    form.get_by_label("Team").select_option("finance")
    form.get_by_label("Role").select_option("viewer")
    form.get_by_label("Password", exact=True).press("Enter")
    expect(page.get_by_role("status")).to_have_text("User created.")
    row = page.locator("#user-erin")
    expect(row).to_contain_text("finance: viewer")
    row.get_by_label("Team for erin", exact=True).select_option("ops")
    row.get_by_label("Role of erin", exact=True).select_option("operator")
    row.get_by_role("button", name="Set the role of erin").focus()
    page.keyboard.press("Enter")
    expect(page.locator("#user-erin")).to_contain_text("ops: operator")
    tab.shoot("users")
    page.locator("#user-erin").get_by_role("button", name="Disable erin").click()
    expect(page.locator("#user-erin")).to_contain_text("disabled")
    erin = next(u for u in accounts.list_users(treadle.db) if u.username == "erin")
    assert not erin.is_active and erin.memberships == {"finance": Role.VIEWER, "ops": Role.OPERATOR}

    page.get_by_role("link", name="API tokens").click()
    page.get_by_label("Name").fill("nightly-export")
    page.get_by_label("Team").select_option("finance")
    page.get_by_label("Role").select_option("operator")
    page.get_by_label("Expires in days").fill("30")
    page.get_by_label("Expires in days").press("Enter")
    secret = page.get_by_label("Token for finance as operator")
    expect(secret).to_have_value(re.compile(r".{20,}"))
    value = secret.input_value()
    tab.shoot("token-created")
    me = page.request.get(treadle.url + "/api/v1/auth/me", headers={"Authorization": f"Bearer {value}"})
    assert me.status == 200 and me.json()["username"] == "chief"
    page = tab.go("/tokens")
    expect(page.locator("main")).not_to_contain_text(value)
    page.get_by_role("button", name="Revoke token nightly-export").click()
    expect(page.get_by_role("status")).to_have_text("Token revoked.")
    expect(page.locator("tbody")).to_contain_text("revoked")
    tab.shoot("tokens")
    gone = page.request.get(treadle.url + "/api/v1/auth/me", headers={"Authorization": f"Bearer {value}"})
    assert gone.status == 401

    page.get_by_role("link", name="Pools").click()
    page.get_by_label("Name").fill("warehouse")
    page.get_by_label("Slots", exact=True).fill("4")
    page.get_by_label("Description").fill("connections to the warehouse")
    page.get_by_role("button", name="Save pool").click()
    row = page.locator("#pool-warehouse")
    expect(row).to_contain_text("0 / 4")
    row.get_by_label("Slots of warehouse").fill("2")
    row.get_by_label("Slots of warehouse").press("Enter")
    expect(page.locator("#pool-warehouse")).to_contain_text("0 / 2")
    expect(page.locator("#pool-warehouse")).to_contain_text("connections to the warehouse")
    tab.shoot("pools")
    audit = {e.action for e in accounts.list_audit(treadle.db, actor="user:chief", limit=100)}
    assert {
        "user.create",
        "user.set_role",
        "user.disable",
        "token.create",
        "token.revoke",
        "pool.created",
    } <= audit
