// SPDX-License-Identifier: Apache-2.0
// GGUF reader: maps the file and validates every count, length and offset against the file size
// before allocating anything, so a corrupt or hostile file ends in one Error line.

#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <unordered_set>

#include "io/gguf_value.h"
#include "io/mapped_file.h"
#include "protokv/error.h"
#include "protokv/gguf.h"
#include "protokv/limits.h"

namespace protokv {
namespace {

using gguf_detail::type_name;

constexpr uint32_t kMinVersion = 2;
constexpr uint32_t kMaxVersion = 3;
constexpr size_t kMaxKeyLength = limits::kMaxGgufKeyLength;
constexpr size_t kMaxStringLength = limits::kMaxGgufStringLength;
constexpr size_t kMaxTensorNameLength = limits::kMaxGgufTensorNameLength;
constexpr uint64_t kMaxArrayElements = limits::kMaxGgufArrayElements;
constexpr int kMaxArrayDepth = limits::kMaxGgufArrayDepth;
constexpr uint32_t kMaxDims = limits::kMaxTensorDims;
constexpr uint64_t kMaxAlignment = limits::kMaxGgufAlignment;
// Smallest possible encodings, to reject impossible counts: key length + type + 1 byte value;
// name length + n_dims + one dim + type + offset.
constexpr size_t kMinKvBytes = 8 + 4 + 1;
constexpr size_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;

// Bounds-checked reading from the mapping.
class Cursor {
 public:
  Cursor(const uint8_t* data, size_t size, const std::string& path)
      : data_(data), size_(size), path_(path) {}

  size_t offset() const { return pos_; }
  size_t remaining() const { return size_ - pos_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

  template <typename T>
  T read(std::string_view what) {
    need(sizeof(T), what);
    T value;
    std::memcpy(&value, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return value;
  }

  std::string read_string(std::string_view what, size_t max_length) {
    const uint64_t length = read<uint64_t>(what);
    if (length > max_length) {
      fail("{}: {} at byte {} has length {} (limit {})", path_, what, pos_ - 8, length, max_length);
    }
    need(static_cast<size_t>(length), what);
    std::string s(reinterpret_cast<const char*>(data_ + pos_), static_cast<size_t>(length));
    pos_ += static_cast<size_t>(length);
    return s;
  }

 private:
  void need(size_t n, std::string_view what) const {
    if (n > remaining()) {
      fail("{}: truncated GGUF file: {} at byte {} needs {} bytes but the file has {}", path_, what,
           pos_, n, size_);
    }
  }

  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
  const std::string& path_;
};

struct MetadataParser {
  Cursor& in;
  uint64_t array_elements = 0;

  GgufValue parse(GgufType type, const std::string& key, int depth) {
    GgufValue value;
    value.type = type;
    switch (type) {
      case GgufType::kUint8:
        value.data.emplace<uint64_t>(in.read<uint8_t>(key));
        break;
      case GgufType::kUint16:
        value.data.emplace<uint64_t>(in.read<uint16_t>(key));
        break;
      case GgufType::kUint32:
        value.data.emplace<uint64_t>(in.read<uint32_t>(key));
        break;
      case GgufType::kUint64:
        value.data.emplace<uint64_t>(in.read<uint64_t>(key));
        break;
      case GgufType::kInt8:
        value.data.emplace<int64_t>(in.read<int8_t>(key));
        break;
      case GgufType::kInt16:
        value.data.emplace<int64_t>(in.read<int16_t>(key));
        break;
      case GgufType::kInt32:
        value.data.emplace<int64_t>(in.read<int32_t>(key));
        break;
      case GgufType::kInt64:
        value.data.emplace<int64_t>(in.read<int64_t>(key));
        break;
      case GgufType::kFloat32:
        value.data.emplace<double>(in.read<float>(key));
        break;
      case GgufType::kFloat64:
        value.data.emplace<double>(in.read<double>(key));
        break;
      case GgufType::kBool:
        value.data.emplace<bool>(in.read<uint8_t>(key) != 0);
        break;
      case GgufType::kString:
        value.data.emplace<std::string>(in.read_string(key, kMaxStringLength));
        break;
      case GgufType::kArray:
        value.data.emplace<GgufArray>(parse_array(key, depth));
        break;
    }
    return value;
  }

  GgufArray parse_array(const std::string& key, int depth) {
    const uint32_t raw_type = in.read<uint32_t>(key);
    if (!gguf_detail::is_valid_type(raw_type)) {
      fail("{}: metadata key '{}' is an array of unknown value type {}", in.path(), key, raw_type);
    }
    const auto element_type = static_cast<GgufType>(raw_type);
    if (element_type == GgufType::kArray && depth + 1 >= kMaxArrayDepth) {
      fail("{}: metadata key '{}' nests arrays deeper than {} levels", in.path(), key,
           kMaxArrayDepth);
    }
    const uint64_t count = in.read<uint64_t>(key);
    if (count > in.remaining() / gguf_detail::min_encoded_size(element_type)) {
      fail("{}: metadata key '{}' claims {} array elements, more than the file can hold", in.path(),
           key, count);
    }
    array_elements += count;
    if (array_elements > kMaxArrayElements) {
      fail("{}: metadata arrays hold more than {} elements in total (key '{}')", in.path(),
           kMaxArrayElements, key);
    }
    GgufArray array;
    array.element_type = element_type;
    array.items.reserve(static_cast<size_t>(count));
    for (uint64_t i = 0; i < count; ++i) array.items.push_back(parse(element_type, key, depth + 1));
    return array;
  }
};

uint64_t read_alignment(const std::map<std::string, GgufValue>& metadata, const std::string& path) {
  const auto it = metadata.find(std::string(gguf_container::kAlignment));
  if (it == metadata.end()) return gguf_container::kDefaultAlignment;
  const GgufValue& v = it->second;
  if (!gguf_detail::is_unsigned(v.type)) {
    fail("{}: {} has type {}, expected an unsigned integer", path, gguf_container::kAlignment,
         type_name(v.type));
  }
  const uint64_t alignment = std::get<uint64_t>(v.data);
  if (alignment == 0 || (alignment & (alignment - 1)) != 0 || alignment > kMaxAlignment) {
    fail("{}: invalid {} {} (must be a power of two up to {})", path, gguf_container::kAlignment,
         alignment, kMaxAlignment);
  }
  return alignment;
}

GgufTensorInfo parse_tensor_info(Cursor& in) {
  GgufTensorInfo info;
  info.name = in.read_string("tensor name", kMaxTensorNameLength);
  const std::string& name = info.name;
  const uint32_t n_dims = in.read<uint32_t>("tensor dimension count");
  if (n_dims < 1 || n_dims > kMaxDims) {
    fail("{}: tensor {} has {} dimensions (1 to {} supported)", in.path(), name, n_dims, kMaxDims);
  }
  int64_t elements = 1;
  for (uint32_t d = 0; d < n_dims; ++d) {
    const uint64_t dim = in.read<uint64_t>("tensor dimension");
    if (dim == 0 || dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      fail("{}: tensor {} has invalid dimension {} = {}", in.path(), name, d, dim);
    }
    if (__builtin_mul_overflow(elements, static_cast<int64_t>(dim), &elements)) {
      fail("{}: tensor {} has an element count that overflows", in.path(), name);
    }
    info.dims.push_back(static_cast<int64_t>(dim));
  }
  // Every supported type takes more than 2 bits per element (Q2_K: 2.625), so this also keeps
  // the byte size computations below far from overflow.
  if (static_cast<uint64_t>(elements) / 4 > in.size()) {
    fail("{}: tensor {} claims {} elements, more than the file ({} bytes) can hold", in.path(),
         name, elements, in.size());
  }
  const uint32_t ggml_type = in.read<uint32_t>("tensor type");
  if (!dtype_supported(ggml_type)) {
    fail("{}: tensor {} has type {}, which protokv does not support", in.path(), name,
         gguf_detail::ggml_type_label(ggml_type));
  }
  info.type = static_cast<DType>(ggml_type);
  info.offset = in.read<uint64_t>("tensor data offset");

  const int64_t block = dtype_block_size(info.type);
  if (info.dims[0] % block != 0) {
    fail("{}: tensor {} has rows of {} values, not a multiple of the {} block size {}", in.path(),
         name, info.dims[0], dtype_name(info.type), block);
  }
  const size_t row_bytes = dtype_row_bytes(info.type, info.dims[0]);
  const auto rows = static_cast<uint64_t>(elements / info.dims[0]);
  uint64_t nbytes = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(row_bytes), rows, &nbytes) ||
      nbytes > std::numeric_limits<size_t>::max()) {
    fail("{}: tensor {} has a byte size that overflows", in.path(), name);
  }
  info.nbytes = static_cast<size_t>(nbytes);
  return info;
}

}  // namespace

int64_t GgufTensorInfo::element_count() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

GgufFile GgufFile::open(const std::string& path) {
  GgufFile file;
  file.mapping_ = map_file(path, 4, "a GGUF file", &file.file_size_);
  const auto* base = static_cast<const uint8_t*>(file.mapping_.get());
  Cursor in(base, file.file_size_, path);

  if (in.read<uint32_t>("magic") != gguf_detail::kMagic) {
    fail("{}: not a GGUF file (bad magic)", path);
  }
  file.version_ = in.read<uint32_t>("version");
  if (file.version_ == 1) fail("{}: GGUF version 1 is not supported (re-convert the file)", path);
  if (file.version_ < kMinVersion || file.version_ > kMaxVersion) {
    const uint32_t swapped = __builtin_bswap32(file.version_);
    if (swapped >= kMinVersion && swapped <= kMaxVersion) {
      fail("{}: big-endian GGUF files are not supported", path);
    }
    fail("{}: unsupported GGUF version {} (expected {} to {})", path, file.version_, kMinVersion,
         kMaxVersion);
  }
  const uint64_t n_tensors = in.read<uint64_t>("tensor count");
  const uint64_t n_kv = in.read<uint64_t>("metadata count");
  if (n_kv > in.remaining() / kMinKvBytes) {
    fail("{}: metadata count {} is impossible for a file of {} bytes", path, n_kv, file.file_size_);
  }
  if (n_tensors > (in.remaining() - n_kv * kMinKvBytes) / kMinTensorInfoBytes) {
    fail("{}: tensor count {} is impossible for a file of {} bytes", path, n_tensors,
         file.file_size_);
  }

  MetadataParser parser{in};
  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string key = in.read_string("metadata key", kMaxKeyLength);
    const uint32_t raw_type = in.read<uint32_t>("metadata value type");
    if (!gguf_detail::is_valid_type(raw_type)) {
      fail("{}: metadata key '{}' has unknown value type {}", path, key, raw_type);
    }
    GgufValue value = parser.parse(static_cast<GgufType>(raw_type), key, 0);
    if (file.metadata_.count(key)) fail("{}: duplicate metadata key '{}'", path, key);
    file.metadata_.emplace(std::move(key), std::move(value));
  }
  file.alignment_ = read_alignment(file.metadata_, path);

  std::unordered_set<std::string> names;
  file.tensors_.reserve(static_cast<size_t>(n_tensors));
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensorInfo info = parse_tensor_info(in);
    if (!names.insert(info.name).second) fail("{}: duplicate tensor name {}", path, info.name);
    file.tensors_.push_back(std::move(info));
  }

  // The data section starts at the first multiple of the alignment after the tensor infos.
  const uint64_t data_start =
      (in.offset() + file.alignment_ - 1) / file.alignment_ * file.alignment_;
  for (GgufTensorInfo& info : file.tensors_) {
    if (info.offset % file.alignment_ != 0) {
      fail("{}: tensor {} data offset {} is not a multiple of the alignment {}", path, info.name,
           info.offset, file.alignment_);
    }
    uint64_t begin = 0, end = 0;
    if (__builtin_add_overflow(data_start, info.offset, &begin) ||
        __builtin_add_overflow(begin, static_cast<uint64_t>(info.nbytes), &end) ||
        end > file.file_size_) {
      fail(
          "{}: tensor {} data ({} bytes at offset {} of the data section) lies outside the file "
          "({} bytes)",
          path, info.name, info.nbytes, info.offset, file.file_size_);
    }
    info.data = base + begin;
  }
  return file;
}

const GgufTensorInfo* GgufFile::find_tensor(const std::string& name) const {
  for (const auto& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

namespace {

[[noreturn]] void wrong_type(const std::string& key, GgufType type, std::string_view expected) {
  fail("metadata key '{}' has type {}, expected {}", key, type_name(type), expected);
}

int64_t as_int(const GgufValue& v, const std::string& key) {
  if (gguf_detail::is_signed(v.type)) return std::get<int64_t>(v.data);
  if (gguf_detail::is_unsigned(v.type)) {
    const uint64_t u = std::get<uint64_t>(v.data);
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      fail("metadata key '{}' value {} is too large", key, u);
    }
    return static_cast<int64_t>(u);
  }
  wrong_type(key, v.type, "an integer");
}

double as_float(const GgufValue& v, const std::string& key) {
  if (gguf_detail::is_float(v.type)) return std::get<double>(v.data);
  if (gguf_detail::is_integer(v.type)) return static_cast<double>(as_int(v, key));
  wrong_type(key, v.type, "a number");
}

const GgufArray& as_array(const GgufValue& v, const std::string& key) {
  if (v.type != GgufType::kArray) wrong_type(key, v.type, "an array");
  return std::get<GgufArray>(v.data);
}

nlohmann::json value_json(const GgufValue& v, size_t max_array) {
  switch (v.type) {
    case GgufType::kBool:
      return std::get<bool>(v.data);
    case GgufType::kString:
      return std::get<std::string>(v.data);
    case GgufType::kFloat32:
      // Print the float's shortest decimal form (1e-05, not 9.999999747378752e-06).
      return std::stod(fmt::format("{}", static_cast<float>(std::get<double>(v.data))));
    case GgufType::kFloat64:
      return std::get<double>(v.data);
    case GgufType::kArray: {
      const auto& array = std::get<GgufArray>(v.data);
      if (array.items.size() > max_array) {
        return {{"type", "array"},
                {"element_type", std::string(type_name(array.element_type))},
                {"length", array.items.size()}};
      }
      nlohmann::json items = nlohmann::json::array();
      for (const auto& item : array.items) items.push_back(value_json(item, max_array));
      return items;
    }
    default:
      if (gguf_detail::is_signed(v.type)) return std::get<int64_t>(v.data);
      return std::get<uint64_t>(v.data);
  }
}

}  // namespace

std::optional<int64_t> GgufFile::get_int(const std::string& key) const {
  const auto it = metadata_.find(key);
  if (it == metadata_.end()) return std::nullopt;
  return as_int(it->second, key);
}

std::optional<double> GgufFile::get_float(const std::string& key) const {
  const auto it = metadata_.find(key);
  if (it == metadata_.end()) return std::nullopt;
  return as_float(it->second, key);
}

std::optional<bool> GgufFile::get_bool(const std::string& key) const {
  const auto it = metadata_.find(key);
  if (it == metadata_.end()) return std::nullopt;
  if (it->second.type != GgufType::kBool) wrong_type(key, it->second.type, "bool");
  return std::get<bool>(it->second.data);
}

std::optional<std::string> GgufFile::get_string(const std::string& key) const {
  const auto it = metadata_.find(key);
  if (it == metadata_.end()) return std::nullopt;
  if (it->second.type != GgufType::kString) wrong_type(key, it->second.type, "string");
  return std::get<std::string>(it->second.data);
}

std::optional<std::vector<std::string>> GgufFile::get_string_array(const std::string& key) const {
  const auto it = metadata_.find(key);
  if (it == metadata_.end()) return std::nullopt;
  const GgufArray& array = as_array(it->second, key);
  if (array.element_type != GgufType::kString) {
    fail("metadata key '{}' is an array of {}, expected strings", key,
         type_name(array.element_type));
  }
  std::vector<std::string> out;
  out.reserve(array.items.size());
  for (const auto& item : array.items) out.push_back(std::get<std::string>(item.data));
  return out;
}

std::optional<std::vector<double>> GgufFile::get_float_array(const std::string& key) const {
  const auto it = metadata_.find(key);
  if (it == metadata_.end()) return std::nullopt;
  const GgufArray& array = as_array(it->second, key);
  if (!gguf_detail::is_float(array.element_type) && !gguf_detail::is_integer(array.element_type)) {
    fail("metadata key '{}' is an array of {}, expected numbers", key,
         type_name(array.element_type));
  }
  std::vector<double> out;
  out.reserve(array.items.size());
  for (const auto& item : array.items) out.push_back(as_float(item, key));
  return out;
}

std::optional<std::vector<int64_t>> GgufFile::get_int_array(const std::string& key) const {
  const auto it = metadata_.find(key);
  if (it == metadata_.end()) return std::nullopt;
  const GgufArray& array = as_array(it->second, key);
  if (!gguf_detail::is_integer(array.element_type)) {
    fail("metadata key '{}' is an array of {}, expected integers", key,
         type_name(array.element_type));
  }
  std::vector<int64_t> out;
  out.reserve(array.items.size());
  for (const auto& item : array.items) out.push_back(as_int(item, key));
  return out;
}

nlohmann::json GgufFile::metadata_json(size_t max_array) const {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [key, value] : metadata_) out[key] = value_json(value, max_array);
  return out;
}

}  // namespace protokv
