// SPDX-License-Identifier: Apache-2.0
// The GGUF reader against hand-assembled bytes: the layout it parses matches the format as
// written down (independently of our writer), and every corruption ends in one protokv::Error
// line, never a crash or an absurd allocation (this suite also runs under ASan).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>

#include "gguf_bytes.h"
#include "protokv/error.h"
#include "protokv/gguf.h"
#include "test_util.h"

namespace protokv {
namespace {

using testing::TempDir;

constexpr uint32_t kMagic = 0x46554747;  // "GGUF"

using Bytes = testing::GgufBytes;

// Encodes one key/value pair.
std::string kv_u32(std::string_view key, uint32_t v) {
  return Bytes().str(key).put<uint32_t>(4).put(v).bytes();
}
std::string kv_string(std::string_view key, std::string_view v) {
  return Bytes().str(key).put<uint32_t>(8).str(v).bytes();
}

struct RawTensor {
  std::string name;
  std::vector<uint64_t> dims;
  uint32_t type = 0;
  uint64_t offset = 0;
};

// A GGUF file assembled field by field; tests corrupt one field at a time.
struct RawFile {
  uint32_t magic = kMagic;
  uint32_t version = 3;
  std::optional<uint64_t> tensor_count, kv_count;  // default: the real counts
  std::vector<std::string> kvs;
  std::vector<RawTensor> tensors;
  uint64_t alignment = 32;  // padding before the data section
  uint64_t data_bytes = 0;  // bytes of (patterned) data after the padding

  std::string encode() const {
    Bytes b;
    b.put(magic).put(version);
    b.put<uint64_t>(tensor_count.value_or(tensors.size()));
    b.put<uint64_t>(kv_count.value_or(kvs.size()));
    for (const auto& kv : kvs) b.raw(kv);
    for (const auto& t : tensors) {
      b.str(t.name).put<uint32_t>(static_cast<uint32_t>(t.dims.size()));
      for (uint64_t d : t.dims) b.put(d);
      b.put(t.type).put(t.offset);
    }
    std::string out = b.bytes();
    out.resize((out.size() + alignment - 1) / alignment * alignment, '\0');
    for (uint64_t i = 0; i < data_bytes; ++i) out.push_back(static_cast<char>(i * 7 + 1));
    return out;
  }
};

// A valid file: 3 keys, tensors f32 [4,2] (32 bytes), q8_0 [32] (34 bytes, padded to 64) and
// f16 [3] (6 bytes) at data offsets 0, 32, 96.
RawFile valid_file() {
  RawFile f;
  f.kvs.push_back(kv_string("general.architecture", "test"));
  f.kvs.push_back(kv_u32("answer", 42));
  f.kvs.push_back(Bytes()
                      .str("tokens")
                      .put<uint32_t>(9)  // array
                      .put<uint32_t>(8)  // of strings
                      .put<uint64_t>(2)
                      .str("a")
                      .str("\xe2\x96\x81")
                      .bytes());
  f.tensors = {{"a", {4, 2}, 0, 0}, {"b", {32}, 8, 32}, {"c", {3}, 1, 96}};
  f.data_bytes = 96 + 6;
  return f;
}

class GgufCorrupt : public ::testing::Test {
 protected:
  std::string write(const std::string& bytes) {
    const auto path = (dir_ / fmt::format("f{}.gguf", counter_++)).string();
    std::ofstream(path, std::ios::binary)
        .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return path;
  }
  // Opening `bytes` must fail with one line containing `expected`.
  void expect_error(const std::string& bytes, const std::string& expected) {
    const std::string path = write(bytes);
    try {
      GgufFile::open(path);
      ADD_FAILURE() << "no error; expected one containing '" << expected << "'";
    } catch (const Error& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find(expected), std::string::npos) << message;
      EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    }
  }
  TempDir dir_;
  int counter_ = 0;
};

TEST_F(GgufCorrupt, HandAssembledFileParsesAsWrittenDown) {
  const RawFile raw = valid_file();
  const std::string bytes = raw.encode();
  const GgufFile f = GgufFile::open(write(bytes));
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.get_string("general.architecture"), "test");
  EXPECT_EQ(f.get_int("answer"), 42);
  EXPECT_EQ(f.get_string_array("tokens"), (std::vector<std::string>{"a", "\xe2\x96\x81"}));
  ASSERT_EQ(f.tensors().size(), 3u);
  const size_t data_start = bytes.size() - raw.data_bytes;
  ASSERT_EQ(data_start % 32, 0u);
  const auto* base = static_cast<const char*>(f.mapping().get());
  const size_t expected_offsets[] = {0, 32, 96};
  const size_t expected_bytes[] = {32, 34, 6};
  const DType expected_types[] = {DType::F32, DType::Q8_0, DType::F16};
  for (size_t i = 0; i < 3; ++i) {
    const auto& t = f.tensors()[i];
    EXPECT_EQ(static_cast<const char*>(t.data) - base,
              static_cast<ptrdiff_t>(data_start + expected_offsets[i]));
    EXPECT_EQ(t.nbytes, expected_bytes[i]);
    EXPECT_EQ(t.type, expected_types[i]);
    EXPECT_EQ(std::memcmp(t.data, bytes.data() + data_start + expected_offsets[i], t.nbytes), 0);
  }
  EXPECT_EQ(f.tensors()[0].dims, (std::vector<int64_t>{4, 2}));
}

TEST_F(GgufCorrupt, WriterProducesTheSameBytesAsTheHandEncoding) {
  RawFile raw;
  raw.kvs = {kv_string("general.architecture", "test"), kv_u32("general.alignment", 32)};
  raw.tensors = {{"w", {2, 2}, 0, 0}};
  raw.data_bytes = 32;  // 16 bytes of data padded to the alignment
  std::string expected = raw.encode();
  const std::vector<float> values = {1.0f, 2.0f, 3.0f, 4.0f};
  const size_t data_start = expected.size() - 32;
  std::memcpy(expected.data() + data_start, values.data(), 16);
  std::fill(expected.begin() + static_cast<ptrdiff_t>(data_start + 16), expected.end(), '\0');

  GgufWriter w;
  w.set_string("general.architecture", "test");
  w.add_tensor("w", {2, 2}, DType::F32, values.data(), 16);
  const auto path = (dir_ / "writer.gguf").string();
  w.write(path);
  std::ifstream in(path, std::ios::binary);
  const std::string actual((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(actual, expected);
}

TEST_F(GgufCorrupt, ReadsVersion2) {
  RawFile raw = valid_file();
  raw.version = 2;
  EXPECT_EQ(GgufFile::open(write(raw.encode())).version(), 2u);
}

TEST_F(GgufCorrupt, EveryTruncationIsAnErrorUntilTheLastTensorEnds) {
  const std::string bytes = valid_file().encode();
  const size_t data_end = bytes.size();  // valid_file() has no padding after its last tensor
  for (size_t length = 0; length < data_end; ++length) {
    const std::string path = write(bytes.substr(0, length));
    EXPECT_THROW(GgufFile::open(path), Error) << "truncated to " << length;
    std::filesystem::remove(path);
  }
  EXPECT_NO_THROW(GgufFile::open(write(bytes)));
}

TEST_F(GgufCorrupt, BadMagicAndVersions) {
  RawFile raw = valid_file();
  raw.magic = 0x58554747;  // "GGUX"
  expect_error(raw.encode(), "not a GGUF file");
  expect_error("", "not a GGUF file");
  expect_error("GGU", "not a GGUF file");
  raw = valid_file();
  raw.version = 1;
  expect_error(raw.encode(), "version 1 is not supported");
  raw.version = 4;
  expect_error(raw.encode(), "unsupported GGUF version 4");
  raw.version = 0;
  expect_error(raw.encode(), "unsupported GGUF version 0");
  raw.version = 0x03000000;  // a big-endian file read on a little-endian machine
  expect_error(raw.encode(), "big-endian");
}

TEST_F(GgufCorrupt, ImpossibleCounts) {
  RawFile raw = valid_file();
  raw.kv_count = uint64_t{1} << 60;
  expect_error(raw.encode(), "metadata count");
  raw = valid_file();
  raw.tensor_count = std::numeric_limits<uint64_t>::max();
  expect_error(raw.encode(), "tensor count");
  raw = valid_file();
  raw.kv_count = 4;  // one more than present: the tensor infos are misread as a key
  EXPECT_THROW(GgufFile::open(write(raw.encode())), Error);
}

TEST_F(GgufCorrupt, HugeStringAndArrayLengths) {
  RawFile raw = valid_file();
  raw.kvs[0] = Bytes().put<uint64_t>(uint64_t{1} << 62).bytes();  // key length
  expect_error(raw.encode(), "length");
  raw = valid_file();
  raw.kvs[0] = Bytes().str("k").put<uint32_t>(8).put<uint64_t>(1000000).raw("short").bytes();
  expect_error(raw.encode(), "truncated");
  raw = valid_file();
  raw.kvs[2] = Bytes()
                   .str("tokens")
                   .put<uint32_t>(9)
                   .put<uint32_t>(8)
                   .put<uint64_t>(uint64_t{1} << 61)
                   .bytes();
  expect_error(raw.encode(), "array elements");
  raw = valid_file();
  raw.kvs[2] = Bytes()
                   .str("big")
                   .put<uint32_t>(9)
                   .put<uint32_t>(0)
                   .put<uint64_t>(std::numeric_limits<uint64_t>::max())
                   .bytes();
  expect_error(raw.encode(), "array elements");
}

TEST_F(GgufCorrupt, UnknownValueTypesAndDeepNesting) {
  RawFile raw = valid_file();
  raw.kvs[1] = Bytes().str("k").put<uint32_t>(13).put<uint32_t>(0).bytes();
  expect_error(raw.encode(), "unknown value type 13");
  raw.kvs[1] = Bytes().str("k").put<uint32_t>(9).put<uint32_t>(77).put<uint64_t>(0).bytes();
  expect_error(raw.encode(), "unknown value type 77");
  Bytes nested;
  nested.str("deep").put<uint32_t>(9);
  for (int level = 0; level < 10; ++level) nested.put<uint32_t>(9).put<uint64_t>(1);
  nested.put<uint32_t>(0).put<uint64_t>(0);
  raw.kvs[1] = nested.bytes();
  expect_error(raw.encode(), "nests arrays");
}

TEST_F(GgufCorrupt, DuplicateKeysAndTensorNames) {
  RawFile raw = valid_file();
  raw.kvs.push_back(kv_u32("answer", 43));
  expect_error(raw.encode(), "duplicate metadata key 'answer'");
  raw = valid_file();
  raw.tensors[2].name = "a";
  expect_error(raw.encode(), "duplicate tensor name a");
}

TEST_F(GgufCorrupt, BadDimensions) {
  RawFile raw = valid_file();
  raw.tensors[0].dims = {};
  expect_error(raw.encode(), "tensor a has 0 dimensions");
  raw.tensors[0].dims = {1, 1, 1, 1, 1};
  expect_error(raw.encode(), "tensor a has 5 dimensions");
  raw.tensors[0].dims = {4, 0};
  expect_error(raw.encode(), "invalid dimension 1 = 0");
  raw.tensors[0].dims = {uint64_t{1} << 63, 1};
  expect_error(raw.encode(), "invalid dimension 0");
  raw.tensors[0].dims = {uint64_t{1} << 40, uint64_t{1} << 40};
  expect_error(raw.encode(), "overflows");
  raw.tensors[0].dims = {uint64_t{1} << 61, 2};  // fits in int64, not in the file
  expect_error(raw.encode(), "more than the file");
  raw.tensors[0].dims = {uint64_t{1} << 62};  // 4-byte elements: the byte size would wrap
  expect_error(raw.encode(), "more than the file");
}

TEST_F(GgufCorrupt, UnsupportedTensorTypesAreNamed) {
  RawFile raw = valid_file();
  raw.tensors[1].type = 16;
  expect_error(raw.encode(),
               "tensor b has type iq2_xxs (ggml type 16), which protokv does not support");
  raw.tensors[1].type = 35;
  expect_error(raw.encode(),
               "tensor b has type tq2_0 (ggml type 35), which protokv does not support");
  raw.tensors[1].type = 15;  // Q8_K exists only as ggml's activation format
  expect_error(raw.encode(),
               "tensor b has type q8_K (ggml type 15), which protokv does not support");
  raw.tensors[1].type = 99;
  expect_error(raw.encode(),
               "tensor b has type 99 (unknown ggml type), which protokv does not support");
  raw.tensors[1].type = 4;  // retired id
  expect_error(raw.encode(),
               "tensor b has type 4 (unknown ggml type), which protokv does not support");
}

TEST_F(GgufCorrupt, RowsMustBeWholeBlocks) {
  RawFile raw = valid_file();
  raw.tensors[1].dims = {33};
  expect_error(raw.encode(), "not a multiple of the q8_0 block size 32");
}

TEST_F(GgufCorrupt, QuantisedRowsMustBeWholeBlocks) {
  RawFile raw = valid_file();
  raw.tensors[1].type = 12;  // q4_K: super-blocks of 256
  raw.tensors[1].dims = {300};
  expect_error(raw.encode(),
               "tensor b has rows of 300 values, not a multiple of the q4_K block size 256");
  raw.tensors[1].type = 14;
  raw.tensors[1].dims = {32};
  expect_error(raw.encode(), "not a multiple of the q6_K block size 256");
  raw.tensors[1].type = 2;  // q4_0: blocks of 32
  raw.tensors[1].dims = {48};
  expect_error(raw.encode(), "not a multiple of the q4_0 block size 32");
}

// Each type's byte size per row: a last tensor of exactly that many bytes loads, one byte less
// is outside the file.
TEST_F(GgufCorrupt, QuantisedTensorBytesFollowTheirShape) {
  struct Case {
    uint32_t type;
    uint64_t cols;
    size_t row_bytes;
  };
  for (const Case c :
       {Case{2, 64, 36}, Case{3, 64, 40}, Case{6, 64, 44}, Case{7, 64, 48}, Case{10, 256, 84},
        Case{11, 256, 110}, Case{12, 512, 288}, Case{13, 256, 176}, Case{14, 256, 210}}) {
    SCOPED_TRACE(c.type);
    RawFile raw = valid_file();
    raw.tensors[2] = {"c", {c.cols, 3}, c.type, 96};
    raw.data_bytes = 96 + 3 * c.row_bytes;
    const GgufFile f = GgufFile::open(write(raw.encode()));
    EXPECT_EQ(f.tensors()[2].nbytes, 3 * c.row_bytes);
    EXPECT_EQ(static_cast<uint32_t>(f.tensors()[2].type), c.type);
    raw.data_bytes -= 1;
    expect_error(raw.encode(), "lies outside the file");
  }
}

TEST_F(GgufCorrupt, TensorDataOutsideTheFile) {
  RawFile raw = valid_file();
  raw.tensors[2].offset = uint64_t{1} << 20;
  expect_error(raw.encode(), "tensor c data");
  raw.tensors[2].offset = std::numeric_limits<uint64_t>::max() / 32 * 32;  // sum overflows
  expect_error(raw.encode(), "lies outside the file");
  raw = valid_file();
  raw.data_bytes -= 1;  // last tensor one byte short
  expect_error(raw.encode(), "lies outside the file");
  raw = valid_file();
  raw.tensors[1].offset = 36;
  expect_error(raw.encode(), "not a multiple of the alignment");
}

TEST_F(GgufCorrupt, BadAlignment) {
  for (uint32_t alignment : {0u, 3u, 48u}) {
    RawFile raw = valid_file();
    raw.kvs.push_back(kv_u32("general.alignment", alignment));
    expect_error(raw.encode(), "invalid general.alignment");
  }
  RawFile raw = valid_file();
  raw.kvs.push_back(kv_string("general.alignment", "32"));
  expect_error(raw.encode(), "general.alignment has type string");
}

TEST_F(GgufCorrupt, LargerAlignmentMovesTheDataSection) {
  RawFile raw = valid_file();
  raw.kvs.push_back(kv_u32("general.alignment", 256));
  raw.alignment = 256;
  raw.tensors[1].offset = 256;
  raw.tensors[2].offset = 512;
  raw.data_bytes = 512 + 6;
  const std::string bytes = raw.encode();
  const GgufFile f = GgufFile::open(write(bytes));
  EXPECT_EQ(f.alignment(), 256u);
  const auto* base = static_cast<const char*>(f.mapping().get());
  EXPECT_EQ(static_cast<const char*>(f.tensors()[2].data) - base,
            static_cast<ptrdiff_t>(bytes.size() - 6));
}

TEST_F(GgufCorrupt, NotAFile) {
  try {
    GgufFile::open((dir_ / "missing.gguf").string());
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot open"), std::string::npos);
  }
  EXPECT_THROW(GgufFile::open(dir_.path().string()), Error);
}

}  // namespace
}  // namespace protokv
