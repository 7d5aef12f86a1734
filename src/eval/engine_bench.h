// SPDX-License-Identifier: Apache-2.0
#pragma once
// `bench e2e`'s machine reference and cost model: OpenBLAS sgemm GFLOP/s and memory copy/read
// bandwidth measured on this machine, and the FLOPs of one prefill and the bytes streamed per
// decode step (formulas in src/cli/cmd_bench.cpp and `protokv bench e2e --help`).
#include <cstddef>
#include <cstdint>

#include "protokv/model.h"

namespace protokv::eval {

struct MachineReference {
  double sgemm_gflops = 0.0;
  int64_t sgemm_size = 1024;
  double copy_gbs = 0.0;  // read + write
  double read_gbs = 0.0;
  size_t copy_bytes = size_t{256} << 20;
};

// Best of repeated square sgemms (at least 3 runs and 0.3 s), after one warm-up.
double measure_sgemm_gflops(int64_t size);

// Best of 5 parallel copies / reads of ref.copy_bytes; fills ref.copy_gbs and ref.read_gbs.
void measure_bandwidth(MachineReference& ref);

// FLOPs of a prefill of n tokens: 2 n P_proj + 2 L H d n(n+1) + 2 V D.
double prefill_flops(const ModelWeights& w, int64_t n);

// Weight bytes one decode step reads: all but the token embedding unless it is the classifier.
size_t streamed_weight_bytes(const ModelWeights& w);

// CPU time consumed so far by every thread of this process (CLOCK_PROCESS_CPUTIME_ID), in ms.
// Unlike wall time it does not grow while the process waits for a core on a loaded machine
// (memory stalls still count); at -t 1 it is the decoding thread's own time.
double process_cpu_ms();

}  // namespace protokv::eval
