#include "protokv/press_registry.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "press/allocator.h"
#include "press/full.h"
#include "press/h2o.h"
#include "press/options.h"
#include "press/protokv.h"
#include "press/snapkv.h"
#include "press/streaming_llm.h"
#include "protokv/error.h"

namespace protokv {
namespace {

using press::AllocatorKind;

void require_uniform(std::string_view name, std::string_view alloc) {
  if (!alloc.empty() && alloc != "uniform")
    fail("press '{}' keeps the same entries in every head and takes no allocator (got --alloc {})",
         name, alloc);
}

// The allocator of a scoring press: the method's own unless --alloc names another; pyramidkv and
// adakv *are* their allocator, so another one contradicts them.
AllocatorKind resolve_allocator(std::string_view name, std::string_view alloc) {
  AllocatorKind fixed = AllocatorKind::Uniform;
  bool method_is_allocator = false;
  if (name == "pyramidkv") fixed = AllocatorKind::Pyramid, method_is_allocator = true;
  if (name == "adakv") fixed = AllocatorKind::AdaKv, method_is_allocator = true;
  if (alloc.empty()) return fixed;
  const AllocatorKind chosen = press::parse_allocator(alloc);
  if (method_is_allocator && chosen != fixed)
    fail(
        "press '{}' is snapkv with the {} allocator; --alloc {} contradicts it (use --press "
        "snapkv --alloc {})",
        name, press::to_string(fixed), alloc, alloc);
  return chosen;
}

}  // namespace

std::unique_ptr<Press> make_press(std::string_view spec, std::string_view alloc) {
  const auto [name, option_text] = press::split_press_spec(spec);
  press::OptionReader options(name, option_text);
  std::unique_ptr<Press> result;
  if (name == "full") {
    require_uniform(name, alloc);
    result = std::make_unique<FullPress>();
  } else if (name == "streaming_llm") {
    require_uniform(name, alloc);
    const int64_t sinks =
        options.get_int("sinks", press::StreamingLlmPress::kDefaultSinks, 0, int64_t{1} << 30);
    result = std::make_unique<press::StreamingLlmPress>(sinks);
  } else if (name == "snapkv" || name == "pyramidkv" || name == "adakv") {
    const press::AllocatorConfig allocator =
        press::read_allocator_options(resolve_allocator(name, alloc), options);
    const press::WindowScoreConfig scores = press::read_window_score_options(options);
    result = std::make_unique<press::ScoringPress>(
        name, std::make_unique<press::SnapKvScorer>(scores), scores.window, allocator);
  } else if (name == "h2o") {
    const press::AllocatorConfig allocator =
        press::read_allocator_options(resolve_allocator(name, alloc), options);
    const press::GqaReduce gqa = press::read_gqa_option(options);
    const bool decode = options.get_bool("decode", false);
    // decode=1 splits the budget between heavy hitters and `recent` tokens as H2O's code does
    // (its scripts use half and half); window= belongs to prefill-only h2o.
    int64_t window = 0, recent = 0;
    if (decode) {
      options.reject_if_given("window", "decode=1 (its recent window is recent=, default B/2)");
      recent = options.get_int("recent", press::H2oPress::kRecentHalfBudget, 1, int64_t{1} << 30);
    } else {
      options.reject_if_given("recent", "decode=0 (recent= is decode=1's window; use window=)");
      window = press::read_window_option(options);
    }
    result = std::make_unique<press::H2oPress>(std::make_unique<press::H2oScorer>(gqa, decode),
                                               window, allocator, decode, gqa, recent);
  } else if (name == "protokv") {
    const press::AllocatorConfig allocator =
        press::read_allocator_options(resolve_allocator(name, alloc), options);
    const press::ProtoKvConfig config = press::read_protokv_options(options);
    result =
        std::make_unique<press::ScoringPress>(name, std::make_unique<press::ProtoKvScorer>(config),
                                              config.window_scores.window, allocator);
  } else {
    fail("unknown press '{}' (available: {})", name, fmt::join(press_names(), ", "));
  }
  options.finish();
  return result;
}

std::vector<std::string> press_names() {
  return {"full", "streaming_llm", "h2o", "snapkv", "pyramidkv", "adakv", "protokv"};
}

}  // namespace protokv
