// SPDX-License-Identifier: Apache-2.0
#include "protokv/press_registry.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <array>

#include "press/chelsea.h"
#include "press/clusterkv.h"
#include "press/entry.h"
#include "press/expected_attention.h"
#include "press/full.h"
#include "press/h2o.h"
#include "press/knorm.h"
#include "press/pod.h"
#include "press/protokv.h"
#include "press/snapkv.h"
#include "press/streaming_llm.h"
#include "protokv/error.h"
#include "protokv/press/allocator.h"
#include "protokv/press/options.h"
#include "protokv/press_spec.h"

namespace protokv {
namespace press {

std::span<const PressEntry* const> press_table() {
  // Display order. A new press adds its entry here (and nowhere else).
  static constexpr std::array kTable = {
      &kFullEntry,      &kStreamingLlmEntry, &kH2oEntry,     &kSnapKvEntry,
      &kPyramidKvEntry, &kAdaKvEntry,        &kKnormEntry,   &kExpectedAttentionEntry,
      &kProtoKvEntry,   &kClusterKvEntry,    &kChelseaEntry, &kPodEntry,
  };
  return kTable;
}

const PressEntry* find_press_entry(std::string_view name) {
  for (const PressEntry* entry : press_table())
    if (entry->name == name) return entry;
  return nullptr;
}

std::vector<OptionSpec> own_option_specs(const PressEntry& entry) {
  return entry.options != nullptr ? entry.options() : std::vector<OptionSpec>{};
}

std::vector<OptionSpec> press_option_schema(const PressEntry& entry, AllocatorKind allocator) {
  return concat(own_option_specs(entry), allocator_option_specs(allocator));
}

namespace {

void require_uniform(std::string_view name, std::string_view alloc) {
  if (!alloc.empty() && alloc != "uniform")
    fail(
        "press '{}' keeps the same entries in every head and takes no allocator (got allocator {})",
        name, alloc);
}

// The allocator of a scoring press: the method's own unless --alloc names another; a method that
// *is* its allocator (pyramidkv, adakv) is contradicted by another one.
AllocatorKind resolve_allocator(const PressEntry& entry, std::string_view alloc) {
  const AllocatorKind fixed = entry.fixed_allocator;
  if (alloc.empty()) return fixed;
  const AllocatorKind chosen = parse_allocator(alloc);
  if (entry.allocator_role == AllocatorRole::Is && chosen != fixed)
    fail(
        "press '{}' is snapkv with the {} allocator; allocator {} contradicts it (use press "
        "snapkv with allocator {})",
        entry.name, to_string(fixed), alloc, alloc);
  return chosen;
}

}  // namespace
}  // namespace press

std::shared_ptr<const PressSpec> PressSpec::parse(std::string_view text, std::string_view alloc) {
  const auto [name, option_text] = press::split_press_spec(text);
  const press::PressEntry* entry = press::find_press_entry(name);
  if (entry == nullptr)
    fail("unknown press '{}' (available: {})", name, fmt::join(press_names(), ", "));
  press::AllocatorKind kind = press::AllocatorKind::Uniform;
  if (entry->allocator_role == press::AllocatorRole::None) {
    press::require_uniform(name, alloc);
  } else {
    kind = press::resolve_allocator(*entry, alloc);
  }
  press::OptionReader options(name, option_text, press::press_option_schema(*entry, kind));
  // The allocator's options are read first, as their order names them in finish()'s message.
  const press::AllocatorConfig allocator = press::read_allocator_options(kind, options);
  // Validated once: every option the method reads, and none it does not.
  press::OptionReader validated = options;
  entry->make(*entry, validated, allocator);
  validated.finish();
  // Each state reads the same parsed options from its own copy of the reader.
  return std::make_shared<const PressSpec>(std::string(text),
                                           [entry, options, allocator]() -> std::unique_ptr<Press> {
                                             press::OptionReader reader = options;
                                             return entry->make(*entry, reader, allocator);
                                           });
}

std::unique_ptr<Press> make_press(std::string_view spec, std::string_view alloc) {
  return PressSpec::parse(spec, alloc)->instantiate();
}

std::vector<press::OptionSpec> press_option_specs(std::string_view name) {
  const press::PressEntry* entry = press::find_press_entry(name);
  if (entry == nullptr)
    fail("unknown press '{}' (available: {})", name, fmt::join(press_names(), ", "));
  return press::press_option_schema(*entry, entry->fixed_allocator);
}

std::vector<std::string> press_names() {
  std::vector<std::string> names;
  for (const press::PressEntry* entry : press::press_table()) names.emplace_back(entry->name);
  return names;
}

}  // namespace protokv
