#!/usr/bin/env python3
"""Split a bench profile's samples by stage of an agent call (README, Benchmarks).

Input: `perf script --no-inline -F comm,pid,tid,time,period,ip,sym,dso` of a
`perf record -k mono --call-graph dwarf,16384` of the bench (`FACTORY_PERF_MAP=1` names the
guest's functions; without it a guest sample is a leaf no native file holds).

The measured spans are found from the samples themselves, so a bench of any commit can be
split the same way: a window is a run of samples whose stack holds one of the `--marker`
substrings (a hook's host function), merged while they are less than `--gap` seconds apart;
with `--thread main` only the main thread's samples mark, and a sample holding a `--closer`
substring (another hook's function) ends the window. Every sample of the process inside a
window (all threads: the store's writer included) is given the stage of the innermost frame
that names one (a page fault or the writer thread first), and the table prints each stage's
share and, with `--per-call` (seconds of the loop per call, from the bench's own row) or
`--calls` (how many calls the windows hold), its CPU per call.

The commands behind README's "Per stage, before and after" (this tree's names first, then
d73fa5d's; `--per-call` is the row's loop time per call, `20000 calls X ms` / 20,000, of the
same run):

    # section 1, FACTORY_BENCH_HOOKS=log,agent-start: the memo hit, then the `log`
    perf_stages.py F --marker 'RunData>::agent_start' --closer Progress::log_at --thread main --per-call 535e-9
    perf_stages.py F --marker Progress::log_at --closer 'RunData>::agent_start' --thread main --per-call 451e-9
    perf_stages.py B --marker RunShared::agent --marker 'RunView>::agent' --closer RunShared::log \
        --closer 'RunView>::step_' --thread main --per-call 1.1e-6
    perf_stages.py B --marker RunShared::log --closer RunShared::agent --closer 'RunView>::' \
        --thread main --per-call 1.47e-6
    # section 3, FACTORY_BENCH_RUNS=15: the 0 ms rows are the first window, 15 x (1,000 + 4,096) agents
    perf_stages.py F --marker Agents:: --marker Started:: --marker LatencyBackend --gap 0.03 --min 0.05 --window 0 --calls 76440
    perf_stages.py B --marker RunShared::agent --marker get_agent --marker LatencyBackend --gap 0.03 --min 0.05 --window 0 --calls 76440
"""
import argparse
import bisect
import collections
import re
import sys

HEADER = re.compile(r"^(\S.*?)\s+(\d+)/(\d+)\s+([0-9.]+):\s+(\d+)")
FRAME = re.compile(r"^\s+[0-9a-f]+\s+(.*?)\s+\((.*)\)$")

# Frames that name no stage: the caller decides.
NEUTRAL = ("core::", "alloc::", "std::", "hashbrown::", "<alloc::", "<core::", "<std::", "<hashbrown",
           "serde_json::", "<serde_json", "serde_core", "serde::", "<serde", "foldhash", "<&", "<F as",
           "<T as core", "__rustc::")


# The bench's own measuring between runs (heap trim, RSS reads): not the host's.
HARNESS = ("malloc_trim", "factory::vm", "factory::rss", "peak_rss")


# The host's own frames (`factory_host::...`) by the stage their name says, first match wins;
# a host frame that matches none is the agent call's own code.
HOST_STAGES = [
    (("add_to_linker_instance", "FactoryPre"), "wasmtime crossing (lift, lower, task)"),
    (("writer::commit", "writer::run", "redb::progress", "PerRun", "RedbStore", "store::records", "Chunk::"), "commit (store writer)"),
    (("Writer::send", "op::Pending", "op::forget", "store::op", "writer::Op", "Writer::"), "writer sends"),
    (("rogress", "::emit", "publish", "Journaled", "::log"), "progress entries"),
    (("ValueCache", "cache::", "LoadedEntries", "agent_fingerprint", "Journal", "journal", "put_agent", "get_agent", "::hit", "cached"), "memo lookup, journal write, value cache"),
    (("Agents::enter", "account", "Accounting", "metrics", "admit", "stopping", "Stop", "span", "trace", "notify", "usage"), "admission, accounting, tracing"),
    (("ComponentLoader", "instantiate", "Host::attempt", "Host::run", "StoreInner", "Host::new", "componentize", "build_crate", "Store::open", "Host::claim", "new_store", "sandbox::engine"), "run start and end"),
]


def samples(path):
    """(comm, pid, tid, time, period, [(symbol, dso)] leaf first) per sample."""
    head, frames = None, []
    with open(path, errors="replace") as f:
        for line in f:
            if not line.strip():
                if head:
                    yield (*head, frames)
                head, frames = None, []
                continue
            m = HEADER.match(line)
            if m and not line[0].isspace():
                head = (m.group(1).strip(), int(m.group(2)), int(m.group(3)), float(m.group(4)), int(m.group(5)))
                frames = []
            elif (m := FRAME.match(line)) and head:
                frames.append((m.group(1), m.group(2)))
    if head:
        yield (*head, frames)


def frame_stage(sym, dso):
    """The stage one frame names, or None."""
    if dso.startswith("/tmp/perf-"):
        return "guest"
    if dso in ("[kernel.kallsyms]", "[vdso]"):
        return "wake-ups (tokio, futex)" if "futex" in sym else None
    if dso.startswith("/usr/lib") or (sym.startswith(NEUTRAL) and not any(k in sym for k in ("factory_host", "wasmtime", "factory::"))):
        return None
    if sym.startswith(("sha2::", "data_encoding", "hex::", "<hex::", "<D as digest", "digest::")) or "AgentKey" in sym or "agent_key::" in sym:
        return "memo key (SHA-256, hex)"
    if sym.startswith(("factory::", "<factory::")):
        return "bench backend stand-in"
    if sym.startswith(("tokio", "<tokio", "futures", "<futures", "parking_lot")):
        return "wake-ups (tokio, futex)"
    if sym.startswith(("tracing", "<tracing", "metrics", "<metrics")):
        return "admission, accounting, tracing"
    if sym.startswith(("redb", "<redb")):
        return "commit (store writer)"
    if "factory_host" in sym:
        for keys, stage in HOST_STAGES:
            if any(k in sym for k in keys):
                return stage
        return "agent call's own code (start, spawn, poll, finish)"
    if "wasmtime" in sym or sym.startswith(("cranelift", "wit_", "wasmparser")):
        return "wasmtime crossing (lift, lower, task)"
    return None


def stage(frames, on_writer):
    if on_writer:
        return "commit (store writer)"
    if any("asm_exc_page_fault" in s for s, _ in frames):
        return "page faults"
    for sym, dso in frames:
        if found := frame_stage(sym, dso):
            return found
    return "other (libc, kernel)"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("file")
    p.add_argument("--marker", action="append", required=True, help="a substring of a marking frame (repeatable)")
    p.add_argument("--closer", action="append", default=[], help="a substring that ends a window (repeatable)")
    p.add_argument("--thread", choices=("main", "all"), default="all")
    p.add_argument("--gap", type=float, default=0.0015, help="merge marks closer than this (s)")
    p.add_argument("--min", type=float, default=0.002, help="drop windows shorter than this (s)")
    p.add_argument("--window", type=int, help="only the window of this index")
    p.add_argument("--per-call", type=float, help="the bench loop's seconds per call")
    p.add_argument("--calls", type=int, help="the calls the windows hold")
    a = p.parse_args()

    rows = [s for s in samples(a.file) if s[0].startswith(("factory", "tokio"))]
    if not rows:
        sys.exit(f"{a.file}: no samples of the bench")
    main_tid = collections.Counter(s[2] for s in rows if s[1] == s[2]).most_common(1)[0][0]
    writer = collections.Counter(s[2] for s in rows if any("writer::run" in f or "writer::commit" in f for f, _ in s[5]))
    writer_tids = {t for t, n in writer.items() if n > 20}

    wins = []
    for comm, pid, tid, t, per, frames in sorted(rows, key=lambda s: s[3]):
        if a.thread == "main" and tid != main_tid:
            continue
        syms = [f for f, _ in frames]
        if any(c in f for f in syms for c in a.closer):
            if wins:
                wins[-1][2] = True
            continue
        if any(m in f for f in syms for m in a.marker):
            if wins and not wins[-1][2] and t - wins[-1][1] < a.gap:
                wins[-1][1] = t
            else:
                wins.append([t, t, False])
    # Marks come from the agent path only: a run's start and its last commit lie just outside.
    pad = (0.0005, 0.004) if a.thread == "all" else (0, 0)
    wins = [(s - pad[0], e + pad[1]) for s, e, _ in wins if e - s >= a.min]
    if a.window is not None:
        wins = wins[a.window:a.window + 1]
    if not wins:
        sys.exit(f"{a.file}: no window of {a.marker}")

    starts = [w[0] for w in wins]
    total, n = collections.Counter(), 0
    for comm, pid, tid, t, per, frames in rows:
        i = bisect.bisect_right(starts, t) - 1
        if i >= 0 and t <= wins[i][1]:
            if any(k in f for f, _ in frames for k in HARNESS) and not any("factory_host" in f for f, _ in frames):
                continue
            total[stage(frames, tid in writer_tids)] += per
            n += 1
    cpu = sum(total.values()) / 1e9
    wall = sum(e - s for s, e in wins)
    if a.per_call:
        per_call = cpu / wall * a.per_call
    elif a.calls:
        per_call = cpu / a.calls
    else:
        per_call = None
    print(f"{len(wins)} windows, {wall * 1e3:.1f} ms wall, {cpu * 1e3:.1f} ms CPU, {n} samples"
          + (f", {per_call * 1e9:.0f} ns CPU per call" if per_call else ""))
    print("| stage | share | ns per call |\n| --- | --- | --- |")
    for name, v in total.most_common():
        share = v / sum(total.values())
        print(f"| {name} | {100 * share:.1f}% | {share * per_call * 1e9:.0f} |" if per_call else f"| {name} | {100 * share:.1f}% | |")


if __name__ == "__main__":
    main()
