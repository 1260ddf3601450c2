// The executor's public surface: run one rank of a plan, as dplan-worker does. Everything else of
// the executor (the model, the process groups, the schedules, ZeRO, checkpoints) is private to it
// (executor/src/).
//
// run_worker takes dplan-worker's command line: the plan.json and the options of a run
// (run_options.h, the same table `dplan run` registers), or --probe / --check-backend. The rank's
// place comes from the environment (RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT as
// dplan run and torchrun set them, or Slurm's SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID). It
// trains the plan's layout for --steps steps, and rank 0 writes what it measured as run.json
// (-o; docs/run-json.md, the format costmodel::RunRecord owns).
//
// Returns, or exits the process with, the status: 0 done; 2 bad input (plan, options, data,
// checkpoint), in one line on rank 0's stderr; 1 a failure while running (a rank that died, a
// timeout), in one line naming the rank.
#pragma once

namespace dplan::executor {

int run_worker(int argc, char** argv);

}  // namespace dplan::executor
