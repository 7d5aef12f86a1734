// SPDX-License-Identifier: Apache-2.0
#pragma once
// Errors: every failure the user can cause (bad files, bad options) is a protokv::Error with a
// one-line message; the CLI prints it as "protokv: error: ..." and exits 1.
#include <fmt/format.h>

#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>

namespace protokv {

class Error : public std::runtime_error {
 public:
  explicit Error(std::string_view message) : std::runtime_error(one_line(message)) {}

  // `message` as one line of bounded length: line breaks and other control characters (a
  // newline or a terminal escape in a key or name read from a file, say) written as escapes
  // (\n, \x1b), and a message longer than kMaxMessageBytes cut at a character boundary with
  // the count of what was left out. Every error protokv reports is one line, whatever its input.
  static std::string one_line(std::string_view message);
  static constexpr size_t kMaxMessageBytes = 4096;
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

// Checks a condition that depends on user input (file contents, options).
#define PROTOKV_CHECK(cond, ...)               \
  do {                                         \
    if (!(cond)) ::protokv::fail(__VA_ARGS__); \
  } while (0)

}  // namespace protokv
