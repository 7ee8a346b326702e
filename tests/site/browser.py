"""Headless Chromium driven over the DevTools protocol, and a loopback HTTP server for a built site (test helpers)."""

from __future__ import annotations

import base64
import functools
import http.server
import json
import re
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

import websocket

CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--hide-scrollbars", "--window-size=1280,900")


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return None


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):
        pass


class LoopbackServer:
    """Serves a folder on 127.0.0.1 (a free port) from a daemon thread."""

    def __init__(self, folder: Path) -> None:
        handler = functools.partial(_QuietHandler, directory=str(folder))
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/"

    def __enter__(self) -> Self:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@dataclass
class PageVisit:
    url: str
    title: str
    h1: str
    headings: list[str]
    errors: list[str] = field(default_factory=list)  # console errors, uncaught exceptions, failed loads
    screenshot: Path | None = None


class Chromium:
    """One headless browser with one page; `visit(url)` loads it and collects what went wrong."""

    def __init__(self, executable: str, timeout_s: float = 30.0) -> None:
        self.executable, self.timeout_s = executable, timeout_s
        self.profile = tempfile.TemporaryDirectory(prefix="toolbox-chromium-", ignore_cleanup_errors=True)  # helpers may still be writing
        self.process: subprocess.Popen | None = None
        self.socket: websocket.WebSocket | None = None
        self.next_id = 0
        self.events: list[dict] = []

    def __enter__(self) -> Self:
        self.process = subprocess.Popen(
            [self.executable, *CHROMIUM_FLAGS, f"--user-data-dir={self.profile.name}", "--remote-debugging-port=0", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        port = self._devtools_port()
        targets = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10).read())
        page = next(t for t in targets if t.get("type") == "page")
        self.socket = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=self.timeout_s, suppress_origin=True)
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable")
        return self

    def _devtools_port(self) -> int:
        assert self.process is not None and self.process.stderr is not None
        deadline = time.monotonic() + self.timeout_s
        seen = []
        while time.monotonic() < deadline:
            line = self.process.stderr.readline()
            if not line:
                if self.process.poll() is not None:
                    break
                continue
            seen.append(line)
            match = re.search(r"DevTools listening on ws://[^:]+:(\d+)/", line)
            if match:
                threading.Thread(target=self._drain, daemon=True).start()
                return int(match.group(1))
        raise RuntimeError("Chromium did not start its DevTools endpoint:\n" + "".join(seen[-20:]))

    def _drain(self) -> None:
        assert self.process is not None and self.process.stderr is not None
        for _ in self.process.stderr:
            pass

    def __exit__(self, *exc) -> None:
        if self.socket is not None:
            self.socket.close()
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self.profile.cleanup()

    def call(self, method: str, **params) -> dict:
        assert self.socket is not None
        self.next_id += 1
        wanted = self.next_id
        self.socket.send(json.dumps({"id": wanted, "method": method, "params": params}))
        while True:
            message = json.loads(self.socket.recv())
            if message.get("id") == wanted:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            self.events.append(message)

    def _wait_for(self, method: str) -> None:
        assert self.socket is not None
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            if any(e.get("method") == method for e in self.events):
                return
            self.events.append(json.loads(self.socket.recv()))
        raise TimeoutError(f"no {method} within {self.timeout_s} s")

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def visit(self, url: str, screenshot: Path | None = None, settle_s: float = 0.5) -> PageVisit:
        self.events = []
        self.call("Page.navigate", url=url)
        self._wait_for("Page.loadEventFired")
        time.sleep(settle_s)  # late scripts (search worker, palette) get a moment to complain
        self.call("Runtime.evaluate", expression="1")  # collects the events that arrived meanwhile
        visit = PageVisit(
            url=url,
            title=self.evaluate("document.title"),
            h1=self.evaluate("(document.querySelector('article h1') || {}).textContent || ''").replace("¶", "").strip(),
            headings=[h.replace("¶", "").strip() for h in self.evaluate("Array.from(document.querySelectorAll('article h2')).map(h => h.textContent)")],
            errors=self._errors(),
        )
        if screenshot is not None:
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            data = self.call("Page.captureScreenshot", format="png")["data"]
            screenshot.write_bytes(base64.b64decode(data))
            visit.screenshot = screenshot
        return visit

    def _errors(self) -> list[str]:
        errors = []
        for event in self.events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                errors.append("console: " + " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", [])))
            elif method == "Runtime.exceptionThrown":
                details = params.get("exceptionDetails", {})
                errors.append("exception: " + str(details.get("exception", {}).get("description") or details.get("text")))
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                entry = params["entry"]
                errors.append(f"log ({entry.get('source')}): {entry.get('text')} {entry.get('url', '')}".strip())
            elif method == "Network.loadingFailed" and not params.get("canceled"):
                errors.append(f"load failed: {params.get('errorText')} ({params.get('type')})")
            elif method == "Network.responseReceived" and params.get("response", {}).get("status", 200) >= 400:
                errors.append(f"HTTP {params['response']['status']}: {params['response'].get('url')}")
        return errors
