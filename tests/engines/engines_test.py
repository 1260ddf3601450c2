#!/usr/bin/env python3
"""dplan's exports checked by the engines themselves (ctest entries engines/...).

    engines_test.py parsers DPLAN WORKDIR         plans covering tp, pp, vpp, cp, ep, ZeRO 1/2/3 and
                                                  recompute, exported to every engine: each export
                                                  the engine can express is accepted by its own
                                                  parser with the plan's layout (check_export.py);
                                                  each one it cannot is refused by dplan, exit 2,
                                                  one line per failure naming the engine
    engines_test.py deepspeed-cpu DPLAN WORKDIR   ZeRO 1, 2 and 3 exports: launch-deepspeed.sh, as
                                                  exported, trains the tiny model on CPU (gloo),
                                                  2 processes
    engines_test.py accelerate-cpu DPLAN WORKDIR  2-rank data-parallel exports (bf16, fp32):
                                                  launch-accelerate.sh trains the tiny model on CPU

Run with the PyTorch 2.x python that holds the engines (scripts/torch-venv.sh --engines). Exits 0
when every check passes, 1 otherwise (a missing engine included: the tests never skip).
"""
import os
import re
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = os.path.join(os.path.dirname(HERE), "data", "executor")
CHECK = os.path.join(HERE, "check_export.py")
ENGINES = ("megatron", "torchtitan", "deepspeed", "accelerate")

# name: (model, dplan estimate arguments). 8 ranks make one node of the default cluster (dgx-h100,
# 8 GPUs per node); 16 make two.
PLANS = {
    "dp8-zero0": ("llama-tiny", "--gpus 8"),
    "dp8-zero1-selective": ("llama-tiny", "--gpus 8 --zero 1 --recompute selective"),
    "dp4-zero2-offload": ("llama-tiny", "--gpus 4 --zero 2 --offload"),
    "dp16-zero3-full-2nodes": ("llama-tiny", "--gpus 16 --zero 3 --recompute full"),
    "tp2-sp-dp4-zero3-full": ("llama-tiny", "--gpus 8 --tp 2 --sp --zero 3 --recompute full"),
    "tp2-dp4-zero2": ("llama-tiny", "--gpus 8 --tp 2 --zero 2"),
    "pp2-dp4-zero1": ("llama-tiny", "--gpus 8 --pp 2 --zero 1"),
    "tp2-sp-pp2-vpp2-dp2-zero3-full": ("llama-tiny-8l", "--gpus 8 --tp 2 --sp --pp 2 --vpp 2 --zero 3 --recompute full"),
    "pp2-vpp2-dp4-zero2-selective": ("llama-tiny-8l", "--gpus 8 --pp 2 --vpp 2 --zero 2 --recompute selective"),
    "cp2-tp2-sp-dp2-zero3": ("llama-tiny", "--gpus 8 --cp 2 --tp 2 --sp --zero 3"),
    "moe-tp2-sp-pp2-ep2-distopt": ("mixtral-tiny", "--gpus 8 --tp 2 --sp --pp 2 --ep 2 --dist-opt"),
    "moe-ep4-etp1-dp8-zero1-full": ("mixtral-tiny", "--gpus 8 --ep 4 --etp 1 --zero 1 --recompute full"),
    # Megatron's --window-size (a window of 16 at 64 tokens) and --rotary-percent, squared ReLU
    # and LayerNorm1P.
    "window-tp2-dp4": ("mistral-tiny", "--gpus 8 --tp 2 --zero 1"),
    "nemotron-tp2-sp-dp4": ("nemotron-tiny", "--gpus 8 --tp 2 --sp --zero 1"),
}
COMMON = "--global-batch 32 --seq 64"

# What each engine cannot express, per plan: a pattern every refusal line of that export must
# match beside the engine's name, and at least one line must. The rest are accepted.
REFUSED = {
    ("dp8-zero1-selective", "torchtitan"): r"ZeRO-1|distributed optimizer",
    ("dp4-zero2-offload", "torchtitan"): r"offload",
    ("tp2-dp4-zero2", "torchtitan"): r"sequence parallel",
    ("pp2-dp4-zero1", "torchtitan"): r"ZeRO-1|distributed optimizer",
    ("moe-tp2-sp-pp2-ep2-distopt", "torchtitan"): r"mixture of experts|ZeRO-1|distributed optimizer|DDP|ep \d",
    ("moe-ep4-etp1-dp8-zero1-full", "torchtitan"): r"mixture of experts|ZeRO-1|distributed optimizer|ep \d",
    ("tp2-sp-dp4-zero3-full", "deepspeed"): r"sequence parallel|AutoTP|zero_stage",
    ("tp2-sp-pp2-vpp2-dp2-zero3-full", "deepspeed"): r"interleaved|tp with pp|sequence parallel|AutoTP|ZeRO",
    ("pp2-vpp2-dp4-zero2-selective", "deepspeed"): r"interleaved|ZeRO-2 and ZeRO-3|pipeline",
    ("cp2-tp2-sp-dp2-zero3", "deepspeed"): r"cp|sequence parallel|AutoTP",
    ("moe-tp2-sp-pp2-ep2-distopt", "deepspeed"): r"sequence parallel|expert parallel|tp with pp",
    ("moe-ep4-etp1-dp8-zero1-full", "deepspeed"): r"expert parallel",
    ("tp2-sp-dp4-zero3-full", "accelerate"): r"sequence parallel",
    ("pp2-dp4-zero1", "accelerate"): r"pipeline parallel",
    ("tp2-sp-pp2-vpp2-dp2-zero3-full", "accelerate"): r"pipeline parallel|sequence parallel",
    ("pp2-vpp2-dp4-zero2-selective", "accelerate"): r"pipeline parallel|selective",
    ("cp2-tp2-sp-dp2-zero3", "accelerate"): r"sequence parallel",
    ("moe-tp2-sp-pp2-ep2-distopt", "accelerate"): r"pipeline parallel|expert parallel|sequence parallel",
    ("moe-ep4-etp1-dp8-zero1-full", "accelerate"): r"expert parallel",
    ("window-tp2-dp4", "torchtitan"): r"sliding windows",
    ("window-tp2-dp4", "accelerate"): r"tp 2 with DeepSpeed",
    ("nemotron-tp2-sp-dp4", "torchtitan"): r"relu2|LayerNorm",
    ("nemotron-tp2-sp-dp4", "deepspeed"): r"sequence parallel",
    ("nemotron-tp2-sp-dp4", "accelerate"): r"sequence parallel",
}


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def make_plan(dplan, workdir, name, model, args):
    path = os.path.join(workdir, f"{name}.json")
    cmd = [dplan, "estimate", "--model", os.path.join(MODELS, model, "config.json"), *args.split(),
           *COMMON.split(), "-o", path, "--force"]
    r = run(cmd)
    if r.returncode != 0:
        print(f"FAIL {name}: dplan estimate exited {r.returncode}: {(r.stderr or r.stdout).strip()}")
        return None
    return path


def export(dplan, plan, engine, out):
    shutil.rmtree(out, ignore_errors=True)
    return run([dplan, "export", plan, "--to", engine, "-o", out])


def parsers(dplan, workdir):
    failures = 0
    table = []
    for name, (model, args) in PLANS.items():
        plan = make_plan(dplan, workdir, name, model, args)
        if plan is None:
            failures += 1
            continue
        for engine in ENGINES:
            out = os.path.join(workdir, f"{name}-{engine}")
            r = export(dplan, plan, engine, out)
            refused = REFUSED.get((name, engine))
            if refused is None:
                if r.returncode != 0:
                    print(f"FAIL {name} --to {engine}: dplan refused an export the engine can take "
                          f"(exit {r.returncode}): {r.stderr.strip()}")
                    failures += 1
                    table.append((name, engine, "dplan refused"))
                    continue
                c = run([sys.executable, CHECK, "--engine", engine, "--plan", plan, "--dir", out])
                print((c.stdout.strip() + "\n" + c.stderr.strip()[-1500:] if c.returncode else c.stdout.strip()).strip())
                if c.returncode != 0:
                    print(f"FAIL {name} --to {engine}: the engine's parser did not accept it")
                    failures += 1
                    table.append((name, engine, "engine rejected"))
                else:
                    table.append((name, engine, "accepted"))
            else:
                lines = [l for l in r.stderr.splitlines() if l.strip()]
                pattern = re.compile(rf"^dplan: error: {engine}: .*")
                ok = (r.returncode == 2 and lines and all(pattern.match(l) for l in lines)
                      and any(re.search(refused, l) for l in lines) and not os.path.exists(out))
                for l in lines:
                    print(f"{name} --to {engine}: {l}")
                if not ok:
                    print(f"FAIL {name} --to {engine}: expected exit 2 with one 'dplan: error: {engine}: ...' line "
                          f"per failure naming /{refused}/ and nothing written; got exit {r.returncode}: "
                          f"{r.stdout.strip()} {r.stderr.strip()}")
                    failures += 1
                table.append((name, engine, f"refused ({len(lines)} line{'s' if len(lines) != 1 else ''})"
                              if ok else "wrong refusal"))
    failures += corrupted(workdir, table)
    print("\nplan | " + " | ".join(ENGINES))
    for name in PLANS:
        print(name + " | " + " | ".join(next((v for n, e, v in table if n == name and e == engine), "-")
                                        for engine in ENGINES))
    return failures


# One wrong value per engine, written into a copy of an accepted export: the engine's parser must
# then refuse it (the checks can fail).
CORRUPTIONS = {
    "megatron": ("megatron.args", r"--global-batch-size (\d+)", lambda m: f"--global-batch-size {int(m[1]) * 3 // 2}"),
    "torchtitan": ("torchtitan.toml", r"tensor_parallel_degree = (\d+)", lambda m: f"tensor_parallel_degree = {int(m[1]) * 2}"),
    "deepspeed": ("ds_config.json", r'"train_batch_size": (\d+)', lambda m: f'"train_batch_size": {int(m[1]) * 3 // 2}'),
    "accelerate": ("accelerate.yaml", r"num_processes: (\d+)", lambda m: f"num_processes: {int(m[1]) // 2}"),
}


def corrupted(workdir, table):
    failures = 0
    for engine, (file, pattern, replace) in CORRUPTIONS.items():
        # An export dplan wrote, preferably one the engine accepted whole.
        written = [n for n, e, v in table if e == engine and v in ("accepted", "engine rejected")]
        name = next((n for n, e, v in table if e == engine and v == "accepted"), written[0] if written else None)
        if name is None:
            print(f"FAIL {engine}: no export to corrupt")
            failures += 1
            continue
        good = os.path.join(workdir, f"{name}-{engine}")
        bad = good + "-corrupted"
        shutil.rmtree(bad, ignore_errors=True)
        shutil.copytree(good, bad)
        path = os.path.join(bad, file)
        text, n = re.subn(pattern, replace, open(path).read(), count=1)
        open(path, "w").write(text)
        c = run([sys.executable, CHECK, "--engine", engine, "--plan", os.path.join(workdir, f"{name}.json"), "--dir", bad])
        print(f"{name} --to {engine}, {file} with a wrong {pattern.split(' ')[0].strip(':')}: "
              f"{c.stdout.strip().splitlines()[-1] if c.stdout.strip() else c.stderr.strip()[-300:]}")
        if n != 1 or c.returncode != 1 or f"rejected {file}" not in c.stdout:
            print(f"FAIL {engine}: the corrupted {file} of {name} was not rejected")
            failures += 1
    return failures


def cpu_env():
    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env["PATH"]  # accelerate, deepspeed, torchrun
    return env


def free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def deepspeed_cpu(dplan, workdir):
    """The exported launch-deepspeed.sh and ds_config.json, run as exported: the `deepspeed`
    launcher starts 2 processes on CPU (gloo) that train the tiny model."""
    failures = 0
    for zero, precision in ((1, "bf16"), (2, "bf16"), (3, "fp32")):
        name = f"dp2-zero{zero}-{precision}"
        plan = make_plan(dplan, workdir, name, "llama-tiny",
                         f"--gpus 2 --zero {zero} --precision {precision} --cluster dgx-h100")
        out = os.path.join(workdir, f"{name}-deepspeed")
        r = export(dplan, plan, "deepspeed", out)
        if plan is None or r.returncode != 0:
            print(f"FAIL {name}: dplan export --to deepspeed: {r.stderr.strip()}")
            failures += 1
            continue
        c = run([sys.executable, CHECK, "--engine", "deepspeed", "--plan", plan, "--dir", out])
        print((c.stdout + c.stderr[-1500:] if c.returncode else c.stdout).strip())
        env = cpu_env()
        # DeepSpeed's CPU accelerator reports LOCAL_SIZE devices to the launcher (cpu_accelerator.py).
        env.update(LOCAL_SIZE="2", TRAIN_SCRIPT=os.path.join(HERE, "tiny_train_deepspeed.py"), MASTER_PORT=free_port())
        cmd = [os.path.join(out, "launch-deepspeed.sh"), "--steps", "4"]
        print(f"$ LOCAL_SIZE=2 DS_ACCELERATOR=cpu MASTER_PORT={env['MASTER_PORT']} "
              f"TRAIN_SCRIPT=tests/engines/tiny_train_deepspeed.py {cmd[0]} --steps 4", flush=True)
        t = run(cmd, env=env, cwd=workdir, timeout=600)
        log = os.path.join(workdir, f"{name}-deepspeed.log")
        open(log, "w").write(t.stdout + t.stderr)
        shown = [l for l in (t.stdout + t.stderr).splitlines()
                 if l.startswith(("deepspeed ", "step ", "rank ")) or "Error" in l]
        print("\n".join(shown[-12:]))
        if t.returncode != 0 or c.returncode != 0:
            print(f"FAIL {name}: DeepSpeed on CPU exited {t.returncode} (log {log})")
            failures += 1
        expected = f"zero {zero} micro 1 accumulation 16 train_batch_size 32"
        if not any(expected in l for l in shown):
            print(f"FAIL {name}: DeepSpeed's engine did not report '{expected}'")
            failures += 1
    return failures


def accelerate_cpu(dplan, workdir):
    """launch-accelerate.sh of 2-rank data-parallel plans (bf16 and fp32), run as exported, on CPU:
    ACCELERATE_USE_CPU=true makes accelerate's processes MULTI_CPU (gloo) instead of MULTI_GPU."""
    failures = 0
    for precision in ("bf16", "fp32"):
        name = f"dp2-zero0-{precision}"
        plan = make_plan(dplan, workdir, name, "llama-tiny", f"--gpus 2 --precision {precision}")
        out = os.path.join(workdir, f"{name}-accelerate")
        r = export(dplan, plan, "accelerate", out)
        if plan is None or r.returncode != 0:
            print(f"FAIL {name}: dplan export --to accelerate: {r.stderr.strip()}")
            failures += 1
            continue
        c = run([sys.executable, CHECK, "--engine", "accelerate", "--plan", plan, "--dir", out])
        print((c.stdout + c.stderr[-1500:] if c.returncode else c.stdout).strip())
        failures += c.returncode != 0
        env = cpu_env()
        env.update(ACCELERATE_USE_CPU="true", TRAIN_SCRIPT=os.path.join(HERE, "tiny_train_accelerate.py"))
        cmd = [os.path.join(out, "launch-accelerate.sh"), "4"]
        print(f"$ ACCELERATE_USE_CPU=true TRAIN_SCRIPT=tests/engines/tiny_train_accelerate.py {cmd[0]} 4", flush=True)
        t = run(cmd, env=env, cwd=workdir, timeout=600)
        log = os.path.join(workdir, f"{name}-accelerate.log")
        open(log, "w").write(t.stdout + t.stderr)
        shown = [l for l in (t.stdout + t.stderr).splitlines()
                 if l.startswith(("accelerate ", "step ", "rank ")) or "Error" in l]
        print("\n".join(shown[-12:]))
        if t.returncode != 0:
            print(f"FAIL {name}: accelerate launch on CPU exited {t.returncode} (log {log})")
            failures += 1
        mixed = {"bf16": "bf16", "fp32": "no"}[precision]
        expected = f"MULTI_CPU processes 2 gradient accumulation 16 mixed_precision {mixed}"
        if not any(expected in l for l in shown):
            print(f"FAIL {name}: Accelerate did not report '{expected}'")
            failures += 1
    return failures


def main():
    modes = {"parsers": parsers, "deepspeed-cpu": deepspeed_cpu, "accelerate-cpu": accelerate_cpu}
    if len(sys.argv) != 4 or sys.argv[1] not in modes:
        print(f"usage: engines_test.py {{{','.join(modes)}}} DPLAN WORKDIR", file=sys.stderr)
        sys.exit(2)
    mode, dplan, workdir = sys.argv[1:]
    # Every engine, at the pinned version, before anything else: one line naming the fix if not.
    probe = run([sys.executable, CHECK, "--engines-installed"])
    if probe.returncode != 0:
        print(probe.stdout.strip() or probe.stderr.strip())
        sys.exit(1)
    os.makedirs(workdir, exist_ok=True)
    failures = modes[mode](dplan, workdir)
    print(f"\n{mode}: {'ok' if not failures else f'{failures} failure(s)'}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
