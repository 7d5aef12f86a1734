// SPDX-License-Identifier: Apache-2.0
// The registry of fuzz targets and the helpers they share.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>

#include "fuzz_target.h"
#include "protokv/tokenizer.h"

namespace protokv::fuzz {

// Each defined in its target_*.cpp.
extern const Target kGgufModel, kSafetensors, kHfTokenizer, kGgufVocab, kTokenize, kChatTemplate,
    kDatasets, kPressSpec, kHttpRequest;

std::span<const Target> targets() {
  static const Target all[] = {kGgufModel,    kSafetensors, kHfTokenizer, kGgufVocab,  kTokenize,
                               kChatTemplate, kDatasets,    kPressSpec,   kHttpRequest};
  return all;
}

const Target& find_target(std::string_view name) {
  std::string known;
  for (const Target& target : targets()) {
    if (target.name == name) return target;
    known += known.empty() ? "" : ", ";
    known += target.name;
  }
  fail("unknown fuzz target '{}' (known: {})", name, known);
}

MemoryFile::MemoryFile(Bytes data) {
  fd_ = memfd_create("protokv-fuzz", MFD_CLOEXEC);
  if (fd_ < 0) {
    std::perror("memfd_create");
    std::abort();
  }
  size_t written = 0;
  while (written < data.size()) {
    const ssize_t n = ::write(fd_, data.data() + written, data.size() - written);
    if (n <= 0) {
      std::perror("write");
      std::abort();
    }
    written += static_cast<size_t>(n);
  }
  path_ = "/proc/self/fd/" + std::to_string(fd_);
}

MemoryFile::~MemoryFile() {
  if (fd_ >= 0) ::close(fd_);
}

namespace {
thread_local std::string last_refusal_message;
}

const std::string& last_refusal() {
  return last_refusal_message;
}

void check_error_message(std::string_view message) {
  if (message.empty() || message.find('\n') != std::string_view::npos) {
    std::fprintf(stderr, "fuzz: an error message is not one non-empty line: [%.*s]\n",
                 static_cast<int>(std::min<size_t>(message.size(), 2000)), message.data());
    std::abort();
  }
  last_refusal_message = message;
}

void finding(std::string_view what) {
  std::fprintf(stderr, "fuzz: %.*s\n", static_cast<int>(what.size()), what.data());
  std::abort();
}

void exercise_tokenizer(const Tokenizer& tokenizer, std::string_view text) {
  for (const bool special : {true, false}) {
    const std::vector<int32_t> ids =
        tokenizer.encode(text, Tokenizer::EncodeOptions{special, special});
    const int32_t vocab = tokenizer.vocab_size();
    for (const int32_t id : ids)
      if (id < 0 || id >= vocab) finding("encode returned an id outside the vocabulary");
    (void)tokenizer.decode(ids);
    Utf8StreamBuffer stream;
    int32_t prev = -1;
    for (const int32_t id : ids) {
      (void)stream.push(tokenizer.decode(prev, id));
      prev = id;
    }
    (void)stream.flush();
  }
  const int32_t vocab = tokenizer.vocab_size();
  for (int32_t id = 0; id < std::min(vocab, 300); ++id) (void)tokenizer.decode(-1, id);
  for (int32_t id = std::max(0, vocab - 16); id < vocab; ++id) (void)tokenizer.decode(-1, id);
  (void)tokenizer.find_token(text.substr(0, 16));
}

std::filesystem::path shared_dir() {
  if (const char* env = std::getenv("PROTOKV_SHARED_DIR"); env != nullptr && *env != '\0')
    return env;
  const auto beside = std::filesystem::path(PROTOKV_SOURCE_DIR).parent_path() / "shared";
  return std::filesystem::is_directory(beside) ? beside : std::filesystem::path();
}

void write_seed(const std::filesystem::path& dir, std::string_view name, std::string_view bytes) {
  std::filesystem::create_directories(dir);
  std::ofstream out(dir / std::string(name), std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) fail("cannot write {}", (dir / std::string(name)).string());
}

std::string read_file_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot read {}", path.string());
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace protokv::fuzz
