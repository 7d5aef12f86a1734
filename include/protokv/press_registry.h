#pragma once
// Creating presses by name: `--press NAME[:key=value,...]` plus `--alloc uniform|pyramid|adakv`.
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "protokv/press.h"

namespace protokv {

// Parses "snapkv:window=8,pool=7" and builds the press; `alloc` (empty = the method's default)
// picks the budget allocator for scoring presses. Throws Error for an unknown press or option,
// a malformed value, or options that contradict each other.
std::unique_ptr<Press> make_press(std::string_view spec, std::string_view alloc = "");
// Registered method names, in display order.
std::vector<std::string> press_names();
// Multi-line help: every method, its options with defaults, and where it is approximate.
std::string press_help();

}  // namespace protokv
