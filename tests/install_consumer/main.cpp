// SPDX-License-Identifier: Apache-2.0
// An outside program on the installed library's public API: loads a GGUF model, prefills a
// prompt with and without a press and prints both caches' bytes; exits 1 unless the press freed
// memory and decoding went on from the compressed cache.
#include <protokv/engine.h>
#include <protokv/error.h>
#include <protokv/model.h>
#include <protokv/press_spec.h>
#include <protokv/tokenizer.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: consumer MODEL.gguf\n");
    return 2;
  }
  try {
    const protokv::LoadedModel model = protokv::load_model(argv[1]);
    std::string text;
    for (int i = 0; i < 40; ++i) text += "The clerk kept the ledger of the harbour. ";
    const std::vector<int32_t> prompt = model.tokenizer->encode(text, /*add_bos=*/true);

    protokv::Session full(model.weights);
    full.prefill(prompt);
    protokv::SessionOptions options;
    options.press = protokv::PressSpec::parse("snapkv");
    options.budget.entries = 32;
    protokv::Session pressed(model.weights, options);
    const auto logits = pressed.prefill(prompt);
    const int32_t next =
        static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    pressed.decode(next);
    const size_t full_bytes = full.prefill_stats().kv_bytes;
    const size_t pressed_bytes = pressed.prefill_stats().kv_bytes;
    std::printf("prompt %zu tokens: full cache %zu bytes, snapkv@32 %zu bytes\n", prompt.size(),
                full_bytes, pressed_bytes);
    return pressed_bytes < full_bytes ? 0 : 1;
  } catch (const protokv::Error& e) {
    std::fprintf(stderr, "consumer: %s\n", e.what());
    return 1;
  }
}
