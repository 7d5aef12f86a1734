#pragma once
// Errors: every failure the user can cause (bad files, bad options) is a protokv::Error with a
// one-line message; the CLI prints it as "protokv: error: ..." and exits 1.
#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace protokv {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
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
