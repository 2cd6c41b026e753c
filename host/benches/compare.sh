#!/usr/bin/env bash
# host/benches/compare.sh BASE_REV: A/B of the bench (host/benches/factory.rs) between the
# commit BASE_REV and the working tree, on this machine, one after the other.
#
# It checks BASE_REV out as a detached git worktree with a target dir of its own (under
# $FACTORY_COMPARE_DIR, default ${TMPDIR:-/tmp}/factory-compare), seeds each side's target
# dir with hard links of the other's third-party release artifacts (immutable per hash; the
# workspace's own crates are never linked, each side builds them itself), builds the bench of
# both sides, then runs them alternately ($FACTORY_COMPARE_ROUNDS rounds, default 3, the side
# that goes first alternating) and prints, per row, the median value of each side over the
# rounds and the ratio working tree / base (below 1: the working tree is faster).
#
# Environment: FACTORY_BENCH_SECTIONS (default 1,3,4: the rows the host's own cost shows in),
# FACTORY_BENCH_RUNS (passed on), FACTORY_COMPARE_ROUNDS, FACTORY_COMPARE_DIR. The raw
# tables of every round are kept in $FACTORY_COMPARE_DIR/runs-<rev>/.
set -euo pipefail

if [[ $# -lt 1 ]]; then
    echo "usage: host/benches/compare.sh BASE_REV" >&2
    exit 2
fi
repo=$(git rev-parse --show-toplevel)
rev=$(git -C "$repo" rev-parse --short=7 "$1^{commit}")
dir=${FACTORY_COMPARE_DIR:-${TMPDIR:-/tmp}/factory-compare}
rounds=${FACTORY_COMPARE_ROUNDS:-3}
export FACTORY_BENCH_SECTIONS=${FACTORY_BENCH_SECTIONS:-1,3,4}
base_tree=$dir/wt-$rev
base_target=$dir/target-$rev
head_target=${CARGO_TARGET_DIR:-$repo/target}
runs=$dir/runs-$rev
mkdir -p "$dir" "$runs"

if [[ ! -d $base_tree ]]; then
    git -C "$repo" worktree add --detach "$base_tree" "$rev" >&2
fi

# Seed each side's target dir with the other's third-party release artifacts (whichever was
# built first): the same crate at the same version and features has the same hash on both
# sides. Workspace crates (their names, with - and _) are left out.
workspace=$(cargo metadata --manifest-path "$repo/Cargo.toml" --no-deps --format-version 1 |
    python3 -c 'import json,sys; print(" ".join(n for p in json.load(sys.stdin)["packages"] for n in {p["name"], p["name"].replace("-", "_")}))')
seed() {
    local from=$1 to=$2 entry name
    [[ -d $from ]] || return 0
    mkdir -p "$to"
    for entry in "$from"/*; do
        [[ -e $entry ]] || continue
        name=$(basename "$entry")
        name=${name#lib}
        name=${name%%.*}
        name=${name%-*}
        if [[ " $workspace " == *" $name "* ]] || [[ -e $to/$(basename "$entry") ]]; then
            continue
        fi
        cp -al "$entry" "$to/"
    done
}
for part in deps .fingerprint build; do
    seed "$head_target/release/$part" "$base_target/release/$part"
    seed "$base_target/release/$part" "$head_target/release/$part"
done

# Build both benches; `cargo bench --no-run` names the executable it built.
build() {
    local tree=$1 target=$2
    (cd "$tree" && CARGO_TARGET_DIR=$target cargo bench -p factory-host --bench factory --no-run 2>&1) |
        tee /dev/stderr | sed -n 's/.*Executable .*(\(.*\)).*/\1/p' | tail -1
}
echo "compare: building the bench of $rev in $base_tree" >&2
base_bin=$(build "$base_tree" "$base_target")
echo "compare: building the bench of the working tree" >&2
head_bin=$(build "$repo" "$head_target")
[[ $base_bin = /* ]] || base_bin=$base_tree/$base_bin
[[ $head_bin = /* ]] || head_bin=$repo/$head_bin
if [[ ! -x $base_bin || ! -x $head_bin ]]; then
    echo "compare: could not find the bench executables ($base_bin, $head_bin)" >&2
    exit 1
fi

for ((round = 1; round <= rounds; round++)); do
    if ((round % 2)); then order="base head"; else order="head base"; fi
    for side in $order; do
        echo "compare: round $round/$rounds, $side (load average $(cut -d' ' -f1-3 /proc/loadavg))" >&2
        if [[ $side == base ]]; then
            (cd "$base_tree/host" && CARGO_TARGET_DIR=$base_target "$base_bin" --bench) >"$runs/$side-$round.md"
        else
            (cd "$repo/host" && CARGO_TARGET_DIR=$head_target "$head_bin" --bench) >"$runs/$side-$round.md"
        fi
    done
done

python3 - "$runs" "$rounds" "$rev" <<'EOF'
import re, statistics, sys
runs, rounds, rev = sys.argv[1], int(sys.argv[2]), sys.argv[3]
UNITS = {"ns": 1e-9, "µs": 1e-6, "us": 1e-6, "ms": 1e-3, "s": 1.0}

def seconds(text):
    m = re.match(r"\s*(-?[0-9.]+)\s*(ns|µs|us|ms|s)\b", text)
    return float(m.group(1)) * UNITS[m.group(2)] if m else None

def rows(path):
    """(section, measurement, nth) -> {figure: seconds}: the value, and the host time per
    call or the host CPU the detail names."""
    out, seen = {}, {}
    for line in open(path, encoding="utf-8"):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 4 or not cells[0][:1].isdigit():
            continue
        key = (cells[0], cells[1])
        seen[key] = seen.get(key, 0) + 1
        figures = {}
        value = seconds(cells[2])
        if value is not None:
            figures["value"] = value
        m = re.search(r"host (-?[0-9.]+) (µs|us|ms) per call", cells[3])
        if m:
            figures["host per call"] = float(m.group(1)) * UNITS[m.group(2)]
        m = re.search(r"host CPU (-?[0-9.]+ ?(?:ns|µs|us|ms|s))\b", cells[3])
        if m:
            figures["host CPU"] = seconds(m.group(1))
        out[key + (seen[key],)] = figures
    return out

sides = {side: [rows(f"{runs}/{side}-{r}.md") for r in range(1, rounds + 1)] for side in ("base", "head")}
order = list(sides["head"][0].keys()) + [k for k in sides["base"][0] if k not in sides["head"][0]]

def fmt(s):
    if s is None:
        return ""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if abs(s) >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s / 1e-9:.0f} ns"

print(f"\nA/B: base {rev} vs working tree, median of {rounds} rounds (ratio = working tree / base)\n")
print("| section | measurement | figure | base | working tree | ratio |")
print("| --- | --- | --- | --- | --- | --- |")
for key in order:
    figures = sorted({f for s in sides.values() for t in s for f in t.get(key, {})})
    for figure in figures:
        med = {}
        for side, tables in sides.items():
            vals = [t[key][figure] for t in tables if figure in t.get(key, {})]
            med[side] = statistics.median(vals) if vals else None
        ratio = f"{med['head'] / med['base']:.2f}x" if med["base"] and med["head"] is not None else ""
        name = key[1] + (f" (#{key[2]})" if key[2] > 1 else "")
        print(f"| {key[0]} | {name} | {figure} | {fmt(med['base'])} | {fmt(med['head'])} | {ratio} |")
EOF
