"""The Python client against a real ``factory serve --http 127.0.0.1:0`` started here on a
temporary state directory (the binary: $FACTORY_BIN, else target/debug/factory) whose default
backend is a script backend (fast ``t:`` agents, slow ``slow:`` ones). Run, resume with a
raised limit, listRuns order and session isolation, progress paging, waitForRun with a
timeout, cancel, run_updated revisions, FactoryResumeError codes, and where the connection
comes from.

    FACTORY_BIN=target/debug/factory python3 -m unittest discover -s clients/python/tests
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", "..", ".."))
sys.path.insert(0, os.path.join(HERE, ".."))

from factory_client import (  # noqa: E402
    FACTORY_RESUME_ERROR_CODES,
    FACTORY_RUN_UPDATED,
    FactoryError,
    FactoryResumeError,
    isFactoryRunTerminal,
    joinSession,
    join_session,
    resolveConnection,
)

#: The Node client's test factory: `n` agents labelled `${prefix}${i}`, then `logs` lines.
FANOUT = os.path.join(ROOT, "clients", "node", "test", "factories", "fanout.js")

RULES = {
    "rules": [
        {"labelPrefix": "t:", "reply": {"text": "ok"}, "latencyMs": 1},
        {"labelPrefix": "slow:", "reply": {"text": "ok"}, "latencyMs": 1500},
        {"labelPrefix": "hang:", "reply": {"text": "late"}, "latencyMs": 600000},
    ],
    "fallback": "dry-run",
}


def factory_bin() -> str:
    path = os.environ.get("FACTORY_BIN") or os.path.join(ROOT, "target", "debug", "factory")
    if not os.path.isfile(path):
        raise RuntimeError(f"no factory binary at {path}: build it (cargo build -p factory-host --bin factory) or set FACTORY_BIN")
    return path


class Service:
    """A real `factory serve --http` on a temporary state directory."""

    def __init__(self) -> None:
        self.state_dir = tempfile.mkdtemp(prefix="factory-python-client-")
        home = os.path.join(self.state_dir, "home")
        os.mkdir(home)
        rules = os.path.join(self.state_dir, "rules.json")
        with open(rules, "w") as f:
            json.dump(RULES, f)
        with open(os.path.join(self.state_dir, "factory.toml"), "w") as f:
            f.write(f'default = "test"\n[backends.test]\nkind = "script"\npath = {json.dumps(rules)}\n')
        env = dict(os.environ, FACTORY_STATE_DIR=self.state_dir, HOME=home, FACTORY_NO_DAEMON="1")
        for name in ("FACTORY_CONFIG", "XDG_CONFIG_HOME", "XDG_STATE_HOME", "FACTORY_URL", "FACTORY_TOKEN", "FACTORY_SESSION"):
            env.pop(name, None)
        self.child = subprocess.Popen([factory_bin(), "serve", "--http", "127.0.0.1:0"], env=env,
                                      stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.lines = []
        self.url = None
        for line in self.child.stderr:
            self.lines.append(line.rstrip("\n"))
            match = re.search(r"HTTP API on (http://[^/]+)/api/", line)
            if match:
                self.url = match.group(1)
                break
        if self.url is None:
            self.child.wait()
            raise RuntimeError("factory serve exited before serving:\n" + "\n".join(self.lines))
        # Keep draining stderr so the service never blocks on a full pipe.
        threading.Thread(target=lambda: [None for _ in self.child.stderr], daemon=True).start()
        with open(os.path.join(self.state_dir, "http.token")) as f:
            self.token = f.read().strip()

    def stop(self) -> None:
        if self.child.poll() is None:
            self.child.terminate()
            self.child.wait(30)
        shutil.rmtree(self.state_dir, ignore_errors=True)


def until(check, what: str, seconds: float = 60):
    deadline = time.monotonic() + seconds
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


class ClientTest(unittest.TestCase):
    service: Service

    @classmethod
    def setUpClass(cls) -> None:
        cls.service = Service()

    @classmethod
    def tearDownClass(cls) -> None:
        cls.service.stop()

    def join(self, **extra):
        session = join_session(url=self.service.url, token=self.service.token, factories=[FANOUT], poll_interval=2.0, **extra)
        self.addCleanup(session.disconnect)
        return session

    def test_run_resolves_with_the_terminal_envelope_by_handle_or_name(self):
        session = self.join()
        self.assertRegex(session.sessionId, r"^python-[0-9a-f-]{36}$")
        self.assertEqual([f["name"] for f in session.factories], ["fanout"])
        self.assertRegex(session.factories[0]["sha256"], r"^[0-9a-f]{64}$")
        by_handle = session.factory.run(session.factories[0], args={"n": 3})
        self.assertEqual(by_handle["status"], "completed", by_handle)
        self.assertEqual(by_handle["result"], {"done": 3})
        self.assertEqual(by_handle["session"], session.sessionId)
        self.assertTrue(isFactoryRunTerminal(by_handle["status"]))
        by_name = session.factory.run("fanout", args={"n": 2}, limits={"maxConcurrentSubagents": 1})
        self.assertEqual((by_name["status"], by_name["result"]), ("completed", {"done": 2}))
        self.assertNotEqual(by_name["runId"], by_handle["runId"])
        self.assertEqual(session.factory.getRun(by_name["runId"]), by_name)
        with self.assertRaises(FactoryError) as caught:
            session.factory.run("no-such-factory")
        self.assertEqual(caught.exception.code, "unknown_factory")
        with self.assertRaises(FactoryError) as caught:
            session.factory.run("fanout", limits={"maxTotalSubagents": 0})
        self.assertEqual(caught.exception.code, "invalid_limits")

    def test_resume_with_a_raised_limit_completes_the_run(self):
        session = self.join()
        stopped = session.factory.run("fanout", args={"n": 4}, limits={"maxTotalSubagents": 2})
        self.assertEqual(stopped["status"], "error", stopped)
        self.assertEqual(stopped["failure"]["type"], "factory_limit_reached")
        self.assertEqual(stopped["failure"]["kind"], "maxTotalSubagents")
        resumed = session.factory.resume(stopped["runId"], limits={"maxTotalSubagents": 10})
        self.assertEqual(resumed["runId"], stopped["runId"])
        self.assertEqual(resumed["status"], "completed", resumed)
        self.assertEqual(resumed["result"], {"done": 4})
        self.assertEqual(resumed["attempts"], 2)
        self.assertGreater(resumed["revision"], stopped["revision"])
        with self.assertRaises(FactoryResumeError) as caught:
            session.factory.resume(stopped["runId"])
        self.assertEqual(caught.exception.code, "non_resumable")
        with self.assertRaises(FactoryResumeError) as caught:
            session.factory.resume("no-such-run")
        self.assertEqual(caught.exception.code, "not_found")
        self.assertIn(caught.exception.code, FACTORY_RESUME_ERROR_CODES)

    def test_list_runs_is_in_creation_order_and_per_session(self):
        first, second = self.join(), self.join()
        a = first.factory.run("fanout", args={"n": 1})
        b = first.factory.run("fanout", args={"n": 1})
        c = second.factory.run("fanout", args={"n": 1})
        self.assertEqual([r["runId"] for r in first.factory.listRuns()], [a["runId"], b["runId"]])
        self.assertEqual([r["runId"] for r in second.factory.list_runs()], [c["runId"]])
        with self.assertRaises(FactoryError) as caught:
            second.factory.getRun(a["runId"])
        self.assertEqual(caught.exception.code, "not_found")
        detail = first.factory.getRunDetail(a["runId"])
        self.assertEqual((detail["runId"], detail["status"]), (a["runId"], "completed"))
        self.assertEqual(detail["phases"], ["Fan out", "Log"])
        self.assertEqual([agent["label"] for agent in detail["agents"]], ["t:0"])
        self.assertNotIn("item 0", json.dumps(detail), "no prompt in the detail")

    def test_progress_pages_forwards_and_by_phase(self):
        session = self.join()
        run = session.factory.run("fanout", args={"n": 2, "logs": 30})
        forward, after = [], 0
        while True:
            page = session.factory.getRunProgress(run["runId"], after_seq=after, limit=7)
            if not page:
                break
            self.assertLessEqual(len(page), 7)
            forward.extend(page)
            after = page[-1]["seq"]
        seqs = [e["seq"] for e in forward]
        self.assertEqual(seqs, sorted(seqs))
        self.assertEqual(len(set(seqs)), len(seqs))
        logs = session.factory.get_run_progress(run["runId"], phase_id="Log", limit=1000)
        self.assertEqual(sum(1 for e in logs if e.get("event") == "log"), 30)
        self.assertTrue(all(e.get("phase") == "Log" for e in logs))

    def test_run_updated_events_and_cancel(self):
        session = self.join()
        events = []
        off = session.on(FACTORY_RUN_UPDATED, events.append)
        done = session.factory.run("fanout", args={"n": 2})
        ours = until(lambda: [e for e in events if e["data"]["runId"] == done["runId"]], "run_updated events")
        revisions = [e["data"]["revision"] for e in ours]
        self.assertEqual(revisions, sorted(revisions))
        self.assertEqual(ours[0]["type"], FACTORY_RUN_UPDATED)
        self.assertIs(ours[0]["ephemeral"], True)
        off()

        started = {}
        thread = threading.Thread(target=lambda: started.update(env=session.factory.run("fanout", args={"n": 1, "prefix": "hang:"})))
        thread.start()
        running = until(lambda: [r for r in session.factory.listRuns() if r["status"] == "running"], "a running run")[0]
        with self.assertRaises(TimeoutError):
            session.factory.waitForRun(running["runId"], timeout=0.5)
        cancelled = session.factory.cancel(running["runId"])
        self.assertEqual(cancelled["status"], "cancelled")
        thread.join(60)
        self.assertEqual(started["env"]["status"], "cancelled")

    def test_connection_comes_from_options_env_or_state_files(self):
        got = resolveConnection(url="http://127.0.0.1:9/x", token="t", env={})
        self.assertEqual(got, {"url": "http://127.0.0.1:9", "token": "t"})
        got = resolveConnection(env={"FACTORY_URL": "http://127.0.0.1:8", "FACTORY_TOKEN": "u"})
        self.assertEqual(got, {"url": "http://127.0.0.1:8", "token": "u"})
        got = resolveConnection(env={"FACTORY_STATE_DIR": self.service.state_dir})
        self.assertEqual(got, {"url": self.service.url, "token": self.service.token})
        empty = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, empty, True)
        with self.assertRaises(FactoryError) as caught:
            resolveConnection(env={"FACTORY_STATE_DIR": empty})
        self.assertEqual(caught.exception.code, "unavailable")
        with self.assertRaises(FactoryError) as caught:
            joinSession(url="http://127.0.0.1:1", token="x").factory.listRuns()
        self.assertEqual(caught.exception.code, "unavailable")
        with self.assertRaises(FactoryError) as caught:
            joinSession(url=self.service.url, token="wrong").factory.listRuns()
        self.assertEqual(caught.exception.http_status, 401)


if __name__ == "__main__":
    unittest.main()
