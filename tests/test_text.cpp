// SPDX-License-Identifier: Apache-2.0
// core/text: substitution and UTF-8, on hand-made inputs with known answers.
#include "core/text.h"

#include <gtest/gtest.h>

namespace protokv::text {
namespace {

TEST(Text, ReplaceAllDoesNotRescanWhatItInserted) {
  EXPECT_EQ(replace_all("{key} is {key}", "{key}", "k"), "k is k");
  EXPECT_EQ(replace_all("aaa", "a", "aa"), "aaaaaa");
  EXPECT_EQ(replace_all("abab", "ab", ""), "");
  EXPECT_EQ(replace_all("none here", "{x}", "y"), "none here");
  EXPECT_EQ(replace_all("text", "", "y"), "text");  // an empty pattern matches nothing
}

TEST(Text, SequenceLengthFromTheLeadByte) {
  EXPECT_EQ(utf8_sequence_length('a'), 1);
  EXPECT_EQ(utf8_sequence_length(0xC3), 2);
  EXPECT_EQ(utf8_sequence_length(0xE4), 3);
  EXPECT_EQ(utf8_sequence_length(0xF0), 4);
  EXPECT_EQ(utf8_sequence_length(0xA9), 0);  // continuation byte
  EXPECT_EQ(utf8_sequence_length(0xF8), 0);
  EXPECT_EQ(utf8_sequence_length(0xFF), 0);
}

TEST(Text, DecodesWellFormedCharactersOnly) {
  char32_t cp = 0;
  EXPECT_EQ(decode_utf8("caf\xC3\xA9", 3, cp), 2);
  EXPECT_EQ(cp, U'\u00E9');
  EXPECT_EQ(decode_utf8("\xE4\xB8\xAD", 0, cp), 3);
  EXPECT_EQ(cp, U'\u4E2D');
  EXPECT_EQ(decode_utf8("\xF0\x9F\x98\x80", 0, cp), 4);
  EXPECT_EQ(cp, U'\U0001F600');
  EXPECT_EQ(decode_utf8("\xE4\xB8", 0, cp), 0);          // truncated
  EXPECT_EQ(decode_utf8("\xC3(", 0, cp), 0);             // not a continuation byte
  EXPECT_EQ(decode_utf8("\xC0\xAF", 0, cp), 0);          // overlong '/'
  EXPECT_EQ(decode_utf8("\xE0\x80\xAF", 0, cp), 0);      // overlong '/'
  EXPECT_EQ(decode_utf8("\xED\xA0\x80", 0, cp), 0);      // surrogate U+D800
  EXPECT_EQ(decode_utf8("\xF4\x90\x80\x80", 0, cp), 0);  // U+110000
  EXPECT_EQ(decode_utf8("x", 1, cp), 0);                 // past the end
}

TEST(Text, EncodesEveryLengthAndRoundTrips) {
  std::string out;
  for (char32_t c : {U'A', U'\u00E9', U'\u4E2D', U'\U0001F600', U'\U0010FFFF'}) append_utf8(c, out);
  EXPECT_EQ(out, "A\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80\xF4\x8F\xBF\xBF");
  EXPECT_EQ(to_code_points(out), U"A\u00E9\u4E2D\U0001F600\U0010FFFF");
  EXPECT_EQ(from_code_points(to_code_points(out)), out);
  EXPECT_EQ(to_code_points("a\xFF"
                           "b\xE4\xB8"),
            U"a\uFFFDb\uFFFD\uFFFD");
}

TEST(Text, ValidatesAndSanitises) {
  EXPECT_TRUE(is_valid_utf8("plain ascii"));
  EXPECT_TRUE(is_valid_utf8("caf\xC3\xA9 \xE4\xB8\xAD"));
  EXPECT_TRUE(is_valid_utf8(""));
  EXPECT_FALSE(is_valid_utf8("bad \xFF byte"));
  EXPECT_FALSE(is_valid_utf8("cut \xE4\xB8"));
  EXPECT_FALSE(is_valid_utf8("overlong \xC0\xAF"));
  EXPECT_EQ(sanitize_utf8("ok \xC3\xA9"), "ok \xC3\xA9");
  EXPECT_EQ(sanitize_utf8("a\xFF b"), "a\xEF\xBF\xBD b");
  EXPECT_EQ(sanitize_utf8("cut \xE4\xB8"), "cut \xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_TRUE(is_valid_utf8(sanitize_utf8("\xC0\xAF\xED\xA0\x80")));
  EXPECT_EQ(sanitize_utf8("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");
}

}  // namespace
}  // namespace protokv::text
