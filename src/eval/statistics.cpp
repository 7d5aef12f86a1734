// SPDX-License-Identifier: Apache-2.0
// Paired statistics shared by every evaluation.
#include "eval/statistics.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "protokv/error.h"

namespace protokv::eval {

double t_quantile_975(int64_t df) {
  PROTOKV_CHECK(df >= 1, "t quantile needs at least one degree of freedom");
  static constexpr double kTable[30] = {12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306,
                                        2.262,  2.228, 2.201, 2.179, 2.160, 2.145, 2.131, 2.120,
                                        2.110,  2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
                                        2.060,  2.056, 2.052, 2.048, 2.045, 2.042};
  if (df <= 30) return kTable[df - 1];
  // Cornish-Fisher expansion around z = 1.95996 (error < 1e-4 for df > 30).
  const double z = 1.959963984540054, v = static_cast<double>(df);
  const double z3 = z * z * z, z5 = z3 * z * z;
  return z + (z3 + z) / (4 * v) + (5 * z5 + 16 * z3 + 3 * z) / (96 * v * v);
}

PairedDifference paired_difference(const std::vector<double>& a, const std::vector<double>& b) {
  PairedDifference out;
  const size_t n = std::min(a.size(), b.size());
  out.samples = static_cast<int64_t>(n);
  if (n == 0) return out;
  double mean = 0.0;
  for (size_t i = 0; i < n; ++i) mean += a[i] - b[i];
  mean /= static_cast<double>(n);
  out.mean = out.lo = out.hi = mean;
  if (n < 2) {
    out.se = std::numeric_limits<double>::quiet_NaN(),
    out.lo = std::numeric_limits<double>::quiet_NaN(),
    out.hi = std::numeric_limits<double>::quiet_NaN();
    return out;
  }
  double ss = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const double d = a[i] - b[i] - mean;
    ss += d * d;
  }
  out.se = std::sqrt(ss / static_cast<double>(n - 1) / static_cast<double>(n));
  const double half = t_quantile_975(static_cast<int64_t>(n) - 1) * out.se;
  out.lo = mean - half;
  out.hi = mean + half;
  return out;
}

}  // namespace protokv::eval
