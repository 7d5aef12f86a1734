// SPDX-License-Identifier: Apache-2.0
// Paired statistics shared by every evaluation (fidelity, niah, ruler, longbench): methods are
// compared on the same samples, so the quantity of interest is the per-sample difference.
#pragma once

#include <cstdint>
#include <vector>

namespace protokv::eval {

// Paired difference (a − b) over the samples both ran: mean, standard error (sample std with
// n − 1, divided by sqrt(n)) and the two-sided 95% Student-t interval [lo, hi]. With fewer than
// two samples `se`, `lo` and `hi` are NaN: one sample says nothing about the spread.
struct PairedDifference {
  int64_t samples = 0;
  double mean = 0.0, se = 0.0, lo = 0.0, hi = 0.0;
  // Half-width of the 95% interval (NaN with fewer than two samples).
  double half_width() const { return hi - mean; }
};
PairedDifference paired_difference(const std::vector<double>& a, const std::vector<double>& b);

// Two-sided 95% quantile of Student's t with `df` degrees of freedom (df >= 1).
double t_quantile_975(int64_t df);

}  // namespace protokv::eval
