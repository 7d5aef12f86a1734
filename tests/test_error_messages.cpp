// SPDX-License-Identifier: Apache-2.0
// Every protokv::Error is one line of bounded length, whatever text it quotes (Error::one_line):
// the fuzz targets found a GGUF metadata key with a newline quoted into a two-line error.
#include <gtest/gtest.h>

#include <string>

#include "protokv/error.h"

namespace protokv {
namespace {

TEST(ErrorMessage, ControlCharactersAreEscapedIntoOneLine) {
  try {
    fail("metadata key '{}' has the wrong type", std::string("tokenizer.\nggml\r.eos\x1b[2J\x7f"));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "metadata key 'tokenizer.\\nggml\\r.eos\\x1b[2J\\x7f' has the wrong type");
  }
  EXPECT_EQ(Error::one_line("tab\tand UTF-8 caf\xc3\xa9 stay"), "tab\tand UTF-8 caf\xc3\xa9 stay");
  EXPECT_EQ(Error::one_line(Error::one_line("a\nb")), "a\\nb");  // escaping twice changes nothing
}

TEST(ErrorMessage, ALongMessageIsCutAtACharacterBoundary) {
  // 4095 ASCII bytes then a 2-byte character straddling the limit: cut before it.
  const std::string text = std::string(Error::kMaxMessageBytes - 1, 'a') + "\xc3\xa9" + "tail";
  const std::string line = Error(text).what();
  EXPECT_EQ(line, std::string(Error::kMaxMessageBytes - 1, 'a') + "... (6 more bytes)");
  EXPECT_EQ(Error::one_line(std::string(Error::kMaxMessageBytes, 'b')),
            std::string(Error::kMaxMessageBytes, 'b'));
}

}  // namespace
}  // namespace protokv
