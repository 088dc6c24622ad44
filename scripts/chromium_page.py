"""Drive headless Chromium through its DevTools protocol over a pipe (no port, no extra
package): open a page, evaluate script in it, record its network requests and script errors,
and take screenshots. Used by tests/commands/test_catalog_page.py and to make docs/catalog-page-*.png:

    .venv/bin/python scripts/chromium_page.py catalog/index.html '' docs/catalog-page-1280.png 1280x900

Chromium is started with ``--remote-debugging-pipe``: it reads protocol messages (JSON, each
ended by a NUL byte) on file descriptor 3 and writes on 4.
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")


class ChromiumError(RuntimeError):
    pass


class Chromium:
    """One headless Chromium; :meth:`open` a URL in a fresh tab, then :meth:`evaluate`,
    :meth:`screenshot`; :attr:`requests` and :attr:`errors` collect what the tab loaded and
    which exceptions or console errors its scripts raised. Use as a context manager."""

    def __init__(self, binary: Path = CHROMIUM, width: int = 1400, height: int = 900, timeout: float = 60):
        if not Path(binary).is_file():
            raise ChromiumError(f"no {binary}: install Debian's chromium (apt-get install chromium; .ci/run does)")
        self.width, self.height, self.timeout = width, height, timeout
        self.profile = tempfile.mkdtemp(prefix="npubuild-chromium-")
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()
        # the child's ends, at 10 or above, so that placing them at 3 and 4 overwrites neither
        ends = (_above_9(to_chrome_r), _above_9(from_chrome_w))

        def child():  # in the child, before exec: its ends at 3 and 4, inheritable
            os.dup2(ends[0], 3)
            os.dup2(ends[1], 4)

        self.proc = subprocess.Popen(
            [
                str(binary),
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--hide-scrollbars",
                "--disable-extensions",
                f"--user-data-dir={self.profile}",
                "--remote-debugging-pipe",
                f"--window-size={width},{height}",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            preexec_fn=child,
            close_fds=False,
        )
        for fd in ends:
            os.close(fd)
        self._buf, self._id, self._session = b"", 0, None
        self.events: list[dict] = []
        self.requests: list[str] = []
        self.errors: list[str] = []
        self.call("Browser.getVersion")

    # ------------------------------------------------------------ protocol

    def _read(self, deadline: float) -> dict:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_chrome], [], [], left)[0]:
                raise ChromiumError(f"Chromium did not answer within {self.timeout:.0f} s")
            chunk = os.read(self._from_chrome, 1 << 20)
            if not chunk:
                err = self.proc.stderr.read().decode(errors="replace")[-2000:] if self.proc.poll() is not None else ""
                raise ChromiumError(f"Chromium closed its DevTools pipe (exit {self.proc.poll()}): {err}")
            self._buf += chunk
        msg, self._buf = self._buf.split(b"\0", 1)
        return json.loads(msg)

    def call(self, method: str, params: dict | None = None, session: bool | None = None) -> dict:
        """Send one command (to the open tab's session unless it is a Browser./Target. one) and
        return its result; events that arrive meanwhile are kept."""
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params or {}}
        if session if session is not None else (self._session and not method.startswith(("Browser.", "Target."))):
            msg["sessionId"] = self._session
        os.write(self._to_chrome, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            m = self._read(deadline)
            if m.get("id") == self._id:
                if "error" in m:
                    raise ChromiumError(f"{method}: {m['error']}")
                return m.get("result", {})
            self._event(m)

    def _event(self, m: dict) -> None:
        self.events.append(m)
        p = m.get("params", {})
        if m.get("method") == "Network.requestWillBeSent":
            self.requests.append(p["request"]["url"])
        elif m.get("method") == "Runtime.exceptionThrown":
            d = p["exceptionDetails"]
            self.errors.append((d.get("exception") or {}).get("description") or d.get("text", "exception"))
        elif m.get("method") == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            self.errors.append(" ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
        elif m.get("method") == "Log.entryAdded" and p["entry"].get("level") == "error":
            self.errors.append(p["entry"].get("text", ""))

    def _wait_event(self, method: str) -> dict:
        deadline = time.monotonic() + self.timeout
        seen = len(self.events)
        while True:
            for m in self.events[seen:]:
                if m.get("method") == method:
                    return m
            seen = len(self.events)
            self._event(self._read(deadline))

    # ------------------------------------------------------------ pages

    def open(self, url: str) -> None:
        """Open ``url`` in a fresh tab (the previous one is closed) and wait for its load event."""
        if self._session:
            self.call("Target.closeTarget", {"targetId": self._target})
        self._target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self._session = self.call("Target.attachToTarget", {"targetId": self._target, "flatten": True})["sessionId"]
        self.requests.clear()
        self.errors.clear()
        for domain in ("Page", "Network", "Runtime", "Log"):
            self.call(f"{domain}.enable")
        self.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": self.width, "height": self.height, "deviceScaleFactor": 1, "mobile": False},
        )
        self.events.clear()
        nav = self.call("Page.navigate", {"url": url})
        if nav.get("errorText"):
            raise ChromiumError(f"{url}: {nav['errorText']}")
        self._wait_event("Page.loadEventFired")

    def evaluate(self, expression: str):
        """The value of a JavaScript expression in the open tab (promises awaited)."""
        r = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in r:
            d = r["exceptionDetails"]
            raise ChromiumError(f"{expression[:80]}: {(d.get('exception') or {}).get('description') or d.get('text')}")
        return r["result"].get("value")

    def wait_for(self, expression: str, timeout: float | None = None):
        """Evaluate ``expression`` until it is truthy; return its value."""
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            v = self.evaluate(expression)
            if v:
                return v
            if time.monotonic() > deadline:
                raise ChromiumError(f"still false after {timeout or self.timeout:.0f} s: {expression}")
            time.sleep(0.05)

    def screenshot(self, out: Path, full_height: bool = False) -> Path:
        """A PNG of the tab's viewport (``full_height``: down to the end of the page)."""
        params = {"format": "png"}
        if full_height:
            h = self.evaluate("document.documentElement.scrollHeight")
            params.update(
                clip={"x": 0, "y": 0, "width": self.width, "height": h, "scale": 1}, captureBeyondViewport=True
            )
        Path(out).write_bytes(base64.b64decode(self.call("Page.captureScreenshot", params)["data"]))
        return Path(out)

    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                try:
                    self.call("Browser.close", session=False)
                except ChromiumError:
                    pass
                self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        finally:
            for fd in (self._to_chrome, self._from_chrome):
                try:
                    os.close(fd)
                except OSError:
                    pass
            if self.proc.stderr:
                self.proc.stderr.close()
            shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _above_9(fd: int) -> int:
    """``fd`` moved to a number of at least 10, close-on-exec."""
    import fcntl

    high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return high


def main(argv: list[str]) -> int:
    if len(argv) not in (3, 4):
        print(__doc__.strip().splitlines()[4].strip(), file=sys.stderr)
        print("usage: chromium_page.py PAGE.html '#fragment' OUT.png [WIDTHxHEIGHT]", file=sys.stderr)
        return 2
    page, fragment, out = Path(argv[0]).resolve(), argv[1], Path(argv[2])
    w, h = (int(x) for x in (argv[3] if len(argv) == 4 else "1400x1000").split("x"))
    with Chromium(width=w, height=h) as c:
        c.open(page.as_uri() + fragment)
        c.wait_for("document.body.dataset.rendered")
        time.sleep(0.3)
        c.screenshot(out)
        if c.errors:
            print("script errors: " + "; ".join(c.errors), file=sys.stderr)
            return 1
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
