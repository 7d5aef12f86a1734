#pragma once
// `protokv demo`: the whole path on a SYNTHETIC model and workload generated in memory, so it
// runs on a fresh machine with nothing downloaded: prefill, compression by several presses at two
// budgets, teacher-forced decode, one comparison table.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "eval/fidelity.h"
#include "eval/synthetic.h"

namespace protokv::eval {

struct DemoOptions {
  bool tiny = false;  // small model and prompt (tests, sanitizers)
  std::vector<std::string> presses = {"streaming_llm", "h2o", "snapkv", "pyramidkv", "protokv"};
  std::vector<int64_t> budgets = {64, 256};
  int64_t prompt_len = 1024;
  int64_t continuation = 32;
  uint64_t seed = 1;
  bool progress = true;
};

struct DemoReport {
  SyntheticModelSpec model;
  FidelityReport fidelity;
};

DemoReport run_demo(const DemoOptions& options);
// The comparison table plus the SYNTHETIC labels and how to run the same on a real model.
std::string render_demo(const DemoReport& report);
nlohmann::json demo_json(const DemoReport& report);

}  // namespace protokv::eval
