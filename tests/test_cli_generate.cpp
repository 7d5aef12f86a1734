// SPDX-License-Identifier: Apache-2.0
// `protokv generate` and `protokv bench e2e` through the binary: the published stories260K
// output, JSON records, and one-line errors for bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "test_engine_model.h"
#include "test_util.h"

namespace protokv {
namespace {

using testing::run_protokv;
using testing::stories_dir;
using testing::TempDir;

// llama2.c's published greedy output for stories260K: BOS, then 200 tokens at temperature 0, the
// leading space of the first piece stripped (shared/models/stories260K/README.md).
constexpr const char* kStoriesGreedy200 =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. "
    "One day, she saw a big, red ball. She wanted to play with it, but it was too high.\n"
    "Lily's mom said, \"Lily, let's go to the park.\" Lily was sad and didn't know what to do. She "
    "said, \"I want to play with your ball, but I can't find it.\"\n"
    "Lily was sad and didn't know what to do. She said, \"I'm sorry, Lily. I didn't know what to "
    "do.\"\n"
    "Lily didn't want to help her mom, so she";

// One thread keeps the suite fast on a busy machine; the golden test below runs with the default
// thread count, so the parallel paths are covered too.
std::string stories_args(const std::string& threads = " -t 1") {
  return "-m '" + (stories_dir() / "stories260K.bin").string() + "' -z '" +
         (stories_dir() / "tok512.bin").string() + "'" + threads;
}

void write_text(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

TEST(CliGenerate, Stories260kGreedyMatchesPublishedOutput) {
  PROTOKV_REQUIRE_STORIES();
  const auto r = run_protokv("generate " + stories_args("") + " -n 200 --temp 0");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, kStoriesGreedy200);
  // One summary line on stderr.
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << r.err;
  EXPECT_NE(r.err.find("prefill"), std::string::npos);
}

TEST(CliGenerate, ConvertedGgufGivesThePublishedOutput) {
  PROTOKV_REQUIRE_STORIES();
  TempDir dir;
  const std::string inputs = "'" + (stories_dir() / "stories260K.bin").string() + "' '" +
                             (stories_dir() / "tok512.bin").string() + "'";
  for (const std::string type : {"f32", "f16", "q8_0"}) {
    SCOPED_TRACE(type);
    const auto gguf = (dir / ("stories-" + type + ".gguf")).string();
    const auto converted =
        run_protokv("convert " + inputs + " --type " + type + " -o '" + gguf + "'");
    ASSERT_EQ(converted.exit_code, 0) << converted.err;
    // The GGUF carries its own tokenizer: no -z.
    const auto r = run_protokv("generate -m '" + gguf + "' -n 200 --temp 0 -t 1");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    if (type == "f32") {
      EXPECT_EQ(r.out, kStoriesGreedy200);  // the same weights bit for bit
    } else {
      // Rounded weights: the greedy path may drift later, but the confident opening survives.
      EXPECT_EQ(r.out.rfind("Once upon a time, there was a little girl named Lily.", 0), 0u)
          << r.out;
    }
  }
}

TEST(CliGenerate, JsonRecordsConfigurationTokensAndMemory) {
  PROTOKV_REQUIRE_STORIES();
  const auto r = run_protokv("generate " + stories_args() + " -n 200 --temp 0 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["text"], kStoriesGreedy200);
  EXPECT_EQ(j["generated_tokens"].size(), 200u);
  EXPECT_EQ(j["prompt_tokens"], 1);
  EXPECT_EQ(j["config"]["press"]["name"], "full");
  EXPECT_EQ(j["config"]["mode"], "query-aware");
  EXPECT_EQ(j["config"]["sampler"]["kind"], "greedy");
  EXPECT_EQ(j["config"]["threads"], 1);  // -t 1
  EXPECT_EQ(j["config"]["model"]["n_kv_heads"], 4);
  // stories260K: 5 layers x 4 KV heads x 8 dims x (K + V) x 4 bytes = 1280 bytes per token.
  EXPECT_EQ(j["kv_bytes_after_prefill"], 1280);
  // Without compression the peak is every layer: 4 done + the full last one.
  EXPECT_EQ(j["kv_bytes_peak_prefill"], 1280);
  EXPECT_EQ(j["kv_bytes_end"], 200 * 1280);  // BOS + 199 decoded tokens
  EXPECT_EQ(j["decode_steps"], 199);
  EXPECT_TRUE(j["prefill_ms"].is_number());
  EXPECT_TRUE(j["decode_ms_per_token"].is_number());
}

TEST(CliGenerate, KvPositionsListWhatEachHeadKeeps) {
  PROTOKV_REQUIRE_STORIES();
  const std::string base = "generate " + stories_args() +
                           " -p 'Once upon a time there was a little girl who liked to play' "
                           "--press snapkv --budget 8 -n 3 --ignore-eos --kv-positions";
  const auto r = run_protokv(base + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  const int64_t prompt = j["prompt_tokens"].get<int64_t>();
  const int64_t steps = j["decode_steps"].get<int64_t>();
  ASSERT_EQ(steps, 2);  // the last generated token is not fed back
  ASSERT_EQ(j["kv_positions"].size(), j["config"]["model"]["n_layers"].get<size_t>());
  for (const auto& layer : j["kv_positions"]) {
    ASSERT_EQ(layer.size(), j["config"]["model"]["n_kv_heads"].get<size_t>());
    for (const auto& head : layer) {
      const auto positions = head.get<std::vector<int32_t>>();
      // Budget 8 after prefill, then one entry per decoded token, in position order.
      ASSERT_EQ(positions.size(), 8u + steps);
      EXPECT_TRUE(std::is_sorted(positions.begin(), positions.end()));
      EXPECT_EQ(positions.back(), prompt + steps - 1);
      EXPECT_EQ(positions[7], prompt - 1);  // SnapKV keeps its observation window
    }
  }
  testing::expect_run_fails_with_one_line(base, "--kv-positions needs --json");
}

TEST(CliGenerate, SamplingIsReproducibleAndSeedDependent) {
  PROTOKV_REQUIRE_STORIES();
  const std::string args = "generate " + stories_args() + " -p 'Once upon a time' -n 40 --temp 1";
  const auto a = run_protokv(args + " --seed 5");
  const auto b = run_protokv(args + " --seed 5");
  const auto c = run_protokv(args + " --seed 6");
  ASSERT_EQ(a.exit_code, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
  EXPECT_NE(a.out, c.out);
  EXPECT_FALSE(a.out.empty());
}

TEST(CliGenerate, BudgetCoveringThePromptChangesNothing) {
  PROTOKV_REQUIRE_STORIES();
  TempDir dir;
  write_text(dir / "prompt.txt",
             "Once upon a time, there was a little dog named Max. He liked to run.");
  const std::string base = "generate " + stories_args() + " -f '" + (dir / "prompt.txt").string() +
                           "' -n 60 --temp 0 --json";
  const auto plain = run_protokv(base);
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  const auto plain_json = nlohmann::json::parse(plain.out);
  // FullPress through the compression path (budget < prompt) and a budget >= prompt (skipped).
  for (const std::string extra :
       {" --press full --budget 4", " --press full --budget 1000", " --press full --ratio 1"}) {
    const auto r = run_protokv(base + extra);
    ASSERT_EQ(r.exit_code, 0) << extra << r.err;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["generated_tokens"], plain_json["generated_tokens"]) << extra;
    EXPECT_EQ(j["kv_bytes_after_prefill"], plain_json["kv_bytes_after_prefill"]) << extra;
  }
}

TEST(CliGenerate, QueryAgnosticModeFeedsTheSameTokens) {
  PROTOKV_REQUIRE_STORIES();
  const std::string base = "generate " + stories_args() +
                           " -p 'Lily had a red ball.' --question 'What color was the ball?' "
                           "-n 20 --temp 0 --json";
  const auto aware = run_protokv(base);
  const auto agnostic = run_protokv(base + " --mode query-agnostic");
  ASSERT_EQ(aware.exit_code, 0) << aware.err;
  ASSERT_EQ(agnostic.exit_code, 0) << agnostic.err;
  const auto a = nlohmann::json::parse(aware.out);
  const auto b = nlohmann::json::parse(agnostic.out);
  EXPECT_EQ(b["config"]["mode"], "query-agnostic");
  EXPECT_GT(b["question_tokens"].get<int>(), 0);
  EXPECT_EQ(a["prompt_tokens"].get<int>(),
            b["prompt_tokens"].get<int>() + b["question_tokens"].get<int>());
  // Without compression, prefilling the question or decoding it gives the same greedy tokens.
  EXPECT_EQ(a["generated_tokens"], b["generated_tokens"]);
}

// A llama2.c model and tokenizer whose greedy continuation is a fixed chain of tokens: attention
// and FFN outputs are zero (wo = w_down = 0), so the final state is the current token's one-hot
// embedding, and classifier row j holds the embeddings of the tokens whose successor is j.
// From BOS (1) the chain runs 3, 4, ..., 2 + kTokensBeforeEos, then EOS (2), then on to 3 +
// kTokensBeforeEos and upwards, wrapping to 3.
constexpr int kTokensBeforeEos = 5;
constexpr int kChainVocab = 32;

int32_t chain_successor(int32_t token) {
  if (token == 1) return 3;
  if (token == 2 + kTokensBeforeEos) return 2;
  if (token == 2) return 3 + kTokensBeforeEos;
  if (token == 0 || token + 1 >= kChainVocab) return 3;
  return token + 1;
}

void write_chain_model(const std::filesystem::path& model_path,
                       const std::filesystem::path& tokenizer_path) {
  testing::RandomModelSpec spec;
  spec.dim = 64;
  spec.hidden_dim = 32;
  spec.n_layers = 1;
  spec.n_heads = 4;
  spec.n_kv_heads = 4;
  spec.vocab_size = kChainVocab;
  spec.context_length = 64;
  auto model = testing::make_random_model(spec);
  const int dim = spec.dim;
  std::fill(model.token_embd.begin(), model.token_embd.end(), 0.0f);
  std::fill(model.output.begin(), model.output.end(), 0.0f);
  std::fill(model.output_norm.begin(), model.output_norm.end(), 1.0f);
  for (int32_t t = 0; t < kChainVocab; ++t) {
    model.token_embd[static_cast<size_t>(t * dim + t)] = 1.0f;
    model.output[static_cast<size_t>(chain_successor(t) * dim + t)] = 10.0f;
  }
  for (auto& layer : model.layers) {
    std::fill(layer.wo.begin(), layer.wo.end(), 0.0f);
    std::fill(layer.w_down.begin(), layer.w_down.end(), 0.0f);
  }
  testing::write_llama2c(model, model_path);

  // llama2.c tokenizer.bin: max_token_length, then per token (score, length, bytes).
  std::ofstream out(tokenizer_path, std::ios::binary);
  std::vector<std::string> pieces = {"<unk>", "\n<s>\n", "\n</s>\n"};
  for (int t = 3; t < kChainVocab; ++t)
    pieces.push_back(std::string(1, static_cast<char>('A' + t - 3)));
  const int32_t max_length = 8;
  out.write(reinterpret_cast<const char*>(&max_length), 4);
  for (const auto& piece : pieces) {
    const float score = 0.0f;
    const auto length = static_cast<int32_t>(piece.size());
    out.write(reinterpret_cast<const char*>(&score), 4);
    out.write(reinterpret_cast<const char*>(&length), 4);
    out.write(piece.data(), length);
  }
}

TEST(CliGenerate, UbatchGivesTheSameTokensWithAndWithoutAPress) {
  PROTOKV_REQUIRE_STORIES();
  const std::string base = "generate " + stories_args() +
                           " -p 'Once upon a time, there was a little dog named Max. He liked to "
                           "run.' --question 'What did Max like?' -n 30 --temp 0 --json";
  for (const std::string press :
       {"", " --press snapkv --budget 12", " --press protokv --budget 12 --mode query-agnostic"}) {
    const auto whole = run_protokv(base + press);
    const auto chunked = run_protokv(base + press + " --ubatch 5");
    ASSERT_EQ(whole.exit_code, 0) << whole.err;
    ASSERT_EQ(chunked.exit_code, 0) << chunked.err;
    const auto a = nlohmann::json::parse(whole.out);
    const auto b = nlohmann::json::parse(chunked.out);
    EXPECT_FALSE(a["config"].contains("ubatch"));
    EXPECT_EQ(b["config"]["ubatch"], 5);
    EXPECT_EQ(a["generated_tokens"], b["generated_tokens"]) << press;
    EXPECT_EQ(a["kv_bytes_after_prefill"], b["kv_bytes_after_prefill"]) << press;
  }
}

TEST(CliGenerate, StopsAtEosUnlessIgnored) {
  TempDir dir;
  write_chain_model(dir / "chain.bin", dir / "chain_tok.bin");
  const std::string args = "generate -m '" + (dir / "chain.bin").string() + "' -z '" +
                           (dir / "chain_tok.bin").string() + "' -n 12 --temp 0 -t 1 --json";
  const auto r = run_protokv(args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["stopped"], "eos");
  EXPECT_EQ(j["config"]["stop_at_eos"], true);
  EXPECT_EQ(j["generated_tokens"].get<std::vector<int32_t>>(),
            (std::vector<int32_t>{3, 4, 5, 6, 7}));  // EOS itself is not emitted
  EXPECT_EQ(j["text"], "ABCDE");

  const auto ignored = run_protokv(args + " --ignore-eos");
  ASSERT_EQ(ignored.exit_code, 0) << ignored.err;
  const auto k = nlohmann::json::parse(ignored.out);
  EXPECT_EQ(k["stopped"], "max_tokens");
  EXPECT_EQ(k["config"]["stop_at_eos"], false);
  // As llama.cpp's --ignore-eos: the end-of-generation token is never sampled (logit -inf), so
  // the chain goes on with the next most likely token instead of emitting EOS.
  const auto kept = k["generated_tokens"].get<std::vector<int32_t>>();
  ASSERT_EQ(kept.size(), 12u);
  EXPECT_EQ(std::vector<int32_t>(kept.begin(), kept.begin() + 5),
            (std::vector<int32_t>{3, 4, 5, 6, 7}));
  EXPECT_EQ(std::count(kept.begin(), kept.end(), 2), 0);

  // Streaming (no --json) stops at the same place.
  const auto streamed = run_protokv(args.substr(0, args.size() - std::string(" --json").size()));
  ASSERT_EQ(streamed.exit_code, 0) << streamed.err;
  EXPECT_EQ(streamed.out, "ABCDE");
}

TEST(CliGenerate, GenerationStopsWhenTheContextIsFull) {
  PROTOKV_REQUIRE_STORIES();
  const auto r = run_protokv("generate " + stories_args() + " -n 600 --temp 0 --json --ignore-eos");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["stopped"], "context_full");
  EXPECT_EQ(j["generated_tokens"].size(), 512u);  // BOS + 511 decoded; the last needs no pass
  EXPECT_EQ(j["kv_bytes_end"], 512 * 1280);
}

TEST(CliGenerate, BadInputIsOneLineError) {
  PROTOKV_REQUIRE_STORIES();
  TempDir dir;
  const std::string model = "-m '" + (stories_dir() / "stories260K.bin").string() + "'";
  const std::string tok = " -z '" + (stories_dir() / "tok512.bin").string() + "'";
  testing::expect_run_fails_with_one_line("generate " + model + " -n 5", "tokenizer");
  testing::expect_run_fails_with_one_line("generate " + model + tok + " -p ''", "empty prompt");
  // Absurd flags: one line, exit 1, before any work (CLI11's own parse errors included).
  testing::expect_run_fails_with_one_line("generate " + model + tok + " -n 1000000000000",
                                          "Could not convert: --n-predict");
  testing::expect_run_fails_with_one_line("generate " + model + tok + " --no-such-flag",
                                          "no-such-flag");
  testing::expect_run_fails_with_one_line("generate " + model + tok + " -t -3",
                                          "thread count (-t) must be in [0, 1024]");
  testing::expect_run_fails_with_one_line("generate " + model + tok + " -t 1025",
                                          "thread count (-t) must be in [0, 1024]");
  write_text(dir / "empty.txt", "");
  testing::expect_run_fails_with_one_line(
      "generate " + model + tok + " -f '" + (dir / "empty.txt").string() + "'", "empty prompt");
  testing::expect_run_fails_with_one_line(
      "generate " + model + tok + " -f '" + (dir / "absent.txt").string() + "'", "absent.txt");
  std::string long_text;
  for (int i = 0; i < 300; ++i) long_text += "The cat sat on the mat. ";
  write_text(dir / "long.txt", long_text);
  testing::expect_run_fails_with_one_line(
      "generate " + model + tok + " -f '" + (dir / "long.txt").string() + "'",
      "longer than the model's context");
  testing::expect_run_fails_with_one_line("generate " + model + tok + " -n -1", "-n");
  testing::expect_run_fails_with_one_line("generate " + model + tok + " --press nosuch --budget 4",
                                          "nosuch");
  testing::expect_run_fails_with_one_line("generate " + model + tok + " --budget -3", "budget");
  testing::expect_run_fails_with_one_line("generate " + model + tok + " --ratio 1.5", "ratio");
  testing::expect_run_fails_with_one_line("generate " + model + tok + " --budget 4 --ratio 0.5",
                                          "not both");
  testing::expect_run_fails_with_one_line("generate " + model + tok + " --mode sideways", "--mode");
  testing::expect_run_fails_with_one_line("generate " + model + tok + " --ubatch -2", "--ubatch");
  testing::expect_run_fails_with_one_line("generate " + model + tok + " --temp -1", "temperature");
  testing::expect_run_fails_with_one_line("generate " + model + tok + " --top-p 0", "top-p");
  testing::expect_run_fails_with_one_line(
      "generate " + model + tok + " -n 2 --logits-out '" + (dir / "no" / "dir.npy").string() + "'",
      "dir.npy");
  testing::expect_run_fails_with_one_line(
      "generate -m '" + (dir / "nomodel.bin").string() + "'" + tok, "not found");
}

TEST(CliGenerate, CorruptCheckpointsAreOneLineErrors) {
  testing::RandomModelSpec spec;
  const auto model = testing::make_random_model(spec);
  TempDir dir;
  testing::write_llama2c(model, dir / "good.bin");
  std::ifstream in(dir / "good.bin", std::ios::binary);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), {});
  auto write_bytes = [&](const std::string& name, const std::vector<char>& b) {
    std::ofstream out(dir / name, std::ios::binary);
    out.write(b.data(), static_cast<std::streamsize>(b.size()));
    return (dir / name).string();
  };
  for (size_t cut : {size_t{2}, size_t{20}, size_t{28}, size_t{5000}, bytes.size() - 8}) {
    const auto path =
        write_bytes("cut.bin", {bytes.begin(), bytes.begin() + static_cast<long>(cut)});
    testing::expect_run_fails_with_one_line("generate -m '" + path + "' -n 3", "");
  }
  auto longer = bytes;
  longer.insert(longer.end(), 64, '\0');
  testing::expect_run_fails_with_one_line(
      "generate -m '" + write_bytes("long.bin", longer) + "' -n 3", "does not match");
  for (auto [field, value] : std::vector<std::pair<int, int32_t>>{
           {0, -64}, {2, -1}, {3, 0}, {6, 1 << 30}, {1, 1 << 29}}) {
    auto bad = bytes;
    std::memcpy(bad.data() + 4 * field, &value, 4);
    testing::expect_run_fails_with_one_line(
        "generate -m '" + write_bytes("bad.bin", bad) + "' -n 3", "llama2.c");
  }
  // A valid checkpoint without -z: the tokenizer is missing.
  testing::expect_run_fails_with_one_line("generate -m '" + (dir / "good.bin").string() + "' -n 3",
                                          "tokenizer");
}

TEST(CliBench, E2eReportsEveryContext) {
  testing::RandomModelSpec spec;
  spec.dim = 128;
  spec.n_heads = 4;
  spec.hidden_dim = 256;
  spec.context_length = 128;
  const auto model = testing::make_random_model(spec);
  TempDir dir;
  testing::write_llama2c(model, dir / "model.bin");
  const std::string m = "-m '" + (dir / "model.bin").string() + "'";
  const auto r =
      run_protokv("bench e2e " + m + " -c 16,100 -n 4 -t 1 --json --gemm-size 256 --copy-mib 16");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["results"].size(), 2u);
  EXPECT_EQ(j["results"][0]["context"], 16);
  EXPECT_EQ(j["results"][1]["context"], 100);
  EXPECT_EQ(j["results"][1]["decode_steps"], 4);
  // KV bytes after prefill: layers x KV heads x head_dim x (K + V) x 4 bytes per token.
  EXPECT_EQ(j["results"][1]["kv_bytes_after_prefill"], 100 * 2 * 2 * 32 * 2 * 4);
  EXPECT_EQ(j["machine"]["sgemm_size"], 256);
  EXPECT_EQ(j["machine"]["copy_bytes"], 16 << 20);
  EXPECT_GT(j["machine"]["sgemm_gflops"].get<double>(), 0.0);
  EXPECT_GT(j["machine"]["copy_gbs_read_plus_write"].get<double>(), 0.0);
  EXPECT_GT(j["results"][0]["prefill_gflops"].get<double>(), 0.0);
  // Decode CPU time per token: measured, positive, and a single thread cannot use more CPU than
  // wall time (small slack for the two clocks being read at slightly different instants).
  const double cpu_ms = j["results"][1]["decode_cpu_ms_per_token"].get<double>();
  EXPECT_GT(cpu_ms, 0.0);
  EXPECT_LE(cpu_ms, j["results"][1]["decode_ms_per_token"].get<double>() * 1.05 + 0.05);

  const auto chunked = run_protokv("bench e2e " + m +
                                   " -c 100 -n 2 -t 1 --json --gemm-size 64 --copy-mib 8 "
                                   "--ubatch 32");
  ASSERT_EQ(chunked.exit_code, 0) << chunked.err;
  const auto k = nlohmann::json::parse(chunked.out);
  EXPECT_EQ(k["config"]["ubatch"], 32);
  // The kernel variant that ran is part of the record (PROTOKV_ISA picks it).
  const auto scalar =
      run_protokv("bench e2e " + m + " -c 16 -n 1 -t 1 --json --gemm-size 64 " + "--copy-mib 8",
                  "PROTOKV_ISA=scalar");
  ASSERT_EQ(scalar.exit_code, 0) << scalar.err;
  EXPECT_EQ(nlohmann::json::parse(scalar.out)["config"]["kernels"], "scalar");
  EXPECT_EQ(k["results"][0]["kv_bytes_after_prefill"], 100 * 2 * 2 * 32 * 2 * 4);

  const auto table =
      run_protokv("bench e2e " + m + " -c 16 -n 2 -t 1 --gemm-size 128 --copy-mib 8");
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_NE(table.out.find("decode ms/t"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("dec CPU ms/t"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("| kernels "), std::string::npos) << table.out;

  testing::expect_run_fails_with_one_line("bench e2e " + m + " -c 200",
                                          "longer than the model's context");
  testing::expect_run_fails_with_one_line("bench e2e " + m + " -c 0", "context lengths");
  testing::expect_run_fails_with_one_line("bench e2e " + m + " -c 8 --ubatch -1", "--ubatch");
}

}  // namespace
}  // namespace protokv

namespace protokv {
namespace {

// -f reads a text prompt: a missing file and a file far too large to be a prompt (a sparse
// 300 MiB file: a model passed as text, say) are one clear line each, not a crash or a long read.
TEST(CliGenerate, PromptFileErrorsAreOneLine) {
  PROTOKV_REQUIRE_STORIES();
  const auto missing = run_protokv("generate " + stories_args() + " -f /nonexistent/prompt.txt");
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.err.find("file not found: /nonexistent/prompt.txt"), std::string::npos)
      << missing.err;
  TempDir dir;
  const auto huge = dir / "huge.txt";
  { std::ofstream create(huge); }
  std::filesystem::resize_file(huge, uintmax_t{300} << 20);
  const auto big = run_protokv("generate " + stories_args() + " -f '" + huge.string() + "'");
  EXPECT_EQ(big.exit_code, 1);
  EXPECT_NE(big.err.find("the limit is 256 MiB"), std::string::npos) << big.err;
  EXPECT_EQ(std::count(big.err.begin(), big.err.end(), '\n'), 1) << big.err;
}

// A generation whose KV cache could not fit is one line before any work: a model with a 16M-token
// context and 64 KiB of KV per token, asked for 2e9 tokens, needs ~1 TiB.
TEST(CliGenerate, AKvCacheThatCannotFitIsRefusedUpFront) {
  TempDir dir;
  const std::string model = (dir / "wide.gguf").string();
  const auto made = run_protokv(
      "make-model --arch qwen3 --dim 64 --layers 1 --heads 8 --head-dim 1024 --vocab 300 --ctx "
      "16777216 -o '" +
      model + "'");
  ASSERT_EQ(made.exit_code, 0) << made.err;
  testing::expect_run_fails_with_one_line(
      "generate -m '" + model + "' -p hello -n 2000000000 -t 1",
      "(a KV cache of up to 16777216 tokens) needs ~1.0 TiB of memory but only");
  // A short generation from the same model runs.
  const auto small = run_protokv("generate -m '" + model + "' -p hello -n 2 -t 1 --temp 0");
  EXPECT_EQ(small.exit_code, 0) << small.err;
}

}  // namespace
}  // namespace protokv
