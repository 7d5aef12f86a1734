// SPDX-License-Identifier: Apache-2.0
#pragma once
// GGUF v3 (also reads v2): reader over a memory-mapped file, and a writer.
// Layout facts: tensor dims are in ggml order (dims[0] is the contiguous one); tensor offsets are
// relative to the data section, which starts at the first multiple of general.alignment
// (default 32) after the tensor infos.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json_fwd.hpp>  // metadata_json()'s users include the full header
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "protokv/dtype.h"

namespace protokv {

// Container-level keys: how the file itself is laid out (the model's keys are in
// src/model/gguf_names.h).
namespace gguf_container {
inline constexpr std::string_view kAlignment = "general.alignment";
inline constexpr uint32_t kDefaultAlignment = 32;
}  // namespace gguf_container

enum class GgufType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

struct GgufValue;
struct GgufArray {
  GgufType element_type = GgufType::kUint8;
  std::vector<GgufValue> items;
};
struct GgufValue {
  GgufType type = GgufType::kUint8;
  std::variant<uint64_t, int64_t, double, bool, std::string, GgufArray> data;
};

struct GgufTensorInfo {
  std::string name;
  std::vector<int64_t> dims;  // ggml order: dims[0] contiguous
  DType type = DType::F32;
  uint64_t offset = 0;  // relative to the data section
  const void* data = nullptr;
  size_t nbytes = 0;
  int64_t element_count() const;
};

class GgufFile {
 public:
  // Maps and validates the whole structure (magic, version, counts, string lengths, tensor types,
  // tensor data inside the file). Throws Error with a one-line message on any problem.
  static GgufFile open(const std::string& path);

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  const std::map<std::string, GgufValue>& metadata() const { return metadata_; }
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* find_tensor(const std::string& name) const;
  bool has(const std::string& key) const { return metadata_.count(key) != 0; }

  // Typed access; nullopt when absent; Error when present with an incompatible type.
  std::optional<int64_t> get_int(const std::string& key) const;
  std::optional<double> get_float(const std::string& key) const;
  std::optional<bool> get_bool(const std::string& key) const;
  std::optional<std::string> get_string(const std::string& key) const;
  std::optional<std::vector<std::string>> get_string_array(const std::string& key) const;
  std::optional<std::vector<double>> get_float_array(const std::string& key) const;
  std::optional<std::vector<int64_t>> get_int_array(const std::string& key) const;

  // Metadata as JSON (arrays longer than `max_array` are summarised).
  nlohmann::json metadata_json(size_t max_array = 16) const;
  // Keeps the mapping alive (hand it to ModelWeights::storage).
  std::shared_ptr<const void> mapping() const { return mapping_; }
  size_t file_size() const { return file_size_; }

 private:
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  size_t file_size_ = 0;
  std::map<std::string, GgufValue> metadata_;
  std::vector<GgufTensorInfo> tensors_;
  std::shared_ptr<const void> mapping_;
};

class GgufWriter {
 public:
  void set_u32(const std::string& key, uint32_t value);
  void set_i32(const std::string& key, int32_t value);
  void set_u64(const std::string& key, uint64_t value);
  void set_f32(const std::string& key, float value);
  void set_bool(const std::string& key, bool value);
  void set_string(const std::string& key, const std::string& value);
  void set_string_array(const std::string& key, const std::vector<std::string>& values);
  void set_f32_array(const std::string& key, const std::vector<float>& values);
  void set_i32_array(const std::string& key, const std::vector<int32_t>& values);
  void set_value(const std::string& key, GgufValue value);
  // dims in ggml order; data is copied at write time (must stay valid until write()).
  void add_tensor(const std::string& name, std::vector<int64_t> dims, DType type, const void* data,
                  size_t nbytes);
  // Same, but the bytes are produced at write time: `fill` gets a buffer of exactly the tensor's
  // size. Lets a large model be streamed to disk one tensor at a time, never held whole.
  using TensorFill = std::function<void(void* dst, size_t nbytes)>;
  void add_tensor(const std::string& name, std::vector<int64_t> dims, DType type, TensorFill fill);
  // Writes GGUF v3 with general.alignment (default 32). Throws Error on I/O failure.
  void write(const std::string& path) const;

 private:
  std::vector<std::pair<std::string, GgufValue>> metadata_;
  struct PendingTensor {
    std::string name;
    std::vector<int64_t> dims;
    DType type;
    const void* data;
    size_t nbytes;
    TensorFill fill;  // used instead of `data` when set
  };
  std::vector<PendingTensor> tensors_;
};

}  // namespace protokv
