// Llama-family weights from a GGUF file. Matrices point into the mapping; only norm vectors not
// stored as F32 (and tensors the file leaves misaligned for their type) are copied.
#include <fmt/ranges.h>

#include <cstring>
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

ModelConfig read_config(const GgufFile& file) {
  const auto arch = file.get_string(std::string(names::kArchitecture));
  if (!arch) fail("GGUF file has no {} key: not a model", names::kArchitecture);
  // TODO(qwen2): Qwen2 differs by q/k/v biases and NEOX RoPE; planned, not implemented yet.
  if (*arch != names::kArchLlama) {
    fail("unsupported model architecture '{}' (only 'llama' is supported; qwen2 is planned)",
         *arch);
  }
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
  // GGUF llama tensors are in Meta order: RoPE rotates adjacent pairs.
  c.rope_neox = false;

  if (const auto rope_dims = r.optional_int(names::kRopeDimensionCount)) {
    PROTOKV_CHECK(c.n_heads > 0 && *rope_dims == c.dim / c.n_heads,
                  "partial RoPE is not supported ({} = {}, head dimension {})",
                  names::arch_key(*arch, names::kRopeDimensionCount), *rope_dims,
                  c.n_heads > 0 ? c.dim / c.n_heads : 0);
  }
  const std::string scaling_key = names::arch_key(*arch, names::kRopeScalingType);
  if (const auto scaling = file.get_string(scaling_key); scaling && *scaling != "none") {
    fail("RoPE scaling '{}' ({}) is not supported yet", *scaling, scaling_key);
  }
  if (file.find_tensor(std::string(names::kRopeFreqs))) {
    fail("tensor {} (Llama 3.1 RoPE frequency factors) is not supported yet", names::kRopeFreqs);
  }
  return c;
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

  // The file's alignment may be smaller than the element's; kernels need natural alignment.
  const void* aligned_data(const GgufTensorInfo& t) {
    const size_t need = t.type == DType::F32 ? alignof(float) : alignof(uint16_t);
    if (reinterpret_cast<uintptr_t>(t.data) % need == 0) return t.data;
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
  for_each_tensor(c, w, [&](const TensorSlot<ModelWeights>& t) {
    const TensorSpec& s = t.spec;
    if (!s.required() && file.find_tensor(s.name) == nullptr) return;  // optional and absent
    if (s.is_vector()) {
      t.bind(bind.vector(s.name, s.cols));
    } else {
      const WeightMatrix m = bind.matrix(s.name, s.rows, s.cols);
      t.bind(m.data, m.type);
    }
  });
  if (c.shared_classifier) w.output = w.token_embd;
  return w;
}

LoadedModel load_gguf_model(const std::string& path) {
  const GgufFile file = GgufFile::open(path);
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
