"""`bench-py`: the Python twin of the `bench` guest for the host benchmark's language
section (`host/benches/factory.rs`). `args.workload` selects `empty` (start-up), `fanout`
(`n` agents at once) or `small` (3 agents, a step, a log line: many live runs); the result is
`{workload, n, done}` as the Rust guest's."""

from factory_sdk import Ctx, factory


@factory(
    name="bench-py",
    description="Host benchmark workloads in Python. args: { workload: string, n?: int }",
    phases=["Bench"],
)
async def run(ctx: Ctx) -> object:
    workload = ctx.args["workload"]
    n = int(ctx.args.get("n", 0))
    if workload == "empty":
        done = 0
    elif workload == "fanout":
        replies = await ctx.parallel(
            [lambda i=i: ctx.agent(f"fan-out task {i}", label=f"f:{i}") for i in range(n)]
        )
        done = sum(1 for r in replies if r is not None)
    elif workload == "small":
        ctx.phase("Bench")
        replies = await ctx.parallel(
            [lambda i=i: ctx.agent(f"small task {i}", label=f"m:{i}") for i in range(3)]
        )
        ok = sum(1 for r in replies if r is not None)
        done = await ctx.step("count", lambda: ok)
        ctx.log(f"small run: {done} replies")
    else:
        raise ValueError(f"unknown workload `{workload}`")
    return {"workload": workload, "n": n, "done": done}
