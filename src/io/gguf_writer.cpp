// SPDX-License-Identifier: Apache-2.0
// GGUF v3 writer. The header is assembled in memory; tensor data is streamed to a temporary file
// that replaces the destination only once complete, so a failure never leaves half a model.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <set>

#include "io/gguf_value.h"
#include "protokv/error.h"
#include "protokv/gguf.h"
#include "protokv/limits.h"

namespace protokv {
namespace {

using gguf_detail::type_name;

constexpr size_t kMaxDims = limits::kMaxTensorDims;

// Checks that `value` holds the alternative its type declares, and that integers fit.
void validate_value(const std::string& key, const GgufValue& value) {
  const GgufType t = value.type;
  if (!gguf_detail::is_valid_type(static_cast<uint32_t>(t))) {
    fail("GGUF key '{}': invalid value type {}", key, static_cast<uint32_t>(t));
  }
  auto mismatch = [&] { fail("GGUF key '{}': value does not hold a {}", key, type_name(t)); };
  if (gguf_detail::is_unsigned(t)) {
    if (!std::holds_alternative<uint64_t>(value.data)) mismatch();
    const uint64_t v = std::get<uint64_t>(value.data);
    const uint64_t max = t == GgufType::kUint8    ? 0xffu
                         : t == GgufType::kUint16 ? 0xffffu
                         : t == GgufType::kUint32 ? 0xffffffffu
                                                  : std::numeric_limits<uint64_t>::max();
    if (v > max) fail("GGUF key '{}': {} does not fit in {}", key, v, type_name(t));
  } else if (gguf_detail::is_signed(t)) {
    if (!std::holds_alternative<int64_t>(value.data)) mismatch();
    const int64_t v = std::get<int64_t>(value.data);
    const int bits = t == GgufType::kInt8    ? 8
                     : t == GgufType::kInt16 ? 16
                     : t == GgufType::kInt32 ? 32
                                             : 64;
    if (bits < 64 && (v < -(int64_t{1} << (bits - 1)) || v >= (int64_t{1} << (bits - 1)))) {
      fail("GGUF key '{}': {} does not fit in {}", key, v, type_name(t));
    }
  } else if (gguf_detail::is_float(t)) {
    if (!std::holds_alternative<double>(value.data)) mismatch();
  } else if (t == GgufType::kBool) {
    if (!std::holds_alternative<bool>(value.data)) mismatch();
  } else if (t == GgufType::kString) {
    if (!std::holds_alternative<std::string>(value.data)) mismatch();
  } else {  // array
    if (!std::holds_alternative<GgufArray>(value.data)) mismatch();
    const GgufArray& array = std::get<GgufArray>(value.data);
    for (const GgufValue& item : array.items) {
      if (item.type != array.element_type) {
        fail("GGUF key '{}': array of {} holds a {}", key, type_name(array.element_type),
             type_name(item.type));
      }
      validate_value(key, item);
    }
  }
}

class ByteSink {
 public:
  template <typename T>
  void put(T v) {
    const auto* p = reinterpret_cast<const char*>(&v);
    bytes_.append(p, sizeof(T));
  }
  void put_string(const std::string& s) {
    put<uint64_t>(s.size());
    bytes_.append(s);
  }
  void put_value(const GgufValue& v) {
    switch (v.type) {
      case GgufType::kUint8:
        return put(static_cast<uint8_t>(std::get<uint64_t>(v.data)));
      case GgufType::kUint16:
        return put(static_cast<uint16_t>(std::get<uint64_t>(v.data)));
      case GgufType::kUint32:
        return put(static_cast<uint32_t>(std::get<uint64_t>(v.data)));
      case GgufType::kUint64:
        return put(std::get<uint64_t>(v.data));
      case GgufType::kInt8:
        return put(static_cast<int8_t>(std::get<int64_t>(v.data)));
      case GgufType::kInt16:
        return put(static_cast<int16_t>(std::get<int64_t>(v.data)));
      case GgufType::kInt32:
        return put(static_cast<int32_t>(std::get<int64_t>(v.data)));
      case GgufType::kInt64:
        return put(std::get<int64_t>(v.data));
      case GgufType::kFloat32:
        return put(static_cast<float>(std::get<double>(v.data)));
      case GgufType::kFloat64:
        return put(std::get<double>(v.data));
      case GgufType::kBool:
        return put(static_cast<uint8_t>(std::get<bool>(v.data) ? 1 : 0));
      case GgufType::kString:
        return put_string(std::get<std::string>(v.data));
      case GgufType::kArray: {
        const auto& array = std::get<GgufArray>(v.data);
        put(static_cast<uint32_t>(array.element_type));
        put<uint64_t>(array.items.size());
        for (const auto& item : array.items) put_value(item);
        return;
      }
    }
  }
  void pad_to(uint64_t alignment) {
    bytes_.resize((bytes_.size() + alignment - 1) / alignment * alignment, '\0');
  }
  const std::string& bytes() const { return bytes_; }

 private:
  std::string bytes_;
};

GgufValue scalar(GgufType type, uint64_t v) {
  GgufValue value;
  value.type = type;
  value.data.emplace<uint64_t>(v);
  return value;
}
GgufValue scalar_signed(GgufType type, int64_t v) {
  GgufValue value;
  value.type = type;
  value.data.emplace<int64_t>(v);
  return value;
}

uint64_t align_up(uint64_t n, uint64_t alignment) {
  return (n + alignment - 1) / alignment * alignment;
}

// A temporary file beside the destination, renamed over it by commit(); removed otherwise.
class AtomicFile {
 public:
  explicit AtomicFile(const std::string& path)
      : path_(path), temp_(fmt::format("{}.partial-{}", path, ::getpid())) {
    file_ = std::fopen(temp_.c_str(), "wb");
    if (!file_) fail("cannot create {}: {}", temp_, std::strerror(errno));
    std::setvbuf(file_, nullptr, _IOFBF, size_t{1} << 20);
  }
  ~AtomicFile() {
    if (file_) std::fclose(file_);
    if (!committed_) std::remove(temp_.c_str());
  }
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t n) {
    if (n != 0 && std::fwrite(data, 1, n, file_) != n) {
      fail("cannot write {}: {}", path_, std::strerror(errno));
    }
  }
  void commit() {
    const bool flushed = std::fflush(file_) == 0 && !std::ferror(file_);
    const int err = errno;
    const bool closed = std::fclose(file_) == 0;
    file_ = nullptr;
    if (!flushed || !closed) fail("cannot write {}: {}", path_, std::strerror(err));
    if (std::rename(temp_.c_str(), path_.c_str()) != 0) {
      fail("cannot rename {} to {}: {}", temp_, path_, std::strerror(errno));
    }
    committed_ = true;
  }

 private:
  std::string path_, temp_;
  std::FILE* file_ = nullptr;
  bool committed_ = false;
};

}  // namespace

void GgufWriter::set_value(const std::string& key, GgufValue value) {
  PROTOKV_CHECK(!key.empty(), "GGUF metadata key must not be empty");
  validate_value(key, value);
  for (auto& [k, v] : metadata_) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  metadata_.emplace_back(key, std::move(value));
}

void GgufWriter::set_u32(const std::string& key, uint32_t value) {
  set_value(key, scalar(GgufType::kUint32, value));
}
void GgufWriter::set_i32(const std::string& key, int32_t value) {
  set_value(key, scalar_signed(GgufType::kInt32, value));
}
void GgufWriter::set_u64(const std::string& key, uint64_t value) {
  set_value(key, scalar(GgufType::kUint64, value));
}
void GgufWriter::set_f32(const std::string& key, float value) {
  GgufValue v;
  v.type = GgufType::kFloat32;
  v.data.emplace<double>(value);
  set_value(key, std::move(v));
}
void GgufWriter::set_bool(const std::string& key, bool value) {
  GgufValue v;
  v.type = GgufType::kBool;
  v.data.emplace<bool>(value);
  set_value(key, std::move(v));
}
void GgufWriter::set_string(const std::string& key, const std::string& value) {
  GgufValue v;
  v.type = GgufType::kString;
  v.data.emplace<std::string>(value);
  set_value(key, std::move(v));
}

void GgufWriter::set_string_array(const std::string& key, const std::vector<std::string>& values) {
  GgufValue v;
  v.type = GgufType::kArray;
  auto& array = v.data.emplace<GgufArray>();
  array.element_type = GgufType::kString;
  array.items.reserve(values.size());
  for (const auto& s : values) {
    GgufValue item;
    item.type = GgufType::kString;
    item.data.emplace<std::string>(s);
    array.items.push_back(std::move(item));
  }
  set_value(key, std::move(v));
}

void GgufWriter::set_f32_array(const std::string& key, const std::vector<float>& values) {
  GgufValue v;
  v.type = GgufType::kArray;
  auto& array = v.data.emplace<GgufArray>();
  array.element_type = GgufType::kFloat32;
  array.items.reserve(values.size());
  for (float f : values) {
    GgufValue item;
    item.type = GgufType::kFloat32;
    item.data.emplace<double>(f);
    array.items.push_back(std::move(item));
  }
  set_value(key, std::move(v));
}

void GgufWriter::set_i32_array(const std::string& key, const std::vector<int32_t>& values) {
  GgufValue v;
  v.type = GgufType::kArray;
  auto& array = v.data.emplace<GgufArray>();
  array.element_type = GgufType::kInt32;
  array.items.reserve(values.size());
  for (int32_t i : values) array.items.push_back(scalar_signed(GgufType::kInt32, i));
  set_value(key, std::move(v));
}

void GgufWriter::add_tensor(const std::string& name, std::vector<int64_t> dims, DType type,
                            const void* data, size_t nbytes) {
  PROTOKV_CHECK(data != nullptr || nbytes == 0, "GGUF tensor {}: no data", name);
  add_tensor(name, std::move(dims), type, TensorFill{});
  PendingTensor& t = tensors_.back();
  PROTOKV_CHECK(nbytes == t.nbytes, "GGUF tensor {}: {} bytes given, its shape needs {}", name,
                nbytes, t.nbytes);
  t.data = data;
}

void GgufWriter::add_tensor(const std::string& name, std::vector<int64_t> dims, DType type,
                            TensorFill fill) {
  PROTOKV_CHECK(!name.empty(), "GGUF tensor name must not be empty");
  // The reader refuses longer names: a file it would refuse is not written.
  PROTOKV_CHECK(name.size() <= limits::kMaxGgufTensorNameLength,
                "GGUF tensor name of {} bytes is over the limit of {}", name.size(),
                limits::kMaxGgufTensorNameLength);
  for (const auto& t : tensors_) PROTOKV_CHECK(t.name != name, "duplicate GGUF tensor {}", name);
  PROTOKV_CHECK(!dims.empty() && dims.size() <= kMaxDims,
                "GGUF tensor {}: {} dimensions (1 to {} supported)", name, dims.size(), kMaxDims);
  int64_t elements = 1;
  for (int64_t d : dims) {
    PROTOKV_CHECK(d > 0, "GGUF tensor {}: dimension {} is not positive", name, d);
    PROTOKV_CHECK(!__builtin_mul_overflow(elements, d, &elements),
                  "GGUF tensor {}: element count overflows", name);
  }
  PROTOKV_CHECK(dims[0] % dtype_block_size(type) == 0,
                "GGUF tensor {}: rows of {} values are not a multiple of the {} block size {}",
                name, dims[0], dtype_name(type), dtype_block_size(type));
  const size_t nbytes = dtype_row_bytes(type, dims[0]) * static_cast<size_t>(elements / dims[0]);
  tensors_.push_back(PendingTensor{name, std::move(dims), type, nullptr, nbytes, std::move(fill)});
}

void GgufWriter::write(const std::string& path) const {
  uint64_t alignment = gguf_container::kDefaultAlignment;
  bool alignment_set = false;
  for (const auto& [key, value] : metadata_) {
    if (key != gguf_container::kAlignment) continue;
    PROTOKV_CHECK(value.type == GgufType::kUint32, "{} must be a uint32",
                  gguf_container::kAlignment);
    alignment = std::get<uint64_t>(value.data);
    PROTOKV_CHECK(alignment != 0 && (alignment & (alignment - 1)) == 0,
                  "{} {} is not a power of two", gguf_container::kAlignment, alignment);
    alignment_set = true;
  }

  ByteSink header;
  header.put<uint32_t>(gguf_detail::kMagic);
  header.put<uint32_t>(gguf_detail::kWriteVersion);
  header.put<uint64_t>(tensors_.size());
  header.put<uint64_t>(metadata_.size() + (alignment_set ? 0 : 1));
  for (const auto& [key, value] : metadata_) {
    header.put_string(key);
    header.put<uint32_t>(static_cast<uint32_t>(value.type));
    header.put_value(value);
  }
  if (!alignment_set) {
    header.put_string(std::string(gguf_container::kAlignment));
    header.put<uint32_t>(static_cast<uint32_t>(GgufType::kUint32));
    header.put<uint32_t>(static_cast<uint32_t>(alignment));
  }
  uint64_t offset = 0;
  for (const auto& t : tensors_) {
    header.put_string(t.name);
    header.put<uint32_t>(static_cast<uint32_t>(t.dims.size()));
    for (int64_t d : t.dims) header.put<uint64_t>(static_cast<uint64_t>(d));
    header.put<uint32_t>(static_cast<uint32_t>(t.type));
    header.put<uint64_t>(offset);
    offset = align_up(offset + t.nbytes, alignment);
  }
  header.pad_to(alignment);

  AtomicFile out(path);
  out.write(header.bytes().data(), header.bytes().size());
  const std::string padding(alignment, '\0');
  std::vector<char> buffer;
  for (const auto& t : tensors_) {
    if (t.fill) {
      buffer.resize(t.nbytes);
      t.fill(buffer.data(), t.nbytes);
      out.write(buffer.data(), t.nbytes);
    } else {
      out.write(t.data, t.nbytes);
    }
    out.write(padding.data(), align_up(t.nbytes, alignment) - t.nbytes);
  }
  out.commit();
}

}  // namespace protokv
