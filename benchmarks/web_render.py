"""Browser render time of the 25-run x 500-task grid, in Debian's Chromium driven by Playwright.

Seeds PostgreSQL like web_pages.py (`--runs` history, 25 runs of a 500-task DAG, all finished
but the newest), serves the API and web UI with uvicorn on a free loopback port, signs in once,
then opens the DAG page `--repeat` times, each in a fresh browser context (empty cache: the
first visit, script and stylesheet included). For each it reads, from the page's own clock
(milliseconds since navigation start):

- `response_end_ms`: the HTML has arrived;
- `dom_content_loaded_ms`: the document is parsed and app.js has run (it draws the grid);
- `grid_drawn_ms`: app.js's `treadle:grid-drawn` mark, set after the 12,500 cells are in the
  document and laid out (the target: < 1 s);
- `painted_ms`: the first animation frame after that mark (the cells on screen).

Chromium: /usr/bin/chromium with --no-sandbox --disable-gpu --disable-background-networking
--no-first-run and a fresh profile, as tests/web/test_browser.py launches it. Prints JSON.
"""

from __future__ import annotations

import argparse
import os
import socket
import tempfile
import threading
import time
from typing import Any

import uvicorn
from _common import emit, machine, percentile, pg_database
from playwright.sync_api import sync_playwright
from web_pages import PASSWORD, seed

from treadle.api.app import create_app
from treadle.api.settings import ApiSettings
from treadle.domain.access import ALL_TEAMS, Role
from treadle.engine import accounts
from treadle.engine.accounts import Caller
from treadle.store import migrate
from treadle.store.database import Database

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"]
#: Read in the page once the grid is drawn: navigation timing, the mark, the next frame.
TIMINGS = """() => new Promise(done => requestAnimationFrame(() => {
  const nav = performance.getEntriesByType("navigation")[0];
  const mark = performance.getEntriesByName("treadle:grid-drawn")[0];
  const start = performance.getEntriesByName("treadle:grid-start")[0];
  done({response_end_ms: nav.responseEnd, dom_content_loaded_ms: nav.domContentLoadedEventEnd,
        grid_drawn_ms: mark ? mark.startTime : null, painted_ms: performance.now(),
        drawing_ms: mark && start ? mark.startTime - start.startTime : null,
        cells: document.querySelectorAll("table.grid a.cell").length,
        html_kb: nav.transferSize / 1024});
}))"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _serve(db: Database, port: int) -> tuple[uvicorn.Server, threading.Thread]:
    app = create_app(db, ApiSettings(), secret_key="r" * 48)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the web server did not start")
        time.sleep(0.05)
    return server, thread


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--screenshot", help="save the last view of the grid (the viewport) here, as PNG")
    args = parser.parse_args()
    with pg_database("bench_render") as url, tempfile.TemporaryDirectory() as home:
        db = Database(url, pool_size=4)
        migrate.upgrade(db)
        seed(db, args.runs, 25)
        accounts.create_user(db, "bench", PASSWORD, team=ALL_TEAMS, role=Role.ADMIN, by=Caller(actor="bench"))
        port = _free_port()
        server, thread = _serve(db, port)
        base = f"http://127.0.0.1:{port}"
        samples: list[dict[str, Any]] = []
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
                login = browser.new_context(base_url=base)
                page = login.new_page()
                page.goto(base + "/login")
                page.get_by_label("User name").fill("bench")
                page.get_by_label("Password").fill(PASSWORD)
                page.get_by_role("button", name="Sign in").click()
                page.wait_for_url(base + "/")
                state = os.path.join(home, "state.json")
                login.storage_state(path=state)
                login.close()
                for _ in range(args.repeat):
                    context = browser.new_context(
                        base_url=base, storage_state=state, viewport={"width": 1280, "height": 900}
                    )
                    page = context.new_page()
                    page.goto(base + "/dags/bench_web_wide", wait_until="commit")
                    page.wait_for_selector("table.grid[data-drawn]", state="attached", timeout=30_000)
                    samples.append(page.evaluate(TIMINGS))
                    if args.screenshot and len(samples) == args.repeat:
                        page.screenshot(path=args.screenshot)
                    context.close()
                browser.close()
        finally:
            server.should_exit = True
            thread.join(timeout=10)
            db.dispose()
    figures: dict[str, Any] = {}
    for key in ("response_end_ms", "dom_content_loaded_ms", "drawing_ms", "grid_drawn_ms", "painted_ms"):
        values = [s[key] / 1000 for s in samples if s[key] is not None]
        figures[key] = {
            "p50": round(percentile(values, 50) * 1000, 1),
            "p95": round(percentile(values, 95) * 1000, 1),
            "min": round(min(values) * 1000, 1),
            "max": round(max(values) * 1000, 1),
        }
    emit(
        {
            "benchmark": "web_render",
            "machine": machine(),
            "load_average_1m": round(os.getloadavg()[0], 2),
            "runs": args.runs,
            "grid": "25 runs x 500 tasks",
            "cells_drawn": samples[-1]["cells"] if samples else 0,
            "html_kb": round(samples[-1]["html_kb"], 1) if samples else 0,
            "samples": len(samples),
            "target_ms": 1000,
            "timings": figures,
        }
    )


if __name__ == "__main__":
    main()
