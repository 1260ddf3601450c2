// `dplan run plan.json [--steps N] [--data FILE] [--seed S] [-o run.json]`: the local launcher.
// Spawns the plan's ranks of the executor (dplan-worker, built beside dplan when LibTorch is
// found) on this machine, their rendezvous a c10d FileStore in a private temporary folder (no
// port; Gloo listens on 127.0.0.1), and watches them: when one dies or stalls, the others stop
// within the collective timeout, and dplan run names that rank and returns 1. The ranks die with
// the launcher (even when it is killed). Bad input is reported once, by rank 0, as dplan's own
// error (exit 2). SIGINT, SIGTERM or SIGHUP to dplan run stops the ranks: exit 128 + signal.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "dplan/executor/run_options.h"

namespace dplan::cli {

using executor::RunOptions;

// The plan and every option of executor/include/dplan/executor/run_options.h, on `command`.
void add_run_options(CLI::App& command, RunOptions& args);
int run_run(const RunOptions& args);

// dplan-worker beside this binary, or $DPLAN_WORKER; InputError if this build has none.
std::string find_worker();
// Starts `world` local ranks of args[0] with args[1..] and the rendezvous environment (RANK,
// WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1, DPLAN_RUN_DIR), watches them,
// names the rank that failed or stalled, and kills the rest timeout_s + 10 s later. Returns 0; 2
// when a rank exited 2 (bad input, which rank 0 has reported); 128 + the signal when SIGINT,
// SIGTERM or SIGHUP stopped the launcher; else 1. Call it from the main thread: a rank dies when
// the thread that started it ends.
// graceful_stop (a run with --checkpoint-dir): the first such signal is passed on to the ranks as
// SIGTERM, as torchrun and Slurm deliver it, and the ranks get the collective timeout (plus a
// margin) to finish their step, save and exit; when they all exit 0 the launcher returns 0. A
// second signal kills them at once (128 + signal).
int launch_local_ranks(std::vector<std::string> args, int world, double timeout_s, bool graceful_stop = false);

}  // namespace dplan::cli
