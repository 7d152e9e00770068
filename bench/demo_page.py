"""Time to first audio of the demo page's "Stream a paragraph", in a real browser.

Starts a gateway (the default Piper engine), opens its demo page in Debian's
headless Chromium (Playwright, ``executable_path``), clicks "Stream a
paragraph" ``--runs`` times (waiting for each paragraph to finish) and reads
the page's own figure (``#ttfa``: from the first token sent to the first
audio frame, as the page shows it to a visitor).  Prints JSON lines.

    .venv/bin/python bench/demo_page.py --runs 10 --out bench/results/demo_page.jsonl
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from playwright.sync_api import sync_playwright

from gateway.bench.provenance import source_revision
from gateway.bench.runner import free_port, started

ARGS = ["--no-sandbox", "--disable-gpu", "--autoplay-policy=no-user-gesture-required"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    parser.add_argument("--out", type=Path, default=Path("bench/results/demo_page.jsonl"))
    args = parser.parse_args()
    port = free_port()
    http = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "gateway", "serve", "--port", str(port)]
    log = Path(tempfile.gettempdir()) / "gateway-demo-page.log"
    rows: list[dict[str, object]] = [
        {"kind": "run", "source": source_revision(), "runs": args.runs}
    ]
    with started(command, f"{http}/readyz", log), sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=args.chromium, headless=True, args=ARGS)
        page = browser.new_page()
        page.goto(http + "/")
        page.wait_for_function("window.demo && demo.ready", timeout=60000)
        for run in range(args.runs):
            page.evaluate("document.querySelector('#ttfa').textContent = '–'")
            page.click("#paragraph")
            page.wait_for_function(
                "/^\\d+$/.test(document.querySelector('#ttfa').textContent)", timeout=60000
            )
            ttfa = float(page.text_content("#ttfa") or "nan")
            rows.append({"kind": "paragraph", "run": run, "ttfa_ms": ttfa})
            print(json.dumps(rows[-1]), flush=True)
            page.click("#stop")
            time.sleep(1.0)
        browser.close()
    values = [float(r["ttfa_ms"]) for r in rows if r["kind"] == "paragraph"]  # type: ignore[arg-type]
    summary = {
        "kind": "summary",
        "ttfa_p50_ms": statistics.median(values),
        "ttfa_max_ms": max(values),
        "target_ms": 450,
    }
    rows.append(summary)
    print(json.dumps(summary), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    main()
