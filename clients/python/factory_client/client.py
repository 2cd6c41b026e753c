"""The factory service's run, resume and observe API for Python programs, over the HTTP API of
`factory serve --http`: the same calls as the Node client (`clients/node`) with Python names
(`join_session`, `session.factory.run/resume/list_runs/get_run_detail/get_run_progress/
get_run/cancel/wait_for_run`, `session.events()`, `is_factory_run_terminal`,
`FactoryResumeError`, and the owner's `stats`). Standard library only (`urllib.request`, `json`); every read of a server
reply is bounded (`MAX_BODY_BYTES` for a JSON answer, `MAX_EVENT_LINE_BYTES` for a line and
for an event of the event stream).

One `join_session` is one session of the service: the runs it starts, the factories it
registers and the runs it can see, follow and control are that session's only (every call
carries the `Factory-Session` header).
"""

from __future__ import annotations

import json
import os
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from http.client import HTTPException, HTTPResponse
from pathlib import Path
from typing import Any, Final, NotRequired, TypedDict, overload

__all__ = [
    "FACTORY_RESUME_ERROR_CODES",
    "MAX_BODY_BYTES",
    "MAX_EVENT_LINE_BYTES",
    "FactoryApi",
    "FactoryError",
    "FactoryHandle",
    "FactoryPermissionRequest",
    "PermissionHandler",
    "FactoryResumeError",
    "FactoryRunsPage",
    "FactoryStoreStats",
    "FactorySession",
    "WORKFLOW_RESUME_ERROR_CODES",
    "WorkflowResumeError",
    "is_workflow_run_terminal",
    "ProgressEvent",
    "RunSettled",
    "RunStarted",
    "RunUpdated",
    "is_factory_run_terminal",
    "join_session",
    "resolve_connection",
    "stats",
]

#: The statuses a run never leaves.
TERMINAL_STATUSES: Final = frozenset({"completed", "error", "halted", "paused", "cancelled"})

#: `resume`'s `input` when none is given (`None` is the JSON answer `null`).
_NO_INPUT: Final = object()

#: The codes a `FactoryResumeError` carries (upstream's pre-execution resume failures).
FACTORY_RESUME_ERROR_CODES: Final = (
    "not_found",
    "non_resumable",
    "already_active",
    "factory_already_running",
    "factory_limits_invalid",
    "factory_session_disposed",
    "factory_storage_unavailable",
    "factory_storage_corrupt",
)

#: The codes a `WorkflowResumeError` carries: the workflow surface's names of the same failures.
WORKFLOW_RESUME_ERROR_CODES: Final = (
    "not_found",
    "non_resumable",
    "workflow_run_not_resumable",
    "already_active",
    "workflow_already_running",
    "workflow_limits_invalid",
    "workflow_session_disposed",
    "workflow_storage_unavailable",
    "workflow_storage_corrupt",
)


def _resume_code(surface: str, service_code: str) -> str | None:
    """A resume refusal's code on `surface` (`factory` or `workflow`) from the service's code,
    or None when the refusal is not one of a resume's own."""
    if service_code in ("not_found", "non_resumable", "already_active"):
        return service_code
    base = {
        "invalid_limits": "limits_invalid",
        "session_disposed": "session_disposed",
        "storage_unavailable": "storage_unavailable",
        "unavailable": "storage_unavailable",
        "storage_corrupt": "storage_corrupt",
    }.get(service_code)
    return f"{surface}_{base}" if base is not None else None

#: The header naming the session a call acts as.
SESSION_HEADER: Final = "Factory-Session"

#: The largest JSON answer read (a larger one fails with `FactoryError`, code `error`).
MAX_BODY_BYTES: Final = 32 << 20

#: The most runs the service lists in one page of `GET /api/runs`.
RUNS_PAGE: Final = 1000

#: The longest line of the event stream, and the largest event, read (larger drops the stream).
MAX_EVENT_LINE_BYTES: Final = 8 << 20

#: How long `wait_for_run` follows the event stream before it re-reads the run anyway (seconds).
DEFAULT_POLL_INTERVAL: Final = 5.0

#: How long one request may wait for the service's answer (seconds).
DEFAULT_REQUEST_TIMEOUT: Final = 60.0

#: The event stream's reconnect delay: first, and at most (it doubles in between), in seconds.
RECONNECT_DELAY: Final = (0.25, 5.0)

#: The error message's longest excerpt of a non-JSON answer.
_EXCERPT: Final = 200


def is_factory_run_terminal(status: str | None) -> bool:
    """Whether `status` settles an attempt: `completed`, `error`, `halted`, `paused`, `cancelled`."""
    return status in TERMINAL_STATUSES


def is_workflow_run_terminal(status: str | None) -> bool:
    """`is_factory_run_terminal` under the workflow name."""
    return is_factory_run_terminal(status)


class FactoryError(Exception):
    """A refusal or failure of the factory service, with its error code and HTTP status."""

    def __init__(self, code: str, message: str, http_status: int | None = None) -> None:
        super().__init__(message)
        #: The service's error code (README "HTTP API"), `unavailable` when it cannot be
        #: reached, `error` when its answer is not one the API gives.
        self.code = code
        #: The HTTP status of the answer, when there was one.
        self.http_status = http_status
        #: The message (as `str(error)`).
        self.message = message

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, http_status={self.http_status!r}, message={self.message!r})"


class FactoryResumeError(FactoryError):
    """A resume that failed before an attempt started; `code` is one of FACTORY_RESUME_ERROR_CODES,
    `service_code` the service's own code it was mapped from (`invalid_limits`, ...)."""

    def __init__(self, code: str, message: str, http_status: int | None = None, service_code: str | None = None) -> None:
        super().__init__(code, message, http_status)
        #: The service's code the resume code was mapped from.
        self.service_code = service_code if service_code is not None else code


class WorkflowResumeError(FactoryError):
    """A resume of `session.workflow` that failed before an attempt started; `code` is one of
    WORKFLOW_RESUME_ERROR_CODES, `service_code` the service's own code."""

    def __init__(self, code: str, message: str, http_status: int | None = None, service_code: str | None = None) -> None:
        super().__init__(code, message, http_status)
        #: The service's code the resume code was mapped from.
        self.service_code = service_code if service_code is not None else code


class FactoryLimits(TypedDict, total=False):
    """Per-invocation limit overrides in the service's names: left out keeps the factory's
    declared limit, a positive number replaces it, `None` (JSON null) lifts it (no limit of
    that kind). A resume's `timeoutSeconds` counts the active time of earlier attempts."""

    maxConcurrentSubagents: int | None
    maxTotalSubagents: int | None
    timeoutSeconds: float | None
    maxAiCredits: float | None


class FactoryPermissionRequest(TypedDict):
    """The consent question for a factory the machine does not trust (permission kind
    `factory`): what `on_permission_request` is asked."""

    kind: str
    #: `run` or `resume`.
    operation: str
    factoryName: str
    #: The key an approval is for: the sha256 of the component, or of a script's source.
    approvalKey: str
    sha256: str
    backend: str
    #: The limits it would run under (declared, with the call's overrides).
    limits: dict[str, Any]
    phases: list[str]
    grants: list[str]
    #: The service's pending approval this question answers.
    approvalId: str


#: `on_permission_request(request, {"sessionId": ...})`: `{"kind": "approved"}` (with
#: `"always": True` to trust it from now on) starts the factory; anything else declines.
PermissionHandler = Callable[[FactoryPermissionRequest, dict[str, str]], Mapping[str, Any]]


class FactoryRunResult(TypedDict):
    """The run envelope (README "The CLI"): `runId`, `status`, `result`, `failure`, ..."""

    runId: str
    factory: str
    status: str
    result: NotRequired[Any]
    failure: NotRequired[dict[str, Any]]
    error: NotRequired[str]
    accounting: dict[str, Any]
    attempts: int
    resumeAt: NotRequired[str]
    checkpoint: NotRequired[str]
    session: NotRequired[str]
    createdAt: str
    updatedAt: str
    revision: int
    seq: NotRequired[int]


class FactoryRunsPage(TypedDict):
    """A page of runs by creation sequence (`list_runs_page`); each run has its `seq`."""

    runs: list[FactoryRunResult]
    oldestSeq: int | None
    newestSeq: int | None
    hasMoreNewer: bool
    omittedOlder: bool


class FactoryRunDetail(FactoryRunResult):
    """A run's detail: its envelope's fields plus limits, phases, agent summaries and progress."""

    limits: FactoryLimits
    phases: list[str]
    agents: list[dict[str, Any]]
    progress: list[dict[str, Any]]


class FactoryStoreTable(TypedDict):
    """One table of the store (`FactoryStoreStats["tables"]`)."""

    name: str
    entries: int
    storedBytes: int
    leafPages: int
    branchPages: int
    fragmentedBytes: int
    metadataBytes: int


class FactoryStorePart(TypedDict):
    """One part of the store's bytes: journal values, progress, run records, ... (`rows`: 0
    for the file's own parts, page overhead and free pages)."""

    part: str
    bytes: int
    rows: int


class FactoryStoreStats(TypedDict):
    """Where the store's bytes go, as `factory stats --json` prints it; the parts add up to
    `fileBytes`."""

    fileBytes: int
    diskBytes: int
    pageSize: int
    allocatedPages: int
    tables: list[FactoryStoreTable]
    parts: list[FactoryStorePart]


@dataclass(frozen=True, slots=True)
class FactoryHandle:
    """A factory `join_session` registered in the session."""

    name: str
    meta: dict[str, Any]
    sha256: str | None
    #: The file's absolute path.
    source: str


@dataclass(frozen=True, slots=True)
class RunUpdated:
    """A run of the session changed durably (`run_updated`); a run's revisions only grow."""

    run_id: str
    revision: int


@dataclass(frozen=True, slots=True)
class ProgressEvent:
    """A progress entry a run committed (`progress`): `{seq, atMs, phase, event, ...}`."""

    run_id: str
    entry: dict[str, Any]


@dataclass(frozen=True, slots=True)
class RunStarted:
    """An attempt of a run of the session started (`run_started`)."""

    run_id: str
    attempt: int
    factory_name: str


@dataclass(frozen=True, slots=True)
class RunSettled:
    """An attempt of a run of the session settled (`run_settled`), with what it consumed:
    `consumed_credits` AI credits (`consumed_credits_nano` exactly), `consumed_subagents`
    spawned, `elapsed_ms` active, and the failure's type when it failed."""

    run_id: str
    status: str
    consumed_credits: float
    consumed_credits_nano: int
    consumed_subagents: int
    elapsed_ms: int
    failure_type: str | None = None


#: What `FactorySession.events` yields.
FactoryEvent = RunUpdated | ProgressEvent | RunStarted | RunSettled


def _default_state_dir(env: Mapping[str, str]) -> Path:
    """The state directory the service uses by default (as `factory --state-dir` resolves it)."""
    if env.get("FACTORY_STATE_DIR"):
        return Path(env["FACTORY_STATE_DIR"])
    if env.get("XDG_STATE_HOME"):
        return Path(env["XDG_STATE_HOME"]) / "factory"
    return Path.home() / ".local" / "state" / "factory"


def _read_state_file(directory: Path, name: str, what: str) -> str:
    path = directory / name
    try:
        with path.open("r", encoding="utf-8") as file:
            return file.read(4096).strip()
    except OSError as e:
        raise FactoryError(
            "unavailable",
            f"no {what} given and {path} cannot be read ({e.strerror or e}): start "
            "`factory serve --http 127.0.0.1:PORT`, or pass `url`/`token` (or set "
            "FACTORY_URL/FACTORY_TOKEN, or FACTORY_STATE_DIR)",
        ) from e


def resolve_connection(
    url: str | None = None,
    token: str | None = None,
    state_dir: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
) -> tuple[str, str]:
    """Where the service is and its token, as `(origin, token)`: `url`/`token`, else
    FACTORY_URL/FACTORY_TOKEN, else the `http.addr`/`http.token` files of the state directory
    (`state_dir`, else FACTORY_STATE_DIR, else $XDG_STATE_HOME/factory, else
    ~/.local/state/factory)."""
    env = os.environ if env is None else env
    directory = Path(state_dir) if state_dir is not None else _default_state_dir(env)
    base = url or env.get("FACTORY_URL") or f"http://{_read_state_file(directory, 'http.addr', 'url')}"
    bearer = token or env.get("FACTORY_TOKEN") or _read_state_file(directory, "http.token", "token")
    parts = urllib.parse.urlsplit(base)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"the factory service's URL must be http(s)://HOST:PORT, not {base!r}")
    return f"{parts.scheme}://{parts.netloc}", bearer


def _run_path(run_id: str, rest: str = "") -> str:
    if not isinstance(run_id, str) or run_id == "":
        raise TypeError("a run id must be a non-empty string")
    return f"/api/runs/{urllib.parse.quote(run_id, safe='')}{rest}"


def _read_bounded(response: Any, limit: int) -> bytes:
    """At most `limit` bytes of `response`'s body; more fails rather than being read."""
    data = response.read(limit + 1)
    if len(data) > limit:
        raise FactoryError("error", f"the service's answer is larger than {limit} bytes")
    return data


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Follows no redirect: its answer becomes an `HTTPError` (the API never redirects)."""

    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> None:
        return None


class _Transport:
    """The service's HTTP API as one session sees it."""

    def __init__(self, url: str, token: str, session: str | None, timeout: float) -> None:
        self.url = url
        self.timeout = timeout
        #: The session the calls act as (None: the owner, the token's holder, as `stats` asks).
        self.session = session
        self.headers = {"Authorization": f"Bearer {token}"}
        if session is not None:
            self.headers[SESSION_HEADER] = session
        #: Set by `FactorySession.close()`: runs and resumes are refused from then on.
        self.disposed = False
        # Straight to the service: an HTTP proxy from the environment never sees the token,
        # and a redirect is an error (it would carry the token elsewhere).
        self.opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect())

    def request(self, method: str, path: str, body: Any = None) -> Any:
        """Send one call and return its JSON answer; a refusal raises `FactoryError`."""
        headers = dict(self.headers, Accept="application/json")
        data = None
        if body is not None:
            headers["Content-Type"] = "application/json"
            data = json.dumps(body).encode("utf-8")
        request = urllib.request.Request(self.url + path, data=data, headers=headers, method=method)
        try:
            with self.opener.open(request, timeout=self.timeout) as response:
                status, text = response.status, _read_bounded(response, MAX_BODY_BYTES)
        except urllib.error.HTTPError as e:
            with e:
                status, text = e.code, _read_bounded(e, MAX_BODY_BYTES)
        except (urllib.error.URLError, OSError, HTTPException) as e:
            reason = getattr(e, "reason", e)
            raise FactoryError("unavailable", f"the factory service at {self.url} cannot be reached: {reason}") from e
        value: Any = None
        if text:
            try:
                value = json.loads(text)
            except ValueError:
                raise FactoryError(
                    "error",
                    f"{method} {path}: the service answered {status} with no JSON: {text[:_EXCERPT]!r}",
                    status,
                ) from None
        if not 200 <= status < 300:
            code = value.get("code") if isinstance(value, dict) else None
            message = value.get("message") if isinstance(value, dict) else None
            raise FactoryError(
                code if isinstance(code, str) else "error",
                message if isinstance(message, str) else f"{method} {path}: HTTP {status}",
                status,
            )
        return value

    def open_events(self, timeout: float | None) -> HTTPResponse:
        """Open `GET /api/events`; `timeout` bounds each read of it (None: none)."""
        headers = dict(self.headers, Accept="text/event-stream")
        request = urllib.request.Request(self.url + "/api/events", headers=headers, method="GET")
        try:
            return self.opener.open(request, timeout=timeout if timeout is not None else socket.getdefaulttimeout())
        except urllib.error.HTTPError as e:
            with e:
                text = _read_bounded(e, MAX_BODY_BYTES)
            try:
                value = json.loads(text)
            except ValueError:
                value = None
            code = value.get("code") if isinstance(value, dict) else None
            message = value.get("message") if isinstance(value, dict) else None
            raise FactoryError(
                code if isinstance(code, str) else "error",
                message if isinstance(message, str) else f"GET /api/events: HTTP {e.code}",
                e.code,
            ) from None
        except (urllib.error.URLError, OSError, HTTPException) as e:
            reason = getattr(e, "reason", e)
            raise FactoryError("unavailable", f"the factory service at {self.url} cannot be reached: {reason}") from e


def _read_events(response: Any) -> Iterator[FactoryEvent]:
    """The typed events of one Server-Sent Events stream, each line and event bounded."""
    name = "message"
    data: list[bytes] = []
    size = 0
    while True:
        line = response.readline(MAX_EVENT_LINE_BYTES + 1)
        if not line:
            return
        if len(line) > MAX_EVENT_LINE_BYTES:
            raise FactoryError("error", f"the event stream sent a line longer than {MAX_EVENT_LINE_BYTES} bytes")
        line = line.rstrip(b"\r\n")
        if line == b"":
            if data:
                event = _typed_event(name, b"\n".join(data))
                if event is not None:
                    yield event
            name, data, size = "message", [], 0
            continue
        if line.startswith(b":"):
            continue
        field, _, value = line.partition(b":")
        if value.startswith(b" "):
            value = value[1:]
        if field == b"event":
            name = value.decode("utf-8", "replace")
        elif field == b"data":
            size += len(value) + 1
            if size > MAX_EVENT_LINE_BYTES:
                raise FactoryError("error", f"the event stream sent an event larger than {MAX_EVENT_LINE_BYTES} bytes")
            data.append(value)


def _typed_event(name: str, data: bytes) -> FactoryEvent | None:
    """The event `name` with JSON `data`, or None for one this client does not know."""
    try:
        payload = json.loads(data)
    except ValueError:
        return None
    if not isinstance(payload, dict) or not isinstance(payload.get("runId"), str):
        return None
    run_id = payload["runId"]
    if name == "run_updated":
        revision = payload.get("revision")
        if isinstance(revision, int) and not isinstance(revision, bool):
            return RunUpdated(run_id, revision)
    elif name == "progress":
        entry = payload.get("entry")
        if isinstance(entry, dict):
            return ProgressEvent(run_id, entry)
    elif name == "run_started":
        attempt, factory_name = payload.get("attempt"), payload.get("factoryName")
        if _is_int(attempt) and isinstance(factory_name, str):
            return RunStarted(run_id, attempt, factory_name)
    elif name == "run_settled":
        status, nano, spawned, elapsed = (payload.get(k) for k in ("status", "consumedCreditsNano", "consumedSubagents", "elapsedMs"))
        failure_type = payload.get("failureType")
        if isinstance(status, str) and _is_int(nano) and _is_int(spawned) and _is_int(elapsed):
            kind = failure_type if isinstance(failure_type, str) else None
            return RunSettled(run_id, status, nano / 1e9, nano, spawned, elapsed, kind)
    return None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class FactoryApi:
    """`session.factory`: the spec's run, resume and observe API for one session
    (`session.workflow`: the same calls under upstream's workflow names, whose resume
    refusals are `WorkflowResumeError`s with `workflow_*` codes)."""

    def __init__(
        self,
        transport: _Transport,
        poll_interval: float,
        surface: str = "factory",
        on_permission_request: PermissionHandler | None = None,
    ) -> None:
        self._transport = transport
        self._poll_interval = poll_interval
        self._surface = surface
        self._on_permission_request = on_permission_request

    def _consent(self, body: dict[str, Any]) -> dict[str, Any]:
        """A start body's consent: with `on_permission_request`, an untrusted factory comes
        back at once as a pending approval (answered by `_started`); without, the service
        refuses it (`no_approval_provider`)."""
        if body.get("approved") is True:
            return body
        if self._on_permission_request is not None:
            body["approvalWaitSeconds"] = 0
        else:
            body["ask"] = False
        return body

    def start(
        self,
        name: str | FactoryHandle,
        args: Any = None,
        limits: FactoryLimits | None = None,
        approved: bool | None = None,
    ) -> str:
        """Start a factory by registered name or handle and return its run id at once;
        raises `FactoryError` (`unknown_factory`, `invalid_limits`, ...) when no run starts."""
        if self._transport.disposed:
            raise FactoryError(f"{self._surface}_session_disposed", "this session is closed: join a session again")
        factory = name.name if isinstance(name, FactoryHandle) else name
        if not isinstance(factory, str) or factory == "":
            raise TypeError("give a factory name or a handle from join_session")
        body: dict[str, Any] = {"name": factory}
        if args is not None:
            body["args"] = args
        if limits is not None:
            body["limits"] = limits
        if approved is not None:
            body["approved"] = approved
        return self._started(self._transport.request("POST", "/api/runs", self._consent(body)))

    def run(
        self,
        name: str | FactoryHandle,
        args: Any = None,
        limits: FactoryLimits | None = None,
        approved: bool | None = None,
        timeout: float | None = None,
        resume_from_run_id: str | None = None,
    ) -> FactoryRunResult:
        """Run a factory by registered name or handle and return its terminal envelope for
        every outcome; raises `FactoryError` (`unknown_factory`, `invalid_limits`, ...) only
        when no run exists. `timeout`: as for `wait_for_run`. With `resume_from_run_id`, resume
        that run instead (as `resume`)."""
        if resume_from_run_id is not None:
            return self.resume(resume_from_run_id, limits=limits, approved=approved, timeout=timeout)
        return self.wait_for_run(self.start(name, args, limits, approved), timeout=timeout)

    def resume(
        self,
        run_id: str,
        limits: FactoryLimits | None = None,
        approved: bool | None = None,
        timeout: float | None = None,
        input: Any = _NO_INPUT,
    ) -> FactoryRunResult:
        """Resume a run by id (same args, journaled work replays) with limits raised and, for
        a run paused at a checkpoint, `input` (what its `ctx.pause(key)` returns), and
        return its terminal envelope. A failure before the attempt starts raises
        `FactoryResumeError` (`WorkflowResumeError` on `session.workflow`) with upstream's
        codes (`not_found`, `non_resumable`, `already_active`, `factory_limits_invalid`,
        `factory_storage_unavailable`, ...); other refusals (`no_approval_provider`,
        `backend_unavailable`) raise `FactoryError`."""
        body: dict[str, Any] = {}
        if limits is not None:
            body["limits"] = limits
        if approved is not None:
            body["approved"] = approved
        if input is not _NO_INPUT:
            body["input"] = input
        try:
            if self._transport.disposed:
                raise FactoryError("session_disposed", "this session is closed: join a session again")
            started = self._transport.request("POST", _run_path(run_id, "/resume"), self._consent(body))
        except FactoryError as e:
            code = _resume_code(self._surface, e.code)
            if code is not None:
                refusal = WorkflowResumeError if self._surface == "workflow" else FactoryResumeError
                raise refusal(code, e.message, e.http_status, e.code) from e
            raise
        return self.wait_for_run(self._started(started), timeout=timeout)

    @overload
    def list_runs(self) -> list[FactoryRunResult]: ...

    @overload
    def list_runs(
        self, *, after_seq: int | None = None, before_seq: int | None = None, limit: int | None = None
    ) -> FactoryRunsPage: ...

    def list_runs(
        self, *, after_seq: int | None = None, before_seq: int | None = None, limit: int | None = None
    ) -> FactoryRunsPage | list[FactoryRunResult]:
        """The session's runs in durable creation order, as summaries (envelopes without
        `result`, whose size is `resultBytes`; `get_run` reads one whole), asked a page at
        a time. With `after_seq`, `before_seq` or `limit`, one page by creation sequence
        instead (`list_runs_page`)."""
        if after_seq is not None or before_seq is not None or limit is not None:
            return self.list_runs_page(after_seq=after_seq, before_seq=before_seq, limit=limit)
        runs: list[FactoryRunResult] = []
        while True:
            after = f"&after={urllib.parse.quote(runs[-1]['runId'], safe='')}" if runs else ""
            page = self._transport.request("GET", f"/api/runs?limit={RUNS_PAGE}{after}")
            runs.extend(page)
            if len(page) < RUNS_PAGE:
                return runs

    def list_runs_page(
        self, *, after_seq: int | None = None, before_seq: int | None = None, limit: int | None = None
    ) -> FactoryRunsPage:
        """One page of the session's runs by creation sequence: after `after_seq` (walking
        newer), else the newest before `before_seq` (the newest page without either), at most
        `limit` ended runs (default 200, at most 500; running ones come along):
        `{runs, oldestSeq, newestSeq, hasMoreNewer, omittedOlder}`."""
        query: dict[str, str] = {}
        for key, value, least in (("afterSeq", after_seq, 0), ("beforeSeq", before_seq, 0), ("limit", limit, 1)):
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise TypeError(f"list_runs: `{key}` must be an integer >= {least}")
            query[key] = str(value)
        text = urllib.parse.urlencode(query)
        return self._transport.request("GET", f"/api/runs/page{'?' + text if text else ''}")

    def get_run_detail(self, run_id: str) -> FactoryRunDetail:
        """The run's envelope with phases, prompt-safe agent summaries and the latest progress."""
        return self._transport.request("GET", _run_path(run_id))

    def get_run_progress(
        self,
        run_id: str,
        phase_id: str | None = None,
        after_seq: int | None = None,
        before_seq: int | None = None,
        limit: int | None = None,
    ) -> list[dict[str, Any]]:
        """A page of the run's progress entries (ascending `seq`): after `after_seq`, before
        `before_seq`, in phase `phase_id` (a phase's id is its title), at most `limit`; with
        neither seq, the latest tail."""
        query = {
            key: str(value)
            for key, value in (("phase", phase_id), ("afterSeq", after_seq), ("beforeSeq", before_seq), ("limit", limit))
            if value is not None
        }
        text = urllib.parse.urlencode(query, quote_via=urllib.parse.quote)
        return self._transport.request("GET", _run_path(run_id, "/progress" + (f"?{text}" if text else "")))

    def get_run(self, run_id: str) -> FactoryRunResult:
        """The run's latest envelope."""
        return self._transport.request("GET", _run_path(run_id, "/envelope"))

    def cancel(self, run_id: str) -> FactoryRunResult:
        """Cancel the run; its terminal envelope."""
        return self._transport.request("POST", _run_path(run_id, "/cancel"))

    def pause(self, run_id: str) -> FactoryRunResult:
        """Pause the running run; its `paused` envelope (resume it with `resume`)."""
        return self._transport.request("POST", _run_path(run_id, "/pause"))

    def remove(self, run_id: str) -> dict[str, Any]:
        """Delete the ended run and its journal for good: `{"runId", "removed": True}`. A run
        that executes is refused with `already_active` (cancel it first); an unknown one is
        `not_found`."""
        return self._transport.request("DELETE", _run_path(run_id))

    def gc(self, *, keep_days: int | None = None, keep_last: int | None = None, dry_run: bool = False) -> dict[str, Any]:
        """Delete this session's ended runs (completed, error, cancelled) a retention policy
        no longer keeps: those last updated more than `keep_days` days ago and not among the
        newest `keep_last` of their factory (give at least one; `invalid_params` otherwise).
        With `dry_run`, only list them. Returns `{"removed": [run ids], "kept", "dryRun"}`."""
        body: dict[str, Any] = {"dryRun": dry_run}
        if keep_days is not None:
            body["keepDays"] = keep_days
        if keep_last is not None:
            body["keepLast"] = keep_last
        return self._transport.request("POST", "/api/gc", body)

    def wait_for_run(self, run_id: str, timeout: float | None = None) -> FactoryRunResult:
        """The run's terminal envelope once it settles (at once if it has). Follows the
        session's event stream and re-reads the envelope on each `run_updated` of the run,
        and every `poll_interval` seconds besides, so a missed event only delays the answer.
        `timeout` (seconds, None: no limit) raises `TimeoutError`; the run goes on."""
        _run_path(run_id)
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = RECONNECT_DELAY[0]
        while True:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise TimeoutError(f"run {run_id} did not settle within {timeout} s")
            read_timeout = self._poll_interval if remaining is None else max(0.01, min(self._poll_interval, remaining))
            try:
                stream = self._transport.open_events(read_timeout)
            except FactoryError as e:
                if e.code != "unavailable":
                    raise
                # Unreachable for now: read again after a pause.
                time.sleep(delay if remaining is None else min(delay, remaining))
                delay = min(delay * 2, RECONNECT_DELAY[1])
                continue
            dropped = False
            with stream:
                try:
                    # Read after the stream opened, so no change between the two is missed.
                    envelope = self.get_run(run_id)
                    if is_factory_run_terminal(envelope.get("status")):
                        return envelope
                    delay = RECONNECT_DELAY[0]
                    for event in _read_events(stream):
                        if isinstance(event, RunUpdated) and event.run_id == run_id:
                            envelope = self.get_run(run_id)
                            if is_factory_run_terminal(envelope.get("status")):
                                return envelope
                        if deadline is not None and time.monotonic() >= deadline:
                            break
                    else:
                        dropped = True
                except FactoryError as e:
                    if e.code != "unavailable":
                        raise
                    dropped = True  # Unreachable for now: the next round reads again.
                except TimeoutError:
                    dropped = False  # The poll interval passed quietly: re-read at once.
                except (OSError, HTTPException):
                    dropped = True
            if dropped:
                # The stream ended or the service is away: pause before reopening.
                left = None if deadline is None else deadline - time.monotonic()
                time.sleep(delay if left is None else max(0.0, min(delay, left)))
                delay = min(delay * 2, RECONNECT_DELAY[1])

    def _started(self, answer: Any) -> str:
        """The run id a start answered with; a pending approval is put to
        `on_permission_request` (permission kind `factory`) and answered through the API:
        approved, the run's id; declined (or the callback raised), `FactoryError("declined")`
        (nothing started)."""
        if isinstance(answer, dict) and answer.get("status") == "pending_approval" and self._on_permission_request:
            answer = self._ask(answer)
        run_id = answer.get("runId") if isinstance(answer, dict) else None
        if not isinstance(run_id, str) or run_id == "":
            raise FactoryError("error", f"the service's start answer has no runId: {str(answer)[:_EXCERPT]}")
        return run_id


    def _ask(self, answer: dict[str, Any]) -> dict[str, Any]:
        """Put the pending approval in `answer` to `on_permission_request`; the approve
        answer (`{"runId"}`), or `FactoryError("declined")` after declining it."""
        approval = answer.get("approval")
        question = approval.get("question") if isinstance(approval, dict) else None
        approval_id = approval.get("id") if isinstance(approval, dict) else None
        if not isinstance(question, dict) or not isinstance(approval_id, str):
            raise FactoryError("error", f"the service's pending approval is malformed: {str(answer)[:_EXCERPT]}")
        request: FactoryPermissionRequest = {
            "kind": "factory",
            "operation": question.get("operation", "run"),
            "factoryName": question.get("factory", ""),
            "approvalKey": question.get("sha256", ""),
            "sha256": question.get("sha256", ""),
            "backend": question.get("backend", ""),
            "limits": question.get("limits", {}),
            "phases": question.get("phases", []),
            "grants": question.get("grants", []),
            "approvalId": approval_id,
        }
        path = f"/api/approvals/{urllib.parse.quote(approval_id, safe='')}"
        handler = self._on_permission_request
        assert handler is not None
        try:
            result = handler(request, {"sessionId": self._transport.session})
        except BaseException:
            try:
                self._transport.request("POST", f"{path}/decline")
            except FactoryError:
                pass
            raise
        kind = result.get("kind") if isinstance(result, Mapping) else None
        if kind != "approved":
            self._transport.request("POST", f"{path}/decline")
            raise FactoryError(
                "declined",
                f"factory `{request['factoryName']}` (sha256 {request['sha256']}) was not approved to "
                f"{request['operation']}{f' ({kind})' if kind else ''}; nothing started",
            )
        always = isinstance(result, Mapping) and result.get("always") is True
        approved = self._transport.request("POST", f"{path}/approve", {"always": always})
        state = approved.get("state") if isinstance(approved, dict) else None
        return {"runId": state.get("runId") if isinstance(state, dict) else None}


class FactorySession:
    """A session of the service, as `join_session` returns it (a context manager)."""

    def __init__(
        self,
        session_id: str,
        transport: _Transport,
        factories: tuple[FactoryHandle, ...],
        poll_interval: float,
        on_permission_request: PermissionHandler | None = None,
    ) -> None:
        #: The session's name: its runs and registered factories are its own.
        self.session_id = session_id
        #: The service's address.
        self.url = transport.url
        #: Handles of the factories `join_session` registered, in the order given.
        self.factories = factories
        #: The spec's run, resume and observe API.
        self.factory = FactoryApi(transport, poll_interval, "factory", on_permission_request)
        #: The same API under upstream's workflow names (`WorkflowResumeError`, `workflow_*` codes).
        self.workflow = FactoryApi(transport, poll_interval, "workflow", on_permission_request)
        self._transport = transport

    def events(self, timeout: float | None = None, reconnect: bool = True) -> Iterator[FactoryEvent]:
        """The session's events, as they happen: `RunUpdated(run_id, revision)` for each
        durable change of one of its runs, each followed by `ProgressEvent(run_id, entry)`
        for the progress entries committed since. `timeout` bounds the wait for each read
        (`TimeoutError`); a dropped stream is reopened (after 0.25 s, doubling to 5 s) unless
        `reconnect` is false, when the iterator ends. Closing the generator closes the stream."""
        delay = RECONNECT_DELAY[0]
        while True:
            try:
                stream = self._transport.open_events(timeout)
            except FactoryError as e:
                if e.code != "unavailable" or not reconnect:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, RECONNECT_DELAY[1])
                continue
            with stream:
                try:
                    for event in _read_events(stream):
                        delay = RECONNECT_DELAY[0]
                        yield event
                except TimeoutError:
                    raise
                except (OSError, HTTPException):
                    pass  # Dropped: reopen below.
            if not reconnect:
                return
            time.sleep(delay)
            delay = min(delay * 2, RECONNECT_DELAY[1])

    def close(self) -> None:
        """Close the session: later runs and resumes are refused (`factory_session_disposed`,
        `workflow_session_disposed`); nothing else stays open between calls."""
        self._transport.disposed = True

    def __enter__(self) -> FactorySession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def stats(
    url: str | None = None,
    token: str | None = None,
    state_dir: str | os.PathLike[str] | None = None,
    session: str | None = None,
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
) -> FactoryStoreStats | None:
    """Where the store's bytes go, as `factory stats --json` prints it (`fileBytes`,
    `diskBytes`, `pageSize`, `allocatedPages`, `tables`, and `parts` adding up to
    `fileBytes`), or None for a store that does not measure itself. The store
    covers every session's runs, so this asks as the owner (the token's holder, no session);
    given `session`, it asks as that session and is refused (`FactoryError("bad_request")`).
    Connection: `url`, `token`, `state_dir` (see `resolve_connection`)."""
    if session is not None and not isinstance(session, str):
        raise TypeError("stats: `session` must be a string")
    origin, bearer = resolve_connection(url, token, state_dir)
    answer: FactoryStoreStats | None = _Transport(origin, bearer, session, request_timeout).request("GET", "/api/stats")
    return answer


def join_session(
    factories: list[str | os.PathLike[str]] | tuple[str | os.PathLike[str], ...] = (),
    session: str | None = None,
    url: str | None = None,
    token: str | None = None,
    state_dir: str | os.PathLike[str] | None = None,
    poll_interval: float = DEFAULT_POLL_INTERVAL,
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
    workflows: list[str | os.PathLike[str]] | tuple[str | os.PathLike[str], ...] | None = None,
    on_permission_request: PermissionHandler | None = None,
) -> FactorySession:
    """Join a session of the factory service: `session` (a name; default a fresh
    `python-<uuid>`), registering `factories` in it (paths of `.js`, `.ts`, `.py` or `.wasm`
    factories or component directories, relative to the working directory) so
    `session.factory.run(name)` runs them (`workflows`: the same under upstream's workflow
    name, for `session.workflow`; give one of the two). Connection: `url`, `token`,
    `state_dir` (see `resolve_connection`); `poll_interval`: `wait_for_run`'s periodic
    re-read (seconds); `request_timeout`: how long one call waits for its answer (seconds).
    `on_permission_request(request, invocation)`: asked when a run or resume would start a
    factory this machine does not trust (`request`: a `FactoryPermissionRequest`, permission
    kind `factory`; `invocation`: `{"sessionId"}`); return `{"kind": "approved"}` (with
    `"always": True` to trust its sha256 from now on) to start it, anything else to decline
    (the call raises `FactoryError("declined")`, nothing started). Without it such a start
    raises `FactoryError("no_approval_provider")`."""
    if on_permission_request is not None and not callable(on_permission_request):
        raise TypeError("join_session: `on_permission_request` must be callable")
    if workflows is not None:
        if factories:
            raise TypeError("join_session: give `factories` or `workflows`, not both")
        factories = workflows
    if isinstance(factories, (str, os.PathLike)):
        raise TypeError("join_session: `factories` is a list of paths")
    origin, bearer = resolve_connection(url, token, state_dir)
    session_id = session if session is not None else f"python-{uuid.uuid4()}"
    transport = _Transport(origin, bearer, session_id, request_timeout)
    handles = []
    for entry in factories:
        path = str(Path(entry).resolve())
        answer = transport.request("POST", "/api/factories", {"path": path})
        # A file that offers several factories registers each: the answer lists them.
        for registered in answer if isinstance(answer, list) else [answer]:
            meta = registered.get("meta") if isinstance(registered, dict) else None
            if not isinstance(meta, dict) or not isinstance(meta.get("name"), str):
                raise FactoryError("error", f"the service's registration of {path} has no meta.name")
            script = registered.get("script")
            sha256 = script.get("sha256") if isinstance(script, dict) else registered.get("hash")
            handles.append(FactoryHandle(meta["name"], meta, sha256 if isinstance(sha256, str) else None, path))
    return FactorySession(session_id, transport, tuple(handles), poll_interval, on_permission_request)
