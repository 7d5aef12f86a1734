// SPDX-License-Identifier: Apache-2.0
#pragma once
// The fuzz targets (docs/security.md): one row per input protokv reads from strangers. Each target
// turns arbitrary bytes into that input and runs what protokv does with it: the libFuzzer binaries
// (fuzz_main.cpp, clang's -fsanitize=fuzzer) and the unit test that replays the seed corpus and
// every committed regression case (tests/test_fuzz_targets.cpp) call the same functions.
//
// The contract a target checks: an input is either used as a valid one would be, or refused with
// one protokv::Error (or, for HTTP, one server::ApiError) whose message is a single non-empty line.
// Anything else — another exception type, a crash, a sanitizer report, a hang, an allocation the
// input's size does not justify — is a finding.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace protokv {
class Tokenizer;
}

namespace protokv::fuzz {

using Bytes = std::span<const uint8_t>;

enum class Outcome { kAccepted, kRefused };

struct Target {
  std::string_view name;
  std::string_view input;  // what the bytes are, for --help and docs
  Outcome (*run)(Bytes data);
  // Writes valid inputs built from the repository's fixtures (and shared/ when `shared` is not
  // empty) into `dir`, one file each: the seed corpus the fuzzer mutates and the unit test checks.
  void (*write_seeds)(const std::filesystem::path& dir, const std::filesystem::path& shared);
  // Loads what every input shares (vocabularies, a model) once, before the first input, so that
  // libFuzzer's per-input timeout measures the input's own work. May be null.
  void (*prepare)() = nullptr;
};

// Every target, in docs/security.md's order.
std::span<const Target> targets();
// Throws protokv::Error naming the targets for an unknown name.
const Target& find_target(std::string_view name);

// ---- helpers for the targets ----

// The bytes as a file: an anonymous in-memory file (memfd) named by /proc/self/fd/N, for the
// readers that take a path and memory-map it.
class MemoryFile {
 public:
  explicit MemoryFile(Bytes data);
  ~MemoryFile();
  MemoryFile(const MemoryFile&) = delete;
  MemoryFile& operator=(const MemoryFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  int fd_ = -1;
  std::string path_;
};

// Runs `body`; a protokv::Error is a refusal, after checking its message is one non-empty line
// (otherwise aborts: a finding). Other exceptions propagate (libFuzzer reports them).
template <class Body>
Outcome accept_or_refuse(Body&& body);

// Aborts when an error message is not one non-empty line (a finding); otherwise keeps it as
// last_refusal().
void check_error_message(std::string_view message);
// The message of the last refusal checked on this thread (for the seed tool and tests).
const std::string& last_refusal();
// Reports a broken invariant (a finding) and aborts.
[[noreturn]] void finding(std::string_view what);

void write_seed(const std::filesystem::path& dir, std::string_view name, std::string_view bytes);
std::string read_file_bytes(const std::filesystem::path& path);

// shared/ (test models and tokenizers): $PROTOKV_SHARED_DIR, else ../shared beside the checkout;
// empty when neither exists.
std::filesystem::path shared_dir();

// What every tokenizer target does with a loaded tokenizer: `text` encoded with and without
// special tokens and BOS, decoded whole and streamed token by token, and the first and last ids
// of the vocabulary decoded.
void exercise_tokenizer(const Tokenizer& tokenizer, std::string_view text);

}  // namespace protokv::fuzz

#include "protokv/error.h"

namespace protokv::fuzz {

template <class Body>
Outcome accept_or_refuse(Body&& body) {
  try {
    body();
    return Outcome::kAccepted;
  } catch (const Error& e) {
    check_error_message(e.what());
    return Outcome::kRefused;
  }
}

}  // namespace protokv::fuzz
