"""How many bytes LangGraph's SQLite checkpointer keeps for a fan-out of N agent calls: the
yardstick of issue 54, measured on the machine that measures our store (tests/store_size.rs).

The same shape as the factory run beside it: the start fans out N calls (LangGraph's Send
API), each call's node returns its reply, a reducer gathers them and a last node merges.
No model is called: each reply is given (`ok`, or a window of TEXT_FILE of REPLY_BYTES), as
the factory run's backend does. Prints one JSON line: the calls, the reply bytes and the
database's bytes (its WAL and journal files included).

    python3 langgraph_size.py N REPLY_BYTES [TEXT_FILE]

Pinned (./test installs them into .venv): langgraph==1.2.24, langgraph-checkpoint-sqlite==3.1.2.
"""
import json
import operator
import os
import sqlite3
import sys
import tempfile
from typing import Annotated, TypedDict

try:
    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.graph import END, START, StateGraph
    from langgraph.types import Send
except ImportError as e:
    sys.exit(f"{e}: ./test installs langgraph==1.2.24 and langgraph-checkpoint-sqlite==3.1.2 into .venv")


def main():
    n = int(sys.argv[1])
    reply_bytes = int(sys.argv[2])
    text = open(sys.argv[3], encoding="utf-8").read() if len(sys.argv) > 3 else ""

    def reply(i):
        if reply_bytes == 0:
            return "ok"
        span = len(text) - reply_bytes - 8
        start = (i * 7919) % span
        return text[start : start + reply_bytes]

    class State(TypedDict):
        replies: Annotated[list, operator.add]
        done: int

    class Task(TypedDict):
        i: int

    def fan(state):
        return [Send("agent", {"i": i}) for i in range(n)]

    def agent(task: Task):
        return {"replies": [reply(task["i"])]}

    def merge(state):
        return {"done": len(state["replies"])}

    graph = StateGraph(State)
    graph.add_node("agent", agent)
    graph.add_node("merge", merge)
    graph.add_conditional_edges(START, fan, ["agent"])
    graph.add_edge("agent", "merge")
    graph.add_edge("merge", END)

    with tempfile.TemporaryDirectory() as scratch:
        path = os.path.join(scratch, "checkpoints.sqlite")
        conn = sqlite3.connect(path, check_same_thread=False)
        app = graph.compile(checkpointer=SqliteSaver(conn))
        out = app.invoke({"replies": [], "done": 0}, {"configurable": {"thread_id": "run"}})
        if out["done"] != n:
            sys.exit(f"the graph gathered {out['done']} replies of {n}")
        conn.close()
        size = sum(os.path.getsize(os.path.join(scratch, f)) for f in os.listdir(scratch))
        replies = sum(len(reply(i).encode()) for i in range(n))
        print(json.dumps({"calls": n, "replyBytes": replies, "fileBytes": size}))


if __name__ == "__main__":
    main()
