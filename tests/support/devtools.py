"""Drive headless Chromium over the Chrome DevTools protocol, with the standard library only.

`--remote-debugging-pipe` makes Chromium read protocol commands from its fd 3 and write
replies and events to its fd 4, each message JSON ended by a NUL byte: no websocket
client, no port, nothing another process on the machine can reach. One `Browser` is one
Chromium process; `page()` attaches to its first tab (flat sessions: every command names
its session).
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import subprocess
import tempfile
import time
from typing import Any

from browser import FLAGS, chromium


class DevToolsError(AssertionError):
    """A protocol command failed, or the browser did not answer in time."""


def _high_fd(fd: int) -> int:
    """`fd` moved above 9 (close-on-exec), so placing the pipes at 3 and 4 in the child cannot clobber them."""
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return moved


class Browser:
    """One headless Chromium in a fresh profile, stopped on close (or at the end of a `with`)."""

    def __init__(self, timeout_s: float = 60) -> None:
        self.timeout_s = timeout_s
        self._profile = tempfile.TemporaryDirectory(prefix="hp_otel_chromium_")
        commands_read, commands_write = map(_high_fd, os.pipe())
        replies_read, replies_write = map(_high_fd, os.pipe())

        def pipes_at_3_and_4() -> None:  # in the child, before exec: dup2 clears close-on-exec
            os.dup2(commands_read, 3)
            os.dup2(replies_write, 4)

        self._log = tempfile.TemporaryFile()
        self.process = subprocess.Popen(
            [chromium(), *FLAGS, f"--user-data-dir={self._profile.name}", "--remote-debugging-pipe", "about:blank"],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            pass_fds=(3, 4),  # kept open through exec; the preexec function has put the pipes there
            preexec_fn=pipes_at_3_and_4,
            start_new_session=True,
        )
        os.close(commands_read)
        os.close(replies_write)
        self._out = commands_write
        self._in = replies_read
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def log_tail(self) -> str:
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-3000:]

    def send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> dict[str, Any]:
        """Run one command and return its result; events that arrive meanwhile go to `events`."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._out, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + self.timeout_s
        while True:
            reply = self._read(deadline, method)
            if reply.get("id") != self._next_id:
                self.events.append(reply)
                continue
            if "error" in reply:
                raise DevToolsError(f"{method}: {reply['error']}")
            return reply.get("result", {})

    def _read(self, deadline: float, waiting_for: str) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._in], [], [], left)[0]:
                raise DevToolsError(f"no reply to {waiting_for} within {self.timeout_s} s:\n{self.log_tail()}")
            chunk = os.read(self._in, 1 << 20)
            if not chunk:
                raise DevToolsError(f"Chromium closed its pipe (waiting for {waiting_for}):\n{self.log_tail()}")
            self._buffer += chunk
        message, _, self._buffer = self._buffer.partition(b"\0")
        return json.loads(message)

    def page(self) -> Page:
        """The browser's first tab, attached."""
        targets = self.send("Target.getTargets")["targetInfos"]
        tab = next(t for t in targets if t["type"] == "page")
        session = self.send("Target.attachToTarget", {"targetId": tab["targetId"], "flatten": True})["sessionId"]
        return Page(self, session)

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                os.write(self._out, json.dumps({"id": 0, "method": "Browser.close"}).encode() + b"\0")
                self.process.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                os.killpg(self.process.pid, 9)
                self.process.wait(5)
        for fd in (self._out, self._in):
            try:
                os.close(fd)
            except OSError:
                pass
        self._log.close()
        self._profile.cleanup()


class Page:
    """One tab: navigate, evaluate JavaScript, set a file input's files."""

    def __init__(self, browser: Browser, session: str) -> None:
        self.browser = browser
        self.session = session
        self.send("Page.enable")
        self.send("Runtime.enable")  # console messages and uncaught exceptions arrive as events

    def send(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.browser.send(method, params, self.session)

    def navigate(self, url: str) -> None:
        self.send("Page.navigate", {"url": url})

    def evaluate(self, expression: str) -> Any:
        """The expression's value (a promise is awaited); a JavaScript exception fails with its text."""
        result = self.send("Runtime.evaluate", {"expression": expression, "awaitPromise": True, "returnByValue": True})
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            raise DevToolsError(f"{expression[:200]}: {details.get('exception', {}).get('description', details)}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout_s: float, what: str, interval_s: float = 0.5) -> Any:
        """Evaluate `expression` until it is truthy; its value."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise DevToolsError(f"timed out after {timeout_s} s waiting for {what}; last value {value!r}")
            time.sleep(interval_s)

    def set_files(self, selector: str, paths: list[str]) -> None:
        """Choose `paths` in the file input `selector`, as a user does in the file dialog (fires its change event)."""
        root = self.send("DOM.getDocument", {"depth": 0})["root"]["nodeId"]
        node = self.send("DOM.querySelector", {"nodeId": root, "selector": selector})["nodeId"]
        if not node:
            raise DevToolsError(f"no element {selector!r} in the page")
        self.send("DOM.setFileInputFiles", {"nodeId": node, "files": paths})

    def console_errors(self) -> list[str]:
        """What the page logged as an error, and its uncaught exceptions, so far."""
        errors = []
        for event in self.browser.events:
            if event.get("sessionId") != self.session:
                continue
            params = event.get("params", {})
            if event.get("method") == "Runtime.exceptionThrown":
                errors.append(str(params.get("exceptionDetails", {}).get("exception", {}).get("description", params)))
            elif event.get("method") == "Runtime.consoleAPICalled" and params.get("type") == "error":
                errors.append(" ".join(str(arg.get("value", arg.get("description", ""))) for arg in params["args"]))
        return errors
