// SPDX-License-Identifier: Apache-2.0
// The model subcommands through the real binary: make-model, info, convert.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "test_util.h"

namespace protokv {
namespace {

using testing::CommandResult;
using testing::expect_one_line_error;
using testing::run_protokv;
using testing::TempDir;

std::string quoted(const std::filesystem::path& p) {
  return fmt::format("'{}'", p.string());
}

// Exit 1 with exactly one line on stderr, starting "protokv: error:".

nlohmann::json info_json(const std::filesystem::path& model) {
  const CommandResult r = run_protokv("info -m " + quoted(model) + " --json");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return nlohmann::json::parse(r.out);
}

TEST(CliMakeModel, InfoShowsTheRequestedShape) {
  TempDir dir;
  const auto model = dir / "m.gguf";
  const CommandResult made = run_protokv(
      "make-model --dim 128 --layers 3 --heads 8 --kv-heads 2 --ffn 96 --vocab 1000 --ctx 4096 "
      "--type q8_0 --seed 4 --rope-theta 500000 -o " +
      quoted(model));
  ASSERT_EQ(made.exit_code, 0) << made.err;
  EXPECT_NE(made.out.find("wrote"), std::string::npos);
  const auto j = info_json(model);
  EXPECT_EQ(j["format"], "gguf");
  EXPECT_EQ(j["architecture"], "llama");
  EXPECT_EQ(j["dim"], 128);
  EXPECT_EQ(j["hidden_dim"], 96);
  EXPECT_EQ(j["n_layers"], 3);
  EXPECT_EQ(j["n_heads"], 8);
  EXPECT_EQ(j["n_kv_heads"], 2);
  EXPECT_EQ(j["head_dim"], 16);
  EXPECT_EQ(j["vocab_size"], 1000);
  EXPECT_EQ(j["context_length"], 4096);
  EXPECT_EQ(j["rope_theta"], 500000.0);
  EXPECT_EQ(j["tokenizer"]["vocab_size"], 1000);
  // 2 + 2 * 3 norm vectors stay f32; 1 + 1 + 7 * 3 matrices are q8_0 (all rows multiples of 32).
  EXPECT_EQ(j["tensor_types"]["f32"], 7);
  EXPECT_EQ(j["tensor_types"]["q8_0"], 23);
  const int64_t params =
      2 * 1000 * 128 + 128 + 3 * (128 * 128 + 2 * 32 * 128 + 128 * 128 + 3 * 96 * 128 + 2 * 128);
  EXPECT_EQ(j["parameters"], params);

  const CommandResult text = run_protokv("info -m " + quoted(model));
  EXPECT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find("kv heads      2"), std::string::npos) << text.out;
}

TEST(CliMakeModel, ArchitecturesAndRopeScalingShowInInfo) {
  TempDir dir;
  const std::string shape = " --dim 64 --layers 2 --heads 4 --kv-heads 2 --ffn 96 --vocab 300 ";
  {
    const auto model = dir / "q3.gguf";
    const CommandResult made =
        run_protokv("make-model --arch qwen3 --head-dim 32 --tied" + shape + "-o " + quoted(model));
    ASSERT_EQ(made.exit_code, 0) << made.err;
    const auto j = info_json(model);
    EXPECT_EQ(j["architecture"], "qwen3");
    EXPECT_EQ(j["head_dim"], 32);
    EXPECT_EQ(j["rope_type"], "neox");
    EXPECT_EQ(j["n_rot"], 32);
    EXPECT_EQ(j["rope_scaling"], "none");
    EXPECT_TRUE(j["shared_classifier"].get<bool>());
    // token_embd + output_norm + 2 x (attn/ffn norms, q/k norms): 1 + 1 + 2 * 4 f32 vectors and 1
    // + 2 * 7 matrices, all f32 here.
    EXPECT_EQ(j["tensor_types"]["f32"], 1 + 1 + 2 * 4 + 2 * 7);
  }
  {
    const auto model = dir / "q2.gguf";
    ASSERT_EQ(
        run_protokv("make-model --arch qwen2 --type f16" + shape + "-o " + quoted(model)).exit_code,
        0);
    const auto j = info_json(model);
    EXPECT_EQ(j["architecture"], "qwen2");
    EXPECT_EQ(j["rope_type"], "neox");
    // Biases are f32 vectors: 2 global + 2 x (2 norms + 3 biases); matrices f16.
    EXPECT_EQ(j["tensor_types"]["f32"], 1 + 2 * 5);
    EXPECT_EQ(j["tensor_types"]["f16"], 2 + 2 * 7);
  }
  {
    const auto model = dir / "l3.gguf";
    ASSERT_EQ(run_protokv("make-model --rope-scaling llama3 --rope-theta 500000" + shape + "-o " +
                          quoted(model))
                  .exit_code,
              0);
    const auto j = info_json(model);
    EXPECT_EQ(j["rope_type"], "norm");
    EXPECT_NE(j["rope_scaling"].get<std::string>().find("llama3"), std::string::npos);
    const CommandResult text = run_protokv("info -m " + quoted(model));
    EXPECT_NE(text.out.find("rope scaling  llama3 frequency factors"), std::string::npos)
        << text.out;
  }
  {
    const auto model = dir / "lin.gguf";
    ASSERT_EQ(run_protokv("make-model --rope-scaling linear --rope-scaling-factor 4" + shape +
                          "-o " + quoted(model))
                  .exit_code,
              0);
    EXPECT_EQ(info_json(model)["rope_scaling"], "linear (factor 4)");
  }
  const std::string out = " -o " + quoted(dir / "bad.gguf");
  expect_one_line_error(run_protokv("make-model --arch gpt2" + shape + out),
                        "unsupported model architecture 'gpt2'");
  expect_one_line_error(run_protokv("make-model --arch qwen2 --rope-scaling llama3" + shape + out),
                        "--rope-scaling llama3 is for --arch llama");
  expect_one_line_error(run_protokv("make-model --rope-scaling yarn" + shape + out),
                        "unknown --rope-scaling 'yarn'");
  expect_one_line_error(run_protokv("make-model --rope-scaling linear" + shape + out),
                        "--rope-scaling-factor");
  expect_one_line_error(run_protokv("make-model --rope-scaling-factor 2" + shape + out),
                        "--rope-scaling-factor needs --rope-scaling linear");
  expect_one_line_error(run_protokv("make-model --head-dim 32" + shape + out),
                        "only qwen3, gemma3 have wider or narrower heads");
  expect_one_line_error(run_protokv("make-model --arch qwen3 --head-dim 15" + shape + out),
                        "head dimension 15 must be even");
}

TEST(CliMakeModel, Q8FallbackIsReportedOnStderr) {
  TempDir dir;
  const CommandResult r =
      run_protokv("make-model --dim 64 --layers 2 --heads 4 --ffn 80 --vocab 300 --type q8_0 -o " +
                  quoted(dir / "m.gguf"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("blk.1.ffn_down.weight: rows of 80 values"), std::string::npos) << r.err;
  EXPECT_EQ(info_json(dir / "m.gguf")["tensor_types"]["f16"], 2);
}

TEST(CliMakeModel, BadShapesFailWithOneLine) {
  TempDir dir;
  const std::string out = " -o " + quoted(dir / "bad.gguf");
  expect_one_line_error(run_protokv("make-model --dim 64 --layers 2 --heads 3 --vocab 300" + out),
                        "head count 3");
  expect_one_line_error(
      run_protokv("make-model --dim 64 --layers 2 --heads 4 --kv-heads 3 --vocab 300" + out),
      "KV head count 3");
  expect_one_line_error(run_protokv("make-model --dim 36 --layers 2 --heads 4 --vocab 300" + out),
                        "even");
  expect_one_line_error(run_protokv("make-model --dim 64 --layers 2 --heads 4 --vocab 100" + out),
                        "at least 259");
  expect_one_line_error(run_protokv("make-model --dim 64 --layers 0 --heads 4 --vocab 300" + out),
                        "layer count 0");
  expect_one_line_error(
      run_protokv("make-model --dim 64 --layers 2 --heads 4 --vocab 300 --ctx 0" + out),
      "context length 0");
  // q4_0 and q4_K have a quantiser now; q6_K has none, iq2_xxs is not a protokv type.
  expect_one_line_error(
      run_protokv("make-model --dim 64 --layers 2 --heads 4 --vocab 300 --type q6_K" + out),
      "cannot write q6_K weights");
  expect_one_line_error(
      run_protokv("make-model --dim 64 --layers 2 --heads 4 --vocab 300 --type iq2_xxs" + out),
      "unknown tensor type 'iq2_xxs'");
  expect_one_line_error(run_protokv("make-model --dim 65536 --layers 1000 --heads 64 --vocab "
                                    "4000000" +
                                    out),
                        "GiB");
  EXPECT_FALSE(std::filesystem::exists(dir / "bad.gguf"));
}

TEST(CliInfo, TruncatedAndMissingFilesFailWithOneLine) {
  TempDir dir;
  const auto model = dir / "m.gguf";
  ASSERT_EQ(run_protokv("make-model --dim 64 --layers 1 --heads 4 --vocab 300 -o " + quoted(model))
                .exit_code,
            0);
  const auto size = std::filesystem::file_size(model);
  for (const auto keep : {size - 1, size / 2, uintmax_t{100}, uintmax_t{10}}) {
    std::filesystem::copy_file(model, dir / "cut.gguf",
                               std::filesystem::copy_options::overwrite_existing);
    std::filesystem::resize_file(dir / "cut.gguf", keep);
    expect_one_line_error(run_protokv("info -m " + quoted(dir / "cut.gguf")));
  }
  expect_one_line_error(run_protokv("info -m " + quoted(dir / "absent.gguf")), "not found");
  std::ofstream(dir / "junk.gguf", std::ios::binary) << std::string("GGUF\x03\0\0\0\x01", 9);
  expect_one_line_error(run_protokv("info -m " + quoted(dir / "junk.gguf")), "truncated");
}

TEST(CliConvert, Stories260KToGguf) {
  PROTOKV_REQUIRE_STORIES();
  TempDir dir;
  const auto bin = testing::stories_dir() / "stories260K.bin";
  const auto tok = testing::stories_dir() / "tok512.bin";
  const auto out = dir / "stories260K.gguf";
  const CommandResult r =
      run_protokv("convert " + quoted(bin) + " " + quoted(tok) + " -o " + quoted(out));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = info_json(out);
  EXPECT_EQ(j["format"], "gguf");
  EXPECT_EQ(j["dim"], 64);
  EXPECT_EQ(j["hidden_dim"], 172);
  EXPECT_EQ(j["n_layers"], 5);
  EXPECT_EQ(j["n_heads"], 8);
  EXPECT_EQ(j["n_kv_heads"], 4);
  EXPECT_EQ(j["vocab_size"], 512);
  EXPECT_EQ(j["context_length"], 512);
  EXPECT_EQ(j["tokenizer"]["vocab_size"], 512);
  EXPECT_EQ(j["tensor_types"].size(), 1u);
  EXPECT_EQ(j["gguf"]["version"], 3);

  // The llama2.c original reports the same shapes and parameter count.
  const CommandResult original =
      run_protokv("info -m " + quoted(bin) + " --tokenizer " + quoted(tok) + " --json");
  ASSERT_EQ(original.exit_code, 0) << original.err;
  const auto o = nlohmann::json::parse(original.out);
  EXPECT_EQ(o["format"], "llama2c");
  for (const char* key : {"dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size",
                          "context_length", "parameters", "shared_classifier"}) {
    EXPECT_EQ(o[key], j[key]) << key;
  }

  // q8_0: ffn_down rows are 172 wide, so those five tensors fall back to f16, and say so.
  const auto q8 = dir / "stories260K-q8.gguf";
  const CommandResult rq = run_protokv("convert " + quoted(bin) + " " + quoted(tok) + " -o " +
                                       quoted(q8) + " --type q8_0");
  ASSERT_EQ(rq.exit_code, 0) << rq.err;
  EXPECT_NE(rq.err.find("blk.4.ffn_down.weight: rows of 172 values"), std::string::npos) << rq.err;
  j = info_json(q8);
  EXPECT_EQ(j["tensor_types"]["f16"], 5);
  EXPECT_EQ(j["tensor_types"]["q8_0"], 2 * 5 + 4 * 5 + 1);  // gate, up; q, k, v, o; embd

  // GGUF -> GGUF changes the type too.
  const auto f16 = dir / "stories260K-f16.gguf";
  ASSERT_EQ(run_protokv("convert " + quoted(out) + " -o " + quoted(f16) + " --type f16").exit_code,
            0);
  EXPECT_EQ(info_json(f16)["tensor_types"]["f16"], 7 * 5 + 1);
}

TEST(CliConvert, Llama2cNeedsItsTokenizer) {
  PROTOKV_REQUIRE_STORIES();
  TempDir dir;
  expect_one_line_error(
      run_protokv("convert " + quoted(testing::stories_dir() / "stories260K.bin") + " -o " +
                  quoted(dir / "x.gguf")),
      "tokenizer");
  EXPECT_FALSE(std::filesystem::exists(dir / "x.gguf"));
}

}  // namespace
}  // namespace protokv
