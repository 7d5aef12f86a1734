// SPDX-License-Identifier: Apache-2.0
// Press creation by name: option parsing, defaults recorded in config(), and every way a user can
// get it wrong (unknown press/option, bad value, contradictory options, too small a budget).
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "press/entry.h"
#include "protokv/error.h"
#include "protokv/press/options.h"
#include "protokv/press_registry.h"
#include "test_press_util.h"

namespace protokv {
namespace {

using testing::SyntheticLayer;

std::string error_of(std::string_view spec, std::string_view alloc = "") {
  try {
    make_press(spec, alloc);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(PressOptions, EveryRegisteredNameBuildsAndIsDocumented) {
  const std::string help = press_help();
  for (const auto& name : press_names()) {
    auto press = make_press(name);
    ASSERT_NE(press, nullptr) << name;
    EXPECT_EQ(press->name(), name);
    EXPECT_EQ(press->config()["name"], name);
    EXPECT_NE(help.find(name), std::string::npos) << name;
  }
}

// A value every row accepts by type (a range bound, a listed choice), so that giving it reaches
// the getter that reads the row.
std::string accepted_value(const press::OptionSpec& spec) {
  switch (spec.kind) {
    case press::OptionKind::Int:
      return std::to_string(static_cast<int64_t>(spec.max));
    case press::OptionKind::Double:
      return fmt::format("{}", spec.max);
    case press::OptionKind::Seed:
    case press::OptionKind::Bool:
      return "1";
    case press::OptionKind::Choice:
      return std::string(spec.choices.back());
    case press::OptionKind::Text:
      break;
  }
  return "/nonexistent/profile.json";
}

// Every row of every schema is read by its press: giving it alone is accepted or refused for a
// reason (a contradiction, a missing file, a rule on the value), never as an unknown option;
// and the schema declares every option a press reads (or the getter throws).
TEST(PressOptionSchema, EveryDeclaredOptionIsReadByItsPress) {
  for (const auto& name : press_names()) {
    const auto schema = press_option_specs(name);
    for (const press::OptionSpec& spec : schema) {
      const std::string given = fmt::format("{}:{}={}", name, spec.key, accepted_value(spec));
      const std::string error = error_of(given);
      EXPECT_EQ(error.find("unknown option"), std::string::npos) << given << ": " << error;
      EXPECT_EQ(error.find("does not declare"), std::string::npos) << given << ": " << error;
    }
    for (size_t i = 0; i < schema.size(); ++i)
      for (size_t j = 0; j < i; ++j)
        EXPECT_NE(schema[i].key, schema[j].key)
            << name << " declares " << schema[i].key << " twice";
  }
}

// The config() of a press made with no options records the schema's defaults: the default in
// --help and the docs is the one the press runs with.
TEST(PressOptionSchema, ConfigOfTheDefaultPressHoldsTheSchemaDefaults) {
  size_t compared = 0;
  for (const auto& name : press_names()) {
    const nlohmann::json config = make_press(name)->config();
    for (const press::OptionSpec& spec : press_option_specs(name)) {
      if (!spec.derived.empty() || !config.contains(spec.key)) continue;
      const nlohmann::json& value = config[std::string(spec.key)];
      switch (spec.kind) {
        case press::OptionKind::Choice:
        case press::OptionKind::Text:
          EXPECT_EQ(value.get<std::string>(), spec.word) << name << " " << spec.key;
          break;
        case press::OptionKind::Bool:
          EXPECT_EQ(value.get<bool>(), spec.number != 0.0) << name << " " << spec.key;
          break;
        default:
          EXPECT_DOUBLE_EQ(value.get<double>(), spec.number) << name << " " << spec.key;
      }
      ++compared;
    }
  }
  EXPECT_GT(compared, 50u);
}

TEST(PressOptionSchema, ReaderTakesDefaultsAndRangesFromTheRows) {
  const std::vector<press::OptionSpec> schema = {
      press::int_option("window", 8, 1, 16, "w"),
      press::double_option("floor", 0.25, 0.0, 1.0, "f"),
      press::choice_option("pool_type", "max", {"max", "avg"}, "p"),
      press::derived(press::int_option("recent", 0, 1, 100, "r"), "B/2"),
  };
  press::OptionReader defaults("test", "", schema);
  EXPECT_EQ(defaults.get_int("window"), 8);
  EXPECT_DOUBLE_EQ(defaults.get_double("floor"), 0.25);
  EXPECT_EQ(defaults.get_choice("pool_type"), "max");
  EXPECT_EQ(defaults.get_int("recent", 42), 42);       // a derived default is the press's value
  EXPECT_THROW(defaults.get_int("recent"), Error);     // ... and it must pass one
  EXPECT_THROW(defaults.get_int("pool"), Error);       // not declared
  EXPECT_THROW(defaults.get_double("window"), Error);  // declared as another type

  press::OptionReader given("test", "window=16,floor=1,pool_type=avg,recent=7", schema);
  EXPECT_EQ(given.get_int("window"), 16);
  EXPECT_DOUBLE_EQ(given.get_double("floor"), 1.0);
  EXPECT_EQ(given.get_choice("pool_type"), "avg");
  EXPECT_EQ(given.get_int("recent", 42), 7);

  press::OptionReader too_big("test", "window=17", schema);
  EXPECT_THROW(
      {
        try {
          too_big.get_int("window");
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("out of range [1, 16]"), std::string::npos)
              << e.what();
          throw;
        }
      },
      Error);
  press::OptionReader not_listed("test", "pool_type=min", schema);
  EXPECT_THROW(not_listed.get_choice("pool_type"), Error);

  EXPECT_EQ(press::default_text(schema[0]), "8");
  EXPECT_EQ(press::range_text(schema[0]), "1..16");
  EXPECT_EQ(press::default_text(schema[3]), "B/2");
  EXPECT_EQ(press::range_text(schema[2]), "max|avg");
  EXPECT_EQ(press::range_text(press::int_option("sinks", 4, 0, int64_t{1} << 30, "s")), "0..2^30");
}

// An entry whose --help says "Options: those of X" (options_of) reads exactly X's own rows, and
// an entry that repeats another's rows says so instead of listing them twice.
TEST(PressOptionSchema, OptionsOfNamesTheEntryWithTheSameRows) {
  const auto keys = [](const press::PressEntry& entry) {
    std::vector<std::string> out;
    for (const press::OptionSpec& spec : press::own_option_specs(entry)) out.emplace_back(spec.key);
    return out;
  };
  size_t shared = 0;
  for (const press::PressEntry* entry : press::press_table()) {
    if (entry->options_of.empty()) continue;
    const press::PressEntry* owner = press::find_press_entry(entry->options_of);
    ASSERT_NE(owner, nullptr) << entry->name << " names " << entry->options_of;
    EXPECT_TRUE(owner->options_of.empty()) << entry->name;
    EXPECT_EQ(keys(*entry), keys(*owner)) << entry->name << " vs " << entry->options_of;
    ++shared;
  }
  EXPECT_EQ(shared, 2u);  // pyramidkv, adakv
}

// --help lists every option of every press with its default (pyramidkv and adakv name snapkv
// for the rows they share).
TEST(PressOptionSchema, HelpListsEveryOptionWithItsDefault) {
  const std::string help = press_help();
  for (const auto& name : press_names())
    for (const press::OptionSpec& spec : press_option_specs(name)) {
      const std::string item =
          fmt::format("{}={} ({})", spec.key, press::default_text(spec), press::range_text(spec));
      EXPECT_NE(help.find(item), std::string::npos) << name << ": " << item;
    }
}

TEST(PressOptions, ConfigRecordsEveryResolvedDefault) {
  const auto snap = make_press("snapkv")->config();
  EXPECT_EQ(snap["window"], 8);
  EXPECT_EQ(snap["pool"], 7);
  EXPECT_EQ(snap["pool_type"], "max");
  EXPECT_EQ(snap["gqa"], "mean");
  EXPECT_EQ(snap["allocator"], "uniform");

  const auto pyramid = make_press("pyramidkv")->config();
  EXPECT_EQ(pyramid["allocator"], "pyramid");
  EXPECT_EQ(pyramid["beta"], 20);

  const auto ada = make_press("adakv")->config();
  EXPECT_EQ(ada["allocator"], "adakv");
  EXPECT_DOUBLE_EQ(ada["floor"].get<double>(), 0.2);
  EXPECT_EQ(ada["normalise"], false);

  const auto h2o = make_press("h2o")->config();
  EXPECT_EQ(h2o["window"], 8);
  EXPECT_EQ(h2o["gqa"], "mean");
  EXPECT_EQ(h2o["decode"], false);

  EXPECT_EQ(make_press("streaming_llm")->config()["sinks"], 4);

  const auto proto = make_press("protokv")->config();
  EXPECT_EQ(proto["window"], 8);
  EXPECT_EQ(proto["pool"], 1);  // Eq. 18 averages the unpooled window scores (issue 8)
  EXPECT_EQ(proto["pool_type"], "max");
  EXPECT_EQ(make_press("protokv:pool=7")->config()["pool"], 7);  // pooling stays an option
  EXPECT_EQ(proto["gqa"], "mean");
  EXPECT_EQ(proto["chunks"], "auto");
  EXPECT_EQ(proto["chunk_len"], 16);
  EXPECT_EQ(proto["max_chunks"], 496);
  EXPECT_EQ(proto["lsh_bits"], 2);
  EXPECT_EQ(proto["buckets"], 4);
  EXPECT_EQ(proto["irregular"], 12);
  EXPECT_DOUBLE_EQ(proto["gamma"].get<double>(), 1.0);
  EXPECT_EQ(proto["seed"], 0);
  EXPECT_EQ(proto["deviation"], "chunk");
  EXPECT_EQ(proto["score"], "mean");
  EXPECT_EQ(proto["select"], "tokens");
  EXPECT_EQ(proto["prototypes"], "hybrid");
  EXPECT_EQ(proto["allocator"], "uniform");
}

TEST(PressOptions, OptionsAreParsedAndRecorded) {
  const auto snap = make_press("snapkv:window=16,pool=5,pool_type=avg,gqa=max")->config();
  EXPECT_EQ(snap["window"], 16);
  EXPECT_EQ(snap["pool"], 5);
  EXPECT_EQ(snap["pool_type"], "avg");
  EXPECT_EQ(snap["gqa"], "max");

  // irregular follows lsh_bits (p = 3u) unless given.
  const auto proto = make_press("protokv:lsh_bits=3,chunks=64,seed=7,gamma=0.5")->config();
  EXPECT_EQ(proto["irregular"], 24);
  EXPECT_EQ(proto["chunks"], 64);
  EXPECT_FALSE(proto.contains("chunk_len"));
  EXPECT_EQ(proto["seed"], 7);
  EXPECT_DOUBLE_EQ(proto["gamma"].get<double>(), 0.5);

  const auto neighbour = make_press("protokv:deviation=neighbourhood,kappa=3")->config();
  EXPECT_EQ(neighbour["kappa"], 3);

  // Composition: a scorer with another allocator.
  const auto composed = make_press("protokv:floor=0.5", "adakv")->config();
  EXPECT_EQ(composed["allocator"], "adakv");
  EXPECT_DOUBLE_EQ(composed["floor"].get<double>(), 0.5);
  EXPECT_EQ(make_press("adakv", "adakv")->config()["allocator"], "adakv");
  EXPECT_EQ(make_press("snapkv", "pyramid")->config()["allocator"], "pyramid");
  EXPECT_EQ(make_press("h2o:decode=1", "pyramid")->config()["decode"], true);
}

TEST(PressOptions, UserErrorsAreOneLineErrors) {
  struct Case {
    std::string spec, alloc, expect;
  };
  const std::vector<Case> cases = {
      {"nosuch", "", "unknown press 'nosuch'"},
      {"snapkv:windw=8", "", "unknown option 'windw'"},
      {"snapkv:window=abc", "", "not an integer"},
      {"snapkv:window=8x", "", "not an integer"},
      {"snapkv:window=0", "", "out of range"},
      {"snapkv:pool=4", "", "must be odd"},
      {"snapkv:pool_type=median", "", "not one of max|avg"},
      {"snapkv:gqa=first", "", "not one of mean|max|sum"},
      {"snapkv:window", "", "malformed option"},
      {"snapkv:window=8,", "", "malformed option"},
      {"snapkv:=8", "", "malformed option"},
      {"snapkv:window=8,window=9", "", "given twice"},
      {"snapkv", "nosuch", "unknown allocator 'nosuch'"},
      {"snapkv:beta=10", "", "unknown option 'beta'"},  // beta belongs to the pyramid allocator
      {"pyramidkv", "adakv", "contradicts"},
      {"pyramidkv", "uniform", "contradicts"},
      {"adakv", "pyramid", "contradicts"},
      {"full:window=8", "", "takes no options"},
      {"full", "adakv", "takes no allocator"},
      {"streaming_llm:window=8", "", "unknown option 'window'"},
      {"streaming_llm", "pyramid", "takes no allocator"},
      {"h2o:pool=7", "", "unknown option 'pool'"},
      {"h2o:decode=maybe", "", "not a boolean"},
      {"adakv:floor=1.5", "", "out of range"},
      {"adakv:floor=nan", "", "not a number"},
      {"protokv:chunks=64,chunk_len=8", "", "contradicts"},
      {"protokv:chunks=0", "", "out of range"},
      {"protokv:kappa=3", "", "contradicts deviation=chunk"},
      {"protokv:score=sum_logits,pool=5", "", "contradicts score=sum_logits"},
      {"protokv:prototypes=chunk,irregular=4", "", "contradicts prototypes=chunk"},
      {"protokv:prototypes=lsh,deviation=neighbourhood", "", "contradicts prototypes=lsh"},
      {"protokv:lsh_bits=11", "", "out of range"},
      {"protokv:seed=-1", "", "not a non-negative integer"},
      {"protokv:gamma=0", "", "out of range"},
      {"protokv:select=all", "", "not one of tokens|clusters"},
  };
  for (const auto& c : cases) {
    const std::string message = error_of(c.spec, c.alloc);
    EXPECT_NE(message.find(c.expect), std::string::npos)
        << c.spec << " --alloc '" << c.alloc << "' gave: '" << message << "'";
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
}

TEST(PressOptions, BudgetSmallerThanWindowOrSinksIsRejectedWithBothNumbers) {
  SyntheticLayer layer(100, 4, 2, 8);
  auto snap = make_press("snapkv:window=16");
  try {
    snap->begin(layer.info(), testing::entries(10));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("10"), std::string::npos) << message;
    EXPECT_NE(message.find("16"), std::string::npos) << message;
  }
  EXPECT_NO_THROW(snap->begin(layer.info(), testing::entries(16)));  // window only: allowed

  auto streaming = make_press("streaming_llm:sinks=8");
  try {
    streaming->begin(layer.info(), testing::entries(8));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sinks 8"), std::string::npos) << e.what();
  }
  // A ratio that resolves below the window is rejected too.
  Budget ratio;
  ratio.ratio = 0.05;  // 5 of 100 tokens
  EXPECT_THROW(make_press("protokv")->begin(layer.info(), ratio), Error);
  // A budget covering the prompt compresses nothing, so it is never too small.
  SyntheticLayer tiny(5, 4, 2, 8);
  EXPECT_NO_THROW(make_press("snapkv")->begin(tiny.info(), testing::entries(6)));
}

}  // namespace
}  // namespace protokv
