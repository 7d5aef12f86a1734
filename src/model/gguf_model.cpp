// SPDX-License-Identifier: Apache-2.0
// Llama-family weights from a GGUF file. Matrices point into the mapping; only norm vectors not
// stored as F32 (and tensors the file leaves misaligned for their type) are copied.
#include <fmt/ranges.h>

#include <cmath>
#include <cstring>
#include <unordered_set>
#include <vector>

#include "model/gguf_names.h"
#include "model/loaders.h"
#include "model/tensor_table.h"
#include "protokv/error.h"
#include "protokv/gguf.h"
#include "protokv/tokenizer.h"

namespace protokv {
namespace {

namespace names = gguf_names;

struct ConfigReader {
  const GgufFile& file;
  const std::string& arch;

  int64_t required_int(std::string_view suffix) const {
    const std::string key = names::arch_key(arch, suffix);
    const auto v = file.get_int(key);
    if (!v) fail("GGUF model lacks required key {}", key);
    return *v;
  }
  std::optional<int64_t> optional_int(std::string_view suffix) const {
    return file.get_int(names::arch_key(arch, suffix));
  }
  std::optional<double> optional_float(std::string_view suffix) const {
    return file.get_float(names::arch_key(arch, suffix));
  }
};

// Hyper-parameters are ints in ModelConfig; anything beyond int range is absurd anyway.
int to_int(int64_t v, std::string_view what) {
  PROTOKV_CHECK(v > 0 && v <= (int64_t{1} << 30), "invalid {} {} in GGUF model", what, v);
  return static_cast<int>(v);
}

}  // namespace

// Gemma 3's hyper-parameters beyond the Llama block, as llama.cpp's llama_model_gemma3 reads them:
// embeddings scaled by sqrt(dim), GeGLU, the query scale, sliding-window layers (a period, 6 by
// default: layer l is local unless l % 6 == 5, or one flag per layer), their own RoPE base
// (10000 by default) and optional final-logit soft-capping.
void read_gemma3_gguf_config(const GgufFile& file, ModelConfig& c) {
  const ConfigReader r{file, c.architecture};
  set_architecture_constants(c);  // embeddings x sqrt(dim), GeGLU
  // gemma_pytorch config.py: the 27B model scales queries by 1/sqrt(dim / n_heads), the others by
  // 1/sqrt(head_dim) (llama.cpp identifies the 27B model by its 62 layers).
  constexpr int kGemma3_27bLayers = 62;
  const int width_per_head = c.dim / c.n_heads;  // integer, as gemma_pytorch's `//`
  if (c.n_layers == kGemma3_27bLayers && width_per_head != c.head_dim())
    c.attention_scale = 1.0f / std::sqrt(static_cast<float>(width_per_head));
  const std::string attn_softcap_key =
      names::arch_key(c.architecture, names::kAttnLogitSoftcapping);
  PROTOKV_CHECK(!r.optional_float(names::kAttnLogitSoftcapping).value_or(0.0),
                "{} is not supported (llama.cpp's gemma3 ignores it too)", attn_softcap_key);
  if (const auto softcap = r.optional_float(names::kFinalLogitSoftcapping)) {
    PROTOKV_CHECK(*softcap >= 0.0 && *softcap < 1e6, "invalid {} {}",
                  names::arch_key(c.architecture, names::kFinalLogitSoftcapping), *softcap);
    c.final_logit_softcap = static_cast<float>(*softcap);
  }
  const auto window = r.optional_int(names::kSlidingWindow);
  if (!window || *window <= 0) return;  // no sliding window: every layer is global
  const std::string window_key = names::arch_key(c.architecture, names::kSlidingWindow);
  c.sliding_window = to_int(*window, window_key);
  c.rope_theta_local =
      static_cast<float>(r.optional_float(names::kRopeFreqBaseSwa).value_or(10000.0));
  PROTOKV_CHECK(c.rope_theta_local > 0.0f, "invalid {} {}",
                names::arch_key(c.architecture, names::kRopeFreqBaseSwa), c.rope_theta_local);
  const std::string pattern_key = names::arch_key(c.architecture, names::kSlidingWindowPattern);
  c.local_layers.assign(static_cast<size_t>(c.n_layers), 0);
  if (file.has(pattern_key) && !file.get_int(pattern_key)) {
    const std::vector<int64_t> flags = *file.get_int_array(pattern_key);
    PROTOKV_CHECK(static_cast<int>(flags.size()) == c.n_layers, "{} has {} entries for {} layers",
                  pattern_key, flags.size(), c.n_layers);
    for (int l = 0; l < c.n_layers; ++l) c.local_layers[static_cast<size_t>(l)] = flags[l] != 0;
    return;
  }
  constexpr int64_t kGemma3Period = 6;
  const int64_t period = file.get_int(pattern_key).value_or(kGemma3Period);
  PROTOKV_CHECK(period >= 0 && period <= c.n_layers + 1, "invalid {} {}", pattern_key, period);
  c.local_layers = sliding_window_pattern(c.n_layers, static_cast<int>(period));
}

namespace {

ModelConfig read_config(const GgufFile& file) {
  const auto arch = file.get_string(std::string(names::kArchitecture));
  if (!arch) fail("GGUF file has no {} key: not a model", names::kArchitecture);
  const Architecture& architecture_row = architecture(*arch);  // throws for any other
  ConfigReader r{file, *arch};
  ModelConfig c;
  c.architecture = *arch;
  c.dim = to_int(r.required_int(names::kEmbeddingLength), "embedding length");
  c.hidden_dim = to_int(r.required_int(names::kFeedForwardLength), "feed-forward length");
  c.n_layers = to_int(r.required_int(names::kBlockCount), "block count");
  c.n_heads = to_int(r.required_int(names::kHeadCount), "head count");
  c.n_kv_heads = to_int(r.optional_int(names::kHeadCountKv).value_or(c.n_heads), "KV head count");
  c.context_length = to_int(r.required_int(names::kContextLength), "context length");
  c.rope_theta = static_cast<float>(r.optional_float(names::kRopeFreqBase).value_or(10000.0));
  const auto eps = r.optional_float(names::kRmsNormEps);
  if (!eps) fail("GGUF model lacks required key {}", names::arch_key(*arch, names::kRmsNormEps));
  c.norm_eps = static_cast<float>(*eps);
  // llama.cpp's rope type of the architecture: NORM (adjacent pairs) for llama, NEOX for Qwen.
  c.rope_neox = architecture_row.rope_neox;

  // Head width: attention.key_length when present (Qwen3), else dim / n_heads, as llama.cpp.
  const std::string key_length_key = names::arch_key(*arch, names::kKeyLength);
  if (const auto key_length = r.optional_int(names::kKeyLength)) {
    c.explicit_head_dim = to_int(*key_length, key_length_key);
    const auto value_length = r.optional_int(names::kValueLength).value_or(*key_length);
    PROTOKV_CHECK(value_length == *key_length, "{} = {} differs from {} = {} (unsupported)",
                  names::arch_key(*arch, names::kValueLength), value_length, key_length_key,
                  *key_length);
  } else {
    PROTOKV_CHECK(c.dim % c.n_heads == 0,
                  "head count {} ({}) does not divide embedding length {} and there is no {}",
                  c.n_heads, names::arch_key(*arch, names::kHeadCount), c.dim, key_length_key);
  }
  if (architecture_row.q_spans_dim) {  // e.g. llama.cpp's qwen2: attn_q/attn_output [dim, dim]
    PROTOKV_CHECK(c.n_heads * c.head_dim() == c.dim, "{} needs {} x head dimension {} = {}", *arch,
                  names::arch_key(*arch, names::kHeadCount), c.head_dim(),
                  names::arch_key(*arch, names::kEmbeddingLength));
  }
  if (const auto rope_dims = r.optional_int(names::kRopeDimensionCount)) {
    const std::string key = names::arch_key(*arch, names::kRopeDimensionCount);
    c.n_rot = to_int(*rope_dims, key);
    PROTOKV_CHECK(c.n_rot % 2 == 0 && c.n_rot <= c.head_dim(),
                  "{} = {} must be even and at most the head dimension {}", key, c.n_rot,
                  c.head_dim());
    if (c.n_rot == c.head_dim()) c.n_rot = 0;  // the whole head: the default
  }

  // RoPE scaling, as llama.cpp reads it: the type defaults to linear, which with no factor is
  // no scaling; Llama 3.x's "llama3" scaling is not a key but the rope_freqs.weight tensor.
  const std::string scaling_key = names::arch_key(*arch, names::kRopeScalingType);
  const std::string scaling = file.get_string(scaling_key).value_or("linear");
  if (scaling != "none" && scaling != "linear") {
    fail(
        "RoPE scaling '{}' ({}) is not supported (supported: none, linear, and Llama 3.x "
        "rope_freqs.weight)",
        scaling, scaling_key);
  }
  if (scaling == "linear") {
    std::optional<double> factor = r.optional_float(names::kRopeScalingFactor);
    if (!factor) factor = r.optional_float(names::kRopeScaleLinear);
    if (factor && *factor != 0.0) {  // llama.cpp: factor 0 means none
      PROTOKV_CHECK(*factor >= 1.0 / 1024 && *factor <= 1024.0, "invalid {} {}",
                    names::arch_key(*arch, names::kRopeScalingFactor), *factor);
      c.rope_linear_factor = static_cast<float>(*factor);
    }
  }
  if (const auto attn_factor = r.optional_float(names::kRopeScalingAttnFactor)) {
    PROTOKV_CHECK(*attn_factor == 1.0, "{} = {} is not supported (only 1)",
                  names::arch_key(*arch, names::kRopeScalingAttnFactor), *attn_factor);
  }
  if (architecture_row.read_gguf_config != nullptr) architecture_row.read_gguf_config(file, c);
  c.rope_freq_factors = file.find_tensor(std::string(names::kRopeFreqs)) != nullptr;
  PROTOKV_CHECK(!c.rope_freq_factors || architecture_row.rope_freq_factors,
                "tensor {} is not used by architecture '{}'", names::kRopeFreqs, *arch);
  return c;
}

// The file's alignment may be smaller than the element's; kernels need natural alignment.
bool needs_aligned_copy(const GgufTensorInfo& t) {
  const size_t need = t.type == DType::F32 ? alignof(float) : alignof(uint16_t);
  return reinterpret_cast<uintptr_t>(t.data) % need != 0;
}

class TensorBinder {
 public:
  TensorBinder(const GgufFile& file, ModelWeights& weights) : file_(file), weights_(weights) {}

  const GgufTensorInfo& find(const std::string& name) const {
    const GgufTensorInfo* t = file_.find_tensor(name);
    if (!t) fail("GGUF model lacks tensor {}", name);
    return *t;
  }

  // A matrix of `rows` output features by `cols` inputs: GGUF dims {cols, rows}.
  WeightMatrix matrix(const std::string& name, int64_t rows, int64_t cols) {
    const GgufTensorInfo& t = find(name);
    check_shape(t, {cols, rows});
    WeightMatrix w;
    w.type = t.type;
    w.rows = rows;
    w.cols = cols;
    w.data = aligned_data(t);
    return w;
  }

  // A vector of `n` F32 values (norm weights), converted when stored in another type.
  const float* vector(const std::string& name, int64_t n) {
    const GgufTensorInfo& t = find(name);
    check_shape(t, {n});
    if (t.type == DType::F32) return static_cast<const float*>(aligned_data(t));
    auto owned = std::make_shared<std::vector<float>>(static_cast<size_t>(n));
    dequantize_row(t.type, aligned_data(t), owned->data(), n);
    weights_.storage.push_back(owned);
    return owned->data();
  }

 private:
  static void check_shape(const GgufTensorInfo& t, std::vector<int64_t> expected) {
    if (t.dims != expected) {
      fail("tensor {} has shape {} but the model needs {}", t.name, fmt::join(t.dims, "x"),
           fmt::join(expected, "x"));
    }
  }

  const void* aligned_data(const GgufTensorInfo& t) {
    if (!needs_aligned_copy(t)) return t.data;
    auto copy =
        std::make_shared<std::vector<float>>((t.nbytes + sizeof(float) - 1) / sizeof(float));
    std::memcpy(copy->data(), t.data, t.nbytes);
    weights_.storage.push_back(copy);
    return copy->data();
  }

  const GgufFile& file_;
  ModelWeights& weights_;
};

}  // namespace

ModelWeights weights_from_gguf(const GgufFile& file) {
  ModelWeights w;
  w.config = read_config(file);
  ModelConfig& c = w.config;
  w.storage.push_back(file.mapping());

  const GgufTensorInfo* embd = file.find_tensor(std::string(names::kTokenEmbd));
  if (!embd) fail("GGUF model lacks tensor {}", names::kTokenEmbd);
  PROTOKV_CHECK(embd->dims.size() == 2, "tensor {} must have 2 dimensions", names::kTokenEmbd);
  PROTOKV_CHECK(embd->dims[1] <= (int64_t{1} << 30), "tensor {} has an absurd vocabulary {}",
                names::kTokenEmbd, embd->dims[1]);
  c.vocab_size = static_cast<int>(embd->dims[1]);
  if (const auto v = file.get_int(names::arch_key(c.architecture, names::kVocabSize))) {
    PROTOKV_CHECK(*v == c.vocab_size, "{} = {} disagrees with {} ({} rows)",
                  names::arch_key(c.architecture, names::kVocabSize), *v, names::kTokenEmbd,
                  c.vocab_size);
  }
  c.shared_classifier = file.find_tensor(std::string(names::kOutput)) == nullptr;
  c.validate();

  w.layers.resize(static_cast<size_t>(c.n_layers));
  TensorBinder bind(file, w);
  size_t bound = 0;
  for_each_tensor(c, w, [&](const TensorSlot<ModelWeights>& t) {
    const TensorSpec& s = t.spec;
    if (!s.required() && file.find_tensor(s.name) == nullptr) return;  // optional and absent
    ++bound;
    if (s.is_vector()) {
      t.bind(bind.vector(s.name, s.cols));
    } else {
      const WeightMatrix m = bind.matrix(s.name, s.rows, s.cols);
      t.bind(m.data, m.type);
    }
  });
  if (c.shared_classifier) w.output = w.token_embd;
  // A tensor the table does not know means a model variant protokv would silently run wrong
  // (a fused attn_qkv, an output bias, a layer beyond block_count): refuse it, as llama.cpp does.
  if (bound != file.tensors().size()) {
    std::unordered_set<std::string> known;
    for (const TensorSpec& s : tensor_specs(c, /*with_optional=*/true)) known.insert(s.name);
    for (const GgufTensorInfo& t : file.tensors()) {
      PROTOKV_CHECK(known.count(t.name) != 0, "tensor {} is not part of a {} model with {} blocks",
                    t.name, c.architecture, c.n_layers);
    }
  }
  return w;
}

uint64_t gguf_model_memory_bytes(const GgufFile& file) {
  uint64_t total = 0;
  for (const GgufTensorInfo& t : file.tensors()) {
    total += t.nbytes;                               // mapped, read every token
    if (needs_aligned_copy(t)) total += t.nbytes;    // TensorBinder::aligned_data
    if (t.dims.size() == 1 && t.type != DType::F32)  // TensorBinder::vector
      total += static_cast<uint64_t>(t.dims[0]) * sizeof(float);
  }
  return total;
}

LoadedModel load_gguf_model(const std::string& path, const AvailableMemory& available) {
  const GgufFile file = GgufFile::open(path);
  // Before weights_from_gguf() makes its copies and the first token reads every weight.
  check_memory_fits(fmt::format("loading {}", path), gguf_model_memory_bytes(file), available);
  LoadedModel model;
  try {
    model.weights = weights_from_gguf(file);
    if (file.has(std::string(names::kTokenizerModel))) {
      model.tokenizer = Tokenizer::from_gguf(file);
      PROTOKV_CHECK(model.tokenizer->vocab_size() == model.weights.config.vocab_size,
                    "tokenizer has {} tokens but {} has {} rows", model.tokenizer->vocab_size(),
                    names::kTokenEmbd, model.weights.config.vocab_size);
    }
  } catch (const Error& e) {
    fail("{}: {}", path, e.what());
  }
  model.format = "gguf";
  model.path = path;
  return model;
}

}  // namespace protokv
