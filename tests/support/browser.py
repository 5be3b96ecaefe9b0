"""Headless Chromium from Debian, driven through its WebDriver (``chromium-driver``) by Selenium.

``dev/chromium.sh`` installs both with apt-get when missing and prints their paths, so a bare
machine gets them from the project's own setup; Selenium is given both paths and therefore never
tries to download a browser or a driver of its own.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.service import Service

from tests.support.local import REPO

# Screenshots and page dumps of browser tests; git-ignored, kept by CI as artifacts.
ARTIFACTS = Path(os.environ.get("VITESS_TEST_ARTIFACTS", REPO / ".artifacts"))


def chromium_paths() -> tuple[str, str]:
    """(browser, driver), installing them from Debian first if needed."""
    done = subprocess.run(
        [str(REPO / "dev" / "chromium.sh")], capture_output=True, text=True, timeout=900, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"dev/chromium.sh failed ({done.returncode}):\n{done.stderr[-3000:]}")
    browser, driver = done.stdout.split()
    return browser, driver


@contextlib.contextmanager
def chromium(width: int = 1400, height: int = 1000) -> Iterator[webdriver.Chrome]:
    browser, driver = chromium_paths()
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(arg)  # no sandbox: the tests run as root on CI
    options.add_argument(f"--window-size={width},{height}")
    chrome = webdriver.Chrome(options=options, service=Service(executable_path=driver))
    try:
        yield chrome
    finally:
        chrome.quit()
