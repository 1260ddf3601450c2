// `dplan-worker --probe`: what this machine's ranks achieve with the libraries the executor trains
// with (LibTorch's CPU GEMMs and its flash attention, element-wise kernels and copies, Gloo
// collectives), in the format dplan-gpu-probe writes (probe/gpu_probe.cpp), for
// `dplan probe --cluster local-cpu` to fit a profile to. Every rank runs the GEMM and memory
// measurements at once, each with the one intra-op thread a training rank gets, so the figures
// include the ranks' sharing of the machine; each pass keeps the slowest rank's times (a training
// step waits for it), in gemm_rounds passes spread over the probe whose median each GEMM keeps (a
// shared machine's pace drifts); the memory figures are rank 0's. The collectives run over the world group, each
// call after some compute as in training, and so does the overlap measurement (how much of an
// all-reduce hides under GEMMs running beside it).
#pragma once

#include <torch/torch.h>

#include <functional>
#include <string>

#include "comm.h"

namespace dplan::executor {

struct MachineProbeOptions {
  std::string output;                // rank 0 writes this JSON; the collectives as <stem>-<test>.txt beside it
  double max_collective_mib = 64;    // largest collective message
  double seconds_per_point = 0.05;   // each measurement repeats its call for about this long
  int gemm_rounds = 3;               // passes over the GEMMs, spread over the probe; each keeps its median
};

void run_machine_probe(const MachineProbeOptions& options, Group& world);

// The probe's parts, for its tests.
namespace probe_detail {

// Seconds per backward of forward()'s output with gradient `grad`, each call's forward run outside
// the clock; at least 3 calls, for about 2 x budget_s in all.
double backward_time_s(const std::function<at::Tensor()>& forward, const at::Tensor& grad, double budget_s);

// Of a [ranks, gemms] table of one pass's times, the index of the rank whose pass took longest.
int64_t slowest_rank(const at::Tensor& times);

}  // namespace probe_detail

}  // namespace dplan::executor
