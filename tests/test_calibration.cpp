// SPDX-License-Identifier: Apache-2.0
// Calibration profile (press/calibration_profile.h) and `protokv calibrate` (eval/calibration.h):
// the capture against a naive forward pass, the measures against a direct computation on the
// captured tensors, the profile's JSON round trip and every kind of bad file, and the command.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "eval/calibration.h"
#include "press/calibration_measures.h"
#include "press/calibration_profile.h"
#include "press/pod.h"
#include "protokv/error.h"
#include "protokv/press_registry.h"
#include "test_engine_model.h"
#include "test_util.h"

namespace protokv {
namespace {

using press::CalibrationProfile;
using testing::make_random_model;
using testing::random_tokens;
using testing::RandomModelSpec;

// A small valid profile: 3 layers, 4 query heads, 2 KV heads.
CalibrationProfile small_profile() {
  CalibrationProfile p;
  p.model_file = "model.gguf";
  p.model_name = "tiny";
  p.n_layers = 3;
  p.n_heads = 4;
  p.n_kv_heads = 2;
  p.head_dim = 16;
  p.source_kind = "file";
  p.source_name = "text.txt";
  p.samples = 2;
  p.tokens = 300;
  p.chelsea_unlinked_share = {{0.25f, 0.5f}, {0.0f, 1.0f}, {0.125f, 0.75f}};
  p.chelsea_outlier = {{0, 0}, {0, 1}, {0, 0}};
  p.pod_similarity = {{1.0, 0.6, 0.2, 0.6, 1.0, 0.3, 0.2, 0.3, 1.0},
                      {1.0, 0.7, 0.6, 0.7, 1.0, 0.55, 0.6, 0.55, 1.0}};
  p.pod_block_start = {{0, 0, 2}, {0, 0, 0}};
  return p;
}

void expect_equal(const CalibrationProfile& a, const CalibrationProfile& b) {
  EXPECT_EQ(a.version, b.version);
  EXPECT_EQ(a.model_file, b.model_file);
  EXPECT_EQ(a.model_name, b.model_name);
  EXPECT_EQ(a.n_layers, b.n_layers);
  EXPECT_EQ(a.n_heads, b.n_heads);
  EXPECT_EQ(a.n_kv_heads, b.n_kv_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.source_kind, b.source_kind);
  EXPECT_EQ(a.source_name, b.source_name);
  EXPECT_EQ(a.samples, b.samples);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.chelsea_threshold, b.chelsea_threshold);
  EXPECT_EQ(a.chelsea_fraction, b.chelsea_fraction);
  EXPECT_EQ(a.chelsea_layout.sinks, b.chelsea_layout.sinks);
  EXPECT_EQ(a.chelsea_layout.recent, b.chelsea_layout.recent);
  EXPECT_EQ(a.chelsea_layout.chunk, b.chelsea_layout.chunk);
  EXPECT_EQ(a.chelsea_unlinked_share, b.chelsea_unlinked_share);
  EXPECT_EQ(a.chelsea_outlier, b.chelsea_outlier);
  EXPECT_EQ(a.pod_delta, b.pod_delta);
  EXPECT_EQ(a.pod_rows, b.pod_rows);
  EXPECT_EQ(a.pod_similarity, b.pod_similarity);
  EXPECT_EQ(a.pod_block_start, b.pod_block_start);
}

void write_text(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// The Error a read of `text` throws, or "" when it reads.
std::string read_error(const std::string& text) {
  const testing::TempDir dir;
  write_text(dir / "p.json", text);
  try {
    press::read_calibration_profile((dir / "p.json").string());
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(CalibrationProfile, JsonRoundTripIsExact) {
  const testing::TempDir dir;
  const CalibrationProfile p = small_profile();
  press::write_calibration_profile(p, (dir / "p.json").string());
  expect_equal(press::read_calibration_profile((dir / "p.json").string()), p);
  // Format and version lead the file.
  EXPECT_EQ(read_text(dir / "p.json")
                .rfind("{\n  \"format\": \"protokv-calibration-profile\",\n"
                       "  \"version\": 1,",
                       0),
            0u);
}

TEST(CalibrationProfile, EveryBadFileIsOneClearError) {
  const std::string good = press::calibration_profile_to_json(small_profile()).dump();
  ASSERT_EQ(read_error(good), "");
  // Each case edits the valid profile; the error must be one line naming the field.
  struct Case {
    std::string what;
    std::function<void(nlohmann::json&)> edit;
    std::string needle;
  };
  const std::vector<Case> cases = {
      {"wrong format", [](auto& j) { j["format"] = "something-else"; }, "format must be"},
      {"newer version", [](auto& j) { j["version"] = 2; }, "version = 2 is not supported"},
      {"no version", [](auto& j) { j.erase("version"); }, "version = (missing)"},
      {"missing section", [](auto& j) { j.erase("pod"); }, "pod is missing"},
      {"unknown field", [](auto& j) { j["chelsea"]["treshold"] = 0.8; },
       "chelsea.treshold is not a field"},
      {"string for a number", [](auto& j) { j["model"]["n_layers"] = "3"; },
       "model.n_layers must be an integer"},
      {"zero layers", [](auto& j) { j["model"]["n_layers"] = 0; }, "model.n_layers = 0"},
      {"heads not a multiple", [](auto& j) { j["model"]["n_heads"] = 3; },
       "model.n_heads = 3 is not a multiple"},
      {"share rows", [](auto& j) { j["chelsea"]["unlinked_share"].erase(0); },
       "chelsea.unlinked_share must be an array of 3 rows"},
      {"share row length", [](auto& j) { j["chelsea"]["unlinked_share"][1].push_back(0.5); },
       "chelsea.unlinked_share[1] must be an array of 2 values"},
      {"share above 1", [](auto& j) { j["chelsea"]["unlinked_share"][2][1] = 1.5; },
       "chelsea.unlinked_share[2][1] = 1.5 is outside [0, 1]"},
      {"negative share", [](auto& j) { j["chelsea"]["unlinked_share"][0][0] = -0.1; },
       "chelsea.unlinked_share[0][0] = -0.1"},
      {"share null (NaN written)", [](auto& j) { j["chelsea"]["unlinked_share"][0][0] = nullptr; },
       "chelsea.unlinked_share[0][0] must be a number"},
      {"outlier flag 2", [](auto& j) { j["chelsea"]["outlier"][0][1] = 2; },
       "chelsea.outlier[0][1] = 2 is outside [0, 1]"},
      {"outlier shape", [](auto& j) { j["chelsea"]["outlier"] = nlohmann::json::array(); },
       "chelsea.outlier must be an array of 3 rows"},
      {"threshold", [](auto& j) { j["chelsea"]["threshold"] = 1.2; },
       "chelsea.threshold = 1.2 is outside [-1, 1]"},
      {"fraction", [](auto& j) { j["chelsea"]["outlier_fraction"] = -0.5; },
       "chelsea.outlier_fraction = -0.5"},
      {"chunk", [](auto& j) { j["chelsea"]["layout"]["chunk"] = 1; },
       "chelsea.layout.chunk = 1 is outside"},
      {"delta", [](auto& j) { j["pod"]["delta"] = 1.5; }, "pod.delta = 1.5 is outside [0, 1]"},
      {"rows", [](auto& j) { j["pod"]["rows"] = 0; }, "pod.rows = 0"},
      {"similarity shape", [](auto& j) { j["pod"]["similarity"][0].erase(8); },
       "pod.similarity[0] must be an array of 9 values"},
      {"similarity range", [](auto& j) { j["pod"]["similarity"][1][4] = 1.01; },
       "pod.similarity[1][4] = 1.01 is outside [0, 1]"},
      {"similarity asymmetric", [](auto& j) { j["pod"]["similarity"][0][1] = 0.9; },
       "(layers 0 and 1) is not symmetric"},
      {"block start shape", [](auto& j) { j["pod"]["block_start"][1].erase(2); },
       "pod.block_start[1] must be an array of 3 values"},
      {"block start above its layer", [](auto& j) { j["pod"]["block_start"][0][1] = 2; },
       "pod.block_start[0][1] = 2 must be 1 (a new block) or the previous layer's block start 0"},
      {"block start not contiguous",
       [](auto& j) {
         j["pod"]["block_start"][0] = {0, 1, 0};
       },
       "pod.block_start[0][2] = 0 must be 2"},
      {"first block start", [](auto& j) { j["pod"]["block_start"][1][0] = 1; },
       "pod.block_start[1][0] = 1 must be 0"},
      {"negative block start", [](auto& j) { j["pod"]["block_start"][1][0] = -1; },
       "pod.block_start[1][0] = -1 is outside"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    nlohmann::json j = nlohmann::json::parse(good);
    c.edit(j);
    const std::string error = read_error(j.dump(1));
    EXPECT_NE(error.find(c.needle), std::string::npos) << error;
    EXPECT_EQ(error.find('\n'), std::string::npos) << error;
    EXPECT_EQ(error.rfind("calibration profile ", 0), 0u) << error;
  }
  // Not JSON at all, or cut short: where it stops.
  for (const std::string& text :
       {good.substr(0, good.size() / 2), std::string(), std::string("x")}) {
    const std::string error = read_error(text);
    EXPECT_NE(error.find("not valid JSON at byte"), std::string::npos) << error;
    EXPECT_EQ(error.find('\n'), std::string::npos) << error;
  }
  EXPECT_NE(read_error("[1, 2]").find("must be a JSON object"), std::string::npos);
  EXPECT_THROW(press::read_calibration_profile("/nonexistent/p.json"), Error);
  // A device or pipe is refused before reading: /dev/zero would never end.
  try {
    (void)press::read_calibration_profile("/dev/zero");
    ADD_FAILURE() << "/dev/zero read as a profile";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a regular file"), std::string::npos) << e.what();
  }
  // Writing validates too: a bad profile is never written.
  CalibrationProfile bad = small_profile();
  bad.pod_block_start[0][2] = 1;
  const testing::TempDir dir;
  EXPECT_THROW(press::write_calibration_profile(bad, (dir / "bad.json").string()), Error);
  EXPECT_FALSE(std::filesystem::exists(dir / "bad.json"));
}

TEST(CalibrationProfile, PressesRejectAProfileOfAnotherModel) {
  const CalibrationProfile p = small_profile();
  SequenceInfo info{.n_layers = 3, .n_heads = 4, .n_kv_heads = 2, .head_dim = 16, .n_tokens = 99};
  EXPECT_NO_THROW(press::check_profile_matches(p, info, "chelsea"));
  for (auto edit : std::vector<std::function<void(SequenceInfo&)>>{
           [](SequenceInfo& i) { i.n_layers = 4; }, [](SequenceInfo& i) { i.n_heads = 8; },
           [](SequenceInfo& i) { i.n_kv_heads = 1; }, [](SequenceInfo& i) { i.head_dim = 8; }}) {
    SequenceInfo other = info;
    edit(other);
    try {
      press::check_profile_matches(p, other, "pod");
      ADD_FAILURE() << "a profile of another shape was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("press 'pod': the calibration profile is for tiny"),
                std::string::npos)
          << e.what();
    }
  }
}

TEST(CalibrationProfile, CachedLoadReadsEachFileOnce) {
  const testing::TempDir dir;
  press::write_calibration_profile(small_profile(), (dir / "p.json").string());
  const CalibrationProfile& first = press::load_profile_cached((dir / "p.json").string());
  const CalibrationProfile& again = press::load_profile_cached((dir / "." / "p.json").string());
  EXPECT_EQ(&first, &again);
  expect_equal(first, small_profile());
}

TEST(CalibrationProfile, ChelseaTakesItsOutlierHeadsFromAProfile) {
  const testing::TempDir dir;
  const std::string path = (dir / "chelsea.json").string();
  const CalibrationProfile p = small_profile();
  press::write_calibration_profile(p, path);
  const auto press = make_press("chelsea:profile=" + path);
  const nlohmann::json config = press->config();
  EXPECT_EQ(config["outlier_source"], "profile");
  EXPECT_EQ(config["profile"], path);
  EXPECT_EQ(config["outlier_heads"].get<std::vector<std::vector<uint8_t>>>(), p.chelsea_outlier);
  // Another model's shape is refused at prefill; the profile's choice excludes outliers=.
  const SequenceInfo other{
      .n_layers = 4, .n_heads = 4, .n_kv_heads = 2, .head_dim = 16, .n_tokens = 500};
  EXPECT_THROW(press->begin(other, Budget{.entries = 100}), Error);
  EXPECT_THROW(make_press("chelsea:outliers=0.1,profile=" + path), Error);
  EXPECT_THROW(make_press("chelsea:profile=" + (dir / "missing.json").string()), Error);
}

// The outlier heads of a profile were measured with its sinks / recent / chunk layout: a press
// with another layout refuses it, naming both.
TEST(CalibrationProfile, ChelseaRefusesAProfileOfAnotherLayout) {
  const testing::TempDir dir;
  CalibrationProfile p = small_profile();
  const std::string path = (dir / "chelsea.json").string();
  press::write_calibration_profile(p, path);
  for (const std::string options : {"chunk=128,", "sinks=4,", "recent=32,"}) {
    try {
      make_press("chelsea:" + options + "profile=" + path);
      ADD_FAILURE() << options << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("was calibrated with sinks=16 recent=64 chunk=256"),
                std::string::npos)
          << e.what();
    }
  }
  p.chelsea_layout.chunk = 128;
  const std::string other = (dir / "chunk128.json").string();
  press::write_calibration_profile(p, other);
  EXPECT_THROW(make_press("chelsea:profile=" + other), Error);
  EXPECT_EQ(make_press("chelsea:chunk=128,profile=" + other)->config()["outlier_source"],
            "profile");
}

TEST(CalibrationProfile, PodTakesItsLayerBlocksFromAProfile) {
  const testing::TempDir dir;
  const std::string path = (dir / "pod.json").string();
  const CalibrationProfile p = small_profile();
  press::write_calibration_profile(p, path);
  auto press = make_press("pod:profile=" + path);
  EXPECT_EQ(press->config()["blocks"], "profile");
  EXPECT_EQ(press->config()["profile"], path);
  const SequenceInfo info{
      .n_layers = 3, .n_heads = 4, .n_kv_heads = 2, .head_dim = 16, .n_tokens = 500};
  press->begin(info, Budget{.entries = 100});
  EXPECT_EQ(dynamic_cast<const press::PodPress&>(*press).block_starts(), p.pod_block_start);
  SequenceInfo other = info;
  other.n_kv_heads = 1;
  EXPECT_THROW(press->begin(other, Budget{.entries = 100}), Error);
  EXPECT_THROW(make_press("pod:delta=0.3,profile=" + path), Error);
}

// The capture equals a naive double-precision forward pass: keys post-RoPE, and attention rows
// softmax(q.k / sqrt(d)) of the last R queries over the causal prefix.
TEST(Calibration, CaptureMatchesANaiveForwardPass) {
  RandomModelSpec spec;
  spec.n_layers = 3;
  const auto model = make_random_model(spec);
  const ModelConfig& c = model.weights.config;
  constexpr int kTokens = 40, kRows = 6;
  const auto tokens = random_tokens(kTokens, spec.vocab_size, 5);
  const eval::CalibrationCapture capture =
      eval::capture_calibration_sequence(model.weights, tokens, kRows);
  testing::ReferenceTensors ref;
  testing::reference_logits(model.weights, tokens, -1, {}, &ref);
  const int hd = c.head_dim(), group = c.group_size();
  ASSERT_EQ(capture.keys.size(), static_cast<size_t>(c.n_layers));
  for (int l = 0; l < c.n_layers; ++l) {
    for (int h = 0; h < c.n_kv_heads; ++h)
      for (int t = 0; t < kTokens; ++t)
        for (int d = 0; d < hd; ++d)
          ASSERT_NEAR(capture.keys[l][h][static_cast<size_t>(t * hd + d)],
                      ref.k[l][t][static_cast<size_t>(h * hd + d)], 1e-4)
              << l << " " << h << " " << t;
    for (int q = 0; q < c.n_heads; ++q)
      for (int r = 0; r < kRows; ++r) {
        const int i = kTokens - kRows + r;
        std::vector<double> logits;
        for (int j = 0; j <= i; ++j) {
          double dot = 0.0;
          for (int d = 0; d < hd; ++d)
            dot += ref.q[l][i][static_cast<size_t>(q * hd + d)] *
                   ref.k[l][j][static_cast<size_t>((q / group) * hd + d)];
          logits.push_back(dot / std::sqrt(static_cast<double>(hd)));
        }
        const double top = *std::max_element(logits.begin(), logits.end());
        double sum = 0.0;
        for (double& x : logits) sum += (x = std::exp(x - top));
        for (int j = 0; j < kTokens; ++j) {
          const double expected = j <= i ? logits[static_cast<size_t>(j)] / sum : 0.0;
          ASSERT_NEAR(capture.attention[l][q][static_cast<size_t>(r * kTokens + j)], expected, 1e-5)
              << "layer " << l << " head " << q << " row " << r << " column " << j;
        }
      }
  }
}

// calibrate() aggregates exactly the measures of calibration_measures.h on each captured
// sequence: mean shares, outliers of the mean, mean similarities over the group and sequences,
// PoD blocks of the mean.
TEST(Calibration, ProfileEqualsADirectComputationOnTheCapturedTensors) {
  RandomModelSpec spec;
  spec.n_layers = 4;
  spec.n_heads = 4;
  spec.n_kv_heads = 2;
  const auto model = make_random_model(spec);
  const ModelConfig& c = model.weights.config;
  eval::CalibrationOptions options;
  options.chelsea_threshold = 0.3;  // random 16-dim keys rarely reach 0.8
  options.chelsea_layout = {.sinks = 4, .recent = 8, .chunk = 32};
  options.outlier_fraction = 0.25;
  options.pod_rows = 8;
  options.pod_delta = 0.6;
  const std::vector<std::vector<int32_t>> sequences = {random_tokens(100, spec.vocab_size, 1),
                                                       random_tokens(100, spec.vocab_size, 2),
                                                       random_tokens(100, spec.vocab_size, 3)};
  const CalibrationProfile profile = eval::calibrate(model.weights, sequences, options);

  const int hd = c.head_dim(), group = c.group_size(), L = c.n_layers;
  std::vector<std::vector<double>> share(static_cast<size_t>(L),
                                         std::vector<double>(static_cast<size_t>(c.n_kv_heads)));
  std::vector<std::vector<double>> similarity(static_cast<size_t>(c.n_kv_heads),
                                              std::vector<double>(static_cast<size_t>(L * L)));
  for (const auto& tokens : sequences) {
    const auto capture = eval::capture_calibration_sequence(model.weights, tokens, 8);
    for (int l = 0; l < L; ++l)
      for (int h = 0; h < c.n_kv_heads; ++h)
        share[l][h] += press::chelsea_unlinked_share(capture.keys[l][h].data(), 100, hd,
                                                     options.chelsea_layout, 0.3) /
                       3.0;
    for (int h = 0; h < c.n_kv_heads; ++h)
      for (int i = 0; i < L; ++i)
        for (int j = 0; j < L; ++j)
          for (int q = h * group; q < (h + 1) * group; ++q)
            similarity[h][i * L + j] +=
                press::attention_similarity(capture.attention[i][q], capture.attention[j][q], 8,
                                            100) /
                (3.0 * group);
  }
  std::vector<std::vector<float>> share_f(static_cast<size_t>(L));
  for (int l = 0; l < L; ++l)
    for (int h = 0; h < c.n_kv_heads; ++h) {
      share_f[l].push_back(static_cast<float>(share[l][h]));
      EXPECT_NEAR(profile.chelsea_unlinked_share[l][h], share[l][h], 1e-6) << l << " " << h;
    }
  bool some_share_between = false;
  for (const auto& row : share_f)
    for (float s : row) some_share_between = some_share_between || (s > 0.05f && s < 0.95f);
  EXPECT_TRUE(some_share_between) << "the threshold leaves nothing to rank";
  EXPECT_EQ(profile.chelsea_outlier, press::chelsea_outlier_heads(share_f, 0.25));
  int outliers = 0;
  for (const auto& row : profile.chelsea_outlier)
    for (uint8_t flag : row) outliers += flag;
  EXPECT_EQ(outliers, 2);  // 25% of 8 (layer, KV head) pairs

  for (int h = 0; h < c.n_kv_heads; ++h) {
    for (int e = 0; e < L * L; ++e)
      EXPECT_NEAR(profile.pod_similarity[h][e], similarity[h][e], 1e-9) << h << " " << e;
    const auto expected = press::pod_block_starts(
        L, [&](int a, int b) { return similarity[h][a * L + b]; }, 0.6);
    EXPECT_EQ(profile.pod_block_start[h], expected) << h;
  }
  EXPECT_EQ(profile.samples, 3);
  EXPECT_EQ(profile.tokens, 100);
  EXPECT_EQ(profile.n_heads, 4);
}

TEST(Calibration, BadInputsAreErrors) {
  const auto model = make_random_model({});
  const auto tokens = random_tokens(30, 300, 1);
  EXPECT_THROW(eval::capture_calibration_sequence(model.weights, tokens, 30), Error);
  EXPECT_THROW(eval::capture_calibration_sequence(model.weights, tokens, 0), Error);
  eval::CalibrationOptions options;
  options.pod_rows = 4;
  EXPECT_THROW(eval::calibrate(model.weights, {}, options), Error);
  EXPECT_THROW(eval::calibrate(model.weights, {tokens, random_tokens(31, 300, 2)}, options), Error);
  for (auto edit : std::vector<std::function<void(eval::CalibrationOptions&)>>{
           [](auto& o) { o.chelsea_threshold = 1.5; }, [](auto& o) { o.outlier_fraction = -0.1; },
           [](auto& o) { o.pod_delta = 2.0; }, [](auto& o) { o.pod_rows = 0; }}) {
    eval::CalibrationOptions bad = options;
    edit(bad);
    EXPECT_THROW(eval::calibrate(model.weights, {tokens}, bad), Error);
  }
}

// The command on stories260K: a valid profile of the right model, which round-trips.
TEST(CalibrateCommand, WritesAValidProfileForStories) {
  PROTOKV_REQUIRE_STORIES();
  const testing::TempDir dir;
  const auto stories = testing::stories_dir();
  std::string text;
  for (int i = 0; i < 40; ++i)
    text +=
        "Once upon a time, there was a little girl named Lily. She loved to play outside in "
        "the park with her friend Tom. One day, they found a big red ball under a tree. ";
  write_text(dir / "text.txt", text);
  const std::string base = "calibrate -m " + (stories / "stories260K.bin").string() + " -z " +
                           (stories / "tok512.bin").string();
  const testing::CommandResult r = testing::run_protokv(
      base + " -f " + (dir / "text.txt").string() + " --samples 2 --tokens 200 --pod-rows 16 -o " +
      (dir / "p.json").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("outlier head"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("pod: KV head 3:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("key bytes"), std::string::npos) << r.out;
  const CalibrationProfile p = press::read_calibration_profile((dir / "p.json").string());
  EXPECT_EQ(p.model_file, "stories260K.bin");
  EXPECT_EQ(p.n_layers, 5);
  EXPECT_EQ(p.n_kv_heads, 4);
  EXPECT_EQ(p.head_dim, 8);
  EXPECT_EQ(p.source_kind, "file");
  EXPECT_EQ(p.source_name, "text.txt");
  EXPECT_EQ(p.samples, 2);
  EXPECT_EQ(p.tokens, 200);
  EXPECT_EQ(p.pod_rows, 16);
  EXPECT_EQ(p.chelsea_threshold, 0.8);
  // Round trip: what the reader returns writes back to the same file.
  press::write_calibration_profile(p, (dir / "again.json").string());
  EXPECT_EQ(read_text(dir / "again.json"), read_text(dir / "p.json"));

  // Without -f: the model's own text, said so in the profile.
  const testing::CommandResult own =
      testing::run_protokv(base + " --samples 1 --tokens 96 -q -o " + (dir / "own.json").string());
  ASSERT_EQ(own.exit_code, 0) << own.err;
  EXPECT_TRUE(own.out.empty()) << own.out;
  const CalibrationProfile q = press::read_calibration_profile((dir / "own.json").string());
  EXPECT_EQ(q.source_kind, "model");
  EXPECT_NE(q.source_name.find("sampled from BOS"), std::string::npos) << q.source_name;
}

TEST(CalibrateCommand, BadFlagsAreOneLineErrors) {
  const testing::TempDir dir;
  const std::string out = " -o " + (dir / "p.json").string();
  testing::expect_run_fails_with_one_line("calibrate -m /nonexistent/model.gguf" + out,
                                          "/nonexistent/model.gguf");
  testing::expect_run_fails_with_one_line("calibrate -m x.gguf --samples 0" + out,
                                          "--samples must be in [1, 4096], got 0");
  testing::expect_run_fails_with_one_line("calibrate -m x.gguf --samples 100000" + out,
                                          "--samples must be in");
  testing::expect_run_fails_with_one_line("calibrate -m x.gguf -f /nonexistent/text.txt" + out,
                                          "file not found: /nonexistent/text.txt");
  testing::expect_run_fails_with_one_line("calibrate -m x.gguf --chelsea-threshold 2" + out,
                                          "--chelsea-threshold must be");
  testing::expect_run_fails_with_one_line("calibrate -m x.gguf --outlier-fraction 1.5" + out,
                                          "--outlier-fraction must be in [0, 1]");
  testing::expect_run_fails_with_one_line("calibrate -m x.gguf --pod-delta -0.5" + out,
                                          "--pod-delta must be");
  testing::expect_run_fails_with_one_line("calibrate -m x.gguf --pod-rows 0" + out,
                                          "--pod-rows must be at least 1");
  testing::expect_run_fails_with_one_line("calibrate -m x.gguf --tokens 50" + out,
                                          "--tokens 50 is too short");
  write_text(dir / "empty.txt", "");
  testing::expect_run_fails_with_one_line(
      "calibrate -m x.gguf -f " + (dir / "empty.txt").string() + out, "is empty");
  EXPECT_FALSE(std::filesystem::exists(dir / "p.json"));

  PROTOKV_REQUIRE_STORIES();
  const auto stories = testing::stories_dir();
  const std::string model = " -m " + (stories / "stories260K.bin").string();
  testing::expect_run_fails_with_one_line("calibrate" + model + " --tokens 100000" + out,
                                          "--tokens 100000 exceeds the model's context of 512");
  // -f needs a tokenizer; stories260K.bin carries none.
  write_text(dir / "t.txt", "Once upon a time.");
  testing::expect_run_fails_with_one_line(
      "calibrate" + model + " -f " + (dir / "t.txt").string() + out, "has no tokenizer");
  // A text too short for the samples.
  testing::expect_run_fails_with_one_line(
      "calibrate" + model + " -z " + (stories / "tok512.bin").string() + " -f " +
          (dir / "t.txt").string() + out,
      "the text has 5 tokens; samples of --tokens 512 need 511");
  // An unwritable output.
  testing::expect_run_fails_with_one_line(
      "calibrate" + model + " --samples 1 --tokens 96 -o " + "/nonexistent/dir/p.json",
      "cannot write the calibration profile /nonexistent/dir/p.json: no directory");
}

}  // namespace
}  // namespace protokv
