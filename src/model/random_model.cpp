// SPDX-License-Identifier: Apache-2.0
#include "model/random_model.h"
#include "core/parallel.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>
#include <unordered_set>

#include "core/rng.h"
#include "model/gguf_names.h"
#include "protokv/error.h"
#include "protokv/gguf.h"
#include "protokv/tokenizer.h"

namespace protokv {
namespace {

// xoshiro256** (Blackman & Vigna): fast, and plenty for weights.
class Xoshiro256 {
 public:
  explicit Xoshiro256(uint64_t seed) {
    for (auto& s : state_) s = seed = mix64(seed);
  }
  uint64_t next() {
    const uint64_t result = rotl(state_[1] * 5, 7) * 9;
    const uint64_t t = state_[1] << 17;
    state_[2] ^= state_[0];
    state_[3] ^= state_[1];
    state_[1] ^= state_[2];
    state_[0] ^= state_[3];
    state_[2] ^= t;
    state_[3] = rotl(state_[3], 45);
    return result;
  }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t state_[4];
};

// Zero mean, unit variance, approximately normal: the sum of four 16-bit uniforms (Irwin-Hall,
// n = 4, variance 4/12) from one 64-bit draw, recentred and rescaled. Cheaper than Box-Muller
// by an order of magnitude, which matters for multi-gigabyte models.
inline float approx_normal(uint64_t bits) {
  const uint64_t sum =
      (bits & 0xffff) + ((bits >> 16) & 0xffff) + ((bits >> 32) & 0xffff) + (bits >> 48);
  constexpr float kScale = 1.7320508f / 65536.0f;  // sqrt(3) / 2^16
  return (static_cast<float>(sum) + 2.0f - 2.0f * 65536.0f) * kScale;
}

float standard_deviation(const TensorSpec& spec, const ModelConfig& config) {
  const float fan_in = 1.0f / std::sqrt(static_cast<float>(spec.cols));
  const float residual = 1.0f / std::sqrt(2.0f * static_cast<float>(config.n_layers));
  switch (spec.entry->init) {
    case TensorInit::kOnes:
      return 0.0f;  // not random (random_tensor_rows fills ones)
    case TensorInit::kEmbedding:
      return 1.0f;
    case TensorInit::kResidual:
      return fan_in * residual;
    case TensorInit::kFanIn:
      return fan_in;
    case TensorInit::kBias:
      return 0.5f;
    case TensorInit::kNearOnes:
      return 0.25f;
    case TensorInit::kLlama3RopeFreqs:
      return 0.0f;  // not random (llama3_rope_freq_factors)
  }
  return fan_in;
}

// Fills `spec` stored as `type` into `dst` (threads over rows; each row has its own stream, so
// the bytes do not depend on the thread count).
void fill_tensor(const TensorSpec& spec, const ModelConfig& config, uint64_t seed, DType type,
                 void* dst) {
  const size_t row_bytes = dtype_row_bytes(type, spec.cols);
  if (type == DType::F32) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < spec.rows; ++r) {
      random_tensor_rows(spec, config, seed, r, r + 1,
                         reinterpret_cast<float*>(static_cast<char*>(dst) + r * row_bytes));
    }
    return;
  }
  ParallelErrors errors;
#pragma omp parallel
  {
    std::vector<float> row(static_cast<size_t>(spec.cols));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < spec.rows; ++r) {
      errors.run([&] {
        random_tensor_rows(spec, config, seed, r, r + 1, row.data());
        quantize_row(type, row.data(), static_cast<char*>(dst) + r * row_bytes, spec.cols);
      });
    }
  }
  errors.rethrow();
}

constexpr const char* kCommonWords[] = {
    "the",    "and",   "a",     "to",     "was",   "he",   "she",  "it",   "of",   "in",    "that",
    "is",     "his",   "her",   "with",   "for",   "on",   "you",  "they", "but",  "had",   "at",
    "not",    "be",    "this",  "are",    "as",    "have", "one",  "we",   "all",  "day",   "said",
    "so",     "there", "were",  "up",     "out",   "what", "from", "by",   "him",  "can",   "time",
    "little", "big",   "very",  "do",     "go",    "saw",  "play", "them", "when", "like",  "then",
    "could",  "would", "about", "into",   "your",  "my",   "me",   "no",   "did",  "get",   "if",
    "an",     "or",    "more",  "which",  "their", "will", "has",  "been", "who",  "some",  "other",
    "how",    "its",   "our",   "two",    "each",  "make", "over", "see",  "way",  "look",  "come",
    "first",  "now",   "find",  "long",   "down",  "good", "new",  "know", "just", "after", "back",
    "friend", "happy", "mom",   "dog",    "cat",   "tree", "ball", "park", "girl", "boy",   "once",
    "upon",   "named", "loved", "wanted", "went",  "sun",  "fun",  "sad",  "help", "home"};

const std::string kSpace = "\xe2\x96\x81";  // U+2581, SentencePiece's space

}  // namespace

void validate_random_model(const RandomModelOptions& options) {
  const ModelConfig& c = options.config;
  tensor_table(c.architecture);  // throws for an architecture protokv cannot run
  c.validate();
  PROTOKV_CHECK(c.vocab_size >= kMinSyntheticVocab,
                "vocabulary size {} is too small: the synthetic tokenizer needs at least {} "
                "(3 control + 256 byte tokens)",
                c.vocab_size, kMinSyntheticVocab);
  const uint64_t bytes = llama_file_bytes(c, options.type);
  PROTOKV_CHECK(bytes <= kMaxRandomModelBytes, "model would take {:.1f} GiB (limit {} GiB)",
                static_cast<double>(bytes) / (1u << 30), kMaxRandomModelBytes >> 30);
}

SyntheticVocab synthetic_vocab(int vocab_size) {
  PROTOKV_CHECK(vocab_size >= kMinSyntheticVocab,
                "vocabulary size {} is too small: the synthetic tokenizer needs at least {}",
                vocab_size, kMinSyntheticVocab);
  const auto target = static_cast<size_t>(vocab_size);
  SyntheticVocab v;
  v.pieces.reserve(target);
  auto add_special = [&](std::string piece, int32_t type) {
    v.pieces.push_back(std::move(piece));
    v.scores.push_back(0.0f);
    v.types.push_back(type);
  };
  add_special("<unk>", Tokenizer::kUnknown);
  add_special("<s>", Tokenizer::kControl);
  add_special("</s>", Tokenizer::kControl);
  for (int b = 0; b < 256; ++b) add_special(fmt::format("<0x{:02X}>", b), Tokenizer::kByte);

  std::unordered_set<std::string> seen(v.pieces.begin(), v.pieces.end());
  auto full = [&] { return v.pieces.size() >= target; };
  auto add = [&](const std::string& piece) {
    if (full() || !seen.insert(piece).second) return;
    // Earlier (shorter, commoner) pieces score higher, so BPE merges them first.
    v.scores.push_back(-static_cast<float>(v.pieces.size() - kMinSyntheticVocab));
    v.types.push_back(Tokenizer::kNormal);
    v.pieces.push_back(piece);
  };

  add(kSpace);
  for (char ch = 0x21; ch < 0x7f; ++ch) add(std::string(1, ch));
  for (char ch = 0x21; ch < 0x7f; ++ch) add(kSpace + ch);
  // Letter n-grams of growing length, bare and after a space, until the vocabulary is full;
  // common words join after the bigrams. Length 5 alone has 11.8M strings, more than any
  // vocabulary ModelConfig allows.
  for (int length = 2; !full(); ++length) {
    std::string gram(static_cast<size_t>(length), 'a');
    for (const bool spaced : {false, true}) {
      std::fill(gram.begin(), gram.end(), 'a');
      while (!full()) {
        add(spaced ? kSpace + gram : gram);
        int i = length - 1;  // odometer increment over a..z
        while (i >= 0 && gram[static_cast<size_t>(i)] == 'z') gram[static_cast<size_t>(i--)] = 'a';
        if (i < 0) break;
        ++gram[static_cast<size_t>(i)];
      }
    }
    if (length == 2) {
      for (const char* word : kCommonWords) add(kSpace + word);
      for (const char* word : kCommonWords) add(word);
    }
  }
  return v;
}

std::shared_ptr<Tokenizer> synthetic_tokenizer(int vocab_size) {
  SyntheticVocab v = synthetic_vocab(vocab_size);
  return std::make_shared<Tokenizer>(std::move(v.pieces), std::move(v.scores), std::move(v.types),
                                     /*bos_id=*/1, /*eos_id=*/2, /*unk_id=*/0);
}

std::vector<float> llama3_rope_freq_factors(int rope_dims, float theta,
                                            const Llama3RopeScaling& s) {
  // As llama.cpp's converter computes them (conversion/llama.py, generate_extra_tensors): pairs
  // whose wavelength is below original_context / high_freq_factor keep their frequency, those
  // above original_context / low_freq_factor are slowed by `factor`, and the band between is
  // interpolated smoothly.
  const double low_freq_wavelen = s.original_context / s.low_freq_factor;
  const double high_freq_wavelen = s.original_context / s.high_freq_factor;
  std::vector<float> factors;
  for (int i = 0; i < rope_dims; i += 2) {
    const float freq =
        1.0f / std::pow(theta, static_cast<float>(i) / static_cast<float>(rope_dims));
    const double wavelen = 2.0 * std::numbers::pi / freq;
    if (wavelen < high_freq_wavelen) {
      factors.push_back(1.0f);
    } else if (wavelen > low_freq_wavelen) {
      factors.push_back(static_cast<float>(s.factor));
    } else {
      const double smooth = (s.original_context / wavelen - s.low_freq_factor) /
                            (s.high_freq_factor - s.low_freq_factor);
      factors.push_back(static_cast<float>(1.0 / ((1.0 - smooth) / s.factor + smooth)));
    }
  }
  return factors;
}

void random_tensor_rows(const TensorSpec& spec, const ModelConfig& config, uint64_t seed,
                        int64_t row_begin, int64_t row_end, float* out) {
  const auto cols = static_cast<size_t>(spec.cols);
  if (spec.entry->init == TensorInit::kOnes) {
    std::fill(out, out + static_cast<size_t>(row_end - row_begin) * cols, 1.0f);
    return;
  }
  if (spec.entry->init == TensorInit::kLlama3RopeFreqs) {
    const std::vector<float> factors =
        llama3_rope_freq_factors(config.rope_dims(), config.rope_theta, kLlama31Rope);
    std::copy(factors.begin(), factors.end(), out);
    return;
  }
  const float offset = spec.entry->init == TensorInit::kNearOnes ? 1.0f : 0.0f;
  const float sd = standard_deviation(spec, config);
  // One stream per (seed, tensor, row); the tensor key is independent of the layer count.
  const uint64_t tensor_key = static_cast<uint64_t>(spec.layer + 1) * 64 + spec.entry->seed_key;
  const uint64_t tensor_seed = mix64(mix64(seed) ^ tensor_key);
  for (int64_t r = row_begin; r < row_end; ++r) {
    Xoshiro256 rng(mix64(tensor_seed ^ static_cast<uint64_t>(r)));
    float* row = out + static_cast<size_t>(r - row_begin) * cols;
    for (size_t j = 0; j < cols; ++j) row[j] = offset + sd * approx_normal(rng.next());
  }
}

std::vector<std::string> write_random_model(const RandomModelOptions& options,
                                            const std::string& path) {
  validate_random_model(options);
  const ModelConfig& c = options.config;
  GgufWriter writer;
  set_llama_metadata(writer, c, options.type, options.name);
  synthetic_tokenizer(c.vocab_size)->write_gguf(writer);
  for (const auto& spec : tensor_specs(c, /*with_optional=*/false)) {
    const DType type = storage_type(spec, options.type);
    std::vector<int64_t> dims = spec.is_vector() ? std::vector<int64_t>{spec.cols}
                                                 : std::vector<int64_t>{spec.cols, spec.rows};
    writer.add_tensor(spec.name, std::move(dims), type,
                      [spec, c, seed = options.seed, type](void* dst, size_t) {
                        fill_tensor(spec, c, seed, type, dst);
                      });
  }
  writer.write(path);
  return storage_notes(c, options.type);
}

ModelWeights random_model_weights(const ModelConfig& config, uint64_t seed,
                                  const RandomWeightsOptions& options) {
  config.validate();
  PROTOKV_CHECK(llama_file_bytes(config, DType::F32) <= kMaxRandomModelBytes,
                "model would take more than {} GiB", kMaxRandomModelBytes >> 30);
  ModelWeights w;
  w.config = config;
  w.layers.resize(static_cast<size_t>(config.n_layers));
  for_each_tensor(config, w, [&](const TensorSlot<ModelWeights>& t) {
    const TensorSpec& spec = t.spec;
    if (!spec.required() && !options.with_optional) return;
    auto buffer = std::make_shared<std::vector<float>>(static_cast<size_t>(spec.rows * spec.cols));
    fill_tensor(spec, config, seed, DType::F32, buffer->data());
    if (spec.entry->init == TensorInit::kOnes && options.norm_jitter != 0.0f) {
      // Its own stream (the ones of the GGUF writer stay ones): the tensor's key, negated.
      Xoshiro256 rng(mix64(
          ~(mix64(seed) ^ (static_cast<uint64_t>(spec.layer + 1) * 64 + spec.entry->seed_key))));
      for (float& x : *buffer) x += options.norm_jitter * approx_normal(rng.next());
    }
    t.bind(buffer->data());
    w.storage.push_back(std::move(buffer));
  });
  if (config.shared_classifier) w.output = w.token_embd;
  return w;
}

}  // namespace protokv
