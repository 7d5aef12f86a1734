// SPDX-License-Identifier: Apache-2.0
// GGUF writer -> reader round trips: every value type, nested arrays, tensors of every dtype,
// alignment padding, typed accessors and writer-side validation.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "protokv/error.h"
#include "protokv/gguf.h"
#include "test_util.h"

namespace protokv {
namespace {

using testing::TempDir;

GgufValue uint_value(GgufType type, uint64_t v) {
  GgufValue value;
  value.type = type;
  value.data.emplace<uint64_t>(v);
  return value;
}
GgufValue int_value(GgufType type, int64_t v) {
  GgufValue value;
  value.type = type;
  value.data.emplace<int64_t>(v);
  return value;
}
GgufValue float_value(GgufType type, double v) {
  GgufValue value;
  value.type = type;
  value.data.emplace<double>(v);
  return value;
}
GgufValue array_value(GgufType element_type, std::vector<GgufValue> items) {
  GgufValue value;
  value.type = GgufType::kArray;
  value.data.emplace<GgufArray>(GgufArray{element_type, std::move(items)});
  return value;
}

std::string slurp(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(GgufRoundTrip, EveryScalarTypeKeepsTypeAndValue) {
  TempDir dir;
  GgufWriter w;
  w.set_value("u8", uint_value(GgufType::kUint8, 255));
  w.set_value("i8", int_value(GgufType::kInt8, -128));
  w.set_value("u16", uint_value(GgufType::kUint16, 65535));
  w.set_value("i16", int_value(GgufType::kInt16, -32768));
  w.set_u32("u32", 4000000000u);
  w.set_i32("i32", -2000000000);
  w.set_u64("u64", std::numeric_limits<uint64_t>::max());
  w.set_value("i64", int_value(GgufType::kInt64, std::numeric_limits<int64_t>::min()));
  w.set_f32("f32", 0.1f);
  w.set_value("f64", float_value(GgufType::kFloat64, 0.1));
  w.set_bool("yes", true);
  w.set_bool("no", false);
  w.set_string("str", "h\xc3\xa9llo \xe2\x96\x81 world");
  w.set_string("empty", "");
  const auto path = (dir / "scalars.gguf").string();
  w.write(path);

  const GgufFile f = GgufFile::open(path);
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.metadata().size(), 15u);  // 14 + general.alignment added by the writer
  EXPECT_EQ(f.metadata().at("u8").type, GgufType::kUint8);
  EXPECT_EQ(f.get_int("u8"), 255);
  EXPECT_EQ(f.metadata().at("i8").type, GgufType::kInt8);
  EXPECT_EQ(f.get_int("i8"), -128);
  EXPECT_EQ(f.get_int("u16"), 65535);
  EXPECT_EQ(f.get_int("i16"), -32768);
  EXPECT_EQ(f.metadata().at("u32").type, GgufType::kUint32);
  EXPECT_EQ(f.get_int("u32"), 4000000000);
  EXPECT_EQ(f.get_int("i32"), -2000000000);
  EXPECT_EQ(std::get<uint64_t>(f.metadata().at("u64").data), std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(f.get_int("i64"), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(f.metadata().at("f32").type, GgufType::kFloat32);
  EXPECT_EQ(static_cast<float>(*f.get_float("f32")), 0.1f);
  EXPECT_EQ(f.get_float("f64"), 0.1);
  EXPECT_EQ(f.get_bool("yes"), true);
  EXPECT_EQ(f.get_bool("no"), false);
  EXPECT_EQ(f.get_string("str"), "h\xc3\xa9llo \xe2\x96\x81 world");
  EXPECT_EQ(f.get_string("empty"), "");
  EXPECT_EQ(f.get_int("general.alignment"), 32);
}

TEST(GgufRoundTrip, ArraysIncludingNestedAndEmpty) {
  TempDir dir;
  GgufWriter w;
  w.set_string_array("strings", {"a", "", "\xe2\x96\x81the"});
  w.set_f32_array("floats", {1.5f, -2.0f});
  w.set_i32_array("ints", {-1, 0, 7});
  w.set_value("u8s", array_value(GgufType::kUint8, {uint_value(GgufType::kUint8, 1),
                                                    uint_value(GgufType::kUint8, 200)}));
  w.set_value("bools", array_value(GgufType::kBool, {}));
  GgufValue t;
  t.type = GgufType::kBool;
  t.data.emplace<bool>(true);
  w.set_value("bools2", array_value(GgufType::kBool, {t}));
  w.set_value("nested",
              array_value(GgufType::kArray,
                          {array_value(GgufType::kUint16, {uint_value(GgufType::kUint16, 3)}),
                           array_value(GgufType::kString, {})}));
  w.set_value("empty_strings", array_value(GgufType::kString, {}));
  const auto path = (dir / "arrays.gguf").string();
  w.write(path);

  const GgufFile f = GgufFile::open(path);
  EXPECT_EQ(f.get_string_array("strings"), (std::vector<std::string>{"a", "", "\xe2\x96\x81the"}));
  EXPECT_EQ(f.get_float_array("floats"), (std::vector<double>{1.5, -2.0}));
  EXPECT_EQ(f.get_int_array("ints"), (std::vector<int64_t>{-1, 0, 7}));
  EXPECT_EQ(f.get_int_array("u8s"), (std::vector<int64_t>{1, 200}));
  EXPECT_EQ(std::get<GgufArray>(f.metadata().at("bools").data).items.size(), 0u);
  EXPECT_EQ(std::get<GgufArray>(f.metadata().at("bools").data).element_type, GgufType::kBool);
  EXPECT_TRUE(std::get<bool>(std::get<GgufArray>(f.metadata().at("bools2").data).items[0].data));
  const auto& nested = std::get<GgufArray>(f.metadata().at("nested").data);
  ASSERT_EQ(nested.element_type, GgufType::kArray);
  ASSERT_EQ(nested.items.size(), 2u);
  const auto& inner = std::get<GgufArray>(nested.items[0].data);
  EXPECT_EQ(inner.element_type, GgufType::kUint16);
  EXPECT_EQ(std::get<uint64_t>(inner.items.at(0).data), 3u);
  EXPECT_EQ(std::get<GgufArray>(nested.items[1].data).element_type, GgufType::kString);
  EXPECT_EQ(f.get_string_array("empty_strings"), std::vector<std::string>{});
}

TEST(GgufRoundTrip, TypedAccessorsRejectIncompatibleTypesAndReportAbsence) {
  TempDir dir;
  GgufWriter w;
  w.set_string("s", "x");
  w.set_u32("n", 5);
  w.set_f32_array("fa", {1.0f});
  w.set_string_array("sa", {"x"});
  const auto path = (dir / "typed.gguf").string();
  w.write(path);
  const GgufFile f = GgufFile::open(path);
  EXPECT_FALSE(f.get_int("absent").has_value());
  EXPECT_FALSE(f.get_string_array("absent").has_value());
  EXPECT_FALSE(f.has("absent"));
  EXPECT_TRUE(f.has("s"));
  EXPECT_THROW(f.get_int("s"), Error);
  EXPECT_THROW(f.get_string("n"), Error);
  EXPECT_THROW(f.get_bool("n"), Error);
  EXPECT_EQ(f.get_float("n"), 5.0);  // integers widen to floats
  EXPECT_THROW(f.get_int_array("fa"), Error);
  EXPECT_THROW(f.get_float_array("sa"), Error);
  EXPECT_THROW(f.get_string_array("n"), Error);
}

TEST(GgufRoundTrip, TensorsOfEveryTypeWithCustomAlignment) {
  TempDir dir;
  std::vector<float> f32(4 * 3);
  for (size_t i = 0; i < f32.size(); ++i) f32[i] = 0.25f * static_cast<float>(i) - 1.0f;
  std::vector<uint16_t> f16(8), bf16(8);
  for (size_t i = 0; i < 8; ++i) {
    f16[i] = f32_to_f16(static_cast<float>(i) * 0.5f);
    bf16[i] = f32_to_bf16(-static_cast<float>(i));
  }
  std::vector<float> q_src(64 * 2);
  for (size_t i = 0; i < q_src.size(); ++i) q_src[i] = std::sin(static_cast<float>(i));
  std::vector<BlockQ8_0> q8(4);
  quantize_row(DType::Q8_0, q_src.data(), q8.data(), 128);

  GgufWriter w;
  w.set_u32("general.alignment", 64);
  w.add_tensor("f32", {4, 3}, DType::F32, f32.data(), f32.size() * 4);
  w.add_tensor("f16", {8}, DType::F16, f16.data(), f16.size() * 2);
  w.add_tensor("bf16", {2, 2, 2}, DType::BF16, bf16.data(), bf16.size() * 2);
  w.add_tensor("q8", {64, 2}, DType::Q8_0, q8.data(), q8.size() * sizeof(BlockQ8_0));
  w.add_tensor("filled", {5, 1, 1, 2}, DType::F32, [](void* dst, size_t nbytes) {
    auto* out = static_cast<float*>(dst);
    for (size_t i = 0; i < nbytes / 4; ++i) out[i] = static_cast<float>(i * i);
  });
  const auto path = (dir / "tensors.gguf").string();
  w.write(path);

  const GgufFile f = GgufFile::open(path);
  EXPECT_EQ(f.alignment(), 64u);
  ASSERT_EQ(f.tensors().size(), 5u);
  const auto* base = static_cast<const char*>(f.mapping().get());
  for (const auto& t : f.tensors()) {
    EXPECT_EQ((static_cast<const char*>(t.data) - base) % 64, 0) << t.name;
    EXPECT_EQ(t.offset % 64, 0u) << t.name;
  }
  const auto* t = f.find_tensor("f32");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->dims, (std::vector<int64_t>{4, 3}));
  EXPECT_EQ(t->type, DType::F32);
  EXPECT_EQ(t->element_count(), 12);
  ASSERT_EQ(t->nbytes, f32.size() * 4);
  EXPECT_EQ(std::memcmp(t->data, f32.data(), t->nbytes), 0);
  t = f.find_tensor("f16");
  ASSERT_EQ(t->nbytes, 16u);
  EXPECT_EQ(std::memcmp(t->data, f16.data(), 16), 0);
  t = f.find_tensor("bf16");
  EXPECT_EQ(t->dims, (std::vector<int64_t>{2, 2, 2}));
  EXPECT_EQ(std::memcmp(t->data, bf16.data(), 16), 0);
  t = f.find_tensor("q8");
  EXPECT_EQ(t->type, DType::Q8_0);
  ASSERT_EQ(t->nbytes, 4 * sizeof(BlockQ8_0));
  EXPECT_EQ(std::memcmp(t->data, q8.data(), t->nbytes), 0);
  t = f.find_tensor("filled");
  EXPECT_EQ(t->dims, (std::vector<int64_t>{5, 1, 1, 2}));
  EXPECT_EQ(static_cast<const float*>(t->data)[9], 81.0f);
  EXPECT_EQ(f.find_tensor("missing"), nullptr);
  // Every tensor but the last is padded to the alignment; so is the last (as ggml writes).
  EXPECT_EQ(f.file_size() % 64, 0u);
}

TEST(GgufRoundTrip, SettingAKeyTwiceKeepsTheLastValue) {
  TempDir dir;
  GgufWriter w;
  w.set_u32("k", 1);
  w.set_string("k", "two");
  const auto path = (dir / "twice.gguf").string();
  w.write(path);
  const GgufFile f = GgufFile::open(path);
  EXPECT_EQ(f.get_string("k"), "two");
  EXPECT_EQ(f.metadata().size(), 2u);
}

TEST(GgufRoundTrip, MetadataJsonSummarisesLongArrays) {
  TempDir dir;
  GgufWriter w;
  w.set_i32_array("short", {1, 2});
  w.set_i32_array("long", std::vector<int32_t>(40, 3));
  w.set_f32("eps", 1e-5f);
  const auto path = (dir / "json.gguf").string();
  w.write(path);
  const auto j = GgufFile::open(path).metadata_json(16);
  EXPECT_EQ(j["short"], nlohmann::json({1, 2}));
  EXPECT_EQ(j["long"]["length"], 40);
  EXPECT_EQ(j["long"]["element_type"], "int32");
  EXPECT_EQ(j["eps"].get<double>(), 1e-5);  // the float's shortest decimal form
}

TEST(GgufWriter, RejectsInconsistentInput) {
  GgufWriter w;
  std::vector<float> data(8);
  EXPECT_THROW(w.add_tensor("t", {4, 3}, DType::F32, data.data(), 32), Error);  // size
  EXPECT_THROW(w.add_tensor("q", {33}, DType::Q8_0, data.data(), 34), Error);   // block
  EXPECT_THROW(w.add_tensor("z", {0, 2}, DType::F32, data.data(), 0), Error);   // zero dim
  EXPECT_THROW(w.add_tensor("d", {1, 1, 1, 1, 1}, DType::F32, data.data(), 4), Error);
  EXPECT_THROW(w.add_tensor("", {8}, DType::F32, data.data(), 32), Error);
  w.add_tensor("ok", {8}, DType::F32, data.data(), 32);
  EXPECT_THROW(w.add_tensor("ok", {8}, DType::F32, data.data(), 32), Error);  // duplicate
  EXPECT_THROW(w.set_value("big", uint_value(GgufType::kUint32, uint64_t{1} << 33)), Error);
  EXPECT_THROW(w.set_value("neg", int_value(GgufType::kInt8, 200)), Error);
  EXPECT_THROW(w.set_value("wrong", uint_value(GgufType::kString, 1)), Error);
  EXPECT_THROW(w.set_value("mixed", array_value(GgufType::kUint8, {int_value(GgufType::kInt8, 1)})),
               Error);
  EXPECT_THROW(w.set_value("", uint_value(GgufType::kUint8, 1)), Error);
  GgufWriter bad_alignment;
  bad_alignment.set_u32("general.alignment", 48);
  TempDir dir;
  EXPECT_THROW(bad_alignment.write((dir / "x.gguf").string()), Error);
}

TEST(GgufWriter, FailedWriteLeavesNoFileBehind) {
  TempDir dir;
  GgufWriter w;
  w.add_tensor("boom", {4}, DType::F32, [](void*, size_t) { fail("generator failed"); });
  const auto path = dir / "out.gguf";
  EXPECT_THROW(w.write(path.string()), Error);
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
  EXPECT_THROW(GgufWriter().write((dir / "no" / "such" / "dir.gguf").string()), Error);
}

TEST(GgufWriter, RewritingAFileReplacesItWhole) {
  TempDir dir;
  const auto path = (dir / "m.gguf").string();
  GgufWriter big;
  std::vector<float> data(1000, 1.0f);
  big.add_tensor("t", {1000}, DType::F32, data.data(), 4000);
  big.write(path);
  GgufWriter small;
  small.set_string("k", "v");
  small.write(path);
  const GgufFile f = GgufFile::open(path);
  EXPECT_TRUE(f.tensors().empty());
  EXPECT_LT(f.file_size(), 200u);
  EXPECT_EQ(slurp(path).substr(0, 4), "GGUF");
}

}  // namespace
}  // namespace protokv
