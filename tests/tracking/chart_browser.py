"""A page in headless Chromium driven over the DevTools protocol (a websocket), for checks that
need the rendered layout (an element's width), which ``chromium --dump-dom`` does not give.
Chromium is the OS package (scripts/setup_env.sh); the websocket client is ``websockets``."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

from websockets.sync.client import connect


class ChromiumPage:
    """One headless Chromium tab of ``width`` × ``height`` CSS pixels; use as a context manager."""

    def __init__(self, profile: Path, *, width: int = 1400, height: int = 1000) -> None:
        chromium = shutil.which("chromium") or shutil.which("chromium-browser")
        assert chromium, "Chromium is installed by scripts/setup_env.sh (apt-get install chromium)"
        self._process = subprocess.Popen(
            [
                chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
                "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0", f"--window-size={width},{height}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        port_file = profile / "DevToolsActivePort"  # Chromium writes the port it picked here
        deadline = time.time() + 60
        while not (port_file.exists() and port_file.read_text().strip()):
            assert time.time() < deadline, "Chromium did not open its DevTools port"
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as response:
            tab = next(entry for entry in json.load(response) if entry["type"] == "page")
        self._socket = connect(tab["webSocketDebuggerUrl"], max_size=2**26)
        self._id = 0
        self.send("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)
        self.send("Page.enable")

    def send(self, method: str, **params) -> dict:
        self._id += 1
        self._socket.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:  # events arrive in between; the answer carries our id
            message = json.loads(self._socket.recv(timeout=120))
            if message.get("id") == self._id:
                assert "error" not in message, message["error"]
                return message["result"]

    def open(self, url: str) -> None:
        self.send("Page.navigate", url=url)

    def evaluate(self, expression: str):
        """The value of a JavaScript expression in the page (JSON-serialisable)."""
        return self.send("Runtime.evaluate", expression=expression, returnByValue=True)["result"].get("value")

    def wait_for(self, expression: str, *, timeout: float = 180) -> object:
        """Poll until ``expression`` is truthy; its value, or ``None`` after ``timeout`` seconds."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(0.5)
        return None

    def screenshot(self, path: Path, *, height: int | None = None) -> None:
        """A PNG of the page; with ``height``, only its top ``height`` CSS pixels."""
        clip = {}
        if height:
            width = self.evaluate("window.innerWidth")
            clip = {"clip": {"x": 0, "y": 0, "width": width, "height": height, "scale": 1}}
        path.write_bytes(base64.b64decode(self.send("Page.captureScreenshot", format="png", **clip)["data"]))

    def __enter__(self) -> ChromiumPage:
        return self

    def __exit__(self, *_) -> None:
        self._socket.close()
        self._process.terminate()
        try:
            self._process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self._process.kill()
