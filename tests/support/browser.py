"""Headless Chromium driven over the DevTools protocol: enough to load a page, read its DOM and screenshot.

The system Chromium (Debian's ``chromium``, installed by ``make test-deps``) and aiohttp's websocket client;
no browser-automation package.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import aiohttp

CHROMIUM = "/usr/bin/chromium"
_LISTENING = re.compile(rb"DevTools listening on (ws://\S+)")


class Browser:
    """One headless Chromium with one page; ``await Browser.launch()``, then ``await browser.close()``."""

    def __init__(self, process: asyncio.subprocess.Process, profile: str) -> None:
        self._process = process
        self._profile = profile
        self._http = aiohttp.ClientSession()
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._session = ""

    @classmethod
    async def launch(cls, executable: str = CHROMIUM, width: int = 1400, height: int = 1000) -> Browser:
        profile = tempfile.mkdtemp(prefix="progrouter-chromium-")
        process = await asyncio.create_subprocess_exec(
            executable,
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--remote-debugging-port=0",
            f"--user-data-dir={profile}",
            f"--window-size={width},{height}",
            "about:blank",
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        browser = cls(process, profile)
        try:
            await browser._connect()
        except BaseException:
            await browser.close()
            raise
        return browser

    async def _connect(self) -> None:
        stderr = self._process.stderr
        assert stderr is not None
        url = None
        async with asyncio.timeout(30):
            while url is None:
                line = await stderr.readline()
                if not line:
                    raise RuntimeError("chromium exited before its DevTools endpoint was up")
                found = _LISTENING.search(line)
                url = None if found is None else found.group(1).decode()
        self._tasks.append(asyncio.create_task(self._drain(stderr)))
        self._ws = await self._http.ws_connect(url, max_msg_size=1 << 28)
        self._tasks.append(asyncio.create_task(self._read()))
        target = await self.send("Target.createTarget", {"url": "about:blank"}, page=False)
        attached = await self.send(
            "Target.attachToTarget", {"targetId": target["targetId"], "flatten": True}, page=False
        )
        self._session = attached["sessionId"]
        await self.send("Page.enable")
        await self.send("Runtime.enable")

    @staticmethod
    async def _drain(stream: asyncio.StreamReader) -> None:
        while await stream.read(65536):
            pass

    async def _read(self) -> None:
        assert self._ws is not None
        async for message in self._ws:
            if message.type is not aiohttp.WSMsgType.TEXT:
                continue
            data = message.json()
            future = self._pending.pop(data.get("id", -1), None)
            if future is not None and not future.done():
                future.set_result(data)
        for future in self._pending.values():
            future.set_exception(ConnectionError("DevTools connection closed"))

    async def send(self, method: str, params: dict[str, Any] | None = None, *, page: bool = True) -> Any:
        """One DevTools command (on the page's session unless ``page`` is False); its ``result``."""
        assert self._ws is not None
        ident = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[ident] = future
        message: dict[str, Any] = {"id": ident, "method": method, "params": params or {}}
        if page:
            message["sessionId"] = self._session
        await self._ws.send_json(message)
        async with asyncio.timeout(30):
            reply = await future
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return reply.get("result", {})

    async def goto(self, url: str) -> None:
        await self.send("Page.navigate", {"url": url})
        await self.wait_for("document.readyState === 'complete'")

    async def evaluate(self, expression: str) -> Any:
        result = await self.send(
            "Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True}
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def wait_for(self, expression: str, timeout: float = 20.0) -> Any:
        """Poll ``expression`` in the page until it is truthy; fail with its last value after ``timeout``."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            value = await self.evaluate(expression)
            if value:
                return value
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"{expression!r} still {value!r} after {timeout} s")
            await asyncio.sleep(0.05)

    async def screenshot(self, path: Path) -> Path:
        shot = await self.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(shot["data"]))
        return path

    async def close(self) -> None:
        if self._ws is not None:
            with contextlib.suppress(Exception):
                await self.send("Browser.close", page=False)
            await self._ws.close()
        if self._process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self._process.kill()
        await self._process.wait()
        for task in self._tasks:
            task.cancel()
        await self._http.close()
        shutil.rmtree(self._profile, ignore_errors=True)
