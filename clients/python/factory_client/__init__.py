"""factory_client: the factory service's run, resume and observe API for Python (>= 3.11),
over the HTTP API of `factory serve --http`, with the Node client's calls in Python names.
Standard library only. See `factory_client.client` and README.md ("Python client")."""

from .client import (
    FACTORY_RESUME_ERROR_CODES,
    MAX_BODY_BYTES,
    MAX_EVENT_LINE_BYTES,
    FactoryApi,
    FactoryError,
    FactoryEvent,
    FactoryHandle,
    FactoryLimits,
    FactoryResumeError,
    FactoryRunDetail,
    FactoryRunResult,
    FactorySession,
    ProgressEvent,
    RunUpdated,
    is_factory_run_terminal,
    join_session,
    resolve_connection,
)

__all__ = [
    "FACTORY_RESUME_ERROR_CODES",
    "MAX_BODY_BYTES",
    "MAX_EVENT_LINE_BYTES",
    "FactoryApi",
    "FactoryError",
    "FactoryEvent",
    "FactoryHandle",
    "FactoryLimits",
    "FactoryResumeError",
    "FactoryRunDetail",
    "FactoryRunResult",
    "FactorySession",
    "ProgressEvent",
    "RunUpdated",
    "is_factory_run_terminal",
    "join_session",
    "resolve_connection",
]
