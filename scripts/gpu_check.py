#!/usr/bin/env python3
"""dplan on one real GPU, as one prepared command: build, probe, train, measure, calibrate.

scripts/gpu-check.sh is the entry point and docs/gpu-check.md the manual. Three modes:

  --bundle    (on a machine with Debian's packages) gathers the headers the build takes from
              Debian's -dev packages (nlohmann/json, CLI11, the Boost headers the sources really
              include, gloo, zlib) into .gpu-bundle/, checks what travels against the GPU
              machine's limits, and prints the call to make there.
  (default)   (on the GPU machine) builds dplan, dplan-worker and dplan-gpu-probe against that
              machine's PyTorch with CUDA and the bundle, then runs the steps below, writing each
              step's result to OUT/summary.json as soon as it is known.
  --dry-run   (here, no GPU) the bundle, the same build against the CUDA PyTorch of
              scripts/torch-venv.sh, a check that the build read no header from a -dev package
              outside the bundle, and every step: those that need no GPU run, each GPU step must
              refuse in one line (the tool's own), not crash.

Standard library only: it runs under the GPU machine's python3 and Debian's.
"""

import argparse
import concurrent.futures
import datetime
import glob
import io
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "scripts", "gpu-check")
BUNDLE = ".gpu-bundle"  # relative to ROOT; ignored by git, carried to the GPU machine
BUILD = "build-gpu"     # the GPU machine's (and the dry run's) build, relative to ROOT
# Every step's name, in the order they run (--only takes these; the rehearsal's are cpu/NAME).
STEP_NAMES = ("machine", "build", "bundle-complete", "probe", "nccl", "gloo", "plan", "train-dense", "pytorch-eager",
              "pytorch-compile", "train-recompute", "train-offload", "train-moe", "checkpoint", "calibrate",
              "predicted-vs-measured")

SCAN = "build-gpu-scan"  # the bundle step's configure-only build, for the compile commands

# The GPU machine's limits (what one call may carry, return and spend), checked by --bundle.
TREE_LIMIT_BYTES = 64 << 20   # the working tree plus carried paths
CARRY_LIMIT_PATHS = 8
FILES_BACK_LIMIT = 8          # files returned from the output folder
FILE_BACK_LIMIT_BYTES = 16 << 20
CALL_LIMIT_S = 480            # what the call is given; the steps stop starting at BUDGET_S
BUDGET_S = 450



class Workload:
    """What the steps train, where, and how long. The GPU's: a dense Llama-style model that fills
    one GPU at sequence 4096, a Mixtral-style MoE, a small GPT with dropout for the checkpoint. The
    dry run's rehearsal plays the same steps on the CPU with the test suite's tiny models, so that
    every step's reading of plans and runs is exercised before a GPU ever sees it."""

    def __init__(self, device, dense, moe, dropout, seq, global_batch, steps, ckpt_seq, ckpt_mbs, backend):
        self.device, self.dense, self.moe, self.dropout = device, dense, moe, dropout
        self.seq, self.global_batch, self.steps = seq, global_batch, steps
        self.ckpt_seq, self.ckpt_mbs, self.backend = ckpt_seq, ckpt_mbs, backend


# Steps per training run (the first 2 are warm-up): the dense run 20 measured, the others fewer to
# stay inside the budget (the offloaded optimizer's step runs on the host).
GPU_WORKLOAD = Workload("cuda", "llama-3.2-1b", os.path.join(DATA, "mixtral-style-1b.json"),
                        os.path.join(DATA, "gpt-dropout-43m.json"), seq=4096, global_batch=8,
                        steps={"dense": 22, "pytorch": 12, "recompute": 12, "offload": 10, "moe": 12}, ckpt_seq=2048, ckpt_mbs=4,
                        backend="nccl")
TINY = os.path.join(ROOT, "tests", "data", "executor")
CPU_WORKLOAD = Workload("cpu", os.path.join(TINY, "llama-tiny", "config.json"),
                        os.path.join(TINY, "mixtral-tiny", "config.json"),
                        os.path.join(TINY, "gpt-tiny-dropout", "config.json"), seq=64, global_batch=4,
                        steps={"dense": 6, "pytorch": 4, "recompute": 4, "offload": 4, "moe": 4}, ckpt_seq=64, ckpt_mbs=2,
                        backend="gloo")
CKPT_STEPS, CKPT_SAVE_AT = 6, 3

# The output folder: at most FILES_BACK_LIMIT files.
SUMMARY = "summary.json"
LOG_TAIL_BYTES = 256 << 10
LOG_LIMIT_BYTES = 8 << 20
LOG = "gpu-check.log"
RECORDS = "records.tar.gz"


class Refused(Exception):
    """A GPU step on a machine without one: the tool's own one-line refusal."""


class Failed(Exception):
    pass


class Skipped(Exception):
    """A step that cannot run here for a reason named (not a failure)."""


def now_iso():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def write_atomically(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def prediction_error(predicted, measured):
    """How far a prediction is from the measurement, as dplan compare reports it: predicted /
    measured - 1 (+0.10: predicted 10 % too high)."""
    if predicted is None or measured is None or measured == 0:
        return None
    return predicted / measured - 1


# ---------------------------------------------------------------------------------------------
# The bundle


def toolchain_headers():
    """Every header of the C and C++ toolchain's own packages (glibc, the kernel's, libstdc++):
    present on any machine that compiles; the rest of /usr/include comes from -dev packages."""
    anchors = ["/usr/include/stdio.h", "/usr/include/linux/types.h"] + glob.glob("/usr/include/c++/*/vector")
    packages = set()
    for anchor in anchors:
        out = subprocess.run(["dpkg", "-S", anchor], capture_output=True, text=True).stdout
        for line in out.splitlines():
            packages.update(p.strip().split(":")[0] for p in line.split(": ")[0].split(","))
    files = set()
    for p in sorted(packages):
        files.update(subprocess.run(["dpkg", "-L", p], capture_output=True, text=True).stdout.split())
    return files


def torch_prefix(python):
    """The torch install folder of `python`'s PyTorch 2.x (what CMAKE_PREFIX_PATH takes), its
    version, its CUDA version (or None), and its site-packages."""
    r = subprocess.run([python, os.path.join(ROOT, "scripts", "torch_info.py"), "--json"], capture_output=True,
                       text=True)
    if r.returncode != 0:
        raise Failed(f"{python} does not import PyTorch 2.x: {last_line(r.stderr) or 'torch_info.py exit ' + str(r.returncode)}")
    info = json.loads(r.stdout.strip().splitlines()[-1])
    info["site_packages"] = os.path.dirname(info["dir"])
    return info


def last_line(text):
    lines = [l for l in (text or "").strip().splitlines() if l.strip()]
    return lines[-1] if lines else ""


def cmake_configure_args(torch, bundle):
    """The one configuration the GPU machine and the dry run share: Release, Ninja, no tests, the
    given torch, NCCL from beside it, and (bundle) the bundle's headers and zlib."""
    args = ["-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release", "-DDPLAN_BUILD_TESTS=OFF", "-DDPLAN_EXECUTOR=ON",
            f"-DCMAKE_PREFIX_PATH={torch['dir']}", "-DDPLAN_TORCH_PYTHON=",
            f"-DDPLAN_NCCL_ROOT={os.path.join(torch['site_packages'], 'nvidia', 'nccl')}"]
    if bundle:
        include = os.path.join(ROOT, BUNDLE, "include")
        args += [f"-DDPLAN_HEADER_DEPS={include}", f"-DZLIB_INCLUDE_DIR={include}", f"-DZLIB_LIBRARY={libz()}"]
    if shutil.which("ccache"):
        args.append("-DCMAKE_CXX_COMPILER_LAUNCHER=ccache")
    return args


def libz():
    """The machine's zlib runtime (libz.so.1): the GPU machine has no zlib1g-dev."""
    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"
    try:
        out = subprocess.run([ldconfig, "-p"], capture_output=True, text=True).stdout
    except OSError:
        out = ""
    for line in out.splitlines():
        name, _, path = line.strip().partition(" => ")
        if name.startswith("libz.so.1 ") and "x86-64" in name and os.path.exists(path):
            return path
    for path in ["/usr/lib/x86_64-linux-gnu/libz.so.1", "/lib/x86_64-linux-gnu/libz.so.1", "/usr/lib64/libz.so.1"]:
        if os.path.exists(path):
            return path
    raise Failed("no libz.so.1 on this machine (ldconfig -p lists none)")


def build_env():
    env = dict(os.environ)
    env["CCACHE_BASEDIR"] = ROOT  # as setup.sh: paths in the clone are relative in ccache's keys
    # CMake's FindCUDAToolkit (the probe's, and PyTorch's CUDA config) starts from nvcc on the PATH.
    if not shutil.which("nvcc") and os.path.exists("/usr/local/cuda/bin/nvcc"):
        env["PATH"] = "/usr/local/cuda/bin:" + env.get("PATH", "")
    return env


def make_bundle(python, log=print):
    """Gathers the headers into BUNDLE/include and returns its manifest."""
    torch = torch_prefix(python)
    scan = os.path.join(ROOT, SCAN)
    r = subprocess.run(["cmake", "-S", ROOT, "-B", scan, "-DCMAKE_EXPORT_COMPILE_COMMANDS=ON"]
                       + cmake_configure_args(torch, bundle=False), capture_output=True, text=True, env=build_env())
    if r.returncode != 0:
        raise Failed(f"configuring {SCAN} failed: {last_line(r.stderr) or last_line(r.stdout)}")
    commands = json.load(open(os.path.join(scan, "compile_commands.json")))

    def dependencies(entry):
        argv = shlex.split(entry["command"]) if "command" in entry else list(entry["arguments"])
        if argv and os.path.basename(argv[0]) == "ccache":
            argv = argv[1:]
        out = []
        skip = False
        for a in argv:
            if skip:
                skip = False
                continue
            if a in ("-o", "-MF", "-MT", "-MQ"):
                skip = True
                continue
            if a in ("-c", "-MD", "-MMD"):
                continue
            out.append(a)
        r = subprocess.run(out + ["-M"], cwd=entry["directory"], capture_output=True, text=True)
        if r.returncode != 0:
            raise Failed(f"listing the headers of {entry['file']} failed: {last_line(r.stderr)}")
        return r.stdout.replace("\\\n", " ").split()[1:]

    headers = set()
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        for deps in pool.map(dependencies, commands):
            headers.update(os.path.normpath(d if os.path.isabs(d) else os.path.join(scan, d)) for d in deps)
    toolchain = toolchain_headers()
    wanted = sorted(h for h in headers if h.startswith("/usr/include/") and h not in toolchain)
    # Whole folders where a compiler other than this one may take other branches: Boost's
    # compiler and library configuration, and gloo (small).
    for folder in ["/usr/include/boost/config", "/usr/include/gloo"]:
        if any(h.startswith(folder + "/") for h in wanted):
            for dirpath, _, names in os.walk(folder):
                wanted.extend(os.path.join(dirpath, n) for n in names)
    wanted = sorted(set(wanted))
    include = os.path.join(ROOT, BUNDLE, "include")
    shutil.rmtree(os.path.join(ROOT, BUNDLE), ignore_errors=True)
    total = 0
    for h in wanted:
        target = os.path.join(include, os.path.relpath(h, "/usr/include"))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copy2(h, target)
        total += os.path.getsize(h)
    packages = {}
    for i in range(0, len(wanted), 200):
        out = subprocess.run(["dpkg", "-S"] + wanted[i:i + 200], capture_output=True, text=True).stdout
        for line in out.splitlines():
            pkg = line.split(": ")[0].split(":")[0]
            packages[pkg] = packages.get(pkg, 0) + 1
    commit = subprocess.run(["git", "-C", ROOT, "describe", "--always", "--dirty"], capture_output=True,
                            text=True).stdout.strip()
    manifest = {"generator": "scripts/gpu-check.sh --bundle", "commit": commit or None, "files": len(wanted),
                "bytes": total,
                "packages": dict(sorted(packages.items())), "scanned_sources": len(commands),
                "torch": {k: torch[k] for k in ("version", "cuda")}}
    write_atomically(os.path.join(ROOT, BUNDLE, "manifest.json"), json.dumps(manifest, indent=1) + "\n")
    return manifest


def traveling_bytes():
    """The working tree that travels to the GPU machine: tracked and untracked-not-ignored files."""
    out = subprocess.run(["git", "-C", ROOT, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         capture_output=True, text=True).stdout
    total = 0
    for path in filter(None, out.split("\0")):
        p = os.path.join(ROOT, path)
        if os.path.isfile(p) and not os.path.islink(p):
            total += os.path.getsize(p)
    return total


def folder_bytes(folder):
    return sum(os.path.getsize(os.path.join(d, n)) for d, _, names in os.walk(folder) for n in names)


def bundle_command(args):
    python = args.python or "python3"
    manifest = make_bundle(python)
    tree = traveling_bytes()
    bundle = folder_bytes(os.path.join(ROOT, BUNDLE))
    print(f"gpu-check: bundle {BUNDLE}/: {manifest['files']} headers, {bundle / 2**20:.1f} MiB, from "
          + ", ".join(f"{p} ({n})" for p, n in manifest["packages"].items()))
    print(f"gpu-check: what travels: the tree {tree / 2**20:.1f} MiB + the bundle {bundle / 2**20:.1f} MiB = "
          f"{(tree + bundle) / 2**20:.1f} MiB of {TREE_LIMIT_BYTES >> 20} MiB; 1 carried path of {CARRY_LIMIT_PATHS}")
    if tree + bundle > TREE_LIMIT_BYTES:
        print(f"gpu-check: error: {(tree + bundle) / 2**20:.1f} MiB would travel, over the "
              f"{TREE_LIMIT_BYTES >> 20} MiB limit", file=sys.stderr)
        return 1
    print("gpu-check: the call, on the GPU machine, from the repository root:")
    print("  command:    scripts/gpu-check.sh --out \"$OUT\"")
    print(f"  carry:      {BUNDLE}")
    print(f"  time limit: {CALL_LIMIT_S} s (the steps stop starting at {BUDGET_S} s; "
          f"{SUMMARY} holds every finished step)")
    return 0


# ---------------------------------------------------------------------------------------------
# The check


class Check:
    def __init__(self, out, mode, python, bin_dir=None, limit_s=CALL_LIMIT_S, only=None):
        """mode: "gpu", "dry-run", or "rehearsal" (the dry run's CPU rehearsal alone, with the
        binaries of bin_dir and its files under out)."""
        self.out = os.path.abspath(out)
        self.mode = mode
        self.dry_run = mode != "gpu"
        self.python = python
        # The call's limit (the device call's timeout_s): steps stop starting 30 s before it and
        # each ends 15 s before it, so that the summary is written. only: the steps to run (their
        # needs among them), else all.
        self.call_limit_s, self.budget_s = limit_s, limit_s - (CALL_LIMIT_S - BUDGET_S)
        self.only = only
        self.start = time.monotonic()
        work_root = os.path.join(self.out, "work") if mode == "rehearsal" else os.path.join(ROOT, BUILD)
        self.gpu_work = os.path.join(work_root, "check")
        self.cpu_work = os.path.join(work_root, "check-cpu")
        self.work = self.gpu_work
        self.bin = os.path.abspath(bin_dir) if bin_dir else os.path.join(ROOT, BUILD)
        for work in (self.gpu_work, self.cpu_work):
            shutil.rmtree(work, ignore_errors=True)
        os.makedirs(self.gpu_work)
        os.makedirs(self.out, exist_ok=True)
        self.log_path = os.path.join(self.out, LOG)
        open(self.log_path, "w").close()
        # The commit the bundle was made at names the tree that travelled; the GPU machine's own
        # .git, where it has one, may be an older copy. Without a bundle (a dry run), git here.
        try:
            commit = json.load(open(os.path.join(ROOT, BUNDLE, "manifest.json"))).get("commit") or ""
        except (OSError, ValueError):
            commit = ""
        if not commit:
            try:
                commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                                        capture_output=True, text=True).stdout.strip()
            except OSError:
                commit = ""
        self.summary = {"format_version": 1, "generator": "scripts/gpu-check.sh", "mode": mode,
                        "started": now_iso(), "commit": commit or None, "host": platform.node(),
                        "budget_s": self.budget_s, "steps": []}
        self.results = {}
        self.cluster = "dgx-h100"
        self.w = GPU_WORKLOAD
        self.prefix = ""  # the rehearsal's steps are "cpu/NAME"

    # -- plumbing

    def elapsed_s(self):
        return time.monotonic() - self.start

    def log(self, text):
        # The log comes back whole or not at all (16 MiB a file): a command's output is kept to its
        # last LOG_TAIL_BYTES, the log to LOG_LIMIT_BYTES.
        if len(text) > LOG_TAIL_BYTES:
            text = f"(... {len(text) - LOG_TAIL_BYTES} bytes left out)\n" + text[-LOG_TAIL_BYTES:]
        size = os.path.getsize(self.log_path) if os.path.exists(self.log_path) else 0
        if size + len(text) > LOG_LIMIT_BYTES:
            text = "(log full: the rest left out)\n" if size < LOG_LIMIT_BYTES else ""
            size = LOG_LIMIT_BYTES
        with open(self.log_path, "a") as f:
            f.write(text if text.endswith("\n") or not text else text + "\n")

    def run(self, argv, timeout_s, cwd=None, env=None, errors_apart=False, log_output=True):
        """Runs argv, its output into the log; returns (exit status, output), or with errors_apart
        (exit status, standard output, standard error). A run past its time is killed and reads as
        status 124."""
        self.log(f"$ {' '.join(shlex.quote(a) for a in argv)}")
        t0 = time.monotonic()
        text = lambda b: b.decode(errors="replace") if isinstance(b, bytes) else (b or "")
        try:
            r = subprocess.run(argv, cwd=cwd or self.work, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE if errors_apart else subprocess.STDOUT, text=True,
                               timeout=timeout_s)
            status, output, errors = r.returncode, r.stdout, r.stderr or ""
        except subprocess.TimeoutExpired as e:
            status, output, errors = 124, text(e.stdout), text(e.stderr) + f"\n(killed after {timeout_s:.0f} s)"
        except OSError as e:
            status, output, errors = 127, "", str(e)
        self.log(output + errors if log_output else f"({len(output)} bytes of output, not logged)")
        self.log(f"(exit {status}, {time.monotonic() - t0:.1f} s)")
        return (status, output, errors) if errors_apart else (status, output + errors)

    def result(self, name):
        return self.results.get(self.prefix + name)

    def tool(self, name):
        return os.path.join(self.bin, name)

    def gpu_tool(self, argv, timeout_s):
        """A tool that needs the GPU: on a machine without one its refusal is expected, and must be
        one line with exit status 2 (bad input), not a crash."""
        status, output, errors = self.run(argv, timeout_s, errors_apart=True)
        if status == 0:
            return output
        lines = [l for l in errors.strip().splitlines() if l.strip()] or [last_line(output)]
        if self.dry_run:
            if status == 2 and len(lines) == 1:
                raise Refused(lines[0])
            raise Failed(f"exit {status} without a GPU, not a one-line refusal: {lines[-1] if lines else ''}")
        raise Failed(f"exit {status}: {lines[-1] if lines else ''}")

    def write_summary(self):
        self.summary["elapsed_s"] = round(self.elapsed_s(), 1)
        write_atomically(os.path.join(self.out, SUMMARY), json.dumps(self.summary, indent=1) + "\n")
        # Every record so far (plans, runs, probe, profiles), small, in one archive.
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            for work, folder in [(self.gpu_work, "gpu-check"), (self.cpu_work, "gpu-check-cpu")]:
                for name in sorted(os.listdir(work)) if os.path.isdir(work) else []:
                    path = os.path.join(work, name)
                    if os.path.isfile(path) and name.endswith((".json", ".txt")) and os.path.getsize(path) < (4 << 20):
                        tar.add(path, arcname=os.path.join(folder, name))
        with open(os.path.join(self.out, RECORDS + ".tmp"), "wb") as f:
            f.write(buf.getvalue())
        os.replace(os.path.join(self.out, RECORDS + ".tmp"), os.path.join(self.out, RECORDS))

    def step(self, name, fn, needs=(), timeout_s=120):
        name = self.prefix + name
        entry = {"name": name, "status": None}
        self.summary["steps"].append(entry)
        missing = [self.prefix + n for n in needs if self.prefix + n not in self.results]
        t0 = time.monotonic()
        if self.only is not None and name.split("/")[-1] not in self.only:
            entry.update(status="skipped", why="not in --only")
        elif missing:
            entry.update(status="skipped", why=f"needs {', '.join(missing)}, which did not finish")
        elif not self.dry_run and self.elapsed_s() > self.budget_s:  # the device call's limit (a dry run has none)
            entry.update(status="skipped", why=f"out of time ({self.elapsed_s():.0f} s of {self.budget_s} s spent)")
        else:
            self.log(f"\n== {name} ({self.elapsed_s():.0f} s in)")
            if not self.dry_run:  # a step ends before the call's limit, so that the summary is written
                timeout_s = max(10.0, min(timeout_s, self.call_limit_s - 15 - self.elapsed_s()))
            try:
                result = fn(timeout_s)
                self.results[name] = result
                entry.update(status="ok", result=result)
            except Refused as e:
                entry.update(status="refused", why=str(e))
            except Skipped as e:
                entry.update(status="skipped", why=str(e))
            except Failed as e:
                entry.update(status="failed", why=str(e))
            except Exception as e:  # a defect of this script: recorded, the other steps go on
                entry.update(status="failed", why=f"{type(e).__name__}: {e}")
        entry["wall_s"] = round(time.monotonic() - t0, 1)
        print(f"gpu-check: {name}: {entry['status']}" + (f" ({entry['why']})" if "why" in entry else "")
              + f", {entry['wall_s']} s", flush=True)
        self.write_summary()

    # -- the steps

    def machine(self, timeout_s):
        info = {"nproc": os.cpu_count(), "python": sys.version.split()[0], "platform": platform.platform()}
        for tool, argv in [("cxx", ["c++", "--version"]), ("cmake", ["cmake", "--version"]),
                           ("nvcc", ["nvcc", "--version"]), ("ninja", ["ninja", "--version"])]:
            status, output = self.run(argv, 30)
            info[tool] = last_line(output) if tool == "nvcc" else (output.strip().splitlines() or [""])[0]
            if status != 0:
                info[tool] = None
        fields = "name,memory.total,clocks.max.sm,clocks.max.memory,driver_version,power.limit,pci.bus_id"
        status, output = self.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits"], 30)
        if status == 0 and output.strip():
            values = [v.strip() for v in output.strip().splitlines()[0].split(",")]
            info["nvidia_smi"] = dict(zip(fields.split(","), values))
        else:
            info["nvidia_smi"] = None
        code = r"""
import json, torch
d = {"torch": torch.__version__, "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
     "cuda_available": torch.cuda.is_available(), "device_count": torch.cuda.device_count()}
try:
    d["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
except Exception as e:
    d["nccl"] = None
if d["cuda_available"]:
    p = torch.cuda.get_device_properties(0)
    d.update(name=p.name, sm_count=p.multi_processor_count, memory_bytes=p.total_memory,
             capability=f"{p.major}.{p.minor}", l2_bytes=getattr(p, "L2_cache_size", None))
print(json.dumps(d))
"""
        status, output = self.run([self.python, "-c", code], 120)
        if status != 0:
            raise Failed(f"{self.python} cannot import torch: {last_line(output)}")
        info["torch"] = json.loads(output.strip().splitlines()[-1])
        name = (info["torch"].get("name") or "").upper()
        self.cluster = ("hgx-h200" if "H200" in name else "pcie-h100" if "H100" in name and "PCIE" in name
                        else "dgx-b200" if "B200" in name else "dgx-a100-80g" if "A100" in name and "80" in name
                        else "dgx-a100-40g" if "A100" in name else "dgx-h100")
        info["cluster_profile"] = self.cluster
        if not self.dry_run and not info["torch"]["cuda_available"]:
            raise Failed("PyTorch sees no CUDA device")
        return info

    def build(self, timeout_s):
        torch = torch_prefix(self.python)
        if not torch["cuda"]:
            raise Failed(f"the PyTorch of {self.python} ({torch['version']}) has no CUDA")
        if not os.path.exists(os.path.join(ROOT, BUNDLE, "include", "nlohmann", "json.hpp")):
            raise Failed(f"no {BUNDLE}/ beside the tree: make it with scripts/gpu-check.sh --bundle and carry it")
        build = os.path.join(ROOT, BUILD)
        status, output = self.run(["cmake", "-S", ROOT, "-B", build] + cmake_configure_args(torch, bundle=True),
                                  timeout_s, env=build_env())
        if status != 0:
            raise Failed(f"configure: {last_line(output)}")
        dplan_lines = [l[3:] for l in output.splitlines() if l.startswith("-- dplan:")]
        jobs = str(os.cpu_count() or 2)
        t0 = time.monotonic()
        status, output = self.run(["cmake", "--build", build, "-j", jobs, "--target", "dplan", "dplan-worker",
                                   "dplan-gpu-probe"], max(30, timeout_s - (time.monotonic() - t0)), env=build_env())
        if status != 0:
            errors = [l for l in output.splitlines() if ": error:" in l or "Error:" in l or "FAILED:" in l]
            raise Failed(f"build: {(errors or [last_line(output)])[0][:400]}")
        return {"torch": torch["version"], "cuda": torch["cuda"], "configure": dplan_lines, "jobs": int(jobs),
                "build_s": round(time.monotonic() - t0, 1)}

    def bundle_complete(self, timeout_s):
        """The dry run's proof that the bundle is enough: no header the build read comes from a
        -dev package outside the toolchain."""
        status, output = self.run(["ninja", "-C", os.path.join(ROOT, BUILD), "-t", "deps"], timeout_s, log_output=False)
        if status != 0:
            raise Failed("ninja -t deps failed")
        toolchain = toolchain_headers()
        headers = {os.path.normpath(l.strip()) for l in output.splitlines() if l.startswith("    ")}
        outside = sorted(h for h in headers if h.startswith("/usr/include/") and h not in toolchain)
        if outside:
            raise Failed(f"{len(outside)} headers read from the machine's -dev packages, not the bundle, e.g. {outside[0]}")
        return {"headers_read": len(headers), "from_dev_packages": 0}

    def probe(self, timeout_s):
        # --quick: the layer shapes of hidden 2048 and 4096 and squares to 8192 (seconds, not a minute).
        self.gpu_tool([self.tool("dplan-gpu-probe"), "--quick", "-o", "probe.json", "--nccl-prefix", "probe-nccl"],
                      timeout_s)
        status, output = self.run([self.tool("dplan"), "probe", "--import-gpu-probe", "probe.json", "--cluster",
                                   self.cluster, "--name", "probed", "-o", "probed.json"], 120)
        with open(os.path.join(self.work, "probe-import.txt"), "w") as f:
            f.write(output)
        if status != 0:
            raise Failed(f"dplan probe --import-gpu-probe: {last_line(output)}")
        probe = json.load(open(os.path.join(self.work, "probe.json")))
        shipped = self.gpu_profile(self.cluster)
        probed = json.load(open(os.path.join(self.work, "probed-gpu.json"))).get("gpu", {})
        differences = {}
        for key in sorted(set(flatten(shipped)) | set(flatten(probed))):
            a, b = flatten(shipped).get(key), flatten(probed).get(key)
            if isinstance(a, (int, float)) and isinstance(b, (int, float)) and a != b:
                differences[key] = {"shipped": a, "probed": b, "ratio": b / a if a else None}
        rates = {}
        for row in probe.get("gemm", []):
            rates.setdefault(row["precision"], []).append(row["flops_per_s"])
        return {"device": probe.get("device"), "launch": probe.get("launch"),
                "copy_bytes_per_s": probe.get("memory", {}).get("bytes_per_s"),
                "gemm_tflops": {p: {"median": median(v) / 1e12, "max": max(v) / 1e12, "count": len(v)}
                                for p, v in rates.items()},
                "profile_differences": differences}

    def gpu_profile(self, cluster):
        """The shipped GPU profile of a cluster profile (profiles/clusters/NAME.json names it)."""
        c = json.load(open(os.path.join(ROOT, "profiles", "clusters", cluster + ".json")))["cluster"]
        return json.load(open(os.path.join(ROOT, "profiles", "gpus", c["gpu"] + ".json")))["gpu"]

    def plan(self, timeout_s):
        """The plans of the training steps. The search picks the dense model's micro-batch and
        recompute for one GPU; the recompute and offload plans are that layout with full
        recompute and with the optimizer offloaded (dplan estimate)."""
        dplan, w = self.tool("dplan"), self.w
        common = ["--gpus", "1", "--cluster", self.cluster, "--seq", str(w.seq), "--global-batch", str(w.global_batch)]
        status, output = self.run([dplan, "--model", w.dense] + common + ["--runnable", "-o", "dense-plan.json"],
                                  timeout_s)
        if status != 0:
            raise Failed(f"dplan --model {os.path.basename(w.dense)}: {last_line(output)}")
        dense = json.load(open(os.path.join(self.work, "dense-plan.json")))
        layout = layout_flags(dense)
        plans = {"dense": summary_of_plan(dense)}
        for name, change in [("recompute", ["--recompute", "full"]), ("offload", ["--offload"])]:
            flags = replace_flags(layout, change)
            status, output = self.run([dplan, "estimate", "--model", w.dense] + common + flags
                                      + ["-o", f"{name}-plan.json"], timeout_s)
            if status != 0:
                raise Failed(f"dplan estimate ({name}): {last_line(output)}")
            plans[name] = summary_of_plan(json.load(open(os.path.join(self.work, f"{name}-plan.json"))))
        status, output = self.run([dplan, "--model", w.moe] + common + ["--runnable", "-o", "moe-plan.json"],
                                  timeout_s)
        if status != 0:
            raise Failed(f"dplan --model {os.path.basename(w.moe)}: {last_line(output)}")
        plans["moe"] = summary_of_plan(json.load(open(os.path.join(self.work, "moe-plan.json"))))
        status, output = self.run([dplan, "estimate", "--model", w.dropout, "--gpus", "1", "--cluster",
                                   self.cluster, "--seq", str(w.ckpt_seq), "--global-batch", "8", "--mbs",
                                   str(w.ckpt_mbs), "-o", "checkpoint-plan.json"], timeout_s)
        if status != 0:
            raise Failed(f"dplan estimate ({os.path.basename(w.dropout)}): {last_line(output)}")
        plans["checkpoint"] = summary_of_plan(json.load(open(os.path.join(self.work, "checkpoint-plan.json"))))
        self.dense_layout = layout
        return plans

    def predict_with(self, cluster, name):
        """The dense plan's layout re-estimated with another cluster profile: its step time."""
        w = self.w
        common = ["--gpus", "1", "--cluster", cluster, "--seq", str(w.seq), "--global-batch", str(w.global_batch)]
        status, output = self.run([self.tool("dplan"), "estimate", "--model", w.dense] + common
                                  + self.dense_layout + ["-o", name], 120)
        if status != 0:
            raise Failed(f"dplan estimate --cluster {cluster}: {last_line(output)}")
        return json.load(open(os.path.join(self.work, name)))["prediction"]["step_time_s"]

    def train(self, name, timeout_s, extra=()):
        """One training run of NAME-plan.json on the GPU, compared with its plan."""
        self.gpu_tool([self.tool("dplan"), "run", f"{name}-plan.json", "-o", f"{name}-run.json", "--steps", str(self.w.steps[name]),
                       "--device", self.w.device, "--log-every", "5"] + list(extra), timeout_s)
        status, output = self.run([self.tool("dplan"), "compare", f"{name}-plan.json", f"{name}-run.json"], 60)
        with open(os.path.join(self.work, f"{name}-compare.txt"), "w") as f:
            f.write(output)
        status, output = self.run([self.tool("dplan"), "compare", f"{name}-plan.json", f"{name}-run.json", "--json"], 60)
        if status != 0:
            raise Failed(f"dplan compare: {last_line(output)}")
        comparison = json.loads(output[output.index("{"):output.rindex("}") + 1])
        plan = json.load(open(os.path.join(self.work, f"{name}-plan.json")))
        run = json.load(open(os.path.join(self.work, f"{name}-run.json")))
        return training_result(plan, run, comparison)

    def checkpoint(self, timeout_s):
        """Saved on CUDA after step 3, resumed: the next steps' losses bit-identical to the
        uninterrupted run's (the CUDA generator's state restored, deterministic kernels)."""
        dplan = self.tool("dplan")
        common = ["--steps", str(CKPT_STEPS), "--device", self.w.device, "--deterministic", "--quiet"]
        self.gpu_tool([dplan, "run", "checkpoint-plan.json", "-o", "checkpoint-full.json", "--checkpoint-dir", "ckpt",
                       "--save-every", str(CKPT_SAVE_AT)] + common, timeout_s / 2)
        for folder in glob.glob(os.path.join(self.work, "ckpt", "step-*")):
            if int(folder.rsplit("-", 1)[1]) > CKPT_SAVE_AT:
                shutil.rmtree(folder)
        self.gpu_tool([dplan, "run", "checkpoint-plan.json", "-o", "checkpoint-resumed.json", "--resume", "ckpt"]
                      + common, timeout_s / 2)
        full = json.load(open(os.path.join(self.work, "checkpoint-full.json")))
        resumed = json.load(open(os.path.join(self.work, "checkpoint-resumed.json")))
        a = [s["loss"] for s in full["steps"]]
        b = [s["loss"] for s in resumed["steps"]]
        pairs = [{"step": CKPT_SAVE_AT + i + 1, "uninterrupted": a[CKPT_SAVE_AT + i], "resumed": x}
                 for i, x in enumerate(b) if CKPT_SAVE_AT + i < len(a)]
        identical = len(pairs) == CKPT_STEPS - CKPT_SAVE_AT and all(p["uninterrupted"] == p["resumed"] for p in pairs)
        saves = full.get("checkpoints", {}).get("saves", [])
        result = {"losses": pairs, "bit_identical": identical,
                  "resumed_from": resumed.get("checkpoints", {}).get("resumed_from"),
                  "save": saves[0] if saves else None}
        if not identical:
            raise Failed("the resumed losses differ from the uninterrupted run's: " + json.dumps(pairs))
        return result

    def backend(self, timeout_s):
        """ProcessGroupNCCL at world 1 (the rehearsal: Gloo): its collectives run and are right."""
        name = f"{self.w.backend}-check.json"
        self.gpu_tool([self.tool("dplan-worker"), "--check-backend", self.w.backend, "-o", name], timeout_s)
        result = json.load(open(os.path.join(self.work, name)))
        if not result.get("ok"):
            raise Failed("a collective gave wrong values: " + json.dumps(result["collectives"]))
        return result

    def calibrate(self, timeout_s):
        """dplan calibrate on the runs: fitted to the recompute, offload and MoE runs, the dense run
        is predicted out of sample; fitted to all four, in sample."""
        runs = [n for n in ("recompute", "offload", "moe") if self.result(f"train-{n}")]
        base = "probed.json" if self.result("probe") else self.cluster
        dense_s = self.result("train-dense")["measured"]["median_step_s"]
        out = {"base_profile": base, "fitted_to_held_out": runs}
        for label, fitted in [("held_out", runs), ("all", runs + ["dense"])]:
            if not fitted:
                continue
            profile = f"calibrated-{label}.json"
            status, output = self.run([self.tool("dplan"), "calibrate"] + [f"{n}-run.json" for n in fitted]
                                      + ["--profile", base, "--name", f"calibrated-{label}", "-o", profile], timeout_s)
            with open(os.path.join(self.work, f"calibrate-{label}.txt"), "w") as f:
                f.write(output)
            if status != 0:
                raise Failed(f"dplan calibrate ({label}): {last_line(output)}")
            predicted = self.predict_with(profile, f"dense-{label}-plan.json")
            out[label] = {"fitted_to": fitted, "dense_predicted_s": predicted, "dense_measured_s": dense_s,
                          "error": prediction_error(predicted, dense_s)}
        return out

    def predicted_vs_measured(self, timeout_s):
        """The dense run's step predicted with the shipped profile, the probed one and the
        calibrated ones, beside what it measured."""
        dense = self.result("train-dense")
        measured = dense["measured"]["median_step_s"]
        rows = {"shipped": dense["predicted"]["step_s"]}
        if self.result("probe"):
            rows["probed"] = self.predict_with("probed.json", "dense-probed-plan.json")
        cal = self.result("calibrate") or {}
        for label in ("held_out", "all"):
            if label in cal:
                rows[f"calibrated_{label}"] = cal[label]["dense_predicted_s"]
        return {"measured_s": measured,
                "predicted_s": {k: {"step_s": v, "error": prediction_error(v, measured)} for k, v in rows.items()}}

    def pytorch(self, compiled, timeout_s):
        """The dense plan's model trained by plain PyTorch on the same device (bench/torch_llama.py:
        bf16 autocast, SDPA, fused AdamW; torch.compile per block with compiled): its step time
        beside the executor's, and its MFU by the plan's FLOP count."""
        if self.w.device == "cpu" and compiled:
            raise Skipped("the rehearsal leaves torch.compile out (about 40 s of compiling on a CPU, for one line "
                          "of bench/torch_llama.py)")
        if self.w.device == "cpu":  # the rehearsal: with a PyTorch 2.x (the dry run's); Debian's 1.13 lacks SDPA's GQA
            status, version = self.run([self.python, "-c", "import torch; print(torch.__version__)"], 60)
            major_minor = tuple(int(x) for x in re.findall(r"\d+", (version.strip().splitlines() or ["0"])[-1])[:2])
            if status != 0:
                raise Skipped(f"{self.python} imports no PyTorch")
            if major_minor < (2, 5):
                raise Skipped(f"{self.python}'s PyTorch {version.strip()} is older than 2.5")
        argv = [self.python, os.path.join(ROOT, "bench", "torch_llama.py"), "--plan", "dense-plan.json",
                "--device", self.w.device, "--steps", str(self.w.steps["pytorch"]), "--warmup", "2"]
        output = self.gpu_tool(argv + (["--compile"] if compiled else []), timeout_s)
        ref = json.loads(output.strip().splitlines()[-1])
        with open(os.path.join(self.work, f"pytorch-{'compile' if compiled else 'eager'}.json"), "w") as f:
            json.dump(ref, f, indent=1)
        dense = self.result("train-dense")
        out = {"pytorch": {k: ref[k] for k in ("torch", "median_step_s", "tokens_per_s", "phases_s",
                                                 "peak_allocated_bytes", "precision", "compile")}}
        if dense:
            executor_s, pred = dense["measured"]["median_step_s"], dense["plan"]
            out["executor_over_pytorch"] = executor_s / ref["median_step_s"]
            if pred.get("mfu"):  # one FLOP count for both: the plan's
                out["pytorch"]["mfu"] = pred["mfu"] * pred["step_s"] / ref["median_step_s"]
                out["executor_mfu"] = dense["measured"]["mfu"]
        return out

    def run_training_steps(self):
        self.step(self.w.backend, self.backend, needs=("build",), timeout_s=60)
        self.step("plan", self.plan, needs=("build",), timeout_s=60)
        self.step("train-dense", lambda t: self.train("dense", t), needs=("plan",), timeout_s=120)
        self.step("pytorch-eager", lambda t: self.pytorch(False, t), needs=("plan",), timeout_s=90)
        self.step("pytorch-compile", lambda t: self.pytorch(True, t), needs=("plan",), timeout_s=150)
        for name in ("recompute", "offload", "moe"):
            self.step(f"train-{name}", lambda t, n=name: self.train(n, t), needs=("plan",), timeout_s=120)
        self.step("checkpoint", self.checkpoint, needs=("plan",), timeout_s=120)
        self.step("calibrate", self.calibrate, needs=("train-dense",), timeout_s=60)
        self.step("predicted-vs-measured", self.predicted_vs_measured, needs=("train-dense",), timeout_s=60)

    def run_all(self):
        gpu = "a GPU" if not self.dry_run else "no GPU"
        print(f"gpu-check: {self.mode} on {platform.node()} with {gpu}; results in {self.out}", flush=True)
        if self.mode != "rehearsal":
            self.step("machine", self.machine, timeout_s=120)
            self.step("build", self.build, timeout_s=3000 if self.dry_run else 300)
            if self.dry_run:
                self.step("bundle-complete", self.bundle_complete, needs=("build",), timeout_s=120)
            self.step("probe", self.probe, needs=("build",), timeout_s=90)
            self.run_training_steps()
        else:
            self.results["build"] = {"binaries": self.bin}
        if self.dry_run:
            # The rehearsal: the same steps on the CPU with tiny models (cluster local-cpu, Gloo),
            # so that every step's reading of plans, runs and profiles has run once here.
            self.prefix, self.w, self.cluster, self.work = "cpu/", CPU_WORKLOAD, "local-cpu", self.cpu_work
            os.makedirs(self.cpu_work, exist_ok=True)
            self.results["cpu/build"] = self.results.get("build")
            self.run_training_steps()
        statuses = {s["name"]: s["status"] for s in self.summary["steps"]}
        if self.dry_run:
            # Passed: everything that needs no GPU ran, and every GPU step refused in one line
            # (steps that only read GPU results are skipped).
            bad = {n: s for n, s in statuses.items() if s == "failed"}
            gpu_steps = ["probe", "train-dense", "pytorch-eager", "pytorch-compile", "train-recompute",
                         "train-offload", "train-moe", "checkpoint", "nccl"]
            if self.mode == "dry-run":
                bad.update({n: statuses[n] for n in gpu_steps if statuses.get(n) != "refused"})
                bad.update({n: statuses[n] for n in ("machine", "build", "bundle-complete", "plan")
                            if statuses[n] != "ok"})
            # (the PyTorch reference steps may be skipped where the python's PyTorch predates them)
            bad.update({n: s for n, s in statuses.items() if n.startswith("cpu/") and s != "ok"
                        and not (s == "skipped" and n.startswith("cpu/pytorch-"))})
        else:
            left_out = {e["name"] for e in self.summary["steps"] if e.get("why") == "not in --only"}
            bad = {n: s for n, s in statuses.items() if s != "ok" and n not in left_out}
        self.summary["ok"] = not bad
        self.summary["not_ok"] = bad
        self.summary["finished"] = now_iso()
        self.write_summary()
        print(f"gpu-check: {'passed' if not bad else 'not passed: ' + ', '.join(f'{n} {s}' for n, s in bad.items())}"
              f" in {self.elapsed_s():.0f} s; {os.path.join(self.out, SUMMARY)}")
        return 0 if not bad else 1


# ---------------------------------------------------------------------------------------------
# Reading plans and runs


def flatten(obj, prefix=""):
    out = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.update(flatten(v, f"{prefix}{k}."))
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
        out[prefix[:-1]] = obj
    return out


def median(values):
    v = sorted(values)
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def layout_flags(plan):
    """A one-GPU plan's layout as dplan estimate flags."""
    p = plan["parallel"]
    flags = ["--tp", "1", "--pp", "1", "--mbs", str(p["micro_batch"]), "--recompute", p["recompute"],
             "--zero", str(p.get("zero_stage", 0))]
    if p.get("offload_optimizer"):
        flags.append("--offload")
    return flags


def replace_flags(flags, change):
    out = list(flags)
    if change[0] in out and len(change) == 2:
        out[out.index(change[0]) + 1] = change[1]
    elif change[0] not in out:
        out += change
    return out


def summary_of_plan(plan):
    p, pred = plan["parallel"], plan["prediction"]
    return {"model": plan["model"].get("name"), "num_params": plan["model"].get("num_params"),
            "micro_batch": p["micro_batch"], "recompute": p["recompute"], "offload": p.get("offload_optimizer", False),
            "step_s": pred["step_time_s"], "mfu": pred.get("mfu"), "peak_bytes": pred["memory"]["peak_bytes"]}


# Each component's tolerance: weights, gradients and optimizer states are exact tensor bytes, so
# 1 %; activations a model of the allocator's peak, 15 %.
MEMORY_TOLERANCE = {"weights": 0.01, "gradients": 0.01, "optimizer": 0.01, "activations": 0.15}


def training_result(plan, run, comparison):
    pred = plan["prediction"]
    measured_s = run["step_time_s"]["median"]
    mfu = pred["mfu"] * pred["step_time_s"] / measured_s if pred.get("mfu") else None
    memory = {}
    stage = comparison["memory"][0] if comparison.get("memory") else {}
    for name, value in stage.items():
        if name == "stage" or not isinstance(value, dict):
            continue
        entry = {"predicted_bytes": value.get("predicted"), "measured_bytes": value.get("measured"),
                 "error": value.get("rel_error")}
        if name in MEMORY_TOLERANCE and entry["error"] is not None:
            entry["within"] = MEMORY_TOLERANCE[name]
            entry["ok"] = abs(entry["error"]) <= MEMORY_TOLERANCE[name]
        memory[name] = entry
    rank0 = run["memory"].get("0", {})
    return {"plan": summary_of_plan(plan),
            "measured": {"median_step_s": measured_s, "tokens_per_s": run["tokens_per_s"], "mfu": mfu,
                         "steps": run["step_time_s"]["count"], "first_loss": run["steps"][0]["loss"],
                         "last_loss": run["steps"][-1]["loss"], "phases_s": run.get("phases_s")},
            "predicted": {"step_s": pred["step_time_s"], "mfu": pred.get("mfu"),
                          "step_error": prediction_error(pred["step_time_s"], measured_s)},
            "memory": memory, "peak_allocated_bytes": rank0.get("peak"),
            "reserved_peak_bytes": rank0.get("reserved_peak"),
            "outside_allocator_bytes": rank0.get("outside_allocator"), "phases": comparison.get("phases")}


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line naming the problem and the valid choices, exit 2
        print(f"gpu-check: error: {message}; valid: --bundle, --dry-run, --rehearse BUILD_DIR, --out DIR, "
              "--python PY, --limit-s S, --only STEPS, --help", file=sys.stderr)
        sys.exit(2)


def main():
    parser = Parser(prog="scripts/gpu-check.sh", description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--bundle", action="store_true", help="gather the headers into .gpu-bundle/ and print the call")
    mode.add_argument("--dry-run", action="store_true", help="everything without a GPU (builds against --python)")
    mode.add_argument("--rehearse", metavar="BUILD_DIR",
                      help="the dry run's CPU rehearsal alone, with the dplan and dplan-worker of BUILD_DIR")
    parser.add_argument("--out", default=os.environ.get("OUT"), help="output folder (default: $OUT)")
    parser.add_argument("--limit-s", type=int, default=CALL_LIMIT_S,
                        help=f"the call's time limit (default {CALL_LIMIT_S}): steps stop starting "
                             f"{CALL_LIMIT_S - BUDGET_S} s before it")
    parser.add_argument("--only", help="comma-separated steps to run (each with its needs), e.g. "
                        "machine,build,plan,train-dense,pytorch-eager,pytorch-compile; default all")
    parser.add_argument("--python", help="the python whose PyTorch 2.x with CUDA to build against "
                        "(default: python3; the dry run: scripts/torch-venv.sh's)")
    args = parser.parse_args()
    try:
        if args.bundle:
            return bundle_command(args)
        if not args.out:
            print("gpu-check: error: no output folder: give --out DIR (or set OUT)", file=sys.stderr)
            return 2
        python = args.python
        if args.dry_run:
            if not python:
                r = subprocess.run([os.path.join(ROOT, "scripts", "torch-venv.sh"), "--check"], capture_output=True,
                                   text=True)
                if r.returncode != 0:
                    print("gpu-check: error: no PyTorch 2.x with CUDA to build against: make it with "
                          "scripts/torch-venv.sh, or give --python", file=sys.stderr)
                    return 2
                python = r.stdout.strip().splitlines()[-1]
            t0 = time.monotonic()
            bundle_status = bundle_command(argparse.Namespace(python=python))
            print(f"gpu-check: the bundle step took {time.monotonic() - t0:.0f} s", flush=True)
            if bundle_status != 0:
                return bundle_status
        if args.rehearse:
            if not os.path.exists(os.path.join(args.rehearse, "dplan-worker")):
                print(f"gpu-check: error: --rehearse {args.rehearse}: no dplan-worker there (./setup.sh --all builds it)",
                      file=sys.stderr)
                return 2
            return Check(args.out, "rehearsal", python or "python3", bin_dir=args.rehearse).run_all()
        only = None
        if args.only:
            only = set(x.strip() for x in args.only.split(",") if x.strip())
            unknown = sorted(only - set(STEP_NAMES))
            if unknown:
                parser.error(f"--only: unknown step {unknown[0]!r} (steps: {', '.join(STEP_NAMES)})")
        if args.limit_s < 120 or args.limit_s > 600:
            parser.error(f"--limit-s {args.limit_s} is outside 120..600")
        check = Check(args.out, "dry-run" if args.dry_run else "gpu", python or "python3",
                      limit_s=args.limit_s, only=only)
        return check.run_all()
    except Failed as e:
        print(f"gpu-check: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
