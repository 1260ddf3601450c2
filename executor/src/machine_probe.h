// `dplan-worker --probe`: what this machine's ranks achieve with the libraries
// the executor trains with (LibTorch's CPU GEMMs, its memory bandwidth, Gloo
// collectives), in the format dplan-gpu-probe writes (probe/gpu_probe.cpp), for
// `dplan probe --cluster local-cpu` to fit a profile to. Every rank runs the
// GEMM and copy measurements at once, each with the intra-op threads a training
// rank gets (cores / local ranks), so the figures include the ranks' sharing of
// the cores; rank 0's are recorded. The collectives run over the world group,
// and so does the overlap measurement (how much of an all-reduce hides under
// GEMMs running beside it).
#pragma once

#include <string>

#include "comm.h"

namespace dplan::executor {

struct MachineProbeOptions {
  std::string output;                // rank 0 writes this JSON; the collectives as <stem>-<test>.txt beside it
  double max_collective_mib = 64;    // largest collective message
  double seconds_per_point = 0.05;   // each measurement repeats its call for about this long
};

void run_machine_probe(const MachineProbeOptions& options, Group& world);

}  // namespace dplan::executor
