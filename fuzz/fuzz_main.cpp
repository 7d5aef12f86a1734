// SPDX-License-Identifier: Apache-2.0
// The libFuzzer entry: one binary for every target, the target named by $PROTOKV_FUZZ_TARGET
// (fuzz/run.sh sets it), e.g.
//   PROTOKV_FUZZ_TARGET=gguf_model build-fuzz/protokv_fuzz -max_total_time=60 corpus/gguf_model
#include <cstdio>
#include <cstdlib>

#include "fuzz_target.h"
#include "protokv/threads.h"

namespace {
const protokv::fuzz::Target* target = nullptr;
}

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // One thread: every input runs the same code path, and libFuzzer's timeouts and coverage see
  // one stack.
  protokv::set_threads(1);
  try {
    const char* name = std::getenv("PROTOKV_FUZZ_TARGET");
    target = &protokv::fuzz::find_target(name != nullptr ? name : "");
    if (target->prepare != nullptr) target->prepare();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    std::exit(1);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)target->run(protokv::fuzz::Bytes(data, size));
  return 0;
}
