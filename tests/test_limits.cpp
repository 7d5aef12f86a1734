// SPDX-License-Identifier: Apache-2.0
// Every bound of include/protokv/limits.h at the limit and one over: the value at the limit gets
// past its check (it may fail later, for another reason the message tells apart), one over is
// one protokv::Error line naming the bound. Hostile inputs are small: a file whose header claims a
// huge length or count, or a sparse file (ftruncate), never gigabytes in memory.
#include <gtest/gtest.h>

#include <httplib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "core/units.h"
#include "gguf_bytes.h"
#include "io/safetensors.h"
#include "io/text_file.h"
#include "model/loaders.h"
#include "model/random_model.h"
#include "press/calibration_profile.h"
#include "protokv/error.h"
#include "protokv/gguf.h"
#include "protokv/limits.h"
#include "protokv/memory.h"
#include "protokv/model.h"
#include "protokv/tokenizer.h"
#include "server/http_server.h"
#include "server/openai_api.h"
#include "test_engine_model.h"
#include "test_util.h"

namespace protokv {
namespace {

using testing::TempDir;

// The error `call` throws: its message, which must be one line. Fails the test (and returns "")
// when nothing is thrown.
template <class Call>
std::string error_of(Call&& call) {
  try {
    call();
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    return message;
  }
  ADD_FAILURE() << "no protokv::Error thrown";
  return "";
}

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << (haystack)
#define EXPECT_NOT_CONTAINS(haystack, needle) \
  EXPECT_EQ(std::string(haystack).find(needle), std::string::npos) << (haystack)

// ---- model shape (ModelConfig::validate) ----

// test_engine_model.h's small shape with a longer context.
ModelConfig small_config() {
  ModelConfig c = testing::tiny_config();
  c.context_length = 256;
  return c;
}

TEST(Limits, ModelShapeAtTheLimitIsValidOneOverIsRefused) {
  struct Case {
    const char* bound;
    void (*set)(ModelConfig&, int64_t);
    int64_t limit;
    std::string refused;
  };
  const std::vector<Case> cases = {
      {"embedding length", [](ModelConfig& c, int64_t v) { c.dim = static_cast<int>(v); },
       limits::kMaxModelDim, "invalid embedding length 65537 (1 to 65536)"},
      {"feed-forward length", [](ModelConfig& c, int64_t v) { c.hidden_dim = static_cast<int>(v); },
       8 * limits::kMaxModelDim, "invalid feed-forward length 524289 (1 to 524288)"},
      {"layers", [](ModelConfig& c, int64_t v) { c.n_layers = static_cast<int>(v); },
       limits::kMaxLayers, "invalid layer count 1025 (1 to 1024)"},
      {"vocabulary", [](ModelConfig& c, int64_t v) { c.vocab_size = static_cast<int>(v); },
       limits::kMaxVocab, "invalid vocabulary size 4194305 (1 to 4194304)"},
      {"context", [](ModelConfig& c, int64_t v) { c.context_length = static_cast<int>(v); },
       limits::kMaxContext, "invalid context length 16777217 (1 to 16777216)"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.bound);
    ModelConfig at = small_config();
    c.set(at, c.limit);
    EXPECT_NO_THROW(at.validate());
    ModelConfig over = small_config();
    c.set(over, c.limit + 1);
    EXPECT_CONTAINS(error_of([&] { over.validate(); }), c.refused);
  }
}

TEST(Limits, Llama2cTokenizerVocabularyAtTheLimitIsReadOneOverIsRefused) {
  TempDir dir;
  const auto path = (dir / "tokenizer.bin").string();
  std::ofstream(path, std::ios::binary).write("\x10\0\0\0", 4);  // max_token_length 16, no tokens
  // At the limit the size is accepted and the (tiny) file is too short for that many tokens.
  const std::string at = error_of([&] { Tokenizer::load_llama2c(path, limits::kMaxVocab); });
  EXPECT_CONTAINS(at, "is truncated: 4194304 tokens need");
  const std::string over = error_of([&] { Tokenizer::load_llama2c(path, limits::kMaxVocab + 1); });
  EXPECT_CONTAINS(over, "tokenizer vocabulary size 4194305 out of range (1..4194304)");
}

// ---- GGUF files (io/gguf_reader.cpp) ----

using Bytes = testing::GgufBytes;

constexpr uint32_t kGgufMagic = 0x46554747;
constexpr uint32_t kTypeU32 = 4, kTypeString = 8, kTypeArray = 9, kTypeU8 = 0;

// A version-3 header for `n_tensors` tensors and `n_kv` pairs; the caller appends them.
Bytes gguf_header(uint64_t n_tensors, uint64_t n_kv) {
  Bytes b;
  b.put(kGgufMagic).put<uint32_t>(3).put(n_tensors).put(n_kv);
  return b;
}

// One f32 tensor `name` of `dims` at offset 0, after the pairs already in `b`; the data section
// (32-byte alignment) holds its values.
std::string with_f32_tensor(Bytes b, const std::string& name, const std::vector<uint64_t>& dims) {
  b.str(name).put<uint32_t>(static_cast<uint32_t>(dims.size()));
  uint64_t elements = 1;
  for (uint64_t d : dims) {
    b.put(d);
    elements *= d;
  }
  b.put<uint32_t>(0).put<uint64_t>(0);
  std::string out = b.bytes();
  out.resize((out.size() + 31) / 32 * 32, '\0');
  out.append(elements * 4, '\0');
  return out;
}

class LimitsGguf : public ::testing::Test {
 protected:
  // `bytes`, then zeros up to `size` bytes (a sparse file: nothing is written for them).
  std::string write(const std::string& bytes, uint64_t size = 0) {
    const auto path = (dir_ / fmt::format("f{}.gguf", counter_++)).string();
    std::ofstream(path, std::ios::binary)
        .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (size > bytes.size()) std::filesystem::resize_file(path, size);
    return path;
  }
  std::string open_error(const std::string& bytes, uint64_t size = 0) {
    const std::string path = write(bytes, size);
    return error_of([&] { GgufFile::open(path); });
  }
  TempDir dir_;
  int counter_ = 0;
};

TEST_F(LimitsGguf, KeyLength) {
  const std::string at_limit(limits::kMaxGgufKeyLength, 'k');
  Bytes ok = gguf_header(0, 1);
  ok.str(at_limit).put(kTypeU32).put<uint32_t>(7);
  EXPECT_EQ(GgufFile::open(write(ok.bytes())).get_int(at_limit), 7);
  // One over, with every byte present: refused for its length, not for a truncation.
  Bytes over = gguf_header(0, 1);
  over.str(at_limit + "k").put(kTypeU32).put<uint32_t>(7);
  EXPECT_CONTAINS(open_error(over.bytes()),
                  "metadata key at byte 24 has length 65537 (limit 65536)");
}

TEST_F(LimitsGguf, StringLengthIsRefusedBeforeItIsRead) {
  // A header that claims the length; the file holds none of it.
  const auto claim = [](uint64_t length) {
    Bytes b = gguf_header(0, 1);
    b.str("k").put(kTypeString).put(length).put<uint64_t>(0);
    return b.bytes();
  };
  const std::string at = open_error(claim(limits::kMaxGgufStringLength));
  EXPECT_CONTAINS(at, "truncated GGUF file: k at byte");
  EXPECT_CONTAINS(at, "needs 67108864 bytes");
  EXPECT_CONTAINS(open_error(claim(limits::kMaxGgufStringLength + 1)),
                  "has length 67108865 (limit 67108864)");
}

TEST_F(LimitsGguf, TensorNameLength) {
  const std::string at_limit(limits::kMaxGgufTensorNameLength, 't');
  const GgufFile f = GgufFile::open(write(with_f32_tensor(gguf_header(1, 0), at_limit, {2})));
  ASSERT_EQ(f.tensors().size(), 1u);
  EXPECT_EQ(f.tensors()[0].name, at_limit);
  EXPECT_CONTAINS(open_error(with_f32_tensor(gguf_header(1, 0), at_limit + "t", {2})),
                  "tensor name at byte 24 has length 1025 (limit 1024)");
  // The writer refuses what the reader would.
  GgufWriter w;
  const float value = 1.0f;
  EXPECT_NO_THROW(w.add_tensor(at_limit, {1}, DType::F32, &value, 4));
  EXPECT_CONTAINS(error_of([&] { w.add_tensor(at_limit + "t", {1}, DType::F32, &value, 4); }),
                  "GGUF tensor name of 1025 bytes is over the limit of 1024");
}

TEST_F(LimitsGguf, TensorDimensions) {
  const GgufFile f = GgufFile::open(write(with_f32_tensor(gguf_header(1, 0), "t", {2, 1, 1, 1})));
  EXPECT_EQ(f.tensors()[0].dims.size(), static_cast<size_t>(limits::kMaxTensorDims));
  EXPECT_CONTAINS(open_error(with_f32_tensor(gguf_header(1, 0), "t", {2, 1, 1, 1, 1})),
                  "tensor t has 5 dimensions (1 to 4 supported)");
  GgufWriter w;
  const float values[2] = {1.0f, 2.0f};
  EXPECT_NO_THROW(w.add_tensor("four", {2, 1, 1, 1}, DType::F32, values, 8));
  EXPECT_CONTAINS(error_of([&] {
                    w.add_tensor("five", {2, 1, 1, 1, 1}, DType::F32, values, 8);
                  }),
                  "GGUF tensor five: 5 dimensions (1 to 4 supported)");
}

// Arrays of strings whose count the header claims: the file (sparse) is large enough for that
// many empty strings, so only the total-element bound can refuse it. At the limit the count is
// accepted and the first element, whose length is over its own bound, ends the parse: the
// elements are never materialised (only reserved, untouched).
TEST_F(LimitsGguf, ArrayElementsInTotal) {
  const auto claim = [](uint64_t count) {
    Bytes b = gguf_header(0, 1);
    b.str("a").put(kTypeArray).put(kTypeString).put(count);
    b.put<uint64_t>(limits::kMaxGgufStringLength + 1);
    return b.bytes();
  };
  const uint64_t room = 8 * (limits::kMaxGgufArrayElements + 1) + 64;
  const std::string at = open_error(claim(limits::kMaxGgufArrayElements), room);
  EXPECT_CONTAINS(at, "(limit 67108864)");
  EXPECT_NOT_CONTAINS(at, "elements in total");
  EXPECT_CONTAINS(open_error(claim(limits::kMaxGgufArrayElements + 1), room),
                  "metadata arrays hold more than 4194304 elements in total (key 'a')");
}

TEST_F(LimitsGguf, ArrayNesting) {
  // `levels` arrays, each the only element of the one around it; the innermost holds one byte.
  const auto nested = [](int levels) {
    Bytes b = gguf_header(0, 1);
    b.str("deep").put(kTypeArray);
    for (int level = 1; level < levels; ++level) b.put(kTypeArray).put<uint64_t>(1);
    b.put(kTypeU8).put<uint64_t>(1).put<uint8_t>(5);
    return b.bytes();
  };
  EXPECT_NO_THROW(GgufFile::open(write(nested(limits::kMaxGgufArrayDepth))));
  EXPECT_CONTAINS(open_error(nested(limits::kMaxGgufArrayDepth + 1)),
                  "metadata key 'deep' nests arrays deeper than 4 levels");
}

TEST_F(LimitsGguf, Alignment) {
  const auto aligned = [](uint64_t alignment) {
    Bytes b = gguf_header(0, 1);
    b.str("general.alignment").put<uint32_t>(10).put(alignment);  // uint64
    return b.bytes();
  };
  EXPECT_EQ(GgufFile::open(write(aligned(limits::kMaxGgufAlignment))).alignment(),
            limits::kMaxGgufAlignment);
  // One over is not a power of two; the next power of two is the real test of the bound.
  for (const uint64_t over : {limits::kMaxGgufAlignment + 1, limits::kMaxGgufAlignment * 2}) {
    EXPECT_CONTAINS(open_error(aligned(over)),
                    fmt::format("invalid general.alignment {} (must be a power of two up to "
                                "16777216)",
                                over));
  }
}

// ---- safetensors (io/safetensors.cpp) ----

TEST_F(LimitsGguf, SafetensorsHeaderIsRefusedBeforeItIsParsed) {
  const auto claim = [&](uint64_t length) {
    std::string bytes(8, '\0');
    std::memcpy(bytes.data(), &length, 8);       // little-endian host, as the format
    const auto path = write(bytes, 8 + length);  // sparse: the "header" is zeros
    return error_of([&] { SafetensorsFile::open(path); });
  };
  // At the limit the length is accepted and the zeros are not JSON.
  EXPECT_CONTAINS(claim(limits::kMaxSafetensorsHeaderBytes),
                  "safetensors header is not a valid JSON object");
  EXPECT_CONTAINS(claim(limits::kMaxSafetensorsHeaderBytes + 1),
                  "bad safetensors header length 104857601: over the limit of 104857600 bytes");
}

// ---- text files (io/text_file.cpp) ----

TEST(Limits, TextFileSizeIsCheckedWithoutReadingTheFile) {
  TempDir dir;
  const auto path = (dir / "big.txt").string();
  { std::ofstream create(path); }
  std::filesystem::resize_file(path, limits::kMaxTextFileBytes);  // sparse
  EXPECT_EQ(checked_text_file_size(path), limits::kMaxTextFileBytes);
  std::filesystem::resize_file(path, limits::kMaxTextFileBytes + 1);
  EXPECT_CONTAINS(error_of([&] { checked_text_file_size(path); }),
                  "is 268435457 bytes; the limit is 256 MiB");
  EXPECT_CONTAINS(error_of([&] { read_text_file(path); }), "the limit is 256 MiB");
  std::ofstream(path, std::ios::trunc) << "small";
  EXPECT_EQ(read_text_file(path), "small");
}

// `tokenize -f` reads its input with the same bound (it read any file whole before).
TEST(Limits, TokenizeInputFile) {
  TempDir dir;
  const auto tokenizer = (dir / "t.json").string();
  std::ofstream(tokenizer)
      << R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]},)"
      << R"( "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false,)"
      << R"( "use_regex": true}})";
  const auto input = (dir / "in.txt").string();
  { std::ofstream create(input); }
  std::filesystem::resize_file(input, limits::kMaxTextFileBytes + 1);
  testing::expect_run_fails_with_one_line("tokenize -m '" + tokenizer + "' -f '" + input + "'",
                                          "is 268435457 bytes; the limit is 256 MiB");
  std::ofstream(input, std::ios::trunc) << "abba";
  const testing::CommandResult ok =
      testing::run_protokv("tokenize -m '" + tokenizer + "' -f '" + input + "' --json");
  ASSERT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_EQ(nlohmann::json::parse(ok.out)["ids"], (std::vector<int32_t>{2, 1, 0}));
}

// ---- calibration profiles (press/calibration_profile.cpp) ----

press::CalibrationProfile one_layer_profile() {
  press::CalibrationProfile p;
  p.model_file = "m.gguf";
  p.model_name = "m";
  p.n_layers = 1;
  p.n_heads = 1;
  p.n_kv_heads = 1;
  p.head_dim = 8;
  p.source_kind = "model";
  p.source_name = "samples";
  p.samples = 1;
  p.tokens = 16;
  p.chelsea_unlinked_share = {{0.5f}};
  p.chelsea_outlier = {{0}};
  p.pod_similarity = {{1.0}};
  p.pod_block_start = {{0}};
  return p;
}

TEST(Limits, CalibrationProfileShape) {
  const nlohmann::json valid = calibration_profile_to_json(one_layer_profile());
  ASSERT_NO_THROW(press::calibration_profile_from_json(valid, "p.json"));
  const auto load = [&](const char* field, int64_t value) {
    nlohmann::json j = valid;
    j["model"][field] = value;
    return error_of([&] { press::calibration_profile_from_json(j, "p.json"); });
  };
  // At the layer and KV-head limits the arrays (one layer, one head) no longer match the shape.
  EXPECT_CONTAINS(load("n_layers", limits::kMaxProfileLayers),
                  "chelsea.unlinked_share must be an array of 4096 rows");
  EXPECT_CONTAINS(load("n_layers", limits::kMaxProfileLayers + 1),
                  "model.n_layers = 4097 is outside [1, 4096]");
  EXPECT_CONTAINS(load("n_kv_heads", limits::kMaxProfileHeads),
                  "chelsea.unlinked_share[0] must be an array of 4096 values");
  EXPECT_CONTAINS(load("n_kv_heads", limits::kMaxProfileHeads + 1),
                  "model.n_kv_heads = 4097 is outside [1, 4096]");
  EXPECT_CONTAINS(load("n_heads", limits::kMaxProfileHeads + 1),
                  "model.n_heads = 4097 is outside [1, 4096]");
  EXPECT_CONTAINS(load("head_dim", limits::kMaxProfileHeadDim + 1),
                  "model.head_dim = 16385 is outside [1, 16384]");
  // n_heads and head_dim are recorded, not array lengths: at the limit the profile loads.
  nlohmann::json at = valid;
  at["model"]["n_heads"] = limits::kMaxProfileHeads;
  at["model"]["head_dim"] = limits::kMaxProfileHeadDim;
  const press::CalibrationProfile p = press::calibration_profile_from_json(at, "p.json");
  EXPECT_EQ(p.n_heads, limits::kMaxProfileHeads);
  EXPECT_EQ(p.head_dim, limits::kMaxProfileHeadDim);
}

// ---- make-model (model/random_model.cpp) ----

// The largest vocabulary whose model fits kMaxRandomModelBytes is accepted, one token more is
// refused. Nothing is allocated: validate_random_model only sizes the file.
TEST(Limits, RandomModelBytes) {
  RandomModelOptions options;
  options.config = small_config();
  options.config.dim = 8192;
  options.config.hidden_dim = 8192;
  options.config.n_layers = 1;
  options.config.n_heads = 64;
  options.config.n_kv_heads = 8;
  const auto bytes = [&](int vocab) {
    ModelConfig c = options.config;
    c.vocab_size = vocab;
    return llama_file_bytes(c, options.type);
  };
  int lo = kMinSyntheticVocab, hi = limits::kMaxVocab;  // bytes(lo) fits, bytes(hi) does not
  ASSERT_LE(bytes(lo), limits::kMaxRandomModelBytes);
  ASSERT_GT(bytes(hi), limits::kMaxRandomModelBytes);
  while (hi - lo > 1) {
    const int mid = lo + (hi - lo) / 2;
    (bytes(mid) <= limits::kMaxRandomModelBytes ? lo : hi) = mid;
  }
  options.config.vocab_size = lo;
  EXPECT_NO_THROW(validate_random_model(options));
  options.config.vocab_size = hi;
  EXPECT_CONTAINS(error_of([&] { validate_random_model(options); }), "(limit 64 GiB)");
}

// ---- the CLI's bounds on flags ----

TEST(Limits, CalibrationSamples) {
  // Checked before the model is loaded: at the limit the next check (--tokens) speaks.
  const std::string args = "calibrate -m /nonexistent.gguf --tokens 1 --samples ";
  testing::expect_run_fails_with_one_line(args + std::to_string(limits::kMaxCalibrationSamples),
                                          "--tokens 1 is too short");
  testing::expect_run_fails_with_one_line(args + std::to_string(limits::kMaxCalibrationSamples + 1),
                                          "--samples must be in [1, 4096], got 4097");
}

// ---- the server (server/*, `protokv serve`) ----

std::filesystem::path recall_model_path() {
  return std::filesystem::path(PROTOKV_SOURCE_DIR) / "models" / "protokv-recall.gguf";
}

const LoadedModel& recall_model() {
  static const LoadedModel model = load_model(recall_model_path().string());
  return model;
}

TEST(Limits, StopSequences) {
  nlohmann::json body = {{"prompt", "x"}, {"stop", nlohmann::json::array()}};
  for (size_t i = 0; i < limits::kMaxStopSequences; ++i)
    body["stop"].push_back(std::string(1, static_cast<char>('a' + i)));
  EXPECT_EQ(server::parse_completion_request(body, false).stop.size(), limits::kMaxStopSequences);
  body["stop"].push_back("z");
  try {
    server::parse_completion_request(body, false);
    ADD_FAILURE() << "no error";
  } catch (const server::ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_CONTAINS(e.what(), "at most 4 stop sequences, got 5");
  }
}

TEST(Limits, ServerParallelSessionsAndBodySize) {
  const auto construct = [](auto set) {
    server::ServerOptions o;
    o.host = "127.0.0.1";
    o.port = 0;
    o.chat_template = "chatml";
    set(o);
    return server::Server(recall_model(), o);
  };
  EXPECT_NO_THROW(construct([](auto& o) { o.scheduler.parallel = limits::kMaxParallelSessions; }));
  EXPECT_CONTAINS(
      error_of([&] {
        construct([](auto& o) { o.scheduler.parallel = limits::kMaxParallelSessions + 1; });
      }),
      "--parallel must be in 1..1024, got 1025");
  EXPECT_NO_THROW(construct([](auto& o) { o.max_body_bytes = limits::kMaxRequestBodyBytes; }));
  EXPECT_NO_THROW(construct([](auto& o) { o.max_body_bytes = limits::kMinRequestBodyBytes; }));
  EXPECT_CONTAINS(error_of([&] {
                    construct([](auto& o) { o.max_body_bytes = limits::kMaxRequestBodyBytes + 1; });
                  }),
                  "--max-body must be in [1024, 1073741824] bytes, got 1073741825");
  EXPECT_CONTAINS(error_of([&] {
                    construct([](auto& o) { o.max_body_bytes = limits::kMinRequestBodyBytes - 1; });
                  }),
                  "--max-body must be in [1024, 1073741824] bytes, got 1023");
}

// A body of exactly --max-body bytes is read (and answered); one byte more is 413.
TEST(Limits, ServerRequestBodyOfMaxBodyBytes) {
  server::ServerOptions o;
  o.host = "127.0.0.1";
  o.port = 0;
  o.chat_template = "chatml";
  o.max_body_bytes = 4096;
  server::Server s(recall_model(), o);
  const int port = s.bind();
  std::thread listener([&] { s.listen(); });
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(60, 0);
  // A short prompt padded with JSON whitespace to exactly `size` bytes.
  const auto body_of_size = [](size_t size) {
    std::string body =
        nlohmann::json{{"prompt", "hello"}, {"max_tokens", 1}, {"temperature", 0}}.dump();
    body.append(size - body.size(), ' ');
    return body;
  };
  const auto at = c.Post("/v1/completions", body_of_size(o.max_body_bytes), "application/json");
  const auto over =
      c.Post("/v1/completions", body_of_size(o.max_body_bytes + 1), "application/json");
  s.stop();
  listener.join();
  ASSERT_TRUE(at);
  EXPECT_NE(at->status, 413) << at->body;
  EXPECT_CONTAINS(at->body, "choices");
  ASSERT_TRUE(over);
  EXPECT_EQ(over->status, 413) << over->body;
}

TEST(Limits, ServeFlags) {
  // Checked before the server starts: at the limit the (bad) port is what stops it.
  const std::string serve = "serve -m '" + recall_model_path().string() + "' --port 70000 ";
  testing::expect_run_fails_with_one_line(serve + "--parallel 1024", "--port");
  testing::expect_run_fails_with_one_line(serve + "--parallel 1025",
                                          "--parallel must be in 1..1024, got 1025");
  testing::expect_run_fails_with_one_line(serve + "--max-body 1024", "--port");
  testing::expect_run_fails_with_one_line(serve + "--max-body 1025",
                                          "--max-body must be in (0, 1024] MiB, got 1025");
}

// ---- memory estimates (protokv/memory.h, model/loader.cpp) ----

TEST(MemoryCheck, NeededAtTheAvailableFitsOneByteMoreIsRefused) {
  const AvailableMemory available{uint64_t{3} << 30, "a test's budget"};
  EXPECT_NO_THROW(check_memory_fits("this", available.bytes, available));
  EXPECT_EQ(error_of([&] { check_memory_fits("this", uint64_t{5} << 30, available); }),
            "this needs ~5.0 GiB of memory but only 3.0 GiB is available (a test's budget)");
  EXPECT_CONTAINS(error_of([&] { check_memory_fits("this", available.bytes + 1, available); }),
                  "this needs ~3.0 GiB of memory but only 3.0 GiB is available");
}

TEST(MemoryCheck, TheSystemSaysWhatIsAvailable) {
  const AvailableMemory available = available_memory();
  EXPECT_GT(available.bytes, uint64_t{0});
  EXPECT_FALSE(available.source.empty());
}

TEST(MemoryCheck, KvCacheBytesFollowTheShape) {
  ModelConfig c = small_config();  // 2 layers, 2 KV heads of 16
  // Per token, layer and KV head: key and value rows (2 x 16 floats), a position and a weight.
  const uint64_t per_token = 2 * 2 * (2 * 16 + 2) * 4;
  EXPECT_EQ(kv_cache_bytes(c, 1000), 1000 * per_token);
  c.local_layers = {1, 0};  // layer 0 keeps a window of 100
  c.sliding_window = 100;
  EXPECT_EQ(kv_cache_bytes(c, 1000), (100 + 1000) * per_token / 2);
  EXPECT_EQ(kv_cache_bytes(c, 50), 50 * per_token);
  // In a typed cache, rows of the type (a head of 16 halves: 32 bytes), the same metadata.
  const uint64_t f16_per_token = 2 * 2 * (2 * 32 + 2 * 4);
  EXPECT_EQ(kv_cache_bytes(c, 50, KvCacheType{DType::F16, DType::F16}), 50 * f16_per_token);
}

// The loader's estimate counts the mapped tensors and the copies it makes: a norm vector stored
// as F16 is converted to F32.
TEST(MemoryCheck, GgufEstimateCountsMappedTensorsAndCopies) {
  TempDir dir;
  const auto path = (dir / "t.gguf").string();
  GgufWriter w;
  const uint16_t half[3] = {0x3c00, 0x3c00, 0x3c00};
  const float full[2] = {1.0f, 2.0f};
  w.add_tensor("norm", {3}, DType::F16, half, sizeof(half));
  w.add_tensor("w", {2}, DType::F32, full, sizeof(full));
  w.write(path);
  EXPECT_EQ(gguf_model_memory_bytes(GgufFile::open(path)), sizeof(half) + 3 * 4 + sizeof(full));
}

// A model whose estimate is the available memory loads; one byte less is refused before any
// weight is read or copied, with one line naming the file.
TEST(MemoryCheck, LoadingAModelThatCannotFitIsOneLine) {
  TempDir dir;
  const auto path = (dir / "m.gguf").string();
  RandomModelOptions options;
  options.config = small_config();
  write_random_model(options, path);
  uint64_t tensor_bytes = 0;  // F32 throughout, aligned: the estimate is the tensors' bytes
  const GgufFile file = GgufFile::open(path);
  for (const GgufTensorInfo& t : file.tensors()) tensor_bytes += t.nbytes;
  ASSERT_GT(tensor_bytes, uint64_t{0});
  const LoadedModel model = load_model(path, "", AvailableMemory{tensor_bytes, "test"});
  EXPECT_EQ(model.weights.config.n_layers, 2);
  EXPECT_EQ(error_of([&] {
              load_model(path, "", AvailableMemory{tensor_bytes - 1, "test"});
            }),
            fmt::format("loading {} needs ~{} of memory but only {} is available (test)", path,
                        format_bytes(static_cast<double>(tensor_bytes)),
                        format_bytes(static_cast<double>(tensor_bytes - 1))));
}

TEST(MemoryCheck, LoadingALlama2cCheckpointThatCannotFit) {
  PROTOKV_REQUIRE_STORIES();
  const auto path = (testing::stories_dir() / "stories260K.bin").string();
  const uint64_t size = std::filesystem::file_size(path);
  EXPECT_NO_THROW(load_model(path, "", AvailableMemory{size, "test"}));
  EXPECT_CONTAINS(error_of([&] {
                    load_model(path, "", AvailableMemory{size - 1, "test"});
                  }),
                  "loading " + path + " needs ~");
}

}  // namespace
}  // namespace protokv
