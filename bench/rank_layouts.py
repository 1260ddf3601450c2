#!/usr/bin/env python3
"""Does dplan order layouts the way this machine does? Predicted against measured step time, ranked.

The search (`dplan --model M --gpus N --cluster C --json --top 1000 --runnable`) ranks the layouts
of one workload by predicted step time. This benchmark takes the search's best layout and a seeded
random sample of the others (all of them when it lists no more than --layouts), writes each one's
plan with `dplan estimate ... -o plan.json` (the flags `dplan explain` prints for a layout), trains
it with `dplan run` on this machine's ranks, and compares the two orders: Kendall's tau-b between
predicted and measured step time, the concordant and discordant pairs, and where the predicted best
lands in the measured order. See bench/README.md.

  bench/rank_layouts.py [--layouts 30] [--steps 4] [--warmup 1] [--rounds 2] [--seed 1]
                        [--model gpt-small] [--gpus 8] [--cluster local-cpu] [--global-batch G]
                        [--pool 1000] [--out DIR [--force]] [--plan-only]

Every round runs every sampled layout once (round 1 in a seeded random order, round 2 in the
reverse order, and so on), so that a drifting machine's slow and fast moments fall on all layouts
alike; a layout's measured step time is the median of its measured steps over all rounds. With two
or more rounds it also prints how well the measurement agrees with itself (tau-b between rounds).

Environment: BUILD_DIR (default build, relative to the repository root) holds dplan and
dplan-worker. Exit status: 0 when every layout was planned and measured, 1 when one failed (the
others still run, and the figures cover those measured), 2 on bad usage or a missing build.
Standard library only.
"""

import argparse
import itertools
import json
import math
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROG = "rank_layouts"
SEARCH_TOP_MAX = 1000  # the most layouts `dplan --top` lists


# ----------------------------------------------------------------------------- Kendall's tau-b

def kendall_tau_b(x, y):
    """Kendall's tau-b of two equally long sequences, ties handled, and its asymptotic test.

    With C concordant pairs (x and y order the pair the same way), D discordant pairs, n0 = n(n-1)/2,
    n1 = sum over groups of tied x values of t(t-1)/2 and n2 the same for y (a pair tied in both
    counts in n1 and in n2, and in neither C nor D):

        tau_b = (C - D) / sqrt((n0 - n1) (n0 - n2))

    (M. G. Kendall, "The treatment of ties in ranking problems", Biometrika 33(3), 239-251, 1945;
    without ties it is the 1938 tau-a, (C - D) / n0). Under independence S = C - D has mean 0 and,
    with ties (same paper; M. G. Kendall, Rank Correlation Methods, ch. 4),

        var(S) = (v0 - vt - vu) / 18 + v1 / (2 n (n-1)) + v2 / (9 n (n-1) (n-2))
        v0 = n(n-1)(2n+5), vt = sum t(t-1)(2t+5), vu = sum u(u-1)(2u+5),
        v1 = sum t(t-1) * sum u(u-1), v2 = sum t(t-1)(t-2) * sum u(u-1)(u-2)

    (t over x's tie groups, u over y's); z = S / sqrt(var(S)) and the two-sided p = erfc(|z| / sqrt 2)
    of the normal approximation. scipy.stats.kendalltau (variant "b", method "asymptotic") computes the
    same. O(n^2) pairs: fine for the few hundred layouts a benchmark measures.

    Returns a dict: tau (None when either sequence is constant), concordant, discordant, tied_x
    (pairs tied in x only), tied_y, tied_both, pairs, z and p (None when undefined).
    """
    if len(x) != len(y):
        raise ValueError("kendall_tau_b: sequences of different lengths")
    n = len(x)
    concordant = discordant = tied_x = tied_y = tied_both = 0
    for i, j in itertools.combinations(range(n), 2):
        dx, dy = x[i] - x[j], y[i] - y[j]
        if dx == 0 and dy == 0:
            tied_both += 1
        elif dx == 0:
            tied_x += 1
        elif dy == 0:
            tied_y += 1
        elif (dx > 0) == (dy > 0):
            concordant += 1
        else:
            discordant += 1
    pairs = n * (n - 1) // 2
    ties_x = [t for t in Counter(x).values() if t > 1]
    ties_y = [u for u in Counter(y).values() if u > 1]
    n1 = sum(t * (t - 1) // 2 for t in ties_x)
    n2 = sum(u * (u - 1) // 2 for u in ties_y)
    s = concordant - discordant
    denominator = math.sqrt((pairs - n1) * (pairs - n2)) if n >= 2 else 0.0
    tau = s / denominator if denominator > 0 else None
    z = p = None
    if tau is not None and n >= 3:
        v0 = n * (n - 1) * (2 * n + 5)
        vt = sum(t * (t - 1) * (2 * t + 5) for t in ties_x)
        vu = sum(u * (u - 1) * (2 * u + 5) for u in ties_y)
        v1 = sum(t * (t - 1) for t in ties_x) * sum(u * (u - 1) for u in ties_y)
        v2 = sum(t * (t - 1) * (t - 2) for t in ties_x) * sum(u * (u - 1) * (u - 2) for u in ties_y)
        var = (v0 - vt - vu) / 18 + v1 / (2 * n * (n - 1)) + v2 / (9 * n * (n - 1) * (n - 2))
        if var > 0:
            z = s / math.sqrt(var)
            p = math.erfc(abs(z) / math.sqrt(2))
    return {"tau": tau, "concordant": concordant, "discordant": discordant, "tied_x": tied_x,
            "tied_y": tied_y, "tied_both": tied_both, "pairs": pairs, "z": z, "p": p}


def average_ranks(values):
    """1-based ranks, smallest first; tied values share the mean of their ranks (3.5 for two 3rds)."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def ordinal(n):
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


# ----------------------------------------------------------------------------- layouts

def estimate_flags(parallel, training, overlap, headroom):
    """The `dplan estimate` flags of a layout the search listed, in the order and spelling of
    planner/src/explain.cpp's flag_list (the command `dplan explain` prints); --model, --cluster
    and --gpus are the caller's."""
    p = parallel
    if p.get("layers_per_stage"):
        raise ValueError("a listed layers_per_stage split has no dplan estimate flags")
    f = ["--global-batch", str(training["global_batch"]), "--seq", str(training["seq_len"]),
         "--precision", training["precision"], "--tp", str(p["tp"]), "--pp", str(p["pp"]), "--dp", str(p["dp"])]
    if p["cp"] > 1:
        f += ["--cp", str(p["cp"])]
    if p["ep"] > 1:
        f += ["--ep", str(p["ep"])]
    if p.get("etp", 0) > 0 and p["etp"] != p["tp"]:
        f += ["--etp", str(p["etp"])]
    if p["vpp"] > 1:
        f += ["--vpp", str(p["vpp"])]
    if p.get("first_stage_layers"):
        f += ["--first-stage-layers", str(p["first_stage_layers"])]
    if p.get("last_stage_layers"):
        f += ["--last-stage-layers", str(p["last_stage_layers"])]
    if p.get("account_for_embedding"):
        f += ["--account-for-embedding"]
    if p.get("account_for_loss"):
        f += ["--account-for-loss"]
    if p["pp"] > 1:
        f += ["--schedule", p["schedule"]]
    f += ["--mbs", str(p["micro_batch"])]
    if p["distributed_optimizer"]:
        f += ["--dist-opt"]
    elif p["zero_stage"] > 0:
        f += ["--zero", str(p["zero_stage"])]
    f += ["--recompute", p["recompute"]]
    if p["sequence_parallel"]:
        f += ["--sp"]
    if p["offload_optimizer"]:
        f += ["--offload"]
    if overlap.get("tp_comm"):
        f += ["--tp-comm-overlap"]
    if not overlap.get("grad_reduce", True):
        f += ["--no-overlap-grad-reduce"]
    if not overlap.get("param_gather", True):
        f += ["--no-overlap-param-gather"]
    if training.get("attention", "flash") != "flash":
        f += ["--attention", training["attention"]]
    if training.get("fp32_grads"):
        f += ["--fp32-grads"]
    if headroom is not None and abs(headroom - 0.1) > 1e-12:
        f += ["--headroom", f"{headroom:g}"]
    return f


def layout_name(p):
    """A short name: the sizes, then only what differs from the plain layout."""
    parts = [f"tp{p['tp']}", f"pp{p['pp']}", f"dp{p['dp']}"]
    if p["cp"] > 1:
        parts.append(f"cp{p['cp']}")
    if p["ep"] > 1:
        parts.append(f"ep{p['ep']}")
    if p["vpp"] > 1:
        parts.append(f"vpp{p['vpp']}")
    if p["pp"] > 1 and p["schedule"] not in ("1f1b", "interleaved"):
        parts.append(p["schedule"])
    if p.get("first_stage_layers") or p.get("last_stage_layers"):
        parts.append(f"split{p.get('first_stage_layers') or '-'}/{p.get('last_stage_layers') or '-'}")
    if p.get("account_for_embedding"):
        parts.append("+emb")
    if p.get("account_for_loss"):
        parts.append("+loss")
    parts.append(f"mbs{p['micro_batch']}")
    if p["distributed_optimizer"]:
        parts.append("distopt")
    elif p["zero_stage"] > 0:
        parts.append(f"zero{p['zero_stage']}")
    if p["recompute"] != "none":
        parts.append(f"rc-{p['recompute']}")
    if p["sequence_parallel"]:
        parts.append("sp")
    if p["offload_optimizer"]:
        parts.append("offload")
    return " ".join(parts)


# ----------------------------------------------------------------------------- running dplan

class Usage(Exception):
    """Bad input: one line, exit 2."""


def run_logged(cmd, log_path, stdout_path=None, timeout=None):
    """Runs cmd in its own process group, stderr (and stdout unless stdout_path) to log_path.
    Returns the exit status, or None when it ran past timeout (the group is then ended)."""
    with open(log_path, "w") as log, open(stdout_path or os.devnull, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out if stdout_path else log, stderr=log, start_new_session=True)
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            end_group(proc)
            return None
        except BaseException:  # Ctrl-C (the group has its own session and does not see it) or another error
            end_group(proc)
            raise


def end_group(proc):
    """Ends the process group of a command this benchmark started: SIGTERM, then SIGKILL after 15 s."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    except ProcessLookupError:
        pass


def last_line(path):
    try:
        with open(path) as f:
            lines = [line.strip() for line in f if line.strip()]
        return lines[-1] if lines else ""
    except OSError:
        return ""


def fmt_duration(s):
    s = int(round(s))
    return f"{s // 3600} h {s % 3600 // 60} min" if s >= 3600 else (f"{s // 60} min {s % 60} s" if s >= 60 else f"{s} s")


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line naming the problem and the valid options, exit 2
        print(f"{PROG}: error: {message}; valid: --layouts N, --steps K, --warmup W, --rounds R, --seed S, "
              "--model M, --gpus N, --cluster C, --global-batch G, --pool N, --out DIR, --force, --plan-only, --help",
              file=sys.stderr)
        sys.exit(2)


def parse_args(argv):
    parser = Parser(prog="bench/rank_layouts.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--layouts", type=int, default=30, metavar="N",
                        help="layouts to measure: the search's best and N-1 drawn at random (default 30; all when it lists no more)")
    parser.add_argument("--steps", type=int, default=4, metavar="K", help="optimizer steps per run (default 4)")
    parser.add_argument("--warmup", type=int, default=1, metavar="W",
                        help="of those, warm-up steps left out of the measurement (default 1)")
    parser.add_argument("--rounds", type=int, default=2, metavar="R",
                        help="runs of every layout, in alternating orders (default 2)")
    parser.add_argument("--seed", type=int, default=1, metavar="S", help="seed of the sample and the run order (default 1)")
    parser.add_argument("--model", default="gpt-small", metavar="M", help="preset or config.json (default gpt-small)")
    parser.add_argument("--gpus", type=int, default=8, metavar="N", help="ranks (default 8)")
    parser.add_argument("--cluster", default="local-cpu", metavar="C",
                        help="cluster profile name or path, e.g. one `dplan probe` wrote (default local-cpu)")
    parser.add_argument("--global-batch", type=int, metavar="G", help="sequences per step (default: the search's)")
    parser.add_argument("--pool", type=int, default=SEARCH_TOP_MAX, metavar="N",
                        help=f"draw from the search's N best layouts (default and most: {SEARCH_TOP_MAX})")
    parser.add_argument("--out", metavar="DIR", help="keep the plans, run records, logs and results.json here "
                        "(default: a temporary folder, removed at the end)")
    parser.add_argument("--force", action="store_true", help="write into a non-empty --out DIR")
    parser.add_argument("--plan-only", action="store_true", help="sample and write the plans, train nothing")
    args = parser.parse_args(argv)
    if args.layouts < 2:
        raise Usage(f"--layouts {args.layouts}: a rank correlation needs at least 2 layouts")
    if args.warmup < 0:
        raise Usage(f"--warmup {args.warmup}: must be 0 or more")
    if args.steps < args.warmup + 1:
        raise Usage(f"--steps {args.steps}: must exceed --warmup {args.warmup} (at least one measured step)")
    if args.rounds < 1:
        raise Usage(f"--rounds {args.rounds}: must be at least 1")
    if args.gpus < 1:
        raise Usage(f"--gpus {args.gpus}: must be at least 1")
    if args.global_batch is not None and args.global_batch < 1:
        raise Usage(f"--global-batch {args.global_batch}: must be at least 1")
    if not 1 <= args.pool <= SEARCH_TOP_MAX:
        raise Usage(f"--pool {args.pool}: must be 1 to {SEARCH_TOP_MAX} (the most the search lists)")
    if args.force and not args.out:
        raise Usage("--force without --out: it lets --out DIR hold files already")
    return args


def prepare_out(args):
    """The output folder: --out DIR (created; refused when non-empty without --force) or a temporary one."""
    if not args.out:
        return tempfile.mkdtemp(prefix="dplan-rank-"), True
    out = os.path.abspath(args.out)
    if os.path.exists(out) and not os.path.isdir(out):
        raise Usage(f"--out {args.out}: exists and is not a folder")
    if os.path.isdir(out) and os.listdir(out) and not args.force:
        raise Usage(f"--out {args.out}: the folder is not empty (--force writes into it)")
    os.makedirs(out, exist_ok=True)
    return out, False


def fresh(path):
    """Removes a file this benchmark is about to write (only ever a name of its own inside the output folder),
    so that a failed command cannot leave an older run's file to be read as its result."""
    if os.path.lexists(path):
        os.remove(path)


# ----------------------------------------------------------------------------- the benchmark

def main(argv=None):
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
        build = os.environ.get("BUILD_DIR") or "build"
        build = build if os.path.isabs(build) else os.path.join(ROOT, build)
        dplan = os.path.join(build, "dplan")
        needed = [dplan] + ([] if args.plan_only else [os.path.join(build, "dplan-worker")])
        for program in needed:
            if not os.access(program, os.X_OK):
                raise Usage(f"{os.path.relpath(program, ROOT)} is not built; run ./setup.sh --all first "
                            "(or set BUILD_DIR)")
        out, temporary = prepare_out(args)
    except Usage as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    try:
        return benchmark(args, dplan, out, temporary)
    except Usage as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    finally:
        if temporary:
            shutil.rmtree(out, ignore_errors=True)


def benchmark(args, dplan, out, temporary):
    t_start = time.monotonic()
    where = "--out DIR keeps them" if temporary else out

    # 1. The search.
    common = ["--model", args.model, "--cluster", args.cluster, "--gpus", str(args.gpus)]
    search_cmd = [dplan] + common + ["--precision", "fp32", "--json", "--top", str(args.pool), "--runnable"]
    if args.global_batch:
        search_cmd += ["--global-batch", str(args.global_batch)]
    search_json = os.path.join(out, "search.json")
    status = run_logged(search_cmd, os.path.join(out, "search.log"), stdout_path=search_json)
    if status != 0:
        line = last_line(os.path.join(out, "search.log")) or f"exit {status}"
        raise Usage(f"the search failed: {line}")
    with open(search_json) as f:
        search = json.load(f)
    training, overlap = search["training"], search["overlap"]
    ranked = search["search"]["ranked"]
    summary = search["search"]
    if len(ranked) < 2:
        raise Usage(f"the search lists {len(ranked)} layout(s) of {args.model} on {args.gpus} ranks; "
                    "a rank correlation needs at least 2")

    # 2. The sample: the search's best, and the rest drawn with the seed (every layout when they are few).
    rng = random.Random(args.seed)
    if len(ranked) <= args.layouts:
        picked = list(range(len(ranked)))
        how = f"all {len(ranked)} it lists"
    else:
        picked = [0] + sorted(rng.sample(range(1, len(ranked)), args.layouts - 1))
        how = f"its best and {args.layouts - 1} drawn with seed {args.seed}"
    cluster_note = ("" if args.cluster != "local-cpu" else
                    " (the shipped profile; `dplan probe` writes this machine's, for --cluster)")
    print(f"{PROG}: {search['model']['name']} on {args.gpus} ranks of {args.cluster}{cluster_note}, "
          f"global batch {training['global_batch']} x seq {training['seq_len']}, fp32", flush=True)
    print(f"{PROG}: the search ranks {summary['feasible']} layouts that fit ({summary['evaluated']} evaluated) and "
          f"lists {len(ranked)}; measured: {how}", flush=True)

    # 3. One plan per layout, checked against what the search listed.
    layouts, status = [], 0
    for n, index in enumerate(picked, 1):
        entry = ranked[index]
        name = layout_name(entry["parallel"])
        plan = os.path.join(out, f"plan-{n:02d}.json")
        item = {"n": n, "search_rank": index + 1, "name": name, "parallel": entry["parallel"],
                "listed_s": entry["step_time_s"], "plan": os.path.basename(plan), "predicted_s": None,
                "round_medians_s": [None] * args.rounds, "steps_s": [], "measured_s": None, "failed": []}
        layouts.append(item)
        try:
            flags = estimate_flags(entry["parallel"], training, overlap, search.get("headroom_fraction"))
        except ValueError as e:
            print(f"{PROG}: {name}: {e}", file=sys.stderr)
            item["failed"].append("estimate")
            status = 1
            continue
        item["estimate_flags"] = " ".join(common + flags)
        fresh(plan)
        rc = run_logged([dplan, "estimate"] + common + flags + ["-o", plan], os.path.join(out, f"estimate-{n:02d}.log"))
        if rc != 0 or not os.path.exists(plan):
            print(f"{PROG}: {name}: dplan estimate failed: {last_line(os.path.join(out, f'estimate-{n:02d}.log'))}",
                  file=sys.stderr)
            item["failed"].append("estimate")
            status = 1
            continue
        with open(plan) as f:
            planned = json.load(f)
        item["predicted_s"] = planned["prediction"]["step_time_s"]
        if planned["parallel"] != entry["parallel"]:
            print(f"{PROG}: {name}: the plan's layout differs from the search's: {json.dumps(planned['parallel'])}",
                  file=sys.stderr)
            item["failed"].append("estimate")
            item["predicted_s"] = None
            status = 1
        elif abs(item["predicted_s"] - item["listed_s"]) > 1e-9 * max(1.0, item["listed_s"]):
            print(f"{PROG}: {name}: warning: the plan predicts {item['predicted_s']:.6f} s, the search listed "
                  f"{item['listed_s']:.6f} s; the plan's is used", file=sys.stderr)
    planned_ok = [it for it in layouts if it["predicted_s"] is not None]

    # 4. The runs: every round every layout once, round 1 in a seeded random order, round 2 reversed, ...
    if not args.plan_only and planned_ok:
        total = len(planned_ok) * args.rounds
        print(f"{PROG}: {len(planned_ok)} layouts x {args.rounds} round(s) x {args.steps} steps "
              f"({args.warmup} warm-up); progress on stderr", flush=True)
        done, t_runs = 0, time.monotonic()
        order = []
        for r in range(args.rounds):
            if r % 2 == 0:
                order = planned_ok[:]
                rng.shuffle(order)
            else:
                order = order[::-1]
            for item in order:
                n = item["n"]
                run = os.path.join(out, f"run-{n:02d}-r{r + 1}.json")
                log = os.path.join(out, f"run-{n:02d}-r{r + 1}.log")
                fresh(run)
                t0 = time.monotonic()
                rc = run_logged([dplan, "run", os.path.join(out, item["plan"]), "--steps", str(args.steps),
                                 "--warmup", str(args.warmup), "--quiet", "-o", run], log, timeout=3600)
                done += 1
                measured = None
                if rc == 0 and os.path.exists(run):
                    with open(run) as f:
                        record = json.load(f)
                    steps = [s["time_s"] for s in record["steps"] if not s["warmup"]]
                    if steps:
                        measured = statistics.median(steps)
                        item["steps_s"] += steps
                        item["round_medians_s"][r] = measured
                if measured is None:
                    why = "ran past an hour" if rc is None else (last_line(log) or f"exit {rc}")
                    print(f"{PROG}: {item['name']}: round {r + 1} failed: {why} (logs: {where})", file=sys.stderr)
                    item["failed"].append(f"run round {r + 1}")
                    status = 1
                elapsed = time.monotonic() - t_runs
                left = elapsed / done * (total - done)
                took = f"{measured:.3f} s/step" if measured is not None else "failed"
                print(f"{PROG}: round {r + 1}/{args.rounds}, run {done}/{total}: {item['name']}: {took} "
                      f"({time.monotonic() - t0:.0f} s; about {fmt_duration(left)} left)", file=sys.stderr, flush=True)
        for item in planned_ok:
            if item["steps_s"]:
                item["measured_s"] = statistics.median(item["steps_s"])

    # 5. The figures.
    results = {"model": search["model"]["name"], "gpus": args.gpus, "cluster": args.cluster,
               "training": training, "search": {k: v for k, v in summary.items() if k != "ranked"},
               "listed": len(ranked), "seed": args.seed, "steps": args.steps, "warmup": args.warmup,
               "rounds": args.rounds, "layouts": layouts}
    report(args, layouts, results)
    results["seconds"] = time.monotonic() - t_start
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
        f.write("\n")
    print(f"{PROG}: {fmt_duration(results['seconds'])} in all" +
          ("" if temporary else f"; plans, run records, logs and results.json in {out}"), flush=True)
    if status:
        print(f"{PROG}: some layouts failed (see above)", flush=True)
    return status


def report(args, layouts, results):
    planned = [it for it in layouts if it["predicted_s"] is not None]
    measured = [it for it in planned if it["measured_s"] is not None]
    pred_rank = dict(zip((it["n"] for it in planned), average_ranks([it["predicted_s"] for it in planned])))
    meas_rank = dict(zip((it["n"] for it in measured), average_ranks([it["measured_s"] for it in measured])))
    show_rank = lambda r: "-" if r is None else (f"{r:.0f}" if r == int(r) else f"{r:.1f}")

    print()
    width = max([len("layout")] + [len(it["name"]) for it in planned])
    head = f"{'search#':>7}  {'layout':{width}s} {'pred s':>8} {'meas s':>8} {'pred rank':>9} {'meas rank':>9} {'steps':>7}"
    if args.rounds > 1:
        head += f" {'rounds':>7}"
    print(head)
    for it in sorted(planned, key=lambda it: (pred_rank[it["n"]], it["search_rank"])):
        m = it["measured_s"]
        row = (f"{it['search_rank']:7d}  {it['name']:{width}s} {it['predicted_s']:8.4f} "
               f"{(f'{m:8.3f}' if m is not None else '       -')} {show_rank(pred_rank[it['n']]):>9} "
               f"{show_rank(meas_rank.get(it['n'])):>9}")
        steps = it["steps_s"]
        row += f" {100 * (max(steps) - min(steps)) / m:6.1f}%" if m and len(steps) > 1 else f" {'-':>7}"
        if args.rounds > 1:
            rounds = [x for x in it["round_medians_s"] if x is not None]
            row += f" {100 * (max(rounds) - min(rounds)) / m:6.1f}%" if len(rounds) > 1 else f" {'-':>7}"
        print(row)
    print("search#: the layout's place in the search's list; pred/meas rank: 1 = fastest of those shown, ties share "
          "the mean rank; steps: (max - min) / median of the layout's measured steps" +
          ("; rounds: the same over its per-round medians" if args.rounds > 1 else ""))
    if args.plan_only or len(measured) < 2:
        if not args.plan_only:
            print(f"{PROG}: fewer than 2 layouts measured: no rank correlation")
        return

    k = kendall_tau_b([it["predicted_s"] for it in measured], [it["measured_s"] for it in measured])
    results["kendall"] = k
    n = len(measured)
    tau = "undefined (one side is constant)" if k["tau"] is None else f"{k['tau']:+.3f}"
    print()
    print(f"Kendall tau-b, predicted vs measured step time, {n} layouts: {tau}")
    print(f"  {k['pairs']} pairs: {k['concordant']} concordant, {k['discordant']} discordant, "
          f"{k['tied_x']} tied in the prediction only, {k['tied_y']} in the measurement only, {k['tied_both']} in both")
    if k["z"] is not None and n >= 10:
        print(f"  against no association: z = {k['z']:+.2f}, p = {k['p']:.2g} (two-sided, normal approximation)")

    best_pred = min(measured, key=lambda it: (it["predicted_s"], it["search_rank"]))
    best_meas = min(measured, key=lambda it: it["measured_s"])
    place = 1 + sum(1 for it in measured if it["measured_s"] < best_pred["measured_s"])
    slower = 100 * (best_pred["measured_s"] - best_meas["measured_s"]) / best_meas["measured_s"]
    which = "the search's pick" if best_pred["search_rank"] == 1 else f"search #{best_pred['search_rank']}"
    if best_pred is best_meas:
        print(f"predicted best ({best_pred['name']}, {which}) is measured 1st of {n}: also the measured best")
    else:
        print(f"predicted best ({best_pred['name']}, {which}) is measured {ordinal(place)} of {n}, "
              f"{slower:.1f} % slower than the measured best ({best_meas['name']})")
        place_pred = 1 + sum(1 for it in measured if it["predicted_s"] < best_meas["predicted_s"])
        print(f"measured best ({best_meas['name']}) is predicted {ordinal(place_pred)} of {n}")
    results["predicted_best"] = {"name": best_pred["name"], "measured_place": place, "slower_than_best_pct": slower}

    lo_p, hi_p = min(it["predicted_s"] for it in measured), max(it["predicted_s"] for it in measured)
    lo_m, hi_m = min(it["measured_s"] for it in measured), max(it["measured_s"] for it in measured)
    print(f"range: predicted {lo_p:.4f}-{hi_p:.4f} s (slowest +{100 * (hi_p - lo_p) / lo_p:.1f} %), "
          f"measured {lo_m:.3f}-{hi_m:.3f} s (slowest +{100 * (hi_m - lo_m) / lo_m:.1f} %)")

    if args.rounds > 1:
        complete = [it for it in measured if all(x is not None for x in it["round_medians_s"])]
        if len(complete) >= 2:
            per_round = [kendall_tau_b([it["predicted_s"] for it in complete],
                                       [it["round_medians_s"][r] for it in complete])["tau"] for r in range(args.rounds)]
            between = [kendall_tau_b([it["round_medians_s"][a] for it in complete],
                                     [it["round_medians_s"][b] for it in complete])["tau"]
                       for a, b in itertools.combinations(range(args.rounds), 2)]
            spreads = sorted((max(it["round_medians_s"]) - min(it["round_medians_s"])) / it["measured_s"]
                             for it in complete)
            fmt_tau = lambda t: "undefined" if t is None else f"{t:+.3f}"
            defined = [t for t in between if t is not None]
            print(f"noise, {len(complete)} layouts measured in every round: tau-b between rounds' orders "
                  + (f"{fmt_tau(between[0])}" if len(between) == 1 else
                     f"{min(defined):+.3f} to {max(defined):+.3f} over {len(between)} pairs of rounds" if defined
                     else "undefined")
                  + "; predicted vs each round: " + ", ".join(fmt_tau(t) for t in per_round))
            print(f"  a layout's per-round medians differ by a median {100 * statistics.median(spreads):.1f} % "
                  f"(most {100 * spreads[-1]:.1f} %) of its step time")
            results["noise"] = {"tau_between_rounds": between, "tau_predicted_vs_round": per_round,
                                "round_spread_median": statistics.median(spreads), "round_spread_max": spreads[-1]}


if __name__ == "__main__":
    sys.exit(main())
