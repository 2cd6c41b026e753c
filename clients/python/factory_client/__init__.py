"""factory_client: a Python client of the factory service's HTTP API (``factory serve
--http``), with the Node client's names (``clients/node``): ``join_session`` /
``joinSession``, ``session.factory.run / resume / listRuns / getRun / getRunDetail /
getRunProgress / cancel / waitForRun``, ``session.on("factory.run_updated", handler)``,
``isFactoryRunTerminal``, ``FactoryError``, ``FactoryResumeError``. Standard library only
(``urllib``, ``json``, ``threading``); synchronous (each call blocks until it is answered).

Every snake_case method has its camelCase twin (``list_runs`` is ``listRuns``), so code
written against the Node client reads the same.

One ``join_session`` is one session of the service: the runs it starts, the factories it
registers and the runs it can see are that session's only (every call carries the
``Factory-Session`` header).
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from datetime import datetime, timezone
from typing import Any, Callable, Iterable, Optional

__all__ = [
    "FACTORY_RUN_UPDATED",
    "FACTORY_RESUME_ERROR_CODES",
    "FactoryError",
    "FactoryResumeError",
    "FactorySession",
    "isFactoryRunTerminal",
    "is_factory_run_terminal",
    "joinSession",
    "join_session",
    "resolveConnection",
    "resolve_connection",
]

#: The event a session emits when one of its runs changes durably.
FACTORY_RUN_UPDATED = "factory.run_updated"

#: The codes a FactoryResumeError carries (pre-execution resume failures).
FACTORY_RESUME_ERROR_CODES = (
    "not_found",
    "non_resumable",
    "already_active",
    "reapproval_declined",
    "no_approval_provider",
)

_TERMINAL = frozenset({"completed", "error", "halted", "cancelled"})
_SESSION_HEADER = "factory-session"
#: waitForRun's periodic re-read besides the run_updated events it follows (seconds).
_DEFAULT_POLL_INTERVAL = 5.0
#: The largest answer or event line read (bytes).
_MAX_BODY_BYTES = 64 << 20
_MAX_EVENT_LINE_BYTES = 8 << 20
#: The event stream's reconnect delay: first and at most (it doubles in between).
_RECONNECT = (0.25, 5.0)


def is_factory_run_terminal(status: Optional[str]) -> bool:
    """Whether ``status`` is one a run never leaves: completed, error, halted, cancelled."""
    return status in _TERMINAL


isFactoryRunTerminal = is_factory_run_terminal


class FactoryError(Exception):
    """A refusal or failure of the factory service, with its error code (``unknown_factory``, ...)."""

    def __init__(self, code: str, message: str, http_status: Optional[int] = None):
        super().__init__(message)
        #: The service's error code, or ``unavailable`` when it cannot be reached.
        self.code = code
        #: The HTTP status of the answer, when there was one.
        self.http_status = http_status
        self.httpStatus = http_status


class FactoryResumeError(FactoryError):
    """A resume that failed before an attempt started; ``code`` is in FACTORY_RESUME_ERROR_CODES."""


def _default_state_dir(env: dict) -> str:
    if env.get("FACTORY_STATE_DIR"):
        return env["FACTORY_STATE_DIR"]
    if env.get("XDG_STATE_HOME"):
        return os.path.join(env["XDG_STATE_HOME"], "factory")
    return os.path.join(os.path.expanduser("~"), ".local", "state", "factory")


def _read_state_file(directory: str, name: str, what: str) -> str:
    path = os.path.join(directory, name)
    try:
        with open(path, encoding="utf-8") as f:
            return f.read(4096).strip()
    except OSError as e:
        raise FactoryError(
            "unavailable",
            f"no {what} given and {path} cannot be read ({e.strerror}): start `factory serve --http 127.0.0.1:PORT`, "
            "or pass url/token (or set FACTORY_URL/FACTORY_TOKEN, or FACTORY_STATE_DIR)",
        ) from e


def resolve_connection(url: Optional[str] = None, token: Optional[str] = None, state_dir: Optional[str] = None,
                       env: Optional[dict] = None) -> dict:
    """Where the service is and its token: ``url``/``token``, else FACTORY_URL/FACTORY_TOKEN,
    else the ``http.addr``/``http.token`` files of the state directory (``state_dir``, else
    FACTORY_STATE_DIR, else $XDG_STATE_HOME/factory, else ~/.local/state/factory)."""
    env = dict(os.environ) if env is None else env
    directory = state_dir or _default_state_dir(env)
    base = url or env.get("FACTORY_URL") or "http://" + _read_state_file(directory, "http.addr", "url")
    bearer = token or env.get("FACTORY_TOKEN") or _read_state_file(directory, "http.token", "token")
    parts = urllib.parse.urlsplit(base)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise FactoryError("error", f"not an http(s) URL: {base!r}")
    return {"url": f"{parts.scheme}://{parts.netloc}", "token": bearer}


resolveConnection = resolve_connection


class _Transport:
    """The HTTP API as one session sees it."""

    def __init__(self, url: str, token: str, session: str):
        self.url = url
        self.headers = {"authorization": f"Bearer {token}", _SESSION_HEADER: session}

    def request(self, method: str, path: str, body: Any = None, timeout: Optional[float] = 60.0) -> Any:
        headers = dict(self.headers)
        data = None
        if body is not None:
            headers["content-type"] = "application/json"
            data = json.dumps(body).encode("utf-8")
        req = urllib.request.Request(self.url + path, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as response:
                status, text = response.status, response.read(_MAX_BODY_BYTES + 1)
        except urllib.error.HTTPError as e:
            status, text = e.code, e.read(_MAX_BODY_BYTES + 1)
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise FactoryError("unavailable", f"the factory service at {self.url} cannot be reached: {reason}") from e
        if len(text) > _MAX_BODY_BYTES:
            raise FactoryError("error", f"{method} {path}: the answer is larger than {_MAX_BODY_BYTES} bytes", status)
        value = None
        if text:
            try:
                value = json.loads(text)
            except ValueError:
                raise FactoryError("error", f"{method} {path}: the service answered {status} with no JSON", status) from None
        if status >= 400:
            code = value.get("code") if isinstance(value, dict) and isinstance(value.get("code"), str) else "error"
            message = value.get("message") if isinstance(value, dict) and isinstance(value.get("message"), str) else f"{method} {path}: HTTP {status}"
            raise FactoryError(code, message, status)
        return value


class _Events:
    """The session's events: one ``/api/events`` stream on a thread, open while anyone
    listens, reconnected after a drop."""

    def __init__(self, transport: _Transport):
        self.transport = transport
        self.lock = threading.Lock()
        self.listeners: dict[str, list[list]] = {}
        self.open_listeners: list[Callable[[], None]] = []
        self.count = 0
        self.thread: Optional[threading.Thread] = None
        self.connection: Optional[http.client.HTTPConnection] = None
        self.closed = False
        self.wake = threading.Event()

    def on(self, kind: str, handler: Callable[[dict], None]) -> Callable[[], None]:
        with self.lock:
            if self.closed:
                raise FactoryError("error", "this session is closed")
            entry = [handler]  # one registration per call, even of the same function twice
            self.listeners.setdefault(kind, []).append(entry)
            self.count += 1
            self._start()
        removed = False

        def off() -> None:
            nonlocal removed
            with self.lock:
                if removed:
                    return
                removed = True
                self.listeners[kind] = [e for e in self.listeners.get(kind, []) if e is not entry]
                self.count -= 1
                if self.count == 0:
                    self._stop()

        return off

    def on_open(self, handler: Callable[[], None]) -> Callable[[], None]:
        with self.lock:
            self.open_listeners.append(handler)

        def off() -> None:
            with self.lock:
                if handler in self.open_listeners:
                    self.open_listeners.remove(handler)

        return off

    def close(self) -> None:
        with self.lock:
            self.closed = True
            self.listeners.clear()
            self.count = 0
            self._stop()

    def _start(self) -> None:
        if self.thread is not None and self.thread.is_alive():
            return
        self.wake.clear()
        self.thread = threading.Thread(target=self._loop, name="factory-events", daemon=True)
        self.thread.start()

    def _stop(self) -> None:
        self.wake.set()
        # Shut the socket down (a close would wait for the read in progress): the blocked
        # read returns at once and the thread sees that nobody listens.
        connection = self.connection
        sock = connection.sock if connection is not None else None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _active(self) -> bool:
        with self.lock:
            return self.count > 0 and not self.closed

    def _loop(self) -> None:
        delay = _RECONNECT[0]
        while self._active():
            headers = dict(self.transport.headers)
            headers["accept"] = "text/event-stream"
            parts = urllib.parse.urlsplit(self.transport.url)
            kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
            connection = kind(parts.hostname, parts.port, timeout=None)
            try:
                self.connection = connection
                if not self._active():
                    return
                connection.request("GET", "/api/events", headers=headers)
                response = connection.getresponse()
                if response.status == 200:
                    delay = _RECONNECT[0]
                    with self.lock:
                        openers = list(self.open_listeners)
                    for opener in openers:
                        opener()
                    self._read(response)
            except Exception:  # noqa: BLE001 - dropped, refused or shut down: reconnect below while someone listens
                pass
            finally:
                self.connection = None
                connection.close()
            if not self._active():
                return
            self.wake.wait(delay)
            delay = min(delay * 2, _RECONNECT[1])

    def _read(self, response) -> None:
        name, data = "message", []
        while self._active():
            raw = response.readline(_MAX_EVENT_LINE_BYTES + 1)
            if not raw:
                return
            if len(raw) > _MAX_EVENT_LINE_BYTES:
                return
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            if line == "":
                if data:
                    self._received(name, "\n".join(data))
                name, data = "message", []
                continue
            if line.startswith(":"):
                continue
            field, _, value = line.partition(":")
            if value.startswith(" "):
                value = value[1:]
            if field == "event":
                name = value
            elif field == "data":
                data.append(value)

    def _received(self, name: str, data: str) -> None:
        if name != "run_updated":
            return
        try:
            payload = json.loads(data)
        except ValueError:
            return
        if not isinstance(payload, dict) or not isinstance(payload.get("runId"), str) or not isinstance(payload.get("revision"), int):
            return
        event = {
            "id": str(uuid.uuid4()),
            "timestamp": datetime.now(timezone.utc).isoformat(),
            "parentId": None,
            "ephemeral": True,
            "type": FACTORY_RUN_UPDATED,
            "data": {"runId": payload["runId"], "revision": payload["revision"]},
        }
        with self.lock:
            handlers = [e[0] for key in (FACTORY_RUN_UPDATED, "*") for e in self.listeners.get(key, [])]
        for handler in handlers:
            try:
                handler(event)
            except Exception:  # noqa: BLE001 - a throwing listener must not stop the others
                pass


def _run_path(run_id: str, rest: str = "") -> str:
    if not isinstance(run_id, str) or run_id == "":
        raise TypeError("a run id must be a non-empty string")
    return f"/api/runs/{urllib.parse.quote(run_id, safe='')}{rest}"


class FactoryApi:
    """``session.factory``: run, resume and observe the session's runs."""

    def __init__(self, transport: _Transport, events: _Events, poll_interval: float):
        self._transport = transport
        self._events = events
        self._poll_interval = poll_interval

    def run(self, name_or_handle: Any, args: Any = None, limits: Optional[dict] = None) -> dict:
        """Run a factory by registered name or handle; returns the run's terminal envelope
        for every outcome. Raises FactoryError only when no run exists (``unknown_factory``,
        ``invalid_limits``, ...)."""
        name = name_or_handle if isinstance(name_or_handle, str) else (name_or_handle or {}).get("name")
        if not isinstance(name, str) or name == "":
            raise TypeError("session.factory.run: give a factory name or a handle from join_session")
        body = {"name": name}
        if args is not None:
            body["args"] = args
        if limits is not None:
            body["limits"] = limits
        started = self._transport.request("POST", "/api/runs", body)
        return self.wait_for_run(started["runId"])

    def resume(self, run_id: str, limits: Optional[dict] = None) -> dict:
        """Resume a run (same args, journaled work replays) with limits raised; its terminal
        envelope. A failure before the attempt starts raises FactoryResumeError."""
        body = {} if limits is None else {"limits": limits}
        try:
            started = self._transport.request("POST", _run_path(run_id, "/resume"), body)
        except FactoryError as e:
            if e.code in FACTORY_RESUME_ERROR_CODES and not isinstance(e, FactoryResumeError):
                raise FactoryResumeError(e.code, str(e), e.http_status) from e
            raise
        return self.wait_for_run(started["runId"])

    def list_runs(self) -> list:
        """The session's runs (envelopes) in durable creation order."""
        return self._transport.request("GET", "/api/runs")

    def get_run_detail(self, run_id: str) -> dict:
        """The run's envelope with phases, prompt-safe agent summaries and the latest progress."""
        return self._transport.request("GET", _run_path(run_id))

    def get_run_progress(self, run_id: str, phase_id: Optional[str] = None, after_seq: Optional[int] = None,
                         before_seq: Optional[int] = None, limit: Optional[int] = None) -> list:
        """A page of progress entries (ascending ``seq``): after ``after_seq``, before
        ``before_seq``, in phase ``phase_id`` (its title), at most ``limit``; with neither
        seq, the latest tail."""
        query = {}
        for key, value in (("phase", phase_id), ("afterSeq", after_seq), ("beforeSeq", before_seq), ("limit", limit)):
            if value is not None:
                query[key] = str(value)
        text = urllib.parse.urlencode(query)
        return self._transport.request("GET", _run_path(run_id, "/progress" + (f"?{text}" if text else "")))

    def get_run(self, run_id: str) -> dict:
        """The run's latest envelope."""
        return self._transport.request("GET", _run_path(run_id, "/envelope"))

    def cancel(self, run_id: str) -> dict:
        """Cancel the run; its terminal envelope."""
        return self._transport.request("POST", _run_path(run_id, "/cancel"))

    def wait_for_run(self, run_id: str, timeout: Optional[float] = None) -> dict:
        """The run's terminal envelope once it settles (at once if it has): follows
        ``factory.run_updated`` and re-reads the envelope on each, plus a periodic re-read.
        ``timeout`` (seconds) raises TimeoutError when it passes first; the run goes on."""
        _run_path(run_id)
        changed = threading.Event()
        off_event = self._events.on(FACTORY_RUN_UPDATED, lambda e: e["data"]["runId"] == run_id and changed.set())
        off_open = self._events.on_open(changed.set)
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while True:
                changed.clear()
                try:
                    envelope = self.get_run(run_id)
                    if is_factory_run_terminal((envelope or {}).get("status")):
                        return envelope
                except FactoryError as e:
                    if e.code != "unavailable":
                        raise
                wait = self._poll_interval
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise TimeoutError(f"run {run_id} did not end within {timeout} s")
                    wait = min(wait, left)
                changed.wait(wait)
        finally:
            off_event()
            off_open()

    listRuns = list_runs
    getRunDetail = get_run_detail
    getRunProgress = get_run_progress
    getRun = get_run
    waitForRun = wait_for_run


class FactorySession:
    """A session of the service, as ``join_session`` returns it."""

    def __init__(self, session_id: str, transport: _Transport, events: _Events, factories: list, poll_interval: float):
        #: The session's name: its runs and registered factories are its own.
        self.session_id = session_id
        self.sessionId = session_id
        #: The service's address.
        self.url = transport.url
        #: Handles of the factories join_session registered, in the order given.
        self.factories = factories
        #: Run, resume and observe.
        self.factory = FactoryApi(transport, events, poll_interval)
        self._events = events

    def on(self, kind_or_handler: Any, handler: Optional[Callable[[dict], None]] = None) -> Callable[[], None]:
        """Listen for ``factory.run_updated`` of this session's runs (``{type, id, timestamp,
        parentId, ephemeral, data: {runId, revision}}``), or, given only a handler, every
        event; called on the event thread. Returns the function that stops listening."""
        if callable(kind_or_handler) and handler is None:
            return self._events.on("*", kind_or_handler)
        if not isinstance(kind_or_handler, str) or not callable(handler):
            raise TypeError("session.on(type, handler) or session.on(handler)")
        return self._events.on(kind_or_handler, handler)

    def disconnect(self) -> None:
        """Stop every listener and the event stream (runs are not affected)."""
        self._events.close()

    def __enter__(self) -> "FactorySession":
        return self

    def __exit__(self, *_exc: Any) -> None:
        self.disconnect()


def join_session(factories: Iterable[str] = (), session: Optional[str] = None, url: Optional[str] = None,
                 token: Optional[str] = None, state_dir: Optional[str] = None,
                 poll_interval: float = _DEFAULT_POLL_INTERVAL) -> FactorySession:
    """Join a session of the factory service: ``session`` (a name; default a fresh
    ``python-<uuid>``), registering ``factories`` in it (paths of ``.js``, ``.ts``, ``.py``
    or ``.wasm`` factories or component directories, relative to the working directory), so
    ``session.factory.run(name)`` runs them. Connection: see resolve_connection."""
    if isinstance(factories, (str, bytes)):
        raise TypeError("join_session: `factories` is a list of paths")
    connection = resolve_connection(url, token, state_dir)
    session_id = session or f"python-{uuid.uuid4()}"
    transport = _Transport(connection["url"], connection["token"], session_id)
    handles = []
    for entry in factories:
        path = os.path.abspath(os.fspath(entry))
        registered = transport.request("POST", "/api/factories", {"path": path})
        handles.append({
            "name": registered["meta"]["name"],
            "meta": registered["meta"],
            "sha256": (registered.get("script") or {}).get("sha256") or registered.get("hash"),
            "source": path,
        })
    return FactorySession(session_id, transport, _Events(transport), handles, poll_interval)


joinSession = join_session
