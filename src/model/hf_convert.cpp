// SPDX-License-Identifier: Apache-2.0
// Hugging Face checkpoint -> GGUF. Facts from llama.cpp's converter (convert_hf_to_gguf.py with
// conversion/llama.py, conversion/qwen.py, conversion/base.py and gguf-py's vocab.py and
// constants.py); the code is protokv's own. The tensors written are the architecture's table
// (model/tensor_table.h) walked with tensor_specs; each table entry finds its Hugging Face
// tensor through kHfNames below, so an architecture whose table gains an entry (Qwen3's q/k
// norms) converts without further changes here.
#include "model/hf_convert.h"
#include "core/parallel.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <numbers>
#include <optional>
#include <set>
#include <sstream>
#include <string_view>

#include "io/safetensors.h"
#include "model/gguf_export.h"
#include "model/gguf_names.h"
#include "model/tensor_table.h"
#include "protokv/error.h"
#include "protokv/gguf.h"
#include "protokv/tokenizer.h"

namespace protokv {
namespace {

namespace fs = std::filesystem;
namespace names = gguf_names;
using nlohmann::json;

// Keys of llama.cpp's gguf-py this converter writes beyond the exporter's.
constexpr std::string_view kTokenizerPadId = "tokenizer.ggml.padding_token_id";

// GGUF tensor name (as in the tensor table, "{}" for the layer) -> Hugging Face name
// (gguf-py tensor_mapping.py for these architectures).
constexpr std::pair<std::string_view, std::string_view> kHfNames[] = {
    {"token_embd.weight", "model.embed_tokens.weight"},
    {"output_norm.weight", "model.norm.weight"},
    {"output.weight", "lm_head.weight"},
    {"blk.{}.attn_norm.weight", "model.layers.{}.input_layernorm.weight"},
    {"blk.{}.attn_q.weight", "model.layers.{}.self_attn.q_proj.weight"},
    {"blk.{}.attn_q.bias", "model.layers.{}.self_attn.q_proj.bias"},
    {"blk.{}.attn_k.weight", "model.layers.{}.self_attn.k_proj.weight"},
    {"blk.{}.attn_k.bias", "model.layers.{}.self_attn.k_proj.bias"},
    {"blk.{}.attn_v.weight", "model.layers.{}.self_attn.v_proj.weight"},
    {"blk.{}.attn_v.bias", "model.layers.{}.self_attn.v_proj.bias"},
    {"blk.{}.attn_output.weight", "model.layers.{}.self_attn.o_proj.weight"},
    {"blk.{}.attn_q_norm.weight", "model.layers.{}.self_attn.q_norm.weight"},
    {"blk.{}.attn_k_norm.weight", "model.layers.{}.self_attn.k_norm.weight"},
    {"blk.{}.ffn_norm.weight", "model.layers.{}.post_attention_layernorm.weight"},
    {"blk.{}.ffn_gate.weight", "model.layers.{}.mlp.gate_proj.weight"},
    {"blk.{}.ffn_up.weight", "model.layers.{}.mlp.up_proj.weight"},
    {"blk.{}.ffn_down.weight", "model.layers.{}.mlp.down_proj.weight"},
};

// Tensors whose rows are permuted for hf_undo_qk_permute architectures (weights and biases alike).
bool is_rope_permuted(std::string_view gguf_name) {
  return gguf_name == "blk.{}.attn_q.weight" || gguf_name == "blk.{}.attn_q.bias" ||
         gguf_name == "blk.{}.attn_k.weight" || gguf_name == "blk.{}.attn_k.bias";
}

std::optional<std::string> hf_name_of(const TensorSpec& spec) {
  for (const auto& [gguf, hf] : kHfNames) {
    if (gguf != spec.entry->gguf_name) continue;
    return spec.layer >= 0 ? fmt::format(fmt::runtime(hf), spec.layer) : std::string(hf);
  }
  return std::nullopt;
}

json read_json_object(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  PROTOKV_CHECK(in.good(), "cannot open {}", path.string());
  std::stringstream buffer;
  buffer << in.rdbuf();
  json parsed = json::parse(buffer.str(), nullptr, /*allow_exceptions=*/false);
  PROTOKV_CHECK(!parsed.is_discarded() && parsed.is_object(), "{} is not a valid JSON object",
                path.string());
  return parsed;
}

// config.json accessors with one-line errors naming the file and key.
struct ConfigJson {
  const json& root;
  std::string path;

  int positive_int(const char* key) const {
    PROTOKV_CHECK(root.contains(key), "{}: missing \"{}\"", path, key);
    return checked_int(key);
  }
  int int_or(const char* key, int fallback) const {
    if (!root.contains(key) || root[key].is_null()) return fallback;
    return checked_int(key);
  }
  double float_or(const json& node, const char* key, double fallback) const {
    if (!node.contains(key) || node[key].is_null()) return fallback;
    PROTOKV_CHECK(node[key].is_number() && std::isfinite(node[key].get<double>()),
                  "{}: \"{}\" must be a number", path, key);
    return node[key].get<double>();
  }
  // An id key (bos_token_id, ...) when it is a single integer: a list (Llama 3.1's several EOS
  // ids) is ignored, as llama.cpp's SpecialVocab does.
  std::optional<int32_t> token_id(const char* key) const {
    if (!root.contains(key) || !root[key].is_number_integer()) return std::nullopt;
    const int64_t id = root[key].get<int64_t>();
    if (id < 0 || id >= Tokenizer::kMaxVocabSize) return std::nullopt;
    return static_cast<int32_t>(id);
  }

 private:
  int checked_int(const char* key) const {
    const json& v = root[key];
    PROTOKV_CHECK(
        v.is_number_integer() && v.get<int64_t>() > 0 && v.get<int64_t>() <= (int64_t{1} << 30),
        "{}: \"{}\" must be a positive integer, got {}", path, key, v.dump());
    return static_cast<int>(v.get<int64_t>());
  }
};

// Llama 3 RoPE scaling (rope_type "llama3"): the per-frequency divisors llama.cpp's converter
// stores as rope_freqs.weight (LlamaModel.generate_extra_tensors), computed in float as there.
struct Llama3RopeScaling {
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  double original_context = 8192.0;
};

std::vector<float> llama3_rope_factors(const Llama3RopeScaling& s, float theta, int head_dim) {
  const float low_freq_wavelen = static_cast<float>(s.original_context / s.low_freq_factor);
  const float high_freq_wavelen = static_cast<float>(s.original_context / s.high_freq_factor);
  std::vector<float> factors;
  for (int i = 0; i < head_dim; i += 2) {
    const float freq = 1.0f / std::pow(theta, static_cast<float>(i) / static_cast<float>(head_dim));
    const float wavelen = 2.0f * std::numbers::pi_v<float> / freq;
    if (wavelen < high_freq_wavelen) {
      factors.push_back(1.0f);
    } else if (wavelen > low_freq_wavelen) {
      factors.push_back(static_cast<float>(s.factor));
    } else {
      const float smooth = static_cast<float>((s.original_context / wavelen - s.low_freq_factor) /
                                              (s.high_freq_factor - s.low_freq_factor));
      factors.push_back(1.0f / ((1.0f - smooth) / static_cast<float>(s.factor) + smooth));
    }
  }
  return factors;
}

struct HfModel {
  const Architecture* arch = nullptr;  // the GGUF architecture of its Hugging Face class
  std::string hf_class;                // config.json's "architectures"[0]
  ModelConfig config;
  std::optional<Llama3RopeScaling> llama3_rope;
  bool tie_word_embeddings = false;
};

HfModel read_config(const fs::path& dir) {
  const fs::path path = dir / "config.json";
  PROTOKV_CHECK(fs::exists(path), "{}: no config.json (not a Hugging Face checkpoint folder)",
                dir.string());
  const json root = read_json_object(path);
  const ConfigJson c{root, path.string()};
  PROTOKV_CHECK(root.contains("architectures") && root["architectures"].is_array() &&
                    root["architectures"].size() == 1 && root["architectures"][0].is_string(),
                "{}: \"architectures\" must list one architecture", c.path);
  const std::string hf_arch = root["architectures"][0].get<std::string>();
  HfModel m;
  for (const Architecture& a : architectures()) {
    if (std::find(a.hf_classes.begin(), a.hf_classes.end(), hf_arch) != a.hf_classes.end())
      m.arch = &a;
  }
  PROTOKV_CHECK(m.arch != nullptr, "{}: unsupported architecture '{}' (supported: {})", c.path,
                hf_arch, hf_class_names());
  m.hf_class = hf_arch;
  if (root.contains("hidden_act")) {
    PROTOKV_CHECK(root["hidden_act"] == "silu", "{}: unsupported hidden_act {} (only silu)", c.path,
                  root["hidden_act"].dump());
  }
  PROTOKV_CHECK(!root.value("use_sliding_window", false),
                "{}: sliding-window attention (use_sliding_window) is not supported", c.path);

  ModelConfig& mc = m.config;
  mc.architecture = std::string(m.arch->name);
  mc.dim = c.positive_int("hidden_size");
  mc.hidden_dim = c.positive_int("intermediate_size");
  mc.n_layers = c.positive_int("num_hidden_layers");
  mc.n_heads = c.positive_int("num_attention_heads");
  mc.n_kv_heads = c.int_or("num_key_value_heads", mc.n_heads);
  mc.vocab_size = c.positive_int("vocab_size");
  mc.context_length = c.positive_int("max_position_embeddings");
  mc.norm_eps = static_cast<float>(c.float_or(root, "rms_norm_eps", 1e-6));
  mc.rope_neox = m.arch->rope_neox;
  if (root.contains("head_dim") && !root["head_dim"].is_null()) {
    // Written as attention.key_length / value_length, as llama.cpp's converter does (Qwen3:
    // head_dim 128 with hidden 1024 and 16 heads).
    mc.explicit_head_dim = c.positive_int("head_dim");
  }
  m.tie_word_embeddings = root.value("tie_word_embeddings", false);

  // RoPE: transformers < 5 has rope_theta + rope_scaling; 5 has rope_parameters.
  json rope = root.value("rope_parameters", json());
  if (rope.is_null()) rope = root.value("rope_scaling", json());
  PROTOKV_CHECK(rope.is_null() || rope.is_object(), "{}: rope_scaling must be an object", c.path);
  if (rope.is_null()) rope = json::object();
  const double theta = c.float_or(rope, "rope_theta", c.float_or(root, "rope_theta", 10000.0));
  PROTOKV_CHECK(theta > 0, "{}: rope_theta must be positive", c.path);
  mc.rope_theta = static_cast<float>(theta);
  std::string rope_type = rope.value("rope_type", rope.value("type", std::string("default")));
  if (rope_type == "llama3") {
    Llama3RopeScaling s;
    s.factor = c.float_or(rope, "factor", s.factor);
    s.low_freq_factor = c.float_or(rope, "low_freq_factor", s.low_freq_factor);
    s.high_freq_factor = c.float_or(rope, "high_freq_factor", s.high_freq_factor);
    s.original_context = c.float_or(rope, "original_max_position_embeddings", s.original_context);
    PROTOKV_CHECK(s.factor > 0 && s.low_freq_factor > 0 && s.original_context > 0 &&
                      s.high_freq_factor > s.low_freq_factor,
                  "{}: bad llama3 rope_scaling {}", c.path, rope.dump());
    m.llama3_rope = s;
    mc.rope_freq_factors = true;
  } else {
    PROTOKV_CHECK(rope_type == "default",
                  "{}: unsupported rope scaling type '{}' (supported: default, llama3)", c.path,
                  rope_type);
  }
  try {
    mc.validate();
  } catch (const Error& e) {
    fail("{}: {}", c.path, e.what());
  }
  return m;
}

// Every tensor of the checkpoint, by name, from model.safetensors or the shards named by
// model.safetensors.index.json.
class CheckpointTensors {
 public:
  explicit CheckpointTensors(const fs::path& dir) {
    const fs::path index_path = dir / "model.safetensors.index.json";
    const fs::path single_path = dir / "model.safetensors";
    if (fs::exists(index_path)) {
      const json index = read_json_object(index_path);
      PROTOKV_CHECK(index.contains("weight_map") && index["weight_map"].is_object(),
                    "{}: no \"weight_map\" object", index_path.string());
      std::map<std::string, size_t> shard_of_file;
      for (const auto& [name, file] : index["weight_map"].items()) {
        PROTOKV_CHECK(file.is_string(), "{}: weight_map entry '{}' is not a file name",
                      index_path.string(), name);
        const std::string shard = file.get<std::string>();
        PROTOKV_CHECK(shard.find('/') == std::string::npos && shard != ".." && shard != ".",
                      "{}: shard name '{}' is not a file in the folder", index_path.string(),
                      shard);
        auto [it, inserted] = shard_of_file.emplace(shard, files_.size());
        if (inserted) {
          const fs::path shard_path = dir / shard;
          PROTOKV_CHECK(fs::exists(shard_path), "{}: shard {} is missing", index_path.string(),
                        shard);
          files_.push_back(SafetensorsFile::open(shard_path.string()));
        }
        const SafetensorsTensor* t = files_[it->second].find(name);
        PROTOKV_CHECK(t != nullptr, "{}: tensor '{}' is not in its shard {}", index_path.string(),
                      name, shard);
        tensors_[name] = t;
      }
      // A shard may hold tensors the index does not list; they would be silently lost.
      for (const SafetensorsFile& f : files_) {
        for (const SafetensorsTensor& t : f.tensors()) {
          PROTOKV_CHECK(tensors_.count(t.name) != 0 && tensors_[t.name] == &t,
                        "{}: tensor '{}' is not listed in {}", f.path(), t.name,
                        index_path.filename().string());
        }
      }
    } else {
      PROTOKV_CHECK(fs::exists(single_path),
                    "{}: no model.safetensors or model.safetensors.index.json", dir.string());
      files_.push_back(SafetensorsFile::open(single_path.string()));
      for (const SafetensorsTensor& t : files_.back().tensors()) tensors_[t.name] = &t;
    }
  }

  const SafetensorsTensor* find(const std::string& name) const {
    const auto it = tensors_.find(name);
    return it == tensors_.end() ? nullptr : it->second;
  }
  const std::map<std::string, const SafetensorsTensor*>& all() const { return tensors_; }

 private:
  std::deque<SafetensorsFile> files_;  // a deque: growing it never moves the tensors pointed to
  std::map<std::string, const SafetensorsTensor*> tensors_;
};

// The Hugging Face row that becomes GGUF row `row` of a Q or K projection: llama.cpp's
// LlamaModel.permute views each head's rows as [2, head_dim / 2] and swaps the axes, so GGUF row
// (head, 2i + s) is Hugging Face row (head, s * head_dim / 2 + i).
int64_t hf_row_for_interleaved(int64_t row, int64_t head_dim) {
  const int64_t head = row / head_dim;
  const int64_t j = row % head_dim;
  return head * head_dim + (j % 2) * (head_dim / 2) + j / 2;
}

// Reads `n` values of `type` at `src` (any alignment) as floats.
void read_floats(DType type, const void* src, int64_t n, float* dst) {
  if (type == DType::F32) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  std::vector<uint16_t> raw(static_cast<size_t>(n));
  std::memcpy(raw.data(), src, raw.size() * sizeof(uint16_t));
  dequantize_row(type, raw.data(), dst, n);
}

// One GGUF tensor's bytes in `type` from the Hugging Face tensor `src`, rows permuted by
// `head_dim` when it is > 0.
void fill_tensor(const SafetensorsTensor& src, const TensorSpec& spec, DType type, int64_t head_dim,
                 void* dst) {
  const size_t src_elem = src.type == DType::F32 ? 4 : 2;
  const auto* in = static_cast<const unsigned char*>(src.data);
  if (spec.is_vector()) {  // F32; a bias is permuted element by element like the rows
    std::vector<float> values(static_cast<size_t>(spec.cols));
    read_floats(src.type, in, spec.cols, values.data());
    auto* out = static_cast<float*>(dst);
    for (int64_t k = 0; k < spec.cols; ++k) {
      out[k] = values[static_cast<size_t>(head_dim > 0 ? hf_row_for_interleaved(k, head_dim) : k)];
    }
    return;
  }
  const size_t src_row_bytes = static_cast<size_t>(spec.cols) * src_elem;
  const size_t dst_row_bytes = dtype_row_bytes(type, spec.cols);
  ParallelErrors errors;
#pragma omp parallel
  {
    std::vector<float> row(static_cast<size_t>(spec.cols));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < spec.rows; ++r) {
      errors.run([&] {
        const int64_t from = head_dim > 0 ? hf_row_for_interleaved(r, head_dim) : r;
        const unsigned char* src_row = in + static_cast<size_t>(from) * src_row_bytes;
        char* dst_row = static_cast<char*>(dst) + static_cast<size_t>(r) * dst_row_bytes;
        if (src.type == type) {
          std::memcpy(dst_row, src_row, src_row_bytes);
        } else {
          read_floats(src.type, src_row, spec.cols, row.data());
          quantize_row(type, row.data(), dst_row, spec.cols);
        }
      });
    }
  }
  errors.rethrow();
}

bool looks_special(const std::string& piece) {
  // gguf-py's does_token_look_special for the families converted here: added tokens such as
  // "<|fim_prefix|>" that a checkpoint forgot to mark special are control tokens all the same.
  return piece.size() >= 4 && piece.starts_with("<|") && piece.ends_with("|>");
}

// tokenizer.ggml.* keys: the tokenizer's own (merges, pre-tokenizer, BOS/EOS, add_bos, chat
// template), then the vocabulary padded to the model's vocab_size with "[PAD<id>]" unused tokens
// (get_vocab_base), added tokens that look special typed as control, and special ids missing from
// tokenizer_config.json taken from config.json (SpecialVocab).
void write_vocabulary(GgufWriter& writer, const fs::path& dir, const HfModel& model) {
  const fs::path tokenizer_path = dir / "tokenizer.json";
  PROTOKV_CHECK(fs::exists(tokenizer_path), "{}: no tokenizer.json", dir.string());
  const auto tokenizer = Tokenizer::from_hf_json(tokenizer_path.string());
  const int32_t n_model = model.config.vocab_size;
  PROTOKV_CHECK(tokenizer->vocab_size() <= n_model,
                "{} has {} tokens but config.json vocab_size is {}", tokenizer_path.string(),
                tokenizer->vocab_size(), n_model);
  tokenizer->write_gguf(writer);

  std::vector<std::string> pieces = tokenizer->pieces();
  std::vector<int32_t> types = tokenizer->types();
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (types[i] == Tokenizer::kUserDefined && looks_special(pieces[i])) {
      types[i] = Tokenizer::kControl;
    }
  }
  for (int32_t i = tokenizer->vocab_size(); i < n_model; ++i) {
    pieces.push_back(fmt::format("[PAD{}]", i));
    types.push_back(Tokenizer::kUnused);
  }
  writer.set_string_array(std::string(names::kTokenizerTokens), pieces);
  writer.set_i32_array(std::string(names::kTokenizerTokenType), types);

  const json root = read_json_object(dir / "config.json");
  const ConfigJson config{root, (dir / "config.json").string()};
  auto set_id = [&](std::string_view key, std::optional<int32_t> id) {
    if (id && *id < n_model) writer.set_u32(std::string(key), static_cast<uint32_t>(*id));
  };
  if (tokenizer->bos_id() < 0) set_id(names::kTokenizerBosId, config.token_id("bos_token_id"));
  if (tokenizer->eos_id() < 0) set_id(names::kTokenizerEosId, config.token_id("eos_token_id"));

  std::optional<int32_t> pad;
  const fs::path tokenizer_config_path = dir / "tokenizer_config.json";
  if (fs::exists(tokenizer_config_path)) {
    const json tc = read_json_object(tokenizer_config_path);
    if (tc.contains("pad_token")) {
      const json& p = tc["pad_token"];
      const std::string content = p.is_string()   ? p.get<std::string>()
                                  : p.is_object() ? p.value("content", std::string())
                                                  : std::string();
      if (!content.empty() && tokenizer->find_token(content) >= 0) {
        pad = tokenizer->find_token(content);
      }
    }
  }
  if (!pad) pad = config.token_id("pad_token_id");
  set_id(kTokenizerPadId, pad);
}

}  // namespace

bool is_hf_checkpoint(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) && fs::exists(fs::path(path) / "config.json", ec);
}

HfConvertResult convert_hf_checkpoint(const std::string& dir_string, const std::string& output,
                                      const HfConvertOptions& options) {
  const fs::path dir(dir_string);
  PROTOKV_CHECK(fs::is_directory(dir), "{} is not a folder", dir_string);
  HfModel model = read_config(dir);
  const CheckpointTensors checkpoint(dir);
  ModelConfig& config = model.config;

  // The classifier is shared when the checkpoint stores no lm_head (tie_word_embeddings).
  const bool has_lm_head = checkpoint.find("lm_head.weight") != nullptr;
  PROTOKV_CHECK(has_lm_head || model.tie_word_embeddings,
                "{}: checkpoint lacks tensor lm_head.weight and config.json does not tie it to "
                "the embeddings (tie_word_embeddings)",
                dir_string);
  config.shared_classifier = !has_lm_head;

  GgufWriter writer;
  fs::path folder = fs::absolute(dir).lexically_normal();
  if (folder.filename().empty()) folder = folder.parent_path();  // "dir/" names "dir"
  const std::string name = options.name.empty() ? folder.filename().string() : options.name;
  set_llama_metadata(writer, config, options.type, name.empty() ? "model" : name);
  write_vocabulary(writer, dir, model);

  HfConvertResult result;
  result.hf_architecture = model.hf_class;
  std::set<std::string> used;
  std::vector<TensorSpec> specs = tensor_specs(config, /*with_optional=*/true);
  for (const TensorSpec& spec : specs) {
    if (spec.entry->gguf_name == names::kRopeFreqs) {
      if (!model.llama3_rope) continue;
      // Llama 3.x "llama3" RoPE scaling: no checkpoint tensor, generated from config.json.
      auto factors = std::make_shared<std::vector<float>>(
          llama3_rope_factors(*model.llama3_rope, config.rope_theta, config.rope_dims()));
      PROTOKV_CHECK(static_cast<int64_t>(factors->size()) == spec.cols,
                    "rope_freqs has {} factors, the model needs {}", factors->size(), spec.cols);
      writer.add_tensor(spec.name, {spec.cols}, DType::F32, [factors](void* dst, size_t nbytes) {
        std::memcpy(dst, factors->data(), nbytes);
      });
      continue;
    }
    const std::optional<std::string> hf_name = hf_name_of(spec);
    if (!hf_name) {
      PROTOKV_CHECK(!spec.required(), "no Hugging Face tensor name for GGUF tensor {}", spec.name);
      continue;
    }
    const SafetensorsTensor* src = checkpoint.find(*hf_name);
    if (src == nullptr) {
      // Qwen2 always has q/k/v biases (llama.cpp requires them for arch qwen2).
      const bool required =
          spec.required() || (model.arch->hf_biases_required && spec.is_vector() &&
                              spec.entry->gguf_name.ends_with(".bias"));
      PROTOKV_CHECK(!required, "{}: checkpoint lacks tensor {} (GGUF {})", dir_string, *hf_name,
                    spec.name);
      continue;
    }
    used.insert(*hf_name);
    const std::vector<int64_t> expected = spec.is_vector()
                                              ? std::vector<int64_t>{spec.cols}
                                              : std::vector<int64_t>{spec.rows, spec.cols};
    PROTOKV_CHECK(src->shape == expected, "{}: tensor {} has shape [{}], config.json needs [{}]",
                  dir_string, *hf_name, fmt::join(src->shape, ", "), fmt::join(expected, ", "));
    const DType type = storage_type(spec, options.type);
    const int64_t head_dim =
        model.arch->hf_undo_qk_permute && is_rope_permuted(spec.entry->gguf_name)
            ? config.head_dim()
            : 0;
    std::vector<int64_t> dims = spec.is_vector() ? std::vector<int64_t>{spec.cols}
                                                 : std::vector<int64_t>{spec.cols, spec.rows};
    writer.add_tensor(spec.name, std::move(dims), type,
                      [src, spec, type, head_dim](void* dst, size_t) {
                        fill_tensor(*src, spec, type, head_dim, dst);
                      });
    result.parameters += static_cast<int64_t>(spec.elements());
  }
  for (const auto& [hf_name, tensor] : checkpoint.all()) {
    // Older Llama checkpoints store the RoPE inverse frequencies; llama.cpp skips them too.
    if (hf_name.ends_with(".rotary_emb.inv_freq")) continue;
    PROTOKV_CHECK(used.count(hf_name) != 0,
                  "{}: checkpoint tensor {} has no place in a GGUF {} model (not converted)",
                  dir_string, hf_name, config.architecture);
  }

  writer.write(output);

  result.config = config;
  result.notes = storage_notes(config, options.type);
  return result;
}

}  // namespace protokv
