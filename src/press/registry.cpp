#include "protokv/press_registry.h"

#include <fmt/ranges.h>
#include "press/full.h"

#include "protokv/error.h"

namespace protokv {

std::unique_ptr<Press> make_press(std::string_view spec, std::string_view alloc) {
  const auto colon = spec.find(':');
  const std::string_view name = spec.substr(0, colon);
  if (name == "full") {
    if (colon != std::string_view::npos) fail("press 'full' takes no options");
    if (!alloc.empty() && alloc != "uniform") fail("press 'full' takes no allocator");
    return std::make_unique<FullPress>();
  }
  fail("unknown press '{}' (available: {})", name, fmt::join(press_names(), ", "));
}

std::vector<std::string> press_names() {
  return {"full"};
}

std::string press_help() {
  return "full: no compression (reference)\n";
}

}  // namespace protokv
