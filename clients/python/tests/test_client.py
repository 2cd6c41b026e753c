"""The Python client against a real `factory serve --http` that tests/python_client.rs starts
(FACTORY_URL, FACTORY_TOKEN; its default backend is a script backend: `t:` agents answer at
once, `slow:` ones after 1.5 s, `hang:` ones after minutes) with the Node client's test factory
(FACTORY_TEST_FANOUT: clients/node/test/factories/fanout.js). Run, wait, list, detail, progress
pages, cancel, resume errors, session scoping, the event stream, typed errors; and against
small broken servers: bounded reads, no redirect followed, the event stream reopened after a drop.
Without those variables the service's tests fail (never skip): run them through
`cargo test -p factory-host --test python_client`."""

from __future__ import annotations

import http.server
import os
import socket
import threading
import time
import unittest
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from factory_client import (
    FACTORY_RESUME_ERROR_CODES,
    MAX_BODY_BYTES,
    MAX_EVENT_LINE_BYTES,
    FactoryError,
    FactoryResumeError,
    FactorySession,
    ProgressEvent,
    RunSettled,
    RunStarted,
    RunUpdated,
    WORKFLOW_RESUME_ERROR_CODES,
    WorkflowResumeError,
    is_factory_run_terminal,
    is_workflow_run_terminal,
    join_session,
    resolve_connection,
    stats,
)

T = TypeVar("T")


def service() -> tuple[str, str, str]:
    """The service under test and the test factory: (url, token, fanout path)."""
    missing = [name for name in ("FACTORY_URL", "FACTORY_TOKEN", "FACTORY_TEST_FANOUT") if not os.environ.get(name)]
    if missing:
        raise AssertionError(f"{', '.join(missing)} not set: run `cargo test -p factory-host --test python_client`")
    return os.environ["FACTORY_URL"], os.environ["FACTORY_TOKEN"], os.environ["FACTORY_TEST_FANOUT"]


def join(**extra: Any) -> FactorySession:
    """A fresh session of the service with the test factory registered in it."""
    url, token, fanout = service()
    options: dict[str, Any] = {"url": url, "token": token, "factories": [fanout], "poll_interval": 1.0}
    options.update(extra)
    return join_session(**options)


def until(check: Callable[[], T | None], what: str, seconds: float = 60.0) -> T:
    """Poll `check` until it returns a truthy value; fail after `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def running_run(session: FactorySession) -> str:
    """The id of the session's first `running` run (polled until there is one)."""
    run = until(lambda: next((r for r in session.factory.list_runs() if r["status"] == "running"), None), "a running run")
    return run["runId"]


class Collector:
    """A session's event stream read on a thread of its own until `stop()`. A read that
    waits 0.5 s for an event ends the stream (so `stop()` is seen) and the next one is a new
    stream, which sends each run's progress from its start again: an entry already collected
    is not collected twice, as any reader that reopens the stream must do."""

    def __init__(self, session: FactorySession) -> None:
        self.events: list[Any] = []
        self.errors: list[BaseException] = []
        self._seen: set[tuple[str, int]] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, args=(session,), daemon=True)
        self._thread.start()

    def _read(self, session: FactorySession) -> None:
        while not self._stop.is_set():
            try:
                for event in session.events(timeout=0.5):
                    if isinstance(event, ProgressEvent):
                        seen = (event.run_id, event.entry["seq"])
                        if seen in self._seen:
                            continue
                        self._seen.add(seen)
                    self.events.append(event)
                    if self._stop.is_set():
                        return
            except TimeoutError:
                continue
            except BaseException as e:  # reported by stop()
                self.errors.append(e)
                return

    def stop(self) -> list[RunUpdated | ProgressEvent]:
        self._stop.set()
        self._thread.join(10)
        if self.errors:
            raise self.errors[0]
        return list(self.events)


class ClientTest(unittest.TestCase):
    def test_on_permission_request_answers_an_untrusted_factorys_question(self) -> None:
        # FACTORY_TEST_UNTRUSTED: a factory registered for everyone and never trusted.
        untrusted = os.environ.get("FACTORY_TEST_UNTRUSTED")
        self.assertTrue(untrusted, "FACTORY_TEST_UNTRUSTED not set: run `cargo test -p factory-host --test python_client`")
        url, token, _ = service()
        asked: list[tuple[dict[str, Any], dict[str, str]]] = []
        answer: dict[str, Any] = {"kind": "denied-interactively-by-user"}

        def on_permission_request(request: Any, invocation: dict[str, str]) -> dict[str, Any]:
            asked.append((dict(request), invocation))
            return answer

        with join_session(url=url, token=token, on_permission_request=on_permission_request) as session:
            # Declined: `declined`, and no run exists.
            with self.assertRaises(FactoryError) as refused:
                session.factory.run(untrusted, limits={"maxTotalSubagents": 5})
            self.assertEqual(refused.exception.code, "declined")
            self.assertEqual(session.factory.list_runs(), [])
            request, invocation = asked[0]
            self.assertEqual((request["kind"], request["operation"], request["factoryName"]), ("factory", "run", untrusted))
            self.assertRegex(request["approvalKey"], r"^[0-9a-f]{64}$")
            self.assertEqual(request["limits"]["maxTotalSubagents"], 5)
            self.assertEqual(invocation, {"sessionId": session.session_id})
            # Approved once: it runs to completion, and is asked about again next time.
            answer = {"kind": "approved"}
            done = session.factory.run(untrusted, timeout=120)
            self.assertEqual(done["status"], "completed", done)
            # Without a callback: today's refusal, nothing pending.
            with join_session(url=url, token=token) as plain:
                with self.assertRaises(FactoryError) as refused:
                    plain.factory.run(untrusted)
                self.assertEqual(refused.exception.code, "no_approval_provider")
            # Approved always: trusted from then on, so the next run asks nothing.
            answer = {"kind": "approved", "always": True}
            self.assertEqual(session.factory.run(untrusted, timeout=120)["status"], "completed")
            self.assertEqual(len(asked), 3)
            self.assertEqual(session.factory.run(untrusted, timeout=120)["status"], "completed")
            self.assertEqual(len(asked), 3, "trusted now: not asked")
            self.assertEqual(len(session.factory.list_runs()), 3)

    def test_run_waits_for_the_completed_envelope_by_handle_or_name(self) -> None:
        with join() as session:
            self.assertRegex(session.session_id, r"^python-[0-9a-f-]{36}$")
            self.assertEqual([f.name for f in session.factories], ["fanout"])
            self.assertRegex(session.factories[0].sha256 or "", r"^[0-9a-f]{64}$")

            by_handle = session.factory.run(session.factories[0], args={"n": 3})
            self.assertEqual(by_handle["status"], "completed", by_handle)
            self.assertEqual(by_handle["result"], {"done": 3})
            self.assertEqual(by_handle["session"], session.session_id)
            self.assertEqual(by_handle["factory"], "fanout")
            self.assertTrue(is_factory_run_terminal(by_handle["status"]))

            by_name = session.factory.run("fanout", args={"n": 2}, limits={"maxConcurrentSubagents": 1})
            self.assertEqual((by_name["status"], by_name["result"]), ("completed", {"done": 2}))
            self.assertNotEqual(by_name["runId"], by_handle["runId"])
            self.assertEqual(session.factory.get_run(by_name["runId"]), by_name)
            self.assertEqual(session.factory.wait_for_run(by_name["runId"]), by_name)

            with self.assertRaises(FactoryError) as unknown:
                session.factory.run("no-such-factory")
            self.assertEqual((unknown.exception.code, unknown.exception.http_status), ("unknown_factory", 404))
            self.assertNotIsInstance(unknown.exception, FactoryResumeError)
            with self.assertRaises(FactoryError) as limits:
                session.factory.run("fanout", limits={"maxTotalSubagents": 0})
            self.assertEqual((limits.exception.code, limits.exception.http_status), ("invalid_limits", 400))

    def test_a_file_that_offers_several_factories_registers_each(self) -> None:
        url, token, fanout = service()
        two = str((Path(fanout).parent.parent / "extensions" / "two-factories.mjs").resolve())
        with join_session(url=url, token=token, factories=[two]) as session:
            self.assertEqual([(f.name, f.source) for f in session.factories], [("first-of-two", two), ("second-of-two", two)])
            for name, which in [("first-of-two", "first"), ("second-of-two", "second")]:
                run = session.factory.run(name)
                self.assertEqual((run["status"], run["result"]), ("completed", {"which": which}), run)

    def test_list_runs_in_creation_order(self) -> None:
        with join() as session:
            ids = [session.factory.run("fanout", args={"n": n})["runId"] for n in (1, 2, 1)]
            runs = session.factory.list_runs()
            self.assertEqual([r["runId"] for r in runs], ids)
            self.assertTrue(all(r["session"] == session.session_id and r["status"] == "completed" for r in runs))
            self.assertEqual([r["createdAt"] for r in runs], sorted(r["createdAt"] for r in runs))

            # Pages by creation sequence: the newest first, then walk older and newer.
            def of(page: Any) -> list[str]:
                return [r["runId"] for r in page["runs"]]

            newest = session.factory.list_runs(limit=1)
            self.assertEqual(of(newest), [ids[2]])
            self.assertEqual((newest["oldestSeq"], newest["newestSeq"]), (newest["runs"][0]["seq"],) * 2)
            self.assertEqual((newest["hasMoreNewer"], newest["omittedOlder"]), (False, True))
            middle = session.factory.list_runs(before_seq=newest["oldestSeq"], limit=1)
            self.assertEqual((of(middle), middle["hasMoreNewer"], middle["omittedOlder"]), ([ids[1]], True, True))
            oldest = session.factory.list_runs_page(before_seq=middle["oldestSeq"], limit=1)
            self.assertEqual((of(oldest), oldest["hasMoreNewer"], oldest["omittedOlder"]), ([ids[0]], True, False))
            newer = session.factory.list_runs(after_seq=oldest["newestSeq"], limit=1)
            self.assertEqual((of(newer), newer["hasMoreNewer"]), ([ids[1]], True))
            newer = session.factory.list_runs(after_seq=newer["newestSeq"], limit=1)
            self.assertEqual((of(newer), newer["hasMoreNewer"], newer["omittedOlder"]), ([ids[2]], False, True))
            self.assertEqual(of(session.factory.list_runs_page()), ids)
            with self.assertRaises(TypeError):
                session.factory.list_runs(limit=0)

    def test_detail_and_progress_pages(self) -> None:
        with join() as session:
            run = session.factory.run("fanout", args={"n": 2, "logs": 12})
            self.assertEqual(run["status"], "completed")
            runs = session.factory.get_run_progress
            every = runs(run["runId"], after_seq=0, limit=1000)
            self.assertGreater(len(every), 14)
            self.assertEqual([e["seq"] for e in every], list(range(1, len(every) + 1)))

            first = runs(run["runId"], after_seq=0, limit=5)
            self.assertEqual(first, every[0:5])
            self.assertEqual(runs(run["runId"], after_seq=first[-1]["seq"], limit=5), every[5:10])
            self.assertEqual(runs(run["runId"], before_seq=every[5]["seq"], limit=3), every[2:5])
            self.assertEqual(runs(run["runId"], limit=4), every[-4:])

            log_phase = runs(run["runId"], phase_id="Log", after_seq=0, limit=1000)
            self.assertEqual(log_phase, [e for e in every if e.get("phase") == "Log"])
            self.assertEqual([e["message"] for e in log_phase if e["event"] == "log"], [f"line {i}" for i in range(12)])
            self.assertEqual(runs(run["runId"], phase_id="Log", after_seq=log_phase[5]["seq"], limit=3), log_phase[6:9])
            self.assertEqual(runs(run["runId"], phase_id="No such phase"), [])
            with self.assertRaises(FactoryError) as bad:
                runs(run["runId"], after_seq=-1)
            self.assertEqual((bad.exception.code, bad.exception.http_status), ("invalid_params", 400))

            detail = session.factory.get_run_detail(run["runId"])
            self.assertEqual((detail["runId"], detail["status"]), (run["runId"], "completed"))
            self.assertEqual(detail["phases"], ["Fan out", "Log"])
            self.assertEqual(sorted(a["label"] for a in detail["agents"]), ["t:0", "t:1"])
            self.assertEqual(detail["progress"], every[-len(detail["progress"]) :])
            self.assertNotIn("item 0", repr(detail), "no prompt in the detail")

    def test_cancel_a_long_run_and_a_wait_that_times_out(self) -> None:
        with join() as session:
            run_id = session.factory.start("fanout", args={"n": 1, "prefix": "hang:"})
            self.assertEqual(running_run(session), run_id)
            with self.assertRaises(TimeoutError):
                session.factory.wait_for_run(run_id, timeout=0.3)
            self.assertEqual(session.factory.get_run(run_id)["status"], "running")
            with self.assertRaises(FactoryResumeError) as active:
                session.factory.resume(run_id)
            self.assertEqual((active.exception.code, active.exception.http_status), ("already_active", 409))
            with self.assertRaises(FactoryError) as refused:
                session.factory.remove(run_id)
            self.assertEqual((refused.exception.code, refused.exception.http_status), ("already_active", 409))
            self.assertEqual(session.factory.get_run(run_id)["status"], "running")

            settled: list[Any] = []
            waiter = threading.Thread(target=lambda: settled.append(session.factory.wait_for_run(run_id, timeout=60)))
            waiter.start()
            cancelled = session.factory.cancel(run_id)
            self.assertEqual(cancelled["status"], "cancelled")
            self.assertEqual(cancelled["failure"]["type"], "cancelled")
            waiter.join(90)
            self.assertEqual(settled, [cancelled])
            self.assertEqual(session.factory.wait_for_run(run_id), cancelled)
            # Ended, it is deleted with its journal: then unknown.
            self.assertEqual(session.factory.remove(run_id), {"runId": run_id, "removed": True})
            with self.assertRaises(FactoryError) as gone:
                session.factory.get_run(run_id)
            self.assertEqual(gone.exception.code, "not_found")

    def test_pause_a_running_run_and_what_a_pause_refuses(self) -> None:
        with join() as session:
            run_id = session.factory.start("fanout", args={"n": 1, "prefix": "hang:"})
            self.assertEqual(running_run(session), run_id)
            settled: list[Any] = []
            waiter = threading.Thread(target=lambda: settled.append(session.factory.wait_for_run(run_id, timeout=60)))
            waiter.start()
            paused = session.factory.pause(run_id)
            self.assertEqual((paused["status"], paused["failure"]["type"], paused["failure"]["kind"]), ("paused", "paused", "caller"))
            self.assertTrue(is_factory_run_terminal(paused["status"]))
            waiter.join(90)
            self.assertEqual(settled, [paused])
            with self.assertRaises(FactoryError) as again:
                session.factory.pause(run_id)
            self.assertEqual((again.exception.code, again.exception.http_status), ("not_running", 409))
            with self.assertRaises(FactoryError) as answer:
                session.factory.resume(run_id, input={"approved": True})
            self.assertEqual((answer.exception.code, answer.exception.http_status), ("not_at_checkpoint", 409))

    def test_resume_with_a_raised_limit_and_its_errors(self) -> None:
        self.assertEqual(
            FACTORY_RESUME_ERROR_CODES,
            (
                "not_found",
                "non_resumable",
                "already_active",
                "factory_already_running",
                "factory_limits_invalid",
                "factory_session_disposed",
                "factory_storage_unavailable",
                "factory_storage_corrupt",
            ),
        )
        with join() as session:
            stopped = session.factory.run("fanout", args={"n": 4}, limits={"maxTotalSubagents": 2})
            self.assertEqual(stopped["status"], "error", stopped)
            self.assertEqual((stopped["failure"]["type"], stopped["failure"]["kind"]), ("factory_limit_reached", "maxTotalSubagents"))
            resumed = session.factory.resume(stopped["runId"], limits={"maxTotalSubagents": 10})
            self.assertEqual((resumed["runId"], resumed["status"]), (stopped["runId"], "completed"))
            self.assertEqual((resumed["result"], resumed["attempts"]), ({"done": 4}, 2))
            self.assertGreater(resumed["revision"], stopped["revision"])

            # A `None` override lifts the ceiling: no limit of that kind for the run.
            capped = session.factory.run("fanout", args={"n": 3}, limits={"maxTotalSubagents": 1})
            self.assertEqual(capped["status"], "error", capped)
            lifted = session.factory.resume(capped["runId"], limits={"maxTotalSubagents": None})
            self.assertEqual((lifted["status"], lifted["result"]), ("completed", {"done": 3}))
            self.assertNotIn("maxTotalSubagents", session.factory.get_run_detail(capped["runId"])["limits"])

            with self.assertRaises(FactoryResumeError) as done:
                session.factory.resume(stopped["runId"])
            self.assertEqual((done.exception.code, done.exception.http_status), ("non_resumable", 409))
            self.assertIsInstance(done.exception, FactoryError)
            with self.assertRaises(FactoryResumeError) as missing:
                session.factory.resume("no-such-run")
            self.assertEqual((missing.exception.code, missing.exception.http_status), ("not_found", 404))

    def test_session_workflow_names_resume_refusals_with_workflow_codes(self) -> None:
        url, token, fanout = service()
        with self.assertRaises(TypeError):
            join_session(url=url, token=token, factories=[fanout], workflows=[fanout])
        session = join_session(url=url, token=token, workflows=[fanout], poll_interval=1.0)
        self.assertEqual([w.name for w in session.factories], ["fanout"])
        done = session.workflow.run("fanout", args={"n": 1})
        self.assertTrue(is_workflow_run_terminal(done["status"]))

        def refused(call: Callable[[], Any], code: str, service_code: str) -> None:
            with self.assertRaises(WorkflowResumeError) as caught:
                call()
            self.assertEqual((caught.exception.code, caught.exception.service_code), (code, service_code))
            self.assertIn(caught.exception.code, WORKFLOW_RESUME_ERROR_CODES)
            self.assertIsInstance(caught.exception, FactoryError)
            self.assertNotIsInstance(caught.exception, FactoryResumeError)

        refused(lambda: session.workflow.resume("no-such-run"), "not_found", "not_found")
        refused(lambda: session.workflow.resume(done["runId"]), "non_resumable", "non_resumable")
        stopped = session.workflow.run("fanout", args={"n": 3}, limits={"maxTotalSubagents": 1})
        refused(lambda: session.workflow.resume(stopped["runId"], limits={"maxTotalSubagents": 0}), "workflow_limits_invalid", "invalid_limits")
        with self.assertRaises(FactoryResumeError) as invalid:
            session.factory.resume(stopped["runId"], limits={"maxTotalSubagents": 0})
        self.assertEqual((invalid.exception.code, invalid.exception.service_code), ("factory_limits_invalid", "invalid_limits"))
        # `run(name, resume_from_run_id=...)` resumes that run.
        resumed = session.workflow.run("fanout", resume_from_run_id=stopped["runId"], limits={"maxTotalSubagents": 10})
        self.assertEqual((resumed["runId"], resumed["status"], resumed["attempts"]), (stopped["runId"], "completed", 2))
        # Closed: runs and resumes are refused as the session's disposal.
        session.close()
        refused(lambda: session.workflow.resume(stopped["runId"]), "workflow_session_disposed", "session_disposed")
        with self.assertRaises(FactoryResumeError) as disposed:
            session.factory.resume(stopped["runId"])
        self.assertEqual(disposed.exception.code, "factory_session_disposed")
        with self.assertRaises(FactoryError) as run_disposed:
            session.factory.run("fanout")
        self.assertEqual(run_disposed.exception.code, "factory_session_disposed")

    def test_stats_the_owner_sees_where_the_bytes_go_a_session_is_refused(self) -> None:
        url, token, _ = service()

        def journal(report: Any) -> Any:
            return next(p for p in report["parts"] if p["part"].startswith("journal values"))

        def runs(report: Any) -> Any:
            return next(t for t in report["tables"] if t["name"] == "runs")

        with join() as session:
            session.factory.run("fanout", args={"n": 1})
            before = stats(url=url, token=token)
            assert before is not None
            self.assertGreater(before["fileBytes"], 0)
            self.assertEqual(sum(p["bytes"] for p in before["parts"]), before["fileBytes"], "the parts add up to the file")
            self.assertGreater(journal(before)["bytes"], 0)
            # One more run of three agents: one more run record, three more agent replies at least.
            session.factory.run("fanout", args={"n": 3})
            after = stats(url=url, token=token)
            assert after is not None
            self.assertEqual(runs(after)["entries"], runs(before)["entries"] + 1, after["tables"])
            self.assertGreaterEqual(journal(after)["rows"], journal(before)["rows"] + 3, after["parts"])
            self.assertEqual(sum(p["bytes"] for p in after["parts"]), after["fileBytes"])
            # The store covers every session's runs: a session asking is refused, typed.
            with self.assertRaises(FactoryError) as refused:
                stats(url=url, token=token, session=session.session_id)
            self.assertEqual((refused.exception.code, refused.exception.http_status), ("bad_request", 400))
            with self.assertRaises(FactoryError) as bad:
                stats(url=url, token="0" * 64)
            self.assertEqual((bad.exception.code, bad.exception.http_status), ("unauthorized", 401))

    def test_gc_collects_the_sessions_own_ended_runs_only(self) -> None:
        with join() as session, join() as other:
            mine = [session.factory.run("fanout", args={"n": 1})["runId"] for _ in range(2)]
            theirs = other.factory.run("fanout", args={"n": 1})["runId"]
            with self.assertRaises(FactoryError) as refused:
                session.factory.gc()
            self.assertEqual((refused.exception.code, refused.exception.http_status), ("invalid_params", 400))
            # The newest of the factory is kept; a dry run only says which would go.
            self.assertEqual(
                session.factory.gc(keep_last=1, dry_run=True), {"removed": [mine[0]], "kept": 2, "dryRun": True}
            )
            self.assertEqual([r["runId"] for r in session.factory.list_runs()], mine)
            self.assertEqual(session.factory.gc(keep_days=0), {"removed": mine, "kept": 0, "dryRun": False})
            self.assertEqual(session.factory.list_runs(), [])
            self.assertEqual(other.factory.get_run(theirs)["status"], "completed", "another session's run stays")

    def test_another_sessions_run_is_not_found(self) -> None:
        with join() as session, join(session=f"other-{os.getpid()}") as other:
            self.assertEqual(other.session_id, f"other-{os.getpid()}")
            run_id = session.factory.run("fanout", args={"n": 1})["runId"]
            self.assertNotIn(run_id, [r["runId"] for r in other.factory.list_runs()])
            for read in (
                other.factory.get_run,
                other.factory.get_run_detail,
                other.factory.get_run_progress,
                other.factory.cancel,
                other.factory.wait_for_run,
            ):
                with self.assertRaises(FactoryError, msg=read.__name__) as hidden:
                    read(run_id)
                self.assertEqual(hidden.exception.code, "not_found", read.__name__)
            with self.assertRaises(FactoryResumeError) as resume:
                other.factory.resume(run_id)
            self.assertEqual(resume.exception.code, "not_found")
            # The same name joins the same session.
            own = join(session=other.session_id, factories=[]).factory.run("fanout", args={"n": 1})
            self.assertIn(own["runId"], [r["runId"] for r in other.factory.list_runs()])
            self.assertNotIn(own["runId"], [r["runId"] for r in session.factory.list_runs()])

    def test_the_event_stream_delivers_the_runs_updates_and_progress(self) -> None:
        with join() as session, join() as other:
            mine, theirs = Collector(session), Collector(other)
            run = session.factory.run("fanout", args={"n": 2, "prefix": "slow:", "logs": 3})
            self.assertEqual(run["status"], "completed")
            every = session.factory.get_run_progress(run["runId"], after_seq=0, limit=1000)

            def delivered() -> bool:
                updates = [e for e in mine.events if isinstance(e, RunUpdated) and e.run_id == run["runId"]]
                entries = [e for e in mine.events if isinstance(e, ProgressEvent) and e.run_id == run["runId"]]
                return bool(updates) and updates[-1].revision == run["revision"] and len(entries) >= len(every)

            until(delivered, "the run's last revision and every progress entry")
            events, leaked = mine.stop(), theirs.stop()
            updates = [e.revision for e in events if isinstance(e, RunUpdated) and e.run_id == run["runId"]]
            self.assertGreaterEqual(len(updates), 2, updates)
            self.assertEqual(updates, sorted(set(updates)), "revisions only grow")
            self.assertEqual(updates[-1], run["revision"])
            entries = [e.entry for e in events if isinstance(e, ProgressEvent) and e.run_id == run["runId"]]
            self.assertEqual(entries, every)
            self.assertEqual([e for e in leaked if e.run_id == run["runId"]], [], "another session hears nothing of it")

    def test_the_event_stream_tells_each_attempt_started_and_settled(self) -> None:
        with join() as session:
            events: list[Any] = []

            def read() -> None:
                for event in session.events(timeout=120):
                    events.append(event)

            threading.Thread(target=read, daemon=True).start()
            # The stream is open once a first run's updates arrive; attempts are told from then on.
            first = session.factory.run("fanout", args={"n": 1})
            until(lambda: any(isinstance(e, RunUpdated) and e.run_id == first["runId"] for e in events), "the stream open")
            # One at a time: the two spawns the cap allows both finish (journaled), so the
            # resume spawns exactly the two left.
            capped = {"maxTotalSubagents": 2, "maxConcurrentSubagents": 1}
            stopped = session.factory.run("fanout", args={"n": 4}, limits=capped)
            self.assertEqual(stopped["status"], "error")
            resumed = session.factory.resume(stopped["runId"], limits={"maxTotalSubagents": 10})
            self.assertEqual(resumed["status"], "completed")

            def settled() -> list[RunSettled]:
                return [e for e in events if isinstance(e, RunSettled) and e.run_id == stopped["runId"]]

            until(lambda: len(settled()) == 2, "both attempts settled")
            started = [e for e in events if isinstance(e, RunStarted) and e.run_id == stopped["runId"]]
            self.assertEqual(started, [RunStarted(stopped["runId"], 1, "fanout"), RunStarted(stopped["runId"], 2, "fanout")])
            one, two = settled()
            self.assertEqual((one.status, one.failure_type, one.consumed_subagents), ("error", "factory_limit_reached", 2))
            self.assertEqual((two.status, two.failure_type, two.consumed_subagents), ("completed", None, 2))
            self.assertEqual(one.consumed_subagents + two.consumed_subagents, resumed["accounting"]["agentsSpawned"])

    def test_a_bad_token_and_an_unreachable_service_are_typed_errors(self) -> None:
        url, _, fanout = service()
        with self.assertRaises(FactoryError) as bad:
            join_session(url=url, token="not-the-token", factories=[fanout])
        self.assertEqual((bad.exception.code, bad.exception.http_status), ("unauthorized", 401))
        session = join_session(url=url, token="not-the-token")
        for call in (session.factory.list_runs, lambda: next(session.events())):
            with self.assertRaises(FactoryError) as refused:
                call()
            self.assertEqual((refused.exception.code, refused.exception.http_status), ("unauthorized", 401))

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        with self.assertRaises(FactoryError) as down:
            join_session(url=f"http://127.0.0.1:{port}", token="t").factory.list_runs()
        self.assertEqual((down.exception.code, down.exception.http_status), ("unavailable", None))

    def test_is_factory_run_terminal_and_the_connection_settings(self) -> None:
        for status in ("completed", "error", "halted", "paused", "cancelled"):
            self.assertTrue(is_factory_run_terminal(status), status)
        for status in ("running", "pending", "", None, "Completed"):
            self.assertFalse(is_factory_run_terminal(status), status)
        self.assertEqual(resolve_connection("http://127.0.0.1:9/x", "t", env={}), ("http://127.0.0.1:9", "t"))
        self.assertEqual(
            resolve_connection(env={"FACTORY_URL": "http://127.0.0.1:8/", "FACTORY_TOKEN": "e"}), ("http://127.0.0.1:8", "e")
        )
        with self.assertRaises(FactoryError) as none:
            resolve_connection(env={"FACTORY_STATE_DIR": "/nonexistent/factory"})
        self.assertEqual(none.exception.code, "unavailable")
        self.assertIn("FACTORY_URL", str(none.exception))


class Hostile(http.server.BaseHTTPRequestHandler):
    """A broken server: an endless JSON body, or an event stream of one endless line."""

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.send_response(200)
        events = self.path == "/api/events"
        self.send_header("Content-Type", "text/event-stream" if events else "application/json")
        self.end_headers()
        chunk = (b"data: " if events else b"[") + b"0" * 65536
        try:
            for _ in range(2 * max(MAX_BODY_BYTES, MAX_EVENT_LINE_BYTES) // 65536):
                self.wfile.write(chunk)
                chunk = b"0" * 65536
        except OSError:
            pass  # The client stopped reading, as it should.

    def log_message(self, format: str, *args: Any) -> None:
        pass


class Redirecting(http.server.BaseHTTPRequestHandler):
    """A server that redirects every call to a path of its own, counting the calls there."""

    followed: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if self.path.startswith("/elsewhere"):
            Redirecting.followed.append(self.headers.get("Authorization", ""))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b"[]")
            return
        self.send_response(302)
        self.send_header("Location", "/elsewhere")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


class Dropping(http.server.BaseHTTPRequestHandler):
    """An event stream that sends one `run_updated` per connection, then drops it."""

    connections = 0

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        Dropping.connections += 1
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        data = f'{{"runId": "r", "revision": {Dropping.connections}}}'.encode()
        self.wfile.write(b": hello\n\nevent: run_updated\ndata: " + data + b"\n\nevent: other\ndata: {}\n\n")
        self.close_connection = True

    def log_message(self, format: str, *args: Any) -> None:
        pass


class BrokenServerTest(unittest.TestCase):
    """The client against small servers on 127.0.0.1 that misbehave as the service never does."""

    def test_the_event_stream_reopens_after_a_drop_unless_told_not_to(self) -> None:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Dropping)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            session = join_session(url=f"http://127.0.0.1:{server.server_address[1]}", token="t")
            events = session.events(timeout=30)
            self.assertEqual([next(events), next(events)], [RunUpdated("r", 1), RunUpdated("r", 2)])
            events.close()
            self.assertEqual(list(session.events(timeout=30, reconnect=False)), [RunUpdated("r", 3)])
        finally:
            server.shutdown()
            server.server_close()

    def test_a_redirect_is_an_error_and_never_followed(self) -> None:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Redirecting)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            session = join_session(url=f"http://127.0.0.1:{server.server_address[1]}", token="secret")
            with self.assertRaises(FactoryError) as redirect:
                session.factory.list_runs()
            self.assertEqual((redirect.exception.code, redirect.exception.http_status), ("error", 302))
            self.assertEqual(Redirecting.followed, [], "the token went nowhere else")
        finally:
            server.shutdown()
            server.server_close()

    def test_a_hostile_server_cannot_make_it_read_without_limit(self) -> None:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hostile)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            session = join_session(url=f"http://127.0.0.1:{server.server_address[1]}", token="t", request_timeout=30)
            with self.assertRaises(FactoryError) as body:
                session.factory.list_runs()
            self.assertEqual(body.exception.code, "error")
            self.assertIn(f"larger than {MAX_BODY_BYTES} bytes", str(body.exception))
            with self.assertRaises(FactoryError) as line:
                next(session.events(timeout=30))
            self.assertEqual(line.exception.code, "error")
            self.assertIn(f"longer than {MAX_EVENT_LINE_BYTES} bytes", str(line.exception))
        finally:
            server.shutdown()
            server.server_close()


if __name__ == "__main__":
    unittest.main()
