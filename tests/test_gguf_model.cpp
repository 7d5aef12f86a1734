// SPDX-License-Identifier: Apache-2.0
// Llama models through GGUF: random models written and read back, the loader's checks of keys
// and tensors, export to every type, and the synthetic vocabulary.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <unordered_set>

#include "model/gguf_export.h"
#include "model/gguf_names.h"
#include "model/loaders.h"
#include "model/random_model.h"
#include "protokv/engine.h"
#include "protokv/error.h"
#include "protokv/gguf.h"
#include "protokv/threads.h"
#include "protokv/tokenizer.h"
#include "test_engine_model.h"
#include "test_util.h"

namespace protokv {
namespace {

using testing::TempDir;
namespace names = gguf_names;

// Small, but with GQA and an FFN width (80) that is not a multiple of the Q8_0 block.
ModelConfig small_config() {
  ModelConfig c = testing::tiny_config();
  c.hidden_dim = 80;
  return c;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void expect_same_config(const ModelConfig& a, const ModelConfig& b) {
  EXPECT_EQ(a.architecture, b.architecture);
  EXPECT_EQ(a.dim, b.dim);
  EXPECT_EQ(a.hidden_dim, b.hidden_dim);
  EXPECT_EQ(a.n_layers, b.n_layers);
  EXPECT_EQ(a.n_heads, b.n_heads);
  EXPECT_EQ(a.n_kv_heads, b.n_kv_heads);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.context_length, b.context_length);
  EXPECT_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.norm_eps, b.norm_eps);
  EXPECT_EQ(a.rope_neox, b.rope_neox);
  EXPECT_EQ(a.shared_classifier, b.shared_classifier);
}

// Every tensor of `actual` holds the bytes of `expected`'s F32 values stored as
// storage_type(spec, requested).
void expect_weights_stored_as(const ModelWeights& actual, const ModelWeights& expected,
                              DType requested) {
  for (const auto& spec : tensor_specs(expected.config, /*with_optional=*/false)) {
    const WeightMatrix a = tensor_view(actual, spec);
    const WeightMatrix e = tensor_view(expected, spec);
    ASSERT_EQ(e.type, DType::F32);
    // Norm vectors are always F32 once loaded.
    const DType stored = spec.is_vector() ? DType::F32 : storage_type(spec, requested);
    ASSERT_EQ(a.type, stored) << spec.name;
    ASSERT_EQ(a.rows, e.rows) << spec.name;
    ASSERT_EQ(a.cols, e.cols) << spec.name;
    std::vector<char> row(dtype_row_bytes(stored, e.cols));
    for (int64_t r = 0; r < e.rows; ++r) {
      quantize_row(stored, static_cast<const float*>(e.row(r)), row.data(), e.cols);
      ASSERT_EQ(std::memcmp(a.row(r), row.data(), row.size()), 0) << spec.name << " row " << r;
    }
  }
}

TEST(RandomModel, F32FileHoldsExactlyTheInMemoryWeights) {
  TempDir dir;
  RandomModelOptions options;
  options.config = small_config();
  options.seed = 7;
  const auto path = (dir / "m.gguf").string();
  const auto notes = write_random_model(options, path);
  EXPECT_TRUE(notes.empty());

  const LoadedModel loaded = load_gguf_model(path);
  EXPECT_EQ(loaded.format, "gguf");
  EXPECT_EQ(loaded.path, path);
  expect_same_config(loaded.weights.config, options.config);
  ASSERT_NE(loaded.tokenizer, nullptr);
  EXPECT_EQ(loaded.tokenizer->vocab_size(), 300);
  EXPECT_EQ(loaded.tokenizer->bos_id(), 1);
  EXPECT_EQ(loaded.tokenizer->eos_id(), 2);
  EXPECT_EQ(loaded.tokenizer->unk_id(), 0);
  const ModelWeights expected = random_model_weights(options.config, 7);
  expect_weights_stored_as(loaded.weights, expected, DType::F32);
  EXPECT_EQ(loaded.weights.parameter_count(), expected.parameter_count());
  EXPECT_EQ(loaded.weights.weight_bytes(), expected.weight_bytes());

  // Weights are views into the mapping, not copies.
  const GgufFile file = GgufFile::open(path);
  const ModelWeights w = weights_from_gguf(file);
  EXPECT_EQ(w.layers[1].wk.data, file.find_tensor("blk.1.attn_k.weight")->data);
}

TEST(RandomModel, EveryTypeStoresTheQuantisedF32Values) {
  TempDir dir;
  const ModelConfig c = small_config();
  const ModelWeights expected = random_model_weights(c, 3);
  for (DType type : {DType::F16, DType::BF16, DType::Q8_0}) {
    SCOPED_TRACE(std::string(dtype_name(type)));
    RandomModelOptions options;
    options.config = c;
    options.seed = 3;
    options.type = type;
    const auto path = (dir / fmt::format("m_{}.gguf", dtype_name(type))).string();
    const auto notes = write_random_model(options, path);
    const GgufFile file = GgufFile::open(path);
    expect_weights_stored_as(weights_from_gguf(file), expected, type);
    if (type == DType::Q8_0) {
      // ffn_down rows are 80 wide: one f16 fallback per layer, and said so.
      ASSERT_EQ(notes.size(), 2u);
      EXPECT_NE(notes[0].find("blk.0.ffn_down.weight"), std::string::npos) << notes[0];
      EXPECT_EQ(file.find_tensor("blk.1.ffn_down.weight")->type, DType::F16);
      EXPECT_EQ(file.find_tensor("blk.1.ffn_up.weight")->type, DType::Q8_0);
      EXPECT_EQ(file.get_int(std::string(names::kFileType)), 7);  // LLAMA_FTYPE_MOSTLY_Q8_0
      EXPECT_EQ(file.get_int(std::string(names::kQuantizationVersion)), 2);
    } else {
      EXPECT_TRUE(notes.empty());
    }
  }
}

TEST(RandomModel, BytesDoNotDependOnTheThreadCount) {
  TempDir dir;
  const int saved = num_threads();
  RandomModelOptions options;
  options.config = small_config();
  options.type = DType::Q8_0;
  set_threads(1);
  write_random_model(options, (dir / "one.gguf").string());
  set_threads(2);
  write_random_model(options, (dir / "two.gguf").string());
  set_threads(saved);
  EXPECT_EQ(slurp((dir / "one.gguf").string()), slurp((dir / "two.gguf").string()));
}

TEST(RandomModel, SeedsGiveDifferentWeights) {
  const ModelConfig c = small_config();
  const ModelWeights a = random_model_weights(c, 1), b = random_model_weights(c, 2);
  const ModelWeights a2 = random_model_weights(c, 1);
  EXPECT_NE(std::memcmp(a.layers[0].wq.data, b.layers[0].wq.data, a.layers[0].wq.bytes()), 0);
  EXPECT_EQ(std::memcmp(a.layers[0].wq.data, a2.layers[0].wq.data, a.layers[0].wq.bytes()), 0);
  // Different tensors of one model are different streams.
  EXPECT_NE(std::memcmp(a.layers[0].wk.data, a.layers[0].wv.data, a.layers[0].wk.bytes()), 0);
}

// Sample mean and standard deviation of a matrix.
std::pair<double, double> moments(const WeightMatrix& m) {
  const auto* x = static_cast<const float*>(m.data);
  const int64_t n = m.rows * m.cols;
  double sum = 0, sum_sq = 0;
  for (int64_t i = 0; i < n; ++i) {
    sum += x[i];
    sum_sq += double{x[i]} * x[i];
  }
  const double mean = sum / static_cast<double>(n);
  return {mean, std::sqrt(sum_sq / static_cast<double>(n) - mean * mean)};
}

TEST(RandomModel, WeightScalesFollowTheDocumentedInitialisation) {
  ModelConfig c = small_config();
  c.dim = 256;
  c.hidden_dim = 512;
  c.n_heads = 8;
  c.n_kv_heads = 8;
  c.n_layers = 8;
  c.vocab_size = 1000;
  const ModelWeights w = random_model_weights(c, 11);
  auto check = [](const WeightMatrix& m, double expected_sd, const char* what) {
    const auto [mean, sd] = moments(m);
    EXPECT_NEAR(mean, 0.0, 0.05 * expected_sd) << what;
    EXPECT_NEAR(sd, expected_sd, 0.03 * expected_sd) << what;
  };
  check(w.token_embd, 1.0, "token_embd");
  check(w.output, 1.0 / 16.0, "output");  // 1/sqrt(dim)
  check(w.layers[3].wq, 1.0 / 16.0, "wq");
  check(w.layers[3].w_up, 1.0 / 16.0, "w_up");
  check(w.layers[3].wo, 1.0 / 16.0 / 4.0, "wo");  // * 1/sqrt(2 * 8 layers)
  check(w.layers[3].w_down, 1.0 / std::sqrt(512.0) / 4.0, "w_down");
  for (int i = 0; i < c.dim; ++i) ASSERT_EQ(w.layers[5].ffn_norm[i], 1.0f);
  for (int i = 0; i < c.dim; ++i) ASSERT_EQ(w.output_norm[i], 1.0f);
}

TEST(RandomModel, RejectsBadShapesWithOneLine) {
  auto error_of = [](ModelConfig c, DType type = DType::F32) {
    RandomModelOptions options;
    options.config = c;
    options.type = type;
    try {
      validate_random_model(options);
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
      return std::string(e.what());
    }
    return std::string("no error");
  };
  ModelConfig c = small_config();
  EXPECT_EQ(error_of(c), "no error");
  c.n_heads = 3;
  EXPECT_NE(error_of(c).find("head count 3"), std::string::npos);
  c = small_config();
  c.n_kv_heads = 3;
  EXPECT_NE(error_of(c).find("KV head count 3"), std::string::npos);
  c = small_config();
  c.dim = 36;  // head dim 9
  EXPECT_NE(error_of(c).find("must be even"), std::string::npos);
  c = small_config();
  c.vocab_size = 258;
  EXPECT_NE(error_of(c).find("at least 259"), std::string::npos);
  c = small_config();
  c.dim = -64;
  EXPECT_NE(error_of(c).find("embedding length -64"), std::string::npos);
  c = small_config();
  c.dim = 65536;
  c.n_heads = 64;
  c.n_kv_heads = 64;
  c.hidden_dim = 200000;
  c.n_layers = 100;
  EXPECT_NE(error_of(c).find("GiB (limit 64 GiB)"), std::string::npos);
}

TEST(SyntheticVocab, LayoutIdsAndUniqueness) {
  for (int size : {259, 260, 300, 2000, 50000}) {
    const SyntheticVocab v = synthetic_vocab(size);
    ASSERT_EQ(v.pieces.size(), static_cast<size_t>(size));
    ASSERT_EQ(v.scores.size(), v.pieces.size());
    ASSERT_EQ(v.types.size(), v.pieces.size());
    EXPECT_EQ(v.pieces[0], "<unk>");
    EXPECT_EQ(v.pieces[1], "<s>");
    EXPECT_EQ(v.pieces[2], "</s>");
    EXPECT_EQ(v.types[0], Tokenizer::kUnknown);
    EXPECT_EQ(v.types[1], Tokenizer::kControl);
    EXPECT_EQ(v.types[2], Tokenizer::kControl);
    EXPECT_EQ(v.pieces[3], "<0x00>");
    EXPECT_EQ(v.pieces[3 + 0x0A], "<0x0A>");
    EXPECT_EQ(v.pieces[258], "<0xFF>");
    for (int i = 3; i < 259; ++i) ASSERT_EQ(v.types[static_cast<size_t>(i)], Tokenizer::kByte);
    for (int i = 259; i < size; ++i) {
      ASSERT_EQ(v.types[static_cast<size_t>(i)], Tokenizer::kNormal);
      if (i > 259) {
        ASSERT_LT(v.scores[static_cast<size_t>(i)], v.scores[static_cast<size_t>(i - 1)]);
      }
    }
    const std::unordered_set<std::string> unique(v.pieces.begin(), v.pieces.end());
    EXPECT_EQ(unique.size(), v.pieces.size());
    if (size > 259) {
      EXPECT_EQ(v.pieces[259], "\xe2\x96\x81");
    }
  }
  const SyntheticVocab v = synthetic_vocab(5000);
  const std::unordered_set<std::string> pieces(v.pieces.begin(), v.pieces.end());
  for (const char* p : {"a", "Z",
                        "\xe2\x96\x81"
                        "a",
                        "th",
                        "\xe2\x96\x81"
                        "th",
                        "\xe2\x96\x81"
                        "the",
                        "\xe2\x96\x81"
                        "little"}) {
    EXPECT_TRUE(pieces.count(p)) << p;
  }
  EXPECT_THROW(synthetic_vocab(258), Error);
}

TEST(SyntheticVocab, TextRoundTripsThroughTheTokenizer) {
  const auto tok = synthetic_tokenizer(2000);
  for (const std::string text :
       {"Once upon a time, there was a little girl named Lily.", "the THE tHe 123 !?",
        "caf\xc3\xa9 \xe2\x9c\x93 na\xc3\xafve\nnew line\ttab", "double  spaces"}) {
    const auto ids = tok->encode(text, /*add_bos=*/true);
    ASSERT_FALSE(ids.empty());
    EXPECT_EQ(ids[0], 1);
    for (int32_t id : ids) ASSERT_TRUE(id >= 0 && id < 2000);
    EXPECT_EQ(tok->decode(ids), text);
  }
  // Common words become single pieces rather than bytes.
  const auto ids = tok->encode("the", false);
  EXPECT_EQ(ids.size(), 1u);
}

// --- the loader's checks on hand-written model files -----------------------------------------

// Writes a llama GGUF from `weights` with metadata `keys` (edited by the test) and the listed
// tensor changes.
struct ModelFile {
  ModelWeights weights;
  std::map<std::string, GgufValue> keys;
  std::string skip_tensor;
  std::string transpose_tensor;  // writes {rows, cols} instead of {cols, rows}
  DType norm_type = DType::F32;  // stores norm vectors as this type
  uint32_t alignment = 32;
  std::vector<std::pair<std::string, int64_t>> extra_f32_tensors;

  explicit ModelFile(const ModelConfig& c) : weights(random_model_weights(c, 5)) {
    auto u32 = [](int v) {
      GgufValue value;
      value.type = GgufType::kUint32;
      value.data.emplace<uint64_t>(static_cast<uint64_t>(v));
      return value;
    };
    auto f32 = [](float v) {
      GgufValue value;
      value.type = GgufType::kFloat32;
      value.data.emplace<double>(v);
      return value;
    };
    GgufValue arch;
    arch.type = GgufType::kString;
    arch.data.emplace<std::string>("llama");
    keys["general.architecture"] = arch;
    keys["llama.context_length"] = u32(c.context_length);
    keys["llama.embedding_length"] = u32(c.dim);
    keys["llama.block_count"] = u32(c.n_layers);
    keys["llama.feed_forward_length"] = u32(c.hidden_dim);
    keys["llama.attention.head_count"] = u32(c.n_heads);
    keys["llama.attention.head_count_kv"] = u32(c.n_kv_heads);
    keys["llama.rope.freq_base"] = f32(c.rope_theta);
    keys["llama.attention.layer_norm_rms_epsilon"] = f32(c.norm_eps);
  }

  std::string write(const TempDir& dir, const std::string& name) {
    GgufWriter w;
    GgufValue alignment_value;
    alignment_value.type = GgufType::kUint32;
    alignment_value.data.emplace<uint64_t>(alignment);
    w.set_value("general.alignment", alignment_value);
    for (const auto& [k, v] : keys) w.set_value(k, v);
    std::vector<std::vector<uint16_t>> converted;
    std::vector<std::vector<float>> extras;
    for (const auto& spec : tensor_specs(weights.config, /*with_optional=*/false)) {
      if (spec.name == skip_tensor) continue;
      const WeightMatrix m = tensor_view(weights, spec);
      std::vector<int64_t> dims = spec.is_vector() ? std::vector<int64_t>{spec.cols}
                                                   : std::vector<int64_t>{spec.cols, spec.rows};
      if (spec.name == transpose_tensor) std::swap(dims[0], dims[1]);
      if (spec.is_vector() && norm_type != DType::F32) {
        auto& buf = converted.emplace_back(static_cast<size_t>(spec.cols));
        quantize_row(norm_type, static_cast<const float*>(m.data), buf.data(), spec.cols);
        w.add_tensor(spec.name, dims, norm_type, buf.data(), buf.size() * 2);
      } else {
        w.add_tensor(spec.name, dims, DType::F32, m.data, m.bytes());
      }
    }
    for (const auto& [tensor, n] : extra_f32_tensors) {
      auto& buf = extras.emplace_back(static_cast<size_t>(n), 1.0f);
      w.add_tensor(tensor, {n}, DType::F32, buf.data(), buf.size() * 4);
    }
    const auto path = (dir / name).string();
    w.write(path);
    return path;
  }
};

std::string load_error(const std::string& path) {
  try {
    weights_from_gguf(GgufFile::open(path));
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
    return e.what();
  }
  return "no error";
}

TEST(GgufModel, HandWrittenFileLoadsWithDefaults) {
  TempDir dir;
  ModelFile f(small_config());
  f.keys.erase("llama.attention.head_count_kv");  // defaults to head_count
  f.keys.erase("llama.rope.freq_base");           // defaults to 10000
  f.weights.config.n_kv_heads = f.weights.config.n_heads;
  f.weights = random_model_weights(f.weights.config, 5);
  const auto path = f.write(dir, "defaults.gguf");
  const GgufFile file = GgufFile::open(path);
  const ModelWeights w = weights_from_gguf(file);
  EXPECT_EQ(w.config.n_kv_heads, 4);
  EXPECT_EQ(w.config.rope_theta, 10000.0f);
  EXPECT_FALSE(w.config.rope_neox);
  EXPECT_FALSE(w.config.shared_classifier);
  // No tokenizer keys: the model loads without one.
  EXPECT_EQ(load_gguf_model(path).tokenizer, nullptr);
}

TEST(GgufModel, MissingOutputMeansSharedClassifier) {
  TempDir dir;
  ModelFile f(small_config());
  f.skip_tensor = "output.weight";
  const GgufFile file = GgufFile::open(f.write(dir, "shared.gguf"));
  const ModelWeights w = weights_from_gguf(file);
  EXPECT_TRUE(w.config.shared_classifier);
  EXPECT_EQ(w.output.data, w.token_embd.data);
  EXPECT_EQ(w.output.rows, 300);
}

TEST(GgufModel, NormsStoredInOtherTypesBecomeOwnedF32) {
  TempDir dir;
  ModelFile f(small_config());
  f.norm_type = DType::F16;
  // Non-trivial norm values so the conversion is visible.
  auto* norm = const_cast<float*>(f.weights.layers[1].ffn_norm);
  for (int i = 0; i < 64; ++i) norm[i] = 0.5f + 0.001f * static_cast<float>(i);
  const auto path = f.write(dir, "f16norms.gguf");
  ModelWeights w;
  {
    const GgufFile file = GgufFile::open(path);
    w = weights_from_gguf(file);
  }  // the file object is gone; the mapping and the converted norms live on in storage
  for (int i = 0; i < 64; ++i) {
    EXPECT_EQ(w.layers[1].ffn_norm[i], f16_to_f32(f32_to_f16(norm[i])));
  }
  EXPECT_EQ(w.output_norm[3], 1.0f);
}

TEST(GgufModel, MisalignedTensorsAreCopiedToAlignedMemory) {
  TempDir dir;
  ModelFile f(small_config());
  f.alignment = 1;  // legal; tensors then start at arbitrary byte offsets
  // Grow a string key until the header length, and so every tensor, is not 4-byte aligned.
  std::optional<GgufFile> file;
  bool any_misaligned = false;
  for (std::string name = "o"; !any_misaligned && name.size() <= 4; name += "o") {
    f.keys["general.name"].type = GgufType::kString;
    f.keys["general.name"].data.emplace<std::string>(name);
    file = GgufFile::open(f.write(dir, "packed.gguf"));
    for (const auto& t : file->tensors()) {
      any_misaligned |= reinterpret_cast<uintptr_t>(t.data) % 4 != 0;
    }
  }
  ASSERT_TRUE(any_misaligned) << "test setup: expected a misaligned tensor";
  const ModelWeights w = weights_from_gguf(*file);
  const ModelWeights expected = random_model_weights(small_config(), 5);
  for (const auto& spec : tensor_specs(expected.config, /*with_optional=*/false)) {
    const WeightMatrix a = tensor_view(w, spec);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data) % 4, 0u) << spec.name;
    EXPECT_EQ(std::memcmp(a.data, tensor_view(expected, spec).data, a.bytes()), 0) << spec.name;
  }
}

TEST(GgufModel, MissingKeysAndTensorsAreNamed) {
  TempDir dir;
  for (const char* key : {"llama.embedding_length", "llama.block_count", "llama.context_length",
                          "llama.feed_forward_length", "llama.attention.head_count",
                          "llama.attention.layer_norm_rms_epsilon"}) {
    ModelFile f(small_config());
    f.keys.erase(key);
    EXPECT_NE(load_error(f.write(dir, "k.gguf")).find(key), std::string::npos) << key;
  }
  for (const char* tensor : {"token_embd.weight", "output_norm.weight", "blk.1.attn_v.weight",
                             "blk.0.ffn_gate.weight", "blk.1.ffn_norm.weight"}) {
    ModelFile f(small_config());
    f.skip_tensor = tensor;
    const std::string error = load_error(f.write(dir, "t.gguf"));
    EXPECT_NE(error.find(tensor), std::string::npos) << error;
  }
  ModelFile none(small_config());
  none.keys.erase("general.architecture");
  EXPECT_NE(load_error(none.write(dir, "a.gguf")).find("general.architecture"), std::string::npos);
}

TEST(GgufModel, WrongShapesAndValuesAreRejected) {
  TempDir dir;
  {
    ModelFile f(small_config());
    f.transpose_tensor = "blk.0.attn_k.weight";  // [32 rows, 64 cols]: not square
    const std::string error = load_error(f.write(dir, "s.gguf"));
    EXPECT_NE(error.find("blk.0.attn_k.weight has shape 32x64 but the model needs 64x32"),
              std::string::npos)
        << error;
  }
  {
    ModelFile f(small_config());
    f.keys["llama.block_count"].data.emplace<uint64_t>(3);  // one more block than present
    EXPECT_NE(load_error(f.write(dir, "b.gguf")).find("blk.2."), std::string::npos);
  }
  {
    ModelFile f(small_config());
    f.keys["llama.attention.head_count"].data.emplace<uint64_t>(5);
    EXPECT_NE(load_error(f.write(dir, "h.gguf")).find("head count 5"), std::string::npos);
  }
  {
    ModelFile f(small_config());
    f.keys["general.architecture"].data.emplace<std::string>("gpt2");
    const std::string error = load_error(f.write(dir, "q.gguf"));
    EXPECT_NE(error.find("unsupported model architecture 'gpt2'"), std::string::npos) << error;
  }
  {
    ModelFile f(small_config());
    f.keys["llama.embedding_length"].type = GgufType::kString;
    f.keys["llama.embedding_length"].data.emplace<std::string>("64");
    EXPECT_NE(load_error(f.write(dir, "t.gguf")).find("expected an integer"), std::string::npos);
  }
  {
    ModelFile f(small_config());
    f.keys["llama.rope.dimension_count"] = f.keys["llama.block_count"];
    f.keys["llama.rope.dimension_count"].data.emplace<uint64_t>(3);  // partial RoPE must be even
    EXPECT_NE(
        load_error(f.write(dir, "r.gguf")).find("llama.rope.dimension_count = 3 must be even"),
        std::string::npos);
  }
  {
    ModelFile f(small_config());
    f.keys["llama.vocab_size"] = f.keys["llama.context_length"];  // 128 != 300 rows
    EXPECT_NE(load_error(f.write(dir, "v.gguf")).find("disagrees"), std::string::npos);
  }
  {
    ModelFile f(small_config());
    f.extra_f32_tensors.emplace_back("rope_freqs.weight", 5);  // head dim 16: 8 pairs
    EXPECT_NE(load_error(f.write(dir, "f.gguf")).find("rope_freqs.weight has shape 5"),
              std::string::npos);
  }
}

TEST(GgufModel, TokenizerMustMatchTheVocabulary) {
  TempDir dir;
  ModelFile f(small_config());
  const auto path = f.write(dir, "tok.gguf");
  // Rewrite with a tokenizer one token longer than the embedding.
  GgufWriter w;
  const GgufFile original = GgufFile::open(path);
  for (const auto& [k, v] : original.metadata()) w.set_value(k, v);
  synthetic_tokenizer(301)->write_gguf(w);
  for (const auto& t : original.tensors()) w.add_tensor(t.name, t.dims, t.type, t.data, t.nbytes);
  const auto bad = (dir / "bad.gguf").string();
  w.write(bad);
  try {
    load_gguf_model(bad);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer has 301 tokens"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
  }
}

TEST(GgufExport, RoundTripsInEveryType) {
  TempDir dir;
  ModelConfig c = small_config();
  c.shared_classifier = true;
  const ModelWeights w = random_model_weights(c, 9);
  const auto tok = synthetic_tokenizer(c.vocab_size);
  for (DType type : {DType::F32, DType::F16, DType::BF16, DType::Q8_0}) {
    SCOPED_TRACE(std::string(dtype_name(type)));
    GgufExportOptions options;
    options.type = type;
    options.name = "exported";
    const auto path = (dir / "e.gguf").string();
    const auto notes = export_gguf(w, tok.get(), path, options);
    EXPECT_EQ(notes.size(), type == DType::Q8_0 ? 2u : 0u);
    const GgufFile file = GgufFile::open(path);
    EXPECT_EQ(file.get_string("general.name"), "exported");
    EXPECT_EQ(file.find_tensor("output.weight"), nullptr);  // shared classifier
    const ModelWeights back = weights_from_gguf(file);
    expect_same_config(back.config, c);
    expect_weights_stored_as(back, w, type);
    // Re-exporting what was loaded reproduces the file byte for byte.
    const auto again = (dir / "again.gguf").string();
    export_gguf(back, tok.get(), again, options);
    EXPECT_EQ(slurp(path), slurp(again));
  }
}

// Optional tensors of the table (q/k/v biases) travel through export and loading: a model with
// biases never loses them silently.
TEST(GgufExport, BiasesRoundTrip) {
  TempDir dir;
  const ModelConfig c = small_config();
  ModelWeights w = random_model_weights(c, 4);
  const size_t bytes_without = w.weight_bytes();
  const int64_t params_without = w.parameter_count();
  int64_t bias_values = 0;
  for (auto& layer : w.layers) {
    for (const float** bias : {&layer.bq, &layer.bk, &layer.bv}) {
      const int64_t n = (bias == &layer.bq ? c.n_heads : c.n_kv_heads) * c.head_dim();
      auto values = std::make_shared<std::vector<float>>(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) (*values)[static_cast<size_t>(i)] = 0.01f * (i % 7) - 0.03f;
      *bias = values->data();
      w.storage.push_back(values);
      bias_values += n;
    }
  }
  EXPECT_EQ(w.parameter_count(), params_without + bias_values);
  EXPECT_EQ(w.weight_bytes(), bytes_without + static_cast<size_t>(bias_values) * 4);

  const auto path = (dir / "b.gguf").string();
  export_gguf(w, nullptr, path, {});
  const GgufFile file = GgufFile::open(path);
  ASSERT_NE(file.find_tensor("blk.1.attn_k.bias"), nullptr);
  const ModelWeights back = weights_from_gguf(file);
  for (size_t l = 0; l < w.layers.size(); ++l) {
    ASSERT_NE(back.layers[l].bq, nullptr);
    ASSERT_NE(back.layers[l].bv, nullptr);
    EXPECT_EQ(std::memcmp(back.layers[l].bk, w.layers[l].bk,
                          static_cast<size_t>(c.n_kv_heads * c.head_dim()) * 4),
              0);
  }
  EXPECT_EQ(back.parameter_count(), w.parameter_count());
  // The biases are used: the same logits as the in-memory model, different ones without them.
  const std::vector<int32_t> tokens = {1, 50, 7, 99};
  const ModelWeights no_biases = random_model_weights(c, 4);
  Session a(w), b(back), plain(no_biases);
  const auto in_memory = a.prefill(tokens);
  const std::vector<float> expected(in_memory.begin(), in_memory.end());
  const auto loaded = b.prefill(tokens);
  EXPECT_TRUE(std::equal(expected.begin(), expected.end(), loaded.begin()));
  const auto without = plain.prefill(tokens);
  EXPECT_FALSE(std::equal(expected.begin(), expected.end(), without.begin()));

  // Optional means per tensor: a layer without one bias exports without it.
  ModelWeights partial_weights = back;
  partial_weights.layers[0].bk = nullptr;
  export_gguf(partial_weights, nullptr, path, {});
  const GgufFile partial = GgufFile::open(path);
  EXPECT_EQ(partial.find_tensor("blk.0.attn_k.bias"), nullptr);
  EXPECT_NE(partial.find_tensor("blk.1.attn_k.bias"), nullptr);
}

TEST(GgufExport, WritesTheKeysLlamaCppRequires) {
  TempDir dir;
  RandomModelOptions options;
  options.config = small_config();
  const auto path = (dir / "m.gguf").string();
  write_random_model(options, path);
  const GgufFile f = GgufFile::open(path);
  // llama.cpp checks these types exactly: u32 hyper-parameters and ids, f32 floats.
  for (const char* key : {"llama.context_length", "llama.embedding_length", "llama.block_count",
                          "llama.feed_forward_length", "llama.rope.dimension_count",
                          "llama.attention.head_count", "llama.attention.head_count_kv",
                          "general.alignment", "general.file_type", "tokenizer.ggml.bos_token_id",
                          "tokenizer.ggml.eos_token_id", "tokenizer.ggml.unknown_token_id"}) {
    ASSERT_TRUE(f.has(key)) << key;
    EXPECT_EQ(f.metadata().at(key).type, GgufType::kUint32) << key;
  }
  for (const char* key : {"llama.rope.freq_base", "llama.attention.layer_norm_rms_epsilon"}) {
    ASSERT_TRUE(f.has(key)) << key;
    EXPECT_EQ(f.metadata().at(key).type, GgufType::kFloat32) << key;
  }
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.get_string("tokenizer.ggml.model"), "llama");
  EXPECT_EQ(f.get_int("llama.rope.dimension_count"), 16);
  EXPECT_EQ(f.get_string_array("tokenizer.ggml.tokens")->size(), 300u);
  EXPECT_EQ(f.get_float_array("tokenizer.ggml.scores")->size(), 300u);
  EXPECT_EQ(f.get_int_array("tokenizer.ggml.token_type")->at(3), Tokenizer::kByte);
  // Tensor offsets are consecutive padded sizes, as ggml's reader insists.
  uint64_t expected_offset = 0;
  for (const auto& t : f.tensors()) {
    EXPECT_EQ(t.offset, expected_offset) << t.name;
    expected_offset += (t.nbytes + 31) / 32 * 32;
  }
}

TEST(GgufExport, Stories260KConvertsToTheSameF32Weights) {
  PROTOKV_REQUIRE_STORIES();
  TempDir dir;
  const auto bin = (testing::stories_dir() / "stories260K.bin").string();
  const auto tok = (testing::stories_dir() / "tok512.bin").string();
  const LoadedModel original = load_model(bin, tok);
  const auto path = (dir / "stories.gguf").string();
  const auto notes = export_gguf(original.weights, original.tokenizer.get(), path, {});
  EXPECT_TRUE(notes.empty());
  const GgufFile file = GgufFile::open(path);
  const ModelWeights converted = weights_from_gguf(file);
  expect_same_config(converted.config, original.weights.config);
  for (const auto& spec : tensor_specs(original.weights.config, /*with_optional=*/false)) {
    const WeightMatrix a = tensor_view(converted, spec);
    const WeightMatrix e = tensor_view(original.weights, spec);
    ASSERT_EQ(a.type, DType::F32);
    ASSERT_EQ(a.bytes(), e.bytes());
    EXPECT_EQ(std::memcmp(a.data, e.data, a.bytes()), 0) << spec.name;
  }
  const LoadedModel loaded = load_model(path);
  ASSERT_NE(loaded.tokenizer, nullptr);
  EXPECT_EQ(loaded.tokenizer->pieces(), original.tokenizer->pieces());
  EXPECT_EQ(loaded.tokenizer->scores(), original.tokenizer->scores());
  EXPECT_EQ(loaded.tokenizer->types(), original.tokenizer->types());
}

}  // namespace
}  // namespace protokv
