// SPDX-License-Identifier: Apache-2.0
#include "protokv/error.h"

#include <algorithm>

namespace protokv {

std::string Error::one_line(std::string_view message) {
  size_t keep = std::min(message.size(), kMaxMessageBytes);
  // Cut at the start of a UTF-8 character, so the kept text stays valid.
  if (keep < message.size())
    while (keep > 0 && (static_cast<unsigned char>(message[keep]) & 0xc0) == 0x80) --keep;
  std::string out;
  out.reserve(keep + 32);
  for (const char ch : message.substr(0, keep)) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if ((c < 0x20 && c != '\t') || c == 0x7f) {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out.push_back(ch);
    }
  }
  if (keep < message.size()) out += fmt::format("... ({} more bytes)", message.size() - keep);
  return out;
}

}  // namespace protokv
