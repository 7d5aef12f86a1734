// SPDX-License-Identifier: Apache-2.0
// Where fidelity samples come from: a text file, the model's own samples, or the SYNTHETIC
// workload.
#include <cstdint>
#include <string>
#include <vector>

#include "eval/fidelity.h"
#include "eval/synthetic.h"
#include "protokv/engine.h"
#include "protokv/error.h"
#include "protokv/sampler.h"
#include "protokv/tokenizer.h"

namespace protokv::eval {

std::vector<FidelitySample> samples_from_text(const Tokenizer& tokenizer, const std::string& text,
                                              int64_t prompt_len, int64_t continuation, int count) {
  PROTOKV_CHECK(prompt_len >= 2, "prompt length must be at least 2, got {}", prompt_len);
  PROTOKV_CHECK(count >= 1, "sample count must be at least 1, got {}", count);
  const std::vector<int32_t> tokens = tokenizer.encode(text, false);
  const int64_t need = prompt_len - 1 + continuation;  // BOS is added to every prompt
  const int64_t have = static_cast<int64_t>(tokens.size());
  PROTOKV_CHECK(have >= need,
                "the text has {} tokens; prompt-len {} (BOS included) + continuation {} need {}",
                have, prompt_len, continuation, need);
  std::vector<FidelitySample> samples;
  for (int s = 0; s < count; ++s) {
    const int64_t offset = count == 1 ? 0 : (have - need) * s / (count - 1);
    FidelitySample sample;
    sample.prompt.push_back(tokenizer.bos_id());
    sample.prompt.insert(sample.prompt.end(), tokens.begin() + offset,
                         tokens.begin() + offset + prompt_len - 1);
    sample.continuation.assign(tokens.begin() + offset + prompt_len - 1,
                               tokens.begin() + offset + need);
    sample.origin = {{"source", "text"}, {"token_offset", offset}, {"text_tokens", have}};
    samples.push_back(std::move(sample));
  }
  return samples;
}

std::vector<FidelitySample> samples_from_model(const ModelWeights& weights, int32_t bos,
                                               int32_t eos, int64_t prompt_len,
                                               int64_t continuation, int count, uint64_t seed) {
  PROTOKV_CHECK(prompt_len >= 2, "prompt length must be at least 2, got {}", prompt_len);
  PROTOKV_CHECK(count >= 1, "sample count must be at least 1, got {}", count);
  const int64_t need = prompt_len + continuation;
  const int64_t context = weights.config.context_length;
  std::vector<FidelitySample> samples;
  for (int s = 0; s < count; ++s) {
    SamplerOptions sampler_options;
    sampler_options.temperature = 1.0f;
    sampler_options.top_k = 0;
    sampler_options.top_p = 1.0f;
    sampler_options.seed = seed + static_cast<uint64_t>(s);
    Sampler sampler(sampler_options);
    std::vector<int32_t> stream;
    int stories = 0;
    while (static_cast<int64_t>(stream.size()) < need) {
      // A new story from BOS; every restart adds at least the BOS, so this terminates.
      ++stories;
      stream.push_back(bos);
      Session session(weights);
      const int32_t start[] = {bos};
      auto logits = session.prefill(start);
      while (static_cast<int64_t>(stream.size()) < need) {
        const int32_t token = sampler.sample(logits);
        if (token == eos || token == bos) break;
        stream.push_back(token);
        if (session.n_past() >= context) break;
        logits = session.decode(token);
      }
    }
    FidelitySample sample;
    sample.prompt.assign(stream.begin(), stream.begin() + prompt_len);
    sample.continuation.assign(stream.begin() + prompt_len, stream.begin() + need);
    sample.origin = {{"source", "model-sampled"},
                     {"seed", sampler_options.seed},
                     {"temperature", 1.0},
                     {"stories", stories}};
    samples.push_back(std::move(sample));
  }
  return samples;
}

std::vector<FidelitySample> samples_synthetic(int vocab_size, int64_t prompt_len, int count,
                                              uint64_t seed) {
  PROTOKV_CHECK(count >= 1, "sample count must be at least 1, got {}", count);
  std::vector<FidelitySample> samples;
  for (int s = 0; s < count; ++s) {
    FidelitySample sample;
    sample.prompt = make_synthetic_prompt(prompt_len, vocab_size, seed + static_cast<uint64_t>(s));
    sample.origin = {{"source", "SYNTHETIC workload"}, {"seed", seed + static_cast<uint64_t>(s)}};
    samples.push_back(std::move(sample));
  }
  return samples;
}
}  // namespace protokv::eval
