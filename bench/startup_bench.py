#!/usr/bin/env python3
"""How long a rank takes to start: `dplan run` of gpt-tiny on one rank, its start-up in parts.

    bench/startup_bench.py [--runs 9] [--dplan build/dplan] [--compare OTHER_DPLAN]

Each run is `dplan run plan.json --steps 1` of gpt-tiny (one rank, local-cpu, fp32); its run.json
"startup_s" (docs/run-json.md) times the rank from the moment dplan run started it to its first
training step, in parts: launch_to_main (fork, exec, the dynamic loader mapping and relocating
LibTorch and its dependencies, their static initializers), setup (the plan, the device, the
memory meter, the data), rendezvous (the store, the heartbeat), groups (the process groups),
model, optimizer, before_first_step. Also printed: process start alone (fork and exec of a binary
without LibTorch, /bin/true: what launch_to_main holds beside LibTorch's loading), LibTorch load
(launch_to_main less that), and the whole `dplan run` command's wall time. Medians over the runs,
with min-max. With --compare, the other dplan's runs alternate with these (same sitting, same
drift), and both columns are printed. The target: launcher to first step (the total) under 0.3 s.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

PARTS = ("launch_to_main", "setup", "rendezvous", "groups", "model", "optimizer", "before_first_step", "total")
TARGET_S = 0.3


def process_start_s(runs):
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(["/bin/true"], check=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def one_run(dplan, plan, out):
    t0 = time.perf_counter()
    r = subprocess.run([dplan, "run", plan, "--steps", "1", "--quiet", "-o", out, "--force"],
                       capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        sys.exit(f"startup_bench: {dplan} run exited {r.returncode}: {(r.stderr or r.stdout).strip()[-300:]}")
    startup = json.load(open(out)).get("startup_s")
    if not startup or "launch_to_main" not in startup:
        sys.exit(f"startup_bench: {out} has no startup_s with launch_to_main: this dplan predates the start-up timing")
    startup["dplan_run_wall"] = wall
    return startup


def main():
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--dplan", default=os.path.join(here, "build", "dplan"))
    ap.add_argument("--compare", help="another dplan (with its dplan-worker beside it), run alternately")
    args = ap.parse_args()
    binaries = [args.dplan] + ([args.compare] if args.compare else [])
    for b in binaries:
        if not os.access(b, os.X_OK) or not os.access(os.path.join(os.path.dirname(b), "dplan-worker"), os.X_OK):
            sys.exit(f"startup_bench: {b}: no dplan with a dplan-worker beside it (./setup.sh --all builds both)")
    tmp = tempfile.mkdtemp(prefix="startup_bench.")
    try:
        plan = os.path.join(tmp, "plan.json")
        r = subprocess.run([args.dplan, "estimate", "--model", "gpt-tiny", "--cluster", "local-cpu", "--gpus", "1",
                            "--tp", "1", "--pp", "1", "--dp", "1", "--mbs", "2", "--global-batch", "2", "--seq", "32",
                            "--precision", "fp32", "-o", plan], capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"startup_bench: dplan estimate: {r.stderr.strip()}")
        results = {b: [] for b in binaries}
        one_run(args.dplan, plan, os.path.join(tmp, "warm.json"))  # the page cache warm for both
        for i in range(args.runs):
            for b in (binaries if i % 2 == 0 else binaries[::-1]):
                results[b].append(one_run(b, plan, os.path.join(tmp, f"run{i}.json")))
        spawn = process_start_s(args.runs)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    print(f"gpt-tiny, one rank, dplan run --steps 1; {args.runs} runs each, medians (min-max) in ms; "
          f"{os.cpu_count()} cores")
    header = f"{'part':<22}" + "".join(f"{os.path.relpath(b):>28}" for b in binaries)
    print(header)

    def row(name, values_of):
        cells = []
        for b in binaries:
            v = values_of(b)
            cells.append(f"{statistics.median(v) * 1e3:>10.1f} ({min(v) * 1e3:.0f}-{max(v) * 1e3:.0f})")
        print(f"{name:<22}" + "".join(f"{c:>28}" for c in cells))

    row("process start", lambda b: [spawn])
    row("LibTorch load", lambda b: [r["launch_to_main"] - spawn for r in results[b]])
    for part in PARTS:
        row("launcher to 1st step" if part == "total" else part, lambda b, p=part: [r.get(p, 0.0) for r in results[b]])
    row("dplan run (wall)", lambda b: [r["dplan_run_wall"] for r in results[b]])
    for b in binaries:
        total = statistics.median(r["total"] for r in results[b])
        verdict = "meets" if total < TARGET_S else "misses"
        print(f"{os.path.relpath(b)}: launcher to first step {total:.3f} s, {verdict} the target of {TARGET_S} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
