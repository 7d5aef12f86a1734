// SPDX-License-Identifier: Apache-2.0
// RULER's scoring (NVIDIA/RULER scripts/eval/synthetic/constants.py): string_match_all (the share
// of references found in the prediction) and string_match_part (any reference found), both
// case-insensitive; the task table and the sample generators are in ruler.cpp.
#include <string>
#include <vector>

#include "eval/ruler.h"

namespace protokv::eval {

namespace {
std::string ascii_lower(std::string s) {
  for (char& c : s)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return s;
}
}  // namespace

double string_match_all(const std::string& prediction, const std::vector<std::string>& refs) {
  if (refs.empty()) return 0.0;
  const std::string p = ascii_lower(prediction);
  double hits = 0.0;
  for (const auto& r : refs) hits += p.find(ascii_lower(r)) != std::string::npos ? 1.0 : 0.0;
  return hits / static_cast<double>(refs.size());
}

double string_match_part(const std::string& prediction, const std::vector<std::string>& refs) {
  const std::string p = ascii_lower(prediction);
  for (const auto& r : refs)
    if (p.find(ascii_lower(r)) != std::string::npos) return 1.0;
  return 0.0;
}

double ruler_score(const LongctxSample& sample, const std::string& prediction) {
  const std::string metric = sample.meta.value("metric", "string_match_all");
  return metric == "string_match_part" ? string_match_part(prediction, sample.answers)
                                       : string_match_all(prediction, sample.answers);
}

}  // namespace protokv::eval
