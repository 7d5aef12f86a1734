// SPDX-License-Identifier: Apache-2.0
// Hugging Face checkpoints -> GGUF (protokv convert HF_DIR): tiny random checkpoints written here
// (config.json, safetensors single and sharded, tokenizer.json, tokenizer_config.json) convert to
// files whose logits equal those of the same weights exported directly as GGUF; the safetensors
// reader and the converter reject corrupt or unsupported input with one clear error each.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <numbers>
#include <optional>
#include <random>

#include "io/safetensors.h"
#include "model/gguf_export.h"
#include "model/hf_convert.h"
#include "model/random_model.h"
#include "model/tensor_table.h"
#include "protokv/engine.h"
#include "protokv/error.h"
#include "protokv/gguf.h"
#include "protokv/tokenizer.h"
#include "test_engine_model.h"
#include "test_util.h"

namespace protokv {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::TempDir;

// --- writing safetensors ------------------------------------------------------------------------

struct RawTensor {
  std::string name;
  std::string dtype;  // "F32", "F16", "BF16", or anything for the corrupt cases
  std::vector<int64_t> shape;
  std::string bytes;
};

void write_bytes(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

std::string u64_le(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[static_cast<size_t>(i)] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

// A file with `header` as its JSON header (padded with spaces to a multiple of 8, as the
// reference writer does) followed by `data`.
std::string safetensors_bytes(std::string header, const std::string& data) {
  while (header.size() % 8 != 0) header.push_back(' ');
  return u64_le(header.size()) + header + data;
}

std::string safetensors_of(const std::vector<RawTensor>& tensors) {
  json header = json::object();
  header["__metadata__"] = {{"format", "pt"}};
  std::string data;
  for (const RawTensor& t : tensors) {
    header[t.name] = {{"dtype", t.dtype},
                      {"shape", t.shape},
                      {"data_offsets", {data.size(), data.size() + t.bytes.size()}}};
    data += t.bytes;
  }
  return safetensors_bytes(header.dump(), data);
}

std::string encode_floats(const std::vector<float>& values, const std::string& dtype) {
  std::string bytes;
  for (const float v : values) {
    if (dtype == "F32") {
      bytes.append(reinterpret_cast<const char*>(&v), 4);
    } else {
      const uint16_t h = dtype == "F16" ? f32_to_f16(v) : f32_to_bf16(v);
      bytes.append(reinterpret_cast<const char*>(&h), 2);
    }
  }
  return bytes;
}

// --- tiny Hugging Face checkpoints ------------------------------------------------------------

// The Hugging Face name of a GGUF tensor (independent of the converter's own table).
std::string hf_name(const std::string& gguf) {
  static const std::map<std::string, std::string> kSuffix = {
      {"attn_norm.weight", "input_layernorm.weight"},
      {"attn_q.weight", "self_attn.q_proj.weight"},
      {"attn_q.bias", "self_attn.q_proj.bias"},
      {"attn_k.weight", "self_attn.k_proj.weight"},
      {"attn_k.bias", "self_attn.k_proj.bias"},
      {"attn_v.weight", "self_attn.v_proj.weight"},
      {"attn_v.bias", "self_attn.v_proj.bias"},
      {"attn_output.weight", "self_attn.o_proj.weight"},
      {"attn_q_norm.weight", "self_attn.q_norm.weight"},
      {"attn_k_norm.weight", "self_attn.k_norm.weight"},
      {"ffn_norm.weight", "post_attention_layernorm.weight"},
      {"ffn_gate.weight", "mlp.gate_proj.weight"},
      {"ffn_up.weight", "mlp.up_proj.weight"},
      {"ffn_down.weight", "mlp.down_proj.weight"}};
  if (gguf == "token_embd.weight") return "model.embed_tokens.weight";
  if (gguf == "output_norm.weight") return "model.norm.weight";
  if (gguf == "output.weight") return "lm_head.weight";
  const size_t dot = gguf.find('.', 4);  // "blk.N."
  const std::string layer = gguf.substr(4, dot - 4);
  return "model.layers." + layer + "." + kSuffix.at(gguf.substr(dot + 1));
}

bool is_qk(const std::string& gguf) {
  return gguf.find("attn_q.") != std::string::npos || gguf.find("attn_k.") != std::string::npos;
}

struct CheckpointOptions {
  std::string hf_arch = "LlamaForCausalLM";
  std::string dtype = "F32";
  // Store Q/K in Hugging Face's rotate-half order, as real Llama checkpoints do; false writes the
  // GGUF order unchanged (a checkpoint the converter must then get wrong).
  bool hf_rope_order = true;
  int shards = 1;
  bool tie_word_embeddings = false;
  json extra_config = json::object();             // merged into config.json
  std::string pre_regex_numbers = "\\p{N}{1,3}";  // llama-bpe; Qwen2: "\\p{N}"
  json tokenizer_config = {{"bos_token", "<|begin_of_text|>"},
                           {"eos_token", "<|end_of_text|>"},
                           {"chat_template",
                            "{{ bos_token }}{% for m in messages %}{{ m.content }}"
                            "{% endfor %}"}};
  // Extra HF tensors: name -> (shape, values).
  std::vector<std::pair<std::string, std::pair<std::vector<int64_t>, std::vector<float>>>> extra;
};

// Writes `weights` (all F32) as a Hugging Face checkpoint folder.
void write_checkpoint(const ModelWeights& weights, const fs::path& dir,
                      const CheckpointOptions& o) {
  fs::create_directories(dir);
  const ModelConfig& c = weights.config;
  json config = {{"architectures", {o.hf_arch}},
                 {"hidden_act", "silu"},
                 {"hidden_size", c.dim},
                 {"intermediate_size", c.hidden_dim},
                 {"num_hidden_layers", c.n_layers},
                 {"num_attention_heads", c.n_heads},
                 {"num_key_value_heads", c.n_kv_heads},
                 {"vocab_size", c.vocab_size},
                 {"max_position_embeddings", c.context_length},
                 {"rms_norm_eps", c.norm_eps},
                 {"rope_theta", c.rope_theta},
                 {"tie_word_embeddings", o.tie_word_embeddings},
                 {"torch_dtype", "float32"}};
  config.merge_patch(o.extra_config);
  std::ofstream(dir / "config.json") << config.dump(2);

  std::vector<RawTensor> tensors;
  const int64_t head_dim = c.head_dim();
  for (const TensorSpec& spec : tensor_specs(c, /*with_optional=*/true)) {
    const WeightMatrix w = tensor_view(weights, spec);
    if (w.data == nullptr) continue;
    const auto* values = static_cast<const float*>(w.data);
    std::vector<float> out(values, values + spec.elements());
    if (o.hf_rope_order && c.architecture == "llama" && is_qk(spec.name)) {
      // GGUF row (head, 2i + s) is Hugging Face row (head, s * head_dim / 2 + i).
      const int64_t n_rows = spec.is_vector() ? spec.cols : spec.rows;
      const int64_t row_len = spec.is_vector() ? 1 : spec.cols;
      for (int64_t r = 0; r < n_rows; ++r) {
        const int64_t head = r / head_dim, j = r % head_dim;
        const int64_t hf_row = head * head_dim + (j % 2) * (head_dim / 2) + j / 2;
        std::copy_n(values + r * row_len, row_len, out.begin() + hf_row * row_len);
      }
    }
    const std::vector<int64_t> shape = spec.is_vector()
                                           ? std::vector<int64_t>{spec.cols}
                                           : std::vector<int64_t>{spec.rows, spec.cols};
    tensors.push_back({hf_name(spec.name), o.dtype, shape, encode_floats(out, o.dtype)});
  }
  for (const auto& [name, tensor] : o.extra) {
    tensors.push_back({name, o.dtype, tensor.first, encode_floats(tensor.second, o.dtype)});
  }

  if (o.shards == 1) {
    write_bytes(dir / "model.safetensors", safetensors_of(tensors));
  } else {
    json weight_map = json::object();
    for (int s = 0; s < o.shards; ++s) {
      const std::string file = fmt::format("model-{:05}-of-{:05}.safetensors", s + 1, o.shards);
      std::vector<RawTensor> part;
      for (size_t i = static_cast<size_t>(s); i < tensors.size(); i += o.shards) {
        part.push_back(tensors[i]);
        weight_map[tensors[i].name] = file;
      }
      write_bytes(dir / file, safetensors_of(part));
    }
    std::ofstream(dir / "model.safetensors.index.json")
        << json{{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}}.dump(2);
  }

  // A byte-level BPE tokenizer of 9 tokens (the model's vocab_size is larger: the converter pads).
  const std::string regex = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|" +
                            o.pre_regex_numbers +
                            "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
  json tokenizer = {
      {"version", "1.0"},
      {"added_tokens",
       {{{"id", 6}, {"content", "<|begin_of_text|>"}, {"special", true}},
        {{"id", 7}, {"content", "<|end_of_text|>"}, {"special", true}},
        {{"id", 8}, {"content", "<|reserved_0|>"}, {"special", false}}}},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"},
           {"pattern", {{"Regex", regex}}},
           {"behavior", "Isolated"},
           {"invert", false}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}}},
      {"model",
       {{"type", "BPE"},
        {"vocab",
         {{"a", 0},
          {"b", 1},
          {"ab", 2},
          {"\xC4\xA0", 3},
          {"\xC4\xA0"
           "a",
           4},
          {"c", 5}}},
        {"merges", {"a b", "\xC4\xA0 a"}}}}};
  std::ofstream(dir / "tokenizer.json") << tokenizer.dump(2);
  std::ofstream(dir / "tokenizer_config.json") << o.tokenizer_config.dump(2);
}

ModelConfig small_config() {
  ModelConfig c = testing::tiny_config();
  c.context_length = 64;
  return c;
}

std::vector<float> logits_of(const ModelWeights& weights) {
  const std::vector<int32_t> tokens = testing::random_tokens(12, weights.config.vocab_size, 5);
  Session session(weights);
  const auto logits = session.prefill(tokens);
  return std::vector<float>(logits.begin(), logits.end());
}

// The reference: the same weights exported by protokv's own GGUF writer, then loaded.
std::vector<float> reference_logits(const ModelWeights& weights, DType type, const fs::path& dir) {
  GgufExportOptions options;
  options.type = type;
  const std::string path = (dir / fmt::format("reference-{}.gguf", dtype_name(type))).string();
  export_gguf(weights, nullptr, path, options);
  return logits_of(load_model(path).weights);
}

std::vector<float> converted_logits(const fs::path& hf_dir, DType type, const fs::path& out) {
  HfConvertOptions options;
  options.type = type;
  convert_hf_checkpoint(hf_dir.string(), out.string(), options);
  return logits_of(load_model(out.string()).weights);
}

float max_abs_difference(const std::vector<float>& a, const std::vector<float>& b) {
  float d = 0.0f;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(a[i] - b[i]));
  return d;
}

// The values of GGUF tensor `name` as floats.
std::vector<float> gguf_values(const GgufFile& file, const std::string& name) {
  const GgufTensorInfo* t = file.find_tensor(name);
  if (t == nullptr) {
    ADD_FAILURE() << "no tensor " << name;
    return {};
  }
  const int64_t cols = t->dims[0];
  const int64_t rows = t->element_count() / cols;
  std::vector<float> out(static_cast<size_t>(t->element_count()));
  const size_t row_bytes = dtype_row_bytes(t->type, cols);
  std::vector<char> aligned(row_bytes + 16);
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(aligned.data(), static_cast<const char*>(t->data) + r * row_bytes, row_bytes);
    dequantize_row(t->type, aligned.data(), out.data() + r * cols, cols);
  }
  return out;
}

template <class F>
void expect_error(F&& f, const std::string& text) {
  try {
    f();
    ADD_FAILURE() << "expected an Error mentioning '" << text << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
  }
}

// --- Llama / Mistral: logits equal the direct GGUF export --------------------------------------

TEST(ConvertHf, LlamaF32LogitsEqualDirectGguf) {
  TempDir tmp;
  const ModelWeights w = random_model_weights(small_config(), 11);
  write_checkpoint(w, tmp / "hf", {});
  const auto expected = reference_logits(w, DType::F32, tmp.path());
  const auto got = converted_logits(tmp / "hf", DType::F32, tmp / "out.gguf");
  ASSERT_EQ(got.size(), expected.size());
  EXPECT_EQ(std::memcmp(got.data(), expected.data(), got.size() * sizeof(float)), 0)
      << "max |difference| " << max_abs_difference(got, expected);
}

// Without the Q/K permutation the model is a different one: the logits test above can fail.
TEST(ConvertHf, WrongRopeOrderChangesLogits) {
  TempDir tmp;
  const ModelWeights w = random_model_weights(small_config(), 11);
  CheckpointOptions o;
  o.hf_rope_order = false;
  write_checkpoint(w, tmp / "hf", o);
  const auto expected = reference_logits(w, DType::F32, tmp.path());
  const auto got = converted_logits(tmp / "hf", DType::F32, tmp / "out.gguf");
  EXPECT_GT(max_abs_difference(got, expected), 1e-3f);
}

TEST(ConvertHf, MistralShardedTiedLogitsEqualDirectGguf) {
  TempDir tmp;
  ModelConfig c = small_config();
  c.shared_classifier = true;
  const ModelWeights w = random_model_weights(c, 12);
  CheckpointOptions o;
  o.hf_arch = "MistralForCausalLM";
  o.shards = 2;
  o.tie_word_embeddings = true;
  write_checkpoint(w, tmp / "hf", o);
  const auto expected = reference_logits(w, DType::F32, tmp.path());
  const auto got = converted_logits(tmp / "hf", DType::F32, tmp / "out.gguf");
  EXPECT_EQ(got, expected);
  const GgufFile file = GgufFile::open((tmp / "out.gguf").string());
  EXPECT_EQ(file.find_tensor("output.weight"), nullptr);  // shared with token_embd
}

// Requested types: the converter stores exactly what protokv's exporter stores (same rounding),
// so the logits still match bit for bit; a BF16 checkpoint converts to BF16 without rounding.
TEST(ConvertHf, StorageTypesMatchDirectGguf) {
  TempDir tmp;
  const ModelWeights w = random_model_weights(small_config(), 13);
  write_checkpoint(w, tmp / "hf", {});
  for (const DType type : {DType::F16, DType::Q8_0}) {
    const auto expected = reference_logits(w, type, tmp.path());
    const auto got =
        converted_logits(tmp / "hf", type, tmp / fmt::format("out-{}.gguf", dtype_name(type)));
    EXPECT_EQ(got, expected) << dtype_name(type);
  }
  CheckpointOptions o;
  o.dtype = "BF16";
  write_checkpoint(w, tmp / "hf-bf16", o);
  EXPECT_EQ(converted_logits(tmp / "hf-bf16", DType::BF16, tmp / "out-bf16.gguf"),
            reference_logits(w, DType::BF16, tmp.path()));
}

// The vocabulary as llama.cpp's converter writes it: gpt2 model, pre-tokenizer name, tokens
// padded to vocab_size with [PAD<id>] (unused), look-special added tokens as control, ids,
// add_bos and the chat template.
TEST(ConvertHf, WritesVocabularyLikeLlamaCpp) {
  TempDir tmp;
  const ModelWeights w = random_model_weights(small_config(), 14);
  const CheckpointOptions o;
  write_checkpoint(w, tmp / "hf", o);
  convert_hf_checkpoint((tmp / "hf").string() + "/", (tmp / "out.gguf").string(), {});
  const GgufFile file = GgufFile::open((tmp / "out.gguf").string());
  EXPECT_EQ(file.get_string("general.architecture"), "llama");
  EXPECT_EQ(file.get_string("general.name"), "hf");
  EXPECT_EQ(file.get_string("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(file.get_string("tokenizer.ggml.pre"), "llama-bpe");
  const auto tokens = file.get_string_array("tokenizer.ggml.tokens");
  ASSERT_TRUE(tokens.has_value());
  ASSERT_EQ(tokens->size(), 300u);
  EXPECT_EQ((*tokens)[4],
            "\xC4\xA0"
            "a");
  EXPECT_EQ((*tokens)[6], "<|begin_of_text|>");
  EXPECT_EQ((*tokens)[9], "[PAD9]");
  EXPECT_EQ((*tokens)[299], "[PAD299]");
  const auto types = file.get_int_array("tokenizer.ggml.token_type");
  ASSERT_TRUE(types.has_value());
  EXPECT_EQ((*types)[0], Tokenizer::kNormal);
  EXPECT_EQ((*types)[6], Tokenizer::kControl);
  EXPECT_EQ((*types)[8], Tokenizer::kControl);  // "<|reserved_0|>" looks special
  EXPECT_EQ((*types)[9], Tokenizer::kUnused);
  EXPECT_EQ(file.get_string_array("tokenizer.ggml.merges"),
            (std::vector<std::string>{"a b", "\xC4\xA0 a"}));
  EXPECT_EQ(file.get_int("tokenizer.ggml.bos_token_id"), 6);
  EXPECT_EQ(file.get_int("tokenizer.ggml.eos_token_id"), 7);
  EXPECT_FALSE(file.has("tokenizer.ggml.padding_token_id"));
  EXPECT_EQ(file.get_bool("tokenizer.ggml.add_bos_token"), true);
  EXPECT_EQ(file.get_string("tokenizer.chat_template"),
            o.tokenizer_config["chat_template"].get<std::string>());
  EXPECT_EQ(file.get_int("llama.vocab_size"), 300);
  EXPECT_EQ(file.get_int("llama.rope.dimension_count"), 16);
  EXPECT_EQ(file.get_float("llama.rope.freq_base"), 500000.0);

  // The loaded tokenizer encodes with the merges and BOS.
  const LoadedModel model = load_model((tmp / "out.gguf").string());
  ASSERT_TRUE(model.tokenizer);
  EXPECT_EQ(model.tokenizer->encode("ab a", true), (std::vector<int32_t>{6, 2, 4}));
}

// Llama 3.1 rope_scaling: rope_freqs.weight holds llama.cpp's per-frequency divisors.
TEST(ConvertHf, Llama3RopeScalingWritesRopeFreqs) {
  TempDir tmp;
  const ModelWeights w = random_model_weights(small_config(), 15);
  CheckpointOptions o;
  const double factor = 8, low = 1, high = 4, original = 64;
  o.extra_config = {{"rope_scaling",
                     {{"rope_type", "llama3"},
                      {"factor", factor},
                      {"low_freq_factor", low},
                      {"high_freq_factor", high},
                      {"original_max_position_embeddings", original}}}};
  write_checkpoint(w, tmp / "hf", o);
  convert_hf_checkpoint((tmp / "hf").string(), (tmp / "out.gguf").string(), {});
  const GgufFile file = GgufFile::open((tmp / "out.gguf").string());
  const auto factors = gguf_values(file, "rope_freqs.weight");
  const int head_dim = 16;
  ASSERT_EQ(factors.size(), static_cast<size_t>(head_dim / 2));
  int ones = 0, full = 0, smoothed = 0;
  for (int i = 0; i < head_dim / 2; ++i) {
    const double freq = 1.0 / std::pow(500000.0, 2.0 * i / head_dim);
    const double wavelen = 2 * std::numbers::pi / freq;
    double expected = 0;
    if (wavelen < original / high) {
      expected = 1, ++ones;
    } else if (wavelen > original / low) {
      expected = factor, ++full;
    } else {
      const double smooth = (original / wavelen - low) / (high - low);
      expected = 1 / ((1 - smooth) / factor + smooth), ++smoothed;
    }
    EXPECT_NEAR(factors[static_cast<size_t>(i)], expected, 1e-5 * expected) << i;
  }
  // The shape was chosen so that every branch of the formula is exercised.
  EXPECT_GT(ones, 0);
  EXPECT_GT(full, 0);
  EXPECT_GT(smoothed, 0);
}

// --- Qwen2 / Qwen3 ---------------------------------------------------------------------------

// Qwen-style weights: NeoX RoPE and, for qwen2, random q/k/v biases (owned by `storage`).
ModelWeights qwen_weights(const std::string& arch, uint64_t seed) {
  ModelWeights w = random_model_weights(small_config(), seed);
  w.config.architecture = arch;
  w.config.rope_neox = true;
  if (arch != "qwen2") return w;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uniform(-0.5f, 0.5f);
  auto random_vector = [&](int64_t n) {
    auto v = std::make_shared<std::vector<float>>(static_cast<size_t>(n));
    for (float& x : *v) x = uniform(rng);
    w.storage.push_back(v);
    return v->data();
  };
  const ModelConfig& c = w.config;
  for (LayerWeights& l : w.layers) {
    l.bq = random_vector(int64_t{c.n_heads} * c.head_dim());
    l.bk = random_vector(int64_t{c.n_kv_heads} * c.head_dim());
    l.bv = random_vector(int64_t{c.n_kv_heads} * c.head_dim());
  }
  return w;
}

CheckpointOptions qwen_options(const std::string& hf_arch) {
  CheckpointOptions o;
  o.hf_arch = hf_arch;
  o.pre_regex_numbers = "\\p{N}";
  o.tokenizer_config = {{"add_bos_token", false},
                        {"bos_token", nullptr},
                        {"eos_token", "<|end_of_text|>"},
                        {"pad_token", "<|begin_of_text|>"},
                        {"chat_template", "{% for m in messages %}<|im_start|>{% endfor %}"}};
  return o;
}

// Every tensor of the converted file equals its Hugging Face tensor, unpermuted.
void expect_tensors_equal_checkpoint(const GgufFile& file, const ModelWeights& w) {
  for (const TensorSpec& spec : tensor_specs(w.config, /*with_optional=*/true)) {
    const WeightMatrix m = tensor_view(w, spec);
    if (m.data == nullptr) {
      EXPECT_EQ(file.find_tensor(spec.name), nullptr) << spec.name;
      continue;
    }
    const auto* values = static_cast<const float*>(m.data);
    EXPECT_EQ(gguf_values(file, spec.name), std::vector<float>(values, values + spec.elements()))
        << spec.name;
  }
}

TEST(ConvertHf, Qwen2KeepsNeoxOrderAndBiases) {
  TempDir tmp;
  const ModelWeights w = qwen_weights("qwen2", 21);
  write_checkpoint(w, tmp / "hf", qwen_options("Qwen2ForCausalLM"));
  convert_hf_checkpoint((tmp / "hf").string(), (tmp / "out.gguf").string(), {});
  const GgufFile file = GgufFile::open((tmp / "out.gguf").string());
  EXPECT_EQ(file.get_string("general.architecture"), "qwen2");
  EXPECT_EQ(file.get_int("qwen2.embedding_length"), 64);
  EXPECT_EQ(file.get_int("qwen2.attention.head_count_kv"), 2);
  EXPECT_EQ(file.get_int("qwen2.context_length"), 64);
  EXPECT_NE(file.find_tensor("blk.1.attn_v.bias"), nullptr);
  expect_tensors_equal_checkpoint(file, w);
  EXPECT_EQ(file.get_string("tokenizer.ggml.pre"), "qwen2");
  EXPECT_EQ(file.get_bool("tokenizer.ggml.add_bos_token"), false);
  EXPECT_FALSE(file.has("tokenizer.ggml.bos_token_id"));
  EXPECT_EQ(file.get_int("tokenizer.ggml.eos_token_id"), 7);
  EXPECT_EQ(file.get_int("tokenizer.ggml.padding_token_id"), 6);

  // Qwen2 checkpoints always carry the q/k/v biases; llama.cpp needs them.
  write_checkpoint(qwen_weights("llama", 21), tmp / "no-bias", qwen_options("Qwen2ForCausalLM"));
  expect_error(
      [&] { convert_hf_checkpoint((tmp / "no-bias").string(), (tmp / "x.gguf").string(), {}); },
      "checkpoint lacks tensor model.layers.0.self_attn.q_proj.bias");
}

// Logits of the converted Qwen2 file equal the in-memory model's.
TEST(ConvertHf, Qwen2LogitsEqualInMemoryModel) {
  TempDir tmp;
  const ModelWeights w = qwen_weights("qwen2", 22);
  write_checkpoint(w, tmp / "hf", qwen_options("Qwen2ForCausalLM"));
  convert_hf_checkpoint((tmp / "hf").string(), (tmp / "out.gguf").string(), {});
  const LoadedModel loaded = load_model((tmp / "out.gguf").string());
  EXPECT_EQ(logits_of(loaded.weights), logits_of(w));
}

// Qwen3: q_norm / k_norm and an explicit head_dim.
TEST(ConvertHf, Qwen3WritesQkNormsAndHeadDim) {
  TempDir tmp;
  const ModelWeights w = qwen_weights("llama", 23);
  CheckpointOptions o = qwen_options("Qwen3ForCausalLM");
  o.extra_config = {{"head_dim", 16}};
  const ModelConfig& c = w.config;
  std::vector<float> q_norm(16), k_norm(16);
  for (int i = 0; i < 16; ++i) q_norm[static_cast<size_t>(i)] = 1.0f + 0.01f * i;
  for (int i = 0; i < 16; ++i) k_norm[static_cast<size_t>(i)] = 2.0f - 0.01f * i;
  for (int l = 0; l < c.n_layers; ++l) {
    o.extra.push_back({fmt::format("model.layers.{}.self_attn.q_norm.weight", l), {{16}, q_norm}});
    o.extra.push_back({fmt::format("model.layers.{}.self_attn.k_norm.weight", l), {{16}, k_norm}});
  }
  // The llama-order weights are written unpermuted, as a Qwen3 checkpoint stores them.
  o.hf_rope_order = false;
  write_checkpoint(w, tmp / "hf", o);
  convert_hf_checkpoint((tmp / "hf").string(), (tmp / "out.gguf").string(), {});
  const GgufFile file = GgufFile::open((tmp / "out.gguf").string());
  EXPECT_EQ(file.get_string("general.architecture"), "qwen3");
  EXPECT_EQ(file.get_int("qwen3.attention.key_length"), 16);
  EXPECT_EQ(file.get_int("qwen3.attention.value_length"), 16);
  expect_tensors_equal_checkpoint(file, w);
  for (int l = 0; l < c.n_layers; ++l) {
    EXPECT_EQ(gguf_values(file, fmt::format("blk.{}.attn_q_norm.weight", l)), q_norm);
    EXPECT_EQ(gguf_values(file, fmt::format("blk.{}.attn_k_norm.weight", l)), k_norm);
  }
}

// Every Hugging Face class of the architecture registry (model/tensor_table.h) converts to its
// GGUF architecture with the logits of the in-memory model, so a new registry row is covered here.
TEST(ConvertHf, EveryRegisteredClassConvertsToItsArchitecture) {
  TempDir tmp;
  std::set<std::string> converted;
  for (const Architecture& a : architectures()) {
    for (const std::string_view hf_class : a.hf_classes) {
      SCOPED_TRACE(std::string(hf_class));
      ModelConfig c = small_config();
      c.architecture = std::string(a.name);
      set_architecture_constants(c);
      const ModelWeights w = random_model_weights(c, 31);
      CheckpointOptions o = a.rope_neox ? qwen_options(std::string(hf_class)) : CheckpointOptions{};
      o.hf_arch = std::string(hf_class);
      const fs::path dir = tmp / std::string(hf_class);
      write_checkpoint(w, dir, o);
      const auto out = dir / "out.gguf";
      const auto got = converted_logits(dir, DType::F32, out);
      EXPECT_EQ(GgufFile::open(out.string()).get_string("general.architecture"), a.name);
      EXPECT_EQ(got, reference_logits(w, DType::F32, dir));
      converted.insert(std::string(hf_class));
    }
  }
  // The classes `protokv convert --help` has always named are all registered.
  for (const char* hf_class :
       {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"})
    EXPECT_EQ(converted.count(hf_class), 1u) << hf_class;
}

// --- corrupt safetensors ------------------------------------------------------------------------

TEST(Safetensors, ReadsTensorsAndIgnoresMetadata) {
  TempDir tmp;
  const std::vector<float> values = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, -1.0f};
  write_bytes(tmp / "a.safetensors",
              safetensors_of({{"x", "F32", {2, 3}, encode_floats(values, "F32")},
                              {"y", "BF16", {3}, encode_floats({1, 2, 3}, "BF16")},
                              {"z", "F16", {0}, ""}}));
  const SafetensorsFile file = SafetensorsFile::open((tmp / "a.safetensors").string());
  ASSERT_EQ(file.tensors().size(), 3u);
  EXPECT_EQ(file.find("__metadata__"), nullptr);
  const SafetensorsTensor* x = file.find("x");
  ASSERT_NE(x, nullptr);
  EXPECT_EQ(x->type, DType::F32);
  EXPECT_EQ(x->shape, (std::vector<int64_t>{2, 3}));
  ASSERT_EQ(x->nbytes, 24u);
  std::vector<float> read(6);
  std::memcpy(read.data(), x->data, 24);
  EXPECT_EQ(read, values);
  EXPECT_EQ(file.find("y")->type, DType::BF16);
  EXPECT_EQ(file.find("y")->element_count(), 3);
  EXPECT_EQ(file.find("z")->nbytes, 0u);
}

TEST(Safetensors, RejectsCorruptFiles) {
  TempDir tmp;
  const fs::path path = tmp / "bad.safetensors";
  auto expect_open_error = [&](const std::string& bytes, const std::string& text) {
    write_bytes(path, bytes);
    expect_error([&] { SafetensorsFile::open(path.string()); }, text);
  };
  const std::string data(24, '\0');
  auto entry = [](const std::string& dtype, const std::string& shape, const std::string& offsets) {
    return fmt::format(R"({{"w": {{"dtype": "{}", "shape": {}, "data_offsets": {}}}}})", dtype,
                       shape, offsets);
  };
  expect_open_error("", "not a safetensors file (only 0 bytes)");
  expect_open_error("abc", "not a safetensors file (only 3 bytes)");
  expect_open_error(u64_le(1000) + "{}", "bad safetensors header length 1000");
  expect_open_error(u64_le(uint64_t{1} << 63) + "{}", "bad safetensors header length");
  expect_open_error(u64_le(0), "bad safetensors header length 0");
  expect_open_error(safetensors_bytes("{not json", data), "header is not a valid JSON object");
  expect_open_error(safetensors_bytes("[1, 2]", data), "header is not a valid JSON object");
  expect_open_error(safetensors_bytes(R"({"w": {"dtype": "F32"}})", data),
                    "tensor 'w' needs dtype, shape and data_offsets");
  expect_open_error(safetensors_bytes(entry("I64", "[3]", "[0, 24]"), data),
                    "tensor 'w' has dtype I64, which protokv does not convert");
  expect_open_error(safetensors_bytes(entry("F32", "[-2, 3]", "[0, 24]"), data),
                    "tensor 'w' has a bad shape [-2,3]");
  expect_open_error(safetensors_bytes(entry("F32", "[2, 3]", "[0]"), data),
                    "tensor 'w' has bad data_offsets [0]");
  expect_open_error(safetensors_bytes(entry("F32", "[2, 3]", "[8, 32]"), data),
                    "data_offsets [8, 32] lie outside the data region (24 bytes)");
  expect_open_error(safetensors_bytes(entry("F32", "[2, 3]", "[16, 8]"), data),
                    "lie outside the data region");
  expect_open_error(safetensors_bytes(entry("F32", "[2, 2]", "[0, 24]"), data),
                    "holds 24 bytes but its shape [2,2] of F32 needs 16");
  expect_open_error(safetensors_bytes(entry("F32", "[4294967296, 4294967296]", "[0, 24]"), data),
                    "absurd shape");
  expect_open_error(
      safetensors_bytes(R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                            "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}})",
                        data),
      "tensors 'a' and 'b' overlap");
  // A file cut short: the header promises more data than is left.
  const std::string whole = safetensors_of({{"w", "F32", {2, 3}, data}});
  expect_open_error(whole.substr(0, whole.size() - 5), "lie outside the data region");
  expect_error([&] { SafetensorsFile::open((tmp / "missing.safetensors").string()); },
               "cannot open");
}

// Random byte edits, insertions and truncations of a valid file: each either opens, with every
// tensor's bytes readable, or throws Error (CI runs this under ASan + UBSan).
TEST(Safetensors, MutatedFilesOpenOrThrow) {
  TempDir tmp;
  const std::string seed = safetensors_of({{"a", "F32", {2, 3}, std::string(24, '\x11')},
                                           {"b", "BF16", {4}, std::string(8, '\x22')},
                                           {"c", "F16", {1, 2}, std::string(4, '\x33')}});
  std::mt19937_64 rng(42);
  const std::string kJsonish = "0123456789[],:{}\" -";
  int opened = 0;
  for (int iteration = 0; iteration < 400; ++iteration) {
    std::string bytes = seed;
    for (int edit = 0, edits = 1 + static_cast<int>(rng() % 3); edit < edits; ++edit) {
      const size_t pos = rng() % bytes.size();
      switch (rng() % 4) {
        case 0:
          bytes[pos] = static_cast<char>(rng());
          break;
        case 1:
          bytes.resize(std::max<size_t>(pos, 1));
          break;
        case 2:
          bytes[pos] = kJsonish[rng() % kJsonish.size()];
          break;
        default:
          bytes.insert(pos, 1, kJsonish[rng() % 10]);
          break;
      }
    }
    const fs::path path = tmp / "mutated.safetensors";
    write_bytes(path, bytes);
    try {
      const SafetensorsFile file = SafetensorsFile::open(path.string());
      uint64_t sum = 0;
      for (const SafetensorsTensor& t : file.tensors()) {
        for (size_t i = 0; i < t.nbytes; ++i) sum += static_cast<const uint8_t*>(t.data)[i];
      }
      EXPECT_GE(sum, 0u);
      ++opened;
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    }
  }
  EXPECT_GT(opened, 0);  // some edits (inside the data region) leave a valid file
}

// --- bad checkpoints ----------------------------------------------------------------------------

class ConvertHfErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    weights_ = random_model_weights(small_config(), 31);
    write_checkpoint(weights_, hf_, {});
  }
  void expect_convert_error(const std::string& text) {
    expect_error([&] { convert_hf_checkpoint(hf_.string(), (tmp_ / "out.gguf").string(), {}); },
                 text);
  }
  void patch_config(const json& patch) {
    json config = json::parse(std::ifstream(hf_ / "config.json"));
    config.merge_patch(patch);
    std::ofstream(hf_ / "config.json") << config.dump();
  }

  TempDir tmp_;
  fs::path hf_ = tmp_ / "hf";
  ModelWeights weights_;
};

TEST_F(ConvertHfErrors, MissingConfig) {
  fs::remove(hf_ / "config.json");
  expect_convert_error("no config.json");
}

TEST_F(ConvertHfErrors, UnknownArchitecture) {
  patch_config({{"architectures", {"GPT2LMHeadModel"}}});
  expect_convert_error("unsupported architecture 'GPT2LMHeadModel'");
}

TEST_F(ConvertHfErrors, BadConfigValues) {
  patch_config({{"hidden_size", -64}});
  expect_convert_error("\"hidden_size\" must be a positive integer");
  patch_config({{"hidden_size", 64}, {"num_attention_heads", nullptr}});
  expect_convert_error("missing \"num_attention_heads\"");
  patch_config({{"num_attention_heads", 4}, {"hidden_act", "gelu"}});
  expect_convert_error("unsupported hidden_act \"gelu\"");
  patch_config({{"hidden_act", "silu"}, {"rope_scaling", {{"rope_type", "yarn"}, {"factor", 4}}}});
  expect_convert_error("unsupported rope scaling type 'yarn'");
  // An explicit head_dim changes the q/k/v shapes the checkpoint must have.
  patch_config({{"rope_scaling", nullptr}, {"head_dim", 32}});
  expect_convert_error("self_attn.q_proj.weight has shape");
  std::ofstream(hf_ / "config.json") << "{\"architectures\": [";
  expect_convert_error("config.json is not a valid JSON object");
}

TEST_F(ConvertHfErrors, MissingTensor) {
  // Rewrite the checkpoint without one tensor.
  const SafetensorsFile full = SafetensorsFile::open((hf_ / "model.safetensors").string());
  std::vector<RawTensor> kept;
  for (const SafetensorsTensor& t : full.tensors()) {
    if (t.name == "model.layers.1.mlp.up_proj.weight") continue;
    kept.push_back(
        {t.name, "F32", t.shape, std::string(static_cast<const char*>(t.data), t.nbytes)});
  }
  write_bytes(tmp_ / "tmp.safetensors", safetensors_of(kept));
  fs::rename(tmp_ / "tmp.safetensors", hf_ / "model.safetensors");
  expect_convert_error("checkpoint lacks tensor model.layers.1.mlp.up_proj.weight");
}

TEST_F(ConvertHfErrors, MissingLmHeadWithoutTiedEmbeddings) {
  ModelConfig c = small_config();
  c.shared_classifier = true;
  write_checkpoint(random_model_weights(c, 32), hf_, {});  // tie_word_embeddings false
  expect_convert_error("lacks tensor lm_head.weight");
}

TEST_F(ConvertHfErrors, ShapeMismatch) {
  patch_config({{"intermediate_size", 128}});
  expect_convert_error(
      "tensor model.layers.0.mlp.gate_proj.weight has shape [96, 64], "
      "config.json needs [128, 64]");
}

TEST_F(ConvertHfErrors, UnexpectedTensor) {
  CheckpointOptions o;
  o.extra.push_back({"model.layers.0.mlp.gate_proj.bias", {{96}, std::vector<float>(96, 0.0f)}});
  write_checkpoint(weights_, hf_, o);
  expect_convert_error("checkpoint tensor model.layers.0.mlp.gate_proj.bias has no place");
}

TEST_F(ConvertHfErrors, UnsupportedDtype) {
  write_bytes(hf_ / "model.safetensors",
              safetensors_of({{"model.embed_tokens.weight", "I64", {2}, std::string(16, '\0')}}));
  expect_convert_error("has dtype I64");
}

TEST_F(ConvertHfErrors, TruncatedSafetensors) {
  const auto size = fs::file_size(hf_ / "model.safetensors");
  fs::resize_file(hf_ / "model.safetensors", size - 100);
  expect_convert_error("lie outside the data region");
}

TEST_F(ConvertHfErrors, NoWeights) {
  fs::remove(hf_ / "model.safetensors");
  expect_convert_error("no model.safetensors or model.safetensors.index.json");
}

TEST_F(ConvertHfErrors, ShardedCheckpoints) {
  fs::remove(hf_ / "model.safetensors");
  CheckpointOptions o;
  o.shards = 2;
  write_checkpoint(weights_, hf_, o);
  const fs::path second = hf_ / "model-00002-of-00002.safetensors";
  fs::rename(second, tmp_ / "aside.safetensors");
  expect_convert_error("shard model-00002-of-00002.safetensors is missing");
  fs::rename(tmp_ / "aside.safetensors", second);

  json index = json::parse(std::ifstream(hf_ / "model.safetensors.index.json"));
  const json original = index;
  index["weight_map"]["model.norm.weight"] =
      original["weight_map"]["model.norm.weight"] == "model-00001-of-00002.safetensors"
          ? "model-00002-of-00002.safetensors"
          : "model-00001-of-00002.safetensors";
  std::ofstream(hf_ / "model.safetensors.index.json") << index.dump();
  expect_convert_error("tensor 'model.norm.weight' is not in its shard");

  index = original;
  index["weight_map"].erase("model.norm.weight");
  std::ofstream(hf_ / "model.safetensors.index.json") << index.dump();
  expect_convert_error("tensor 'model.norm.weight' is not listed in model.safetensors.index.json");

  index = original;
  index["weight_map"]["model.norm.weight"] = "../elsewhere.safetensors";
  std::ofstream(hf_ / "model.safetensors.index.json") << index.dump();
  expect_convert_error("is not a file in the folder");

  std::ofstream(hf_ / "model.safetensors.index.json") << "{\"weight_map\": 3}";
  expect_convert_error("no \"weight_map\" object");
}

TEST_F(ConvertHfErrors, Tokenizer) {
  fs::rename(hf_ / "tokenizer.json", tmp_ / "tokenizer.json");
  expect_convert_error("no tokenizer.json");
  fs::rename(tmp_ / "tokenizer.json", hf_ / "tokenizer.json");
  patch_config({{"vocab_size", 8}});
  // The vocabulary is checked before the tensors' shapes.
  expect_convert_error("has 9 tokens but config.json vocab_size is 8");
}

// --- the command line ---------------------------------------------------------------------------

std::string quoted(const fs::path& p) {
  return fmt::format("'{}'", p.string());
}

TEST(ConvertHfCli, ConvertsAFolderAndRejectsBadInput) {
  TempDir tmp;
  write_checkpoint(random_model_weights(small_config(), 41), tmp / "hf", {});
  const auto r = testing::run_protokv("convert " + quoted(tmp / "hf") + " -o " +
                                      quoted(tmp / "out.gguf") + " --type q8_0");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("llama (LlamaForCausalLM)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("q8_0"), std::string::npos) << r.out;
  const auto info = testing::run_protokv("info -m " + quoted(tmp / "out.gguf"));
  EXPECT_EQ(info.exit_code, 0) << info.err;

  fs::create_directories(tmp / "empty");
  testing::expect_one_line_error(
      testing::run_protokv("convert " + quoted(tmp / "empty") + " -o " + quoted(tmp / "x.gguf")),
      "without config.json");
  testing::expect_one_line_error(
      testing::run_protokv("convert " + quoted(tmp / "hf") + " " + quoted(tmp / "tok.bin") +
                           " -o " + quoted(tmp / "x.gguf")),
      "drop the tokenizer argument");
  fs::resize_file(tmp / "hf" / "model.safetensors", 12);
  testing::expect_one_line_error(
      testing::run_protokv("convert " + quoted(tmp / "hf") + " -o " + quoted(tmp / "x.gguf")),
      "bad safetensors header length");
}

}  // namespace
}  // namespace protokv
