"""A headless Chromium driven through the DevTools protocol over a pipe (no websocket client,
no dependency): what the glance page's browser test and its screenshots use.

`--remote-debugging-pipe` makes Chromium read protocol messages on fd 3 and write them on fd 4,
each a JSON object ended by a NUL byte. A small shell step puts our pipe ends on those numbers
(a few lines of Python between this process and Chromium's exec), so nothing runs between fork
and exec here.

    with Browser() as browser:
        page = browser.page(width=1366, height=768)
        page.navigate("http://127.0.0.1:9840/")
        page.evaluate("document.title")
        page.screenshot(Path("wide.png"))
        page.requests, page.problems   # every URL asked for; console errors, exceptions, CSP
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--no-default-browser-check", "--disable-extensions", "--disable-sync",
         "--disable-background-networking", "--disable-component-update",
         "--disable-default-apps", "--mute-audio", "--hide-scrollbars",
         "--force-color-profile=srgb", "--remote-debugging-pipe")


# Run in a fresh interpreter between this process and Chromium: our two pipe ends become fds 3
# and 4 (by way of fds >= 10, so neither overwrites the other), then exec.
_ON_FDS_3_AND_4 = """
import fcntl, os, sys
high = [fcntl.fcntl(int(fd), fcntl.F_DUPFD, 10) for fd in sys.argv[1:3]]
for target, fd in zip((3, 4), high):
    os.dup2(fd, target)
for fd in high:
    os.close(fd)
os.execvp(sys.argv[3], sys.argv[3:])
"""


class BrowserError(RuntimeError):
    """Chromium is missing, died, or answered a command with an error."""


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class Browser:
    def __init__(self, binary: str | None = None, extra_flags: tuple[str, ...] = ()):
        binary = binary or chromium()
        if not binary:
            raise BrowserError("chromium not found (apt-get install chromium)")
        self._profile = tempfile.TemporaryDirectory(prefix="glance-chromium-")
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()
        command = [binary, *FLAGS, *extra_flags, f"--user-data-dir={self._profile.name}",
                   "about:blank"]
        self.log = open(Path(self._profile.name) / "stderr.log", "w+b")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _ON_FDS_3_AND_4, str(to_child_r), str(from_child_w),
             *command],
            pass_fds=(to_child_r, from_child_w), stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=self.log)
        os.close(to_child_r)
        os.close(from_child_w)
        self._lock = threading.Condition()
        self._next_id = 0
        self._answers: dict[int, dict] = {}
        self._events: list[dict] = []
        self._closed = False
        self._reader = threading.Thread(target=self._read, name="cdp", daemon=True)
        self._reader.start()
        self.send("Target.setDiscoverTargets", {"discover": False})

    # -- the pipe ---------------------------------------------------------------------------
    def _read(self) -> None:
        buffer = b""
        while True:
            try:
                chunk = os.read(self._from_child, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                with self._lock:
                    self._closed = True
                    self._lock.notify_all()
                return
            buffer += chunk
            while b"\0" in buffer:
                raw, buffer = buffer.split(b"\0", 1)
                message = json.loads(raw)
                with self._lock:
                    if "id" in message:
                        self._answers[message["id"]] = message
                    else:
                        self._events.append(message)
                    self._lock.notify_all()

    def send(self, method: str, params: dict | None = None, session: str | None = None,
             timeout: float = 30.0) -> dict:
        with self._lock:
            self._next_id += 1
            ident = self._next_id
        message: dict[str, Any] = {"id": ident, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        try:
            os.write(self._to_child, json.dumps(message).encode() + b"\0")
        except OSError as err:
            raise BrowserError(f"chromium is gone ({err}): {self.stderr_tail()}") from None
        deadline = time.monotonic() + timeout
        with self._lock:
            while ident not in self._answers:
                left = deadline - time.monotonic()
                if self._closed or left <= 0:
                    raise BrowserError(f"no answer to {method}: {self.stderr_tail()}")
                self._lock.wait(left)
            answer = self._answers.pop(ident)
        if "error" in answer:
            raise BrowserError(f"{method}: {answer['error']}")
        return answer.get("result", {})

    def events(self, session: str | None = None) -> list[dict]:
        with self._lock:
            return [e for e in self._events if session is None or e.get("sessionId") == session]

    def wait_event(self, predicate: Callable[[dict], bool], timeout: float = 30.0) -> dict:
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                for event in self._events:
                    if predicate(event):
                        return event
                left = deadline - time.monotonic()
                if self._closed or left <= 0:
                    raise BrowserError("the awaited event did not come")
                self._lock.wait(left)

    def stderr_tail(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read().decode("utf-8", "replace")[-2000:]

    # -- pages --------------------------------------------------------------------------------
    def page(self, width: int = 1366, height: int = 768, mobile: bool = False,
             scripts: bool = True) -> Page:
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target,
                                                      "flatten": True})["sessionId"]
        page = Page(self, session)
        for domain in ("Page", "Runtime", "Network", "Log"):
            page.send(f"{domain}.enable")
        page.send("Emulation.setDeviceMetricsOverride", {
            "width": width, "height": height, "deviceScaleFactor": 1, "mobile": mobile})
        if not scripts:
            page.send("Emulation.setScriptExecutionDisabled", {"value": True})
        return page

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(BrowserError):
                self.send("Browser.close", timeout=5)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for fd in (self._to_child, self._from_child):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._reader.join(timeout=5)
        self.log.close()
        self._profile.cleanup()

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Page:
    def __init__(self, browser: Browser, session: str):
        self.browser = browser
        self.session = session

    def send(self, method: str, params: dict | None = None, timeout: float = 30.0) -> dict:
        return self.browser.send(method, params, self.session, timeout)

    def navigate(self, url: str, timeout: float = 30.0) -> None:
        seen = len(self.browser.events(self.session))
        answer = self.send("Page.navigate", {"url": url})
        if answer.get("errorText"):
            raise BrowserError(f"navigating to {url}: {answer['errorText']}")
        events = self.browser.events

        def loaded(event: dict) -> bool:
            return (event.get("sessionId") == self.session
                    and event["method"] == "Page.loadEventFired"
                    and event in events(self.session)[seen:])

        self.browser.wait_event(loaded, timeout)

    def evaluate(self, expression: str) -> Any:
        answer = self.send("Runtime.evaluate", {"expression": expression,
                                                "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in answer:
            raise BrowserError(f"{expression}: {answer['exceptionDetails']}")
        return answer["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 30.0) -> Any:
        """The first truthy value of `expression`, asked every 100 ms."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if value or time.monotonic() > deadline:
                return value
            time.sleep(0.1)

    def screenshot(self, path: Path, selector: str | None = None, full_page: bool = True) -> None:
        """PNG of the whole page (or of the element `selector`), at the viewport's width."""
        params: dict[str, Any] = {"format": "png", "captureBeyondViewport": True}
        if selector is not None:
            box = self.evaluate(
                f"(() => {{ const r = document.querySelector({json.dumps(selector)})"
                ".getBoundingClientRect(); return [r.left + window.scrollX, r.top + "
                "window.scrollY, r.width, r.height]; })()")
            params["clip"] = {"x": box[0], "y": box[1], "width": box[2], "height": box[3],
                              "scale": 1}
        elif full_page:
            size = self.send("Page.getLayoutMetrics")["cssContentSize"]
            params["clip"] = {"x": 0, "y": 0, "width": size["width"],
                              "height": size["height"], "scale": 1}
        data = self.send("Page.captureScreenshot", params)["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))

    # -- what happened ------------------------------------------------------------------------
    @property
    def requests(self) -> list[str]:
        """Every URL the page asked for, in order."""
        return [e["params"]["request"]["url"] for e in self.browser.events(self.session)
                if e["method"] == "Network.requestWillBeSent"]

    @property
    def problems(self) -> list[str]:
        """Console errors and warnings, uncaught exceptions, and errors the browser logged
        (CSP violations, failed loads)."""
        out = []
        for e in self.browser.events(self.session):
            method, params = e["method"], e.get("params", {})
            if method == "Runtime.exceptionThrown":
                out.append("exception: " + json.dumps(params["exceptionDetails"])[:500])
            elif method == "Runtime.consoleAPICalled" and params["type"] in (
                    "error", "warning", "assert"):
                out.append(f"console.{params['type']}: "
                           + " ".join(str(a.get("value", a.get("description", "")))
                                      for a in params["args"]))
            elif method == "Log.entryAdded" and params["entry"]["level"] in ("error", "warning"):
                entry = params["entry"]
                out.append(f"log {entry['level']} ({entry['source']}): {entry['text']} "
                           f"{entry.get('url', '')}")
        return out
