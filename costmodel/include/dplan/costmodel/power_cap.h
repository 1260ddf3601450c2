// GPUs run under a power limit below their TDP (nvidia-smi -pl): the profile's figures derived
// for that limit. A cluster profile's "power_limit_w" applies it to the cluster's GPU
// (cluster_from_json); this is the one place the rule lives. The compute peaks scale by the
// fraction below; HBM bandwidth, capacity and every efficiency stay as they are (a power limit
// lowers the SM clock, not the memory clock). Sources and the fit: profiles/gpus/SOURCES.md
// section 6.
#pragma once

#include <string>

#include "dplan/costmodel/hardware.h"

namespace dplan::costmodel {

// Exponent of the power law below: least squares on log throughput over the Zeus (NSDI '23)
// power-limit traces of training runs whose unconstrained draw reached the limit, at limits from
// half that draw up; rms error 7.6 % (profiles/gpus/SOURCES.md section 6).
inline constexpr double kPowerCapThroughputExponent = 0.56;

// Of its throughput at tdp_w, the fraction a power-bound training step keeps under a limit of
// limit_w: (limit_w / tdp_w)^0.56. 1 at the TDP, smaller for every lower limit. Below half the
// TDP the measured throughput fell faster than this (profiles/gpus/SOURCES.md section 6).
// REQUIRES: 0 < limit_w <= tdp_w.
double power_cap_throughput_fraction(double limit_w, double tdp_w);

// `gpu` under a power limit of limit_w: its peak FLOP/s (and the times of any measured GEMMs) for
// that limit, its name "<name>@<limit>w", its description and sources saying so. A profile already
// derived for another limit is re-derived from its own (the fraction is a ratio to the TDP's). At
// the TDP it is the datasheet profile itself. Throws InputError, one line naming the valid range,
// when the profile gives no power block or no lowest limit, or limit_w lies outside
// [min_power_limit_w, tdp_w].
GpuSpec power_capped(const GpuSpec& gpu, double limit_w);

// "<lo>-<hi> W", the range power_capped accepts for `gpu` ("" when it gives none).
std::string power_limit_range(const GpuSpec& gpu);

}  // namespace dplan::costmodel
