// SPDX-License-Identifier: Apache-2.0
#pragma once
// A press is one entry: its name, its help paragraph (where it is approximate), its option schema,
// how it uses a budget allocator, and the factory that reads its options. Each
// entry is defined beside its press (full.cpp, snapkv.cpp, ...) and listed once in press_table()
// (registry.cpp); make_press(), press_names(), press_help() and the invariants test's list of
// methods are generated from that table.
#include <memory>
#include <nlohmann/json.hpp>  // every press builds its config(); protokv/press.h declares it only
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "protokv/press.h"
#include "protokv/press/allocator.h"
#include "protokv/press/options.h"

namespace protokv::press {

// How a method relates to the per-head budget allocator (--alloc).
enum class AllocatorRole {
  None,      // keeps the same entries in every head (full, streaming_llm): any --alloc but
             // uniform is an error
  Composes,  // a scoring press: uniform by default, composes with any allocator
  Is,        // the method *is* a scoring press fixed to one allocator (pyramidkv, adakv)
};

struct PressEntry {
  std::string_view name;
  AllocatorRole allocator_role;
  // The allocator of an AllocatorRole::Is method (Uniform otherwise).
  AllocatorKind fixed_allocator;
  // false only for the uncompressed reference (full), which keeps every entry at any budget.
  bool compresses;
  // One paragraph: what the method keeps and its approximations. Plain lines without the name
  // column; press_help() indents them and lists the options from the schema below.
  std::string (*help)();
  // The method's options, one row each (type, default, range, help, paper reference): the reader
  // in make() takes defaults and ranges from them, and --help, docs/methods.md and the Python
  // classes list them. An allocator's options are added by the registry. nullptr: none.
  std::vector<OptionSpec> (*options)() = nullptr;
  // A method whose own options are another entry's (pyramidkv, adakv: snapkv's scoring): --help
  // names that entry instead of listing the same rows again. Empty: its rows are its own.
  std::string_view options_of = {};
  // Reads the method's own options (after the allocator's, which `allocator` holds; uniform for
  // AllocatorRole::None) and builds the press. OptionReader::finish() is make_press()'s job.
  std::unique_ptr<Press> (*make)(const PressEntry& entry, OptionReader& options,
                                 const AllocatorConfig& allocator);
  // A recall method (clusterkv): stores every entry and attends to a budget-sized selection at
  // each decode step (Press::selects), so the budget bounds the attended, not the stored, bytes.
  bool recalls = false;
  // A merging method (chelsea): entries may stand for several tokens (log-weight > 0, keys and
  // values are means, Press::merged_positions lists the tokens), so stored rows are not input rows.
  bool merges = false;
  // A key-sharing method (pod): keeps every entry's value, but a layer may hold the keys of some
  // entries only, reading the others from a lower layer (HeadCache::shares_keys).
  bool shares_keys = false;
};

// Every registered method, in display order.
std::span<const PressEntry* const> press_table();
// The entry named `name`, or nullptr.
const PressEntry* find_press_entry(std::string_view name);
// The rows of `entry`'s own options (none when it declares no schema), without an allocator's.
std::vector<OptionSpec> own_option_specs(const PressEntry& entry);
// Every option `entry` reads with `allocator`: its own rows, then the allocator's.
std::vector<OptionSpec> press_option_schema(const PressEntry& entry, AllocatorKind allocator);

}  // namespace protokv::press
