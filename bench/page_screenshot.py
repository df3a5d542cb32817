"""A screenshot of the sandbox's page over a finished run, one agent opened (docs/figures/sandbox_page.png).

    make sandbox-demo
    python -m bench.page_screenshot --run runs/sandbox/demo --out docs/figures/sandbox_page.png [--agent "User 11"]

The page is served read-only from the run folder on a free loopback port and opened in headless
Chromium (apt-get install chromium chromium-driver); the agent named (else the first) is clicked and the
window is saved once its card shows its history.
"""

from __future__ import annotations

import argparse
import shutil
import socket
import threading
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, default=Path("runs/sandbox/demo"))
    parser.add_argument("--out", type=Path, default=Path("docs/figures/sandbox_page.png"))
    parser.add_argument("--agent", help="the agent to open (default: the first listed)")
    args = parser.parse_args(argv)
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not (chromium and driver):
        raise SystemExit("error: no chromium/chromedriver here: apt-get install chromium chromium-driver")
    import uvicorn
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from agents.sandbox.serve import create_app

    app = create_app(args.run, None)  # read-only: no runner
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1100"):
        options.add_argument(flag)
    chrome = webdriver.Chrome(service=Service(driver), options=options)
    try:
        wait = WebDriverWait(chrome, 60)
        chrome.get(f"http://127.0.0.1:{port}/")
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#agents li"))
        items = chrome.find_elements(By.CSS_SELECTOR, "#agents li")
        chosen = next((i for i in items if args.agent and args.agent in i.text), items[0])
        chosen.click()
        wait.until(lambda d: d.find_element(By.ID, "agent-name").text)
        time.sleep(1)  # the card's memory and history lists
        args.out.parent.mkdir(parents=True, exist_ok=True)
        chrome.save_screenshot(str(args.out))
        print(f"{args.out}: {chrome.find_element(By.ID, 'agent-name').text} opened")
    finally:
        chrome.quit()
        server.should_exit = True
        thread.join(10)


if __name__ == "__main__":
    main()
