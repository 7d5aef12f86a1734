// SPDX-License-Identifier: Apache-2.0
// Press specs (`--press NAME:key=value,...`, `--alloc`, a request's kv_compression): parsed
// through the registry, and each accepted spec run end to end — a prefill compressed at a fuzzed
// budget and two decode steps on a small random model — so that option values the parser lets
// through (a window larger than the budget, a pool of 1, a threshold of 0) meet the press code.
//
// Input layout: line 1 the spec, line 2 the allocator (may be empty), byte after the second
// newline the budget in entries (mod 128, + 1).
#include <nlohmann/json.hpp>

#include "fuzz_target.h"
#include "model/random_model.h"
#include "model/tensor_table.h"
#include "protokv/engine.h"
#include "protokv/press_registry.h"
#include "protokv/press_spec.h"

namespace protokv::fuzz {
namespace {

// Three layers (PyramidKV's pyramid and PoD's layer blocks are not degenerate), GQA groups of
// two, a 96-token prompt: compressing and decoding take about a millisecond.
const ModelWeights& small_model() {
  static const ModelWeights weights = [] {
    ModelConfig c;
    c.architecture = "llama";
    c.dim = 32;
    set_architecture_constants(c);
    c.n_layers = 3;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.hidden_dim = 64;
    c.vocab_size = 300;
    c.context_length = 128;
    return random_model_weights(c, 7);
  }();
  return weights;
}

std::string_view next_line(std::string_view& rest) {
  const size_t end = std::min(rest.find('\n'), rest.size());
  const std::string_view line = rest.substr(0, end);
  rest.remove_prefix(std::min(end + 1, rest.size()));
  return line;
}

Outcome run(Bytes data) {
  std::string_view rest(reinterpret_cast<const char*>(data.data()), data.size());
  const std::string_view spec_text = next_line(rest);
  const std::string_view alloc = next_line(rest);
  const int64_t budget = rest.empty() ? 8 : static_cast<uint8_t>(rest[0]) % 128 + 1;
  // A spec naming a file (profile=) reads it: a trusted user's choice on the command line (the
  // server refuses it in requests); not fuzzed, so that the fuzzer does not read /dev/zero.
  if (spec_text.find("profile") != std::string_view::npos) return Outcome::kRefused;
  return accept_or_refuse([&] {
    const auto spec = PressSpec::parse(spec_text, alloc);
    (void)spec->config().dump();
    SessionOptions options;
    options.press = spec;
    options.budget.entries = budget;
    Session session(small_model(), options);
    std::vector<int32_t> prompt(96);
    for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(1 + (i * 37) % 299);
    (void)session.prefill(prompt);
    (void)session.decode(5);
    (void)session.decode(6);
  });
}

void write_seeds(const std::filesystem::path& dir, const std::filesystem::path&) {
  std::vector<std::string> specs;
  for (const std::string& name : press_names())
    specs.push_back(name + "\n\n" + "\x58");  // B = 89: room for chelsea's 81
  // Options of every method, at values small enough for the 96-token prompt.
  for (const char* spec : {
           "streaming_llm:sinks=2",
           "h2o:gqa=max,decode=1,recent=4",
           "snapkv:window=4,pool=3,pool_type=avg,gqa=sum,gqa_order=reduce_first",
           "pyramidkv:beta=4,window=4\npyramid",
           "adakv:floor=0.5,normalise=1,window=4\nadakv",
           "snapkv:window=4\nuniform",
           "protokv:prototypes=lsh,window=4,lsh_bits=4,seed=1",
           "protokv:prototypes=chunk,chunks=2,window=4",
           "clusterkv:sinks=2,clusters=4,iterations=3,recluster=16,decode_clusters=2,full_layers=1",
           "chelsea:sinks=2,recent=4,chunk=8",
           "pod:sinks=2,queries=4,tau=0.5",
       })
    specs.push_back(std::string(spec) +
                    (std::string_view(spec).find('\n') == std::string_view::npos ? "\n\n" : "\n") +
                    "\x18");
  for (size_t i = 0; i < specs.size(); ++i) write_seed(dir, "press-" + std::to_string(i), specs[i]);
}

}  // namespace

extern const Target kPressSpec = {"press_spec", "a press spec NAME:key=value,... and --alloc", run,
                                  write_seeds, [] { (void)small_model(); }};

}  // namespace protokv::fuzz
