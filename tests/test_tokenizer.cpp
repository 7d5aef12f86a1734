// SPDX-License-Identifier: Apache-2.0
#include "protokv/tokenizer.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <limits>
#include <optional>
#include <random>
#include <sstream>
#include <unordered_map>

#include "protokv/error.h"
#include "test_util.h"

namespace protokv {
namespace {

using testing::TempDir;

const std::string kMark = "\xE2\x96\x81";  // U+2581, SentencePiece's space

std::string with_marks(std::string_view text) {
  std::string out;
  for (const char c : text) {
    if (c == ' ') {
      out += kMark;
    } else {
      out += c;
    }
  }
  return out;
}

std::string byte_piece(int byte) {
  return fmt::format("<0x{:02X}>", byte);
}

// A llama2.c-layout vocabulary: <unk>, <s>, </s>, 256 byte pieces, then scored normal pieces
// (written with plain spaces; stored with "▁").
struct HandVocab {
  std::vector<std::string> pieces;
  std::vector<float> scores;
  std::vector<int32_t> types;

  explicit HandVocab(bool with_byte_pieces = true) {
    add("<unk>", 0, Tokenizer::kUnknown);
    add("<s>", 0, Tokenizer::kControl);
    add("</s>", 0, Tokenizer::kControl);
    if (with_byte_pieces) {
      for (int b = 0; b < 256; ++b) add(byte_piece(b), 0, Tokenizer::kByte);
    }
    for (const char* c : {" ", "a", "b", "c", "d", "x", "y"}) add(with_marks(c), -100);
    add("ab", -1);
    add("bc", -2);
    add(with_marks(" a"), -3);
    add("abc", -4);
    add("xy", -5);  // xy and yx tie: the leftmost pair must win
    add("yx", -5);
    add(with_marks(" d"), -6);
    add("cd", -0.5f);  // beats ab and bc wherever it applies
  }
  void add(std::string piece, float score, int32_t type = Tokenizer::kNormal) {
    pieces.push_back(std::move(piece));
    scores.push_back(score);
    types.push_back(type);
  }
  Tokenizer make() const { return Tokenizer(pieces, scores, types, 1, 2, 0); }
};

int32_t id_of(const Tokenizer& tok, std::string_view piece_with_spaces) {
  const std::string piece = with_marks(piece_with_spaces);
  for (int32_t i = 0; i < tok.vocab_size(); ++i) {
    if (tok.pieces()[i] == piece) return i;
  }
  ADD_FAILURE() << "no piece '" << piece << "'";
  return -1;
}

std::vector<int32_t> ids_of(const Tokenizer& tok, std::initializer_list<std::string_view> pieces) {
  std::vector<int32_t> ids;
  for (auto p : pieces) ids.push_back(id_of(tok, p));
  return ids;
}

// Independent reference: llama2.c's encoder, rescanning every adjacent pair after each merge
// (O(n^2)) and merging the best-scoring one, leftmost on ties. Pieces are looked up only among
// normal/user-defined tokens; byte-fallback tokens are looked up by their "<0xHH>" piece.
std::vector<int32_t> naive_encode(const Tokenizer& tok, std::string_view text, bool add_bos) {
  std::unordered_map<std::string, int32_t> lookup;
  std::unordered_map<std::string, int32_t> byte_lookup;
  for (int32_t i = 0; i < tok.vocab_size(); ++i) {
    const int32_t type = tok.types()[i];
    if (type == Tokenizer::kNormal || type == Tokenizer::kUserDefined) {
      lookup.emplace(tok.pieces()[i], i);
    } else if (type == Tokenizer::kByte) {
      byte_lookup.emplace(tok.pieces()[i], i);
    }
  }
  std::vector<int32_t> out;
  if (add_bos) out.push_back(tok.bos_id());
  if (text.empty()) return out;
  const std::string normalized = with_marks(std::string(" ") + std::string(text));
  std::vector<int32_t> tokens;
  for (size_t i = 0; i < normalized.size();) {
    size_t len = 1;
    while (len < 4 && i + len < normalized.size() &&
           (static_cast<unsigned char>(normalized[i + len]) & 0xC0) == 0x80) {
      ++len;
    }
    const auto it = lookup.find(normalized.substr(i, len));
    if (it != lookup.end()) {
      tokens.push_back(it->second);
    } else {
      for (size_t b = i; b < i + len; ++b) {
        tokens.push_back(byte_lookup.at(byte_piece(static_cast<unsigned char>(normalized[b]))));
      }
    }
    i += len;
  }
  while (true) {
    float best_score = 0;
    int best_index = -1;
    int32_t best_id = -1;
    for (size_t i = 0; i + 1 < tokens.size(); ++i) {
      const auto it = lookup.find(tok.pieces()[tokens[i]] + tok.pieces()[tokens[i + 1]]);
      if (it != lookup.end() && (best_index < 0 || tok.scores()[it->second] > best_score)) {
        best_score = tok.scores()[it->second];
        best_index = static_cast<int>(i);
        best_id = it->second;
      }
    }
    if (best_index < 0) break;
    tokens[best_index] = best_id;
    tokens.erase(tokens.begin() + best_index + 1);
  }
  out.insert(out.end(), tokens.begin(), tokens.end());
  return out;
}

std::string random_text(std::mt19937& rng, const std::vector<std::string>& alphabet,
                        size_t max_units) {
  std::uniform_int_distribution<size_t> length(0, max_units);
  std::uniform_int_distribution<size_t> pick(0, alphabet.size() - 1);
  std::string text;
  for (size_t n = length(rng); n > 0; --n) text += alphabet[pick(rng)];
  return text;
}

void write_file(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

template <typename T>
void append_scalar(std::string& out, T value) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));
  out.append(bytes, sizeof(T));
}

// The llama2.c tokenizer.bin layout of `vocab` (pieces with real spaces, as llama2.c exports).
std::string llama2c_bytes(const HandVocab& vocab) {
  std::string out;
  append_scalar<int32_t>(out, 6);
  for (size_t i = 0; i < vocab.pieces.size(); ++i) {
    std::string piece;
    const std::string& marked = vocab.pieces[i];
    for (size_t p = 0; p < marked.size();) {
      if (marked.compare(p, kMark.size(), kMark) == 0) {
        piece += ' ';
        p += kMark.size();
      } else {
        piece += marked[p++];
      }
    }
    append_scalar<float>(out, vocab.scores[i]);
    append_scalar<int32_t>(out, static_cast<int32_t>(piece.size()));
    out += piece;
  }
  return out;
}

std::filesystem::path tok512_path() {
  return testing::stories_dir() / "tok512.bin";
}

// The known greedy output block of the stories260K README.
std::string readme_greedy_text() {
  const std::string readme = read_file(testing::stories_dir() / "README.md");
  const size_t open = readme.find("```\n");
  const size_t close = readme.find("\n```", open + 4);
  EXPECT_NE(open, std::string::npos);
  EXPECT_NE(close, std::string::npos);
  return readme.substr(open + 4, close - open - 4);
}

// ---------------------------------------------------------------------------------------------
// Hand-made vocabulary: merge orders worked out by hand from the scores in HandVocab.

TEST(Tokenizer, EncodeMergesHighestScoringPairFirst) {
  const Tokenizer tok = HandVocab().make();
  // " abc": pairs " a"(-3) ab(-1) bc(-2) -> ab; then abc(-4) -> [" ", abc].
  EXPECT_EQ(tok.encode("abc", false), ids_of(tok, {" ", "abc"}));
  // " bcd": bc(-2) vs cd(-0.5) -> cd first, leaving b alone (bcd is no piece).
  EXPECT_EQ(tok.encode("bcd", false), ids_of(tok, {" ", "b", "cd"}));
  // " a" is a piece: the dummy prefix merges into it.
  EXPECT_EQ(tok.encode("a", false), ids_of(tok, {" a"}));
  // " abcd": cd(-0.5) first, then ab(-1); "abcd" and " ab" are no pieces.
  EXPECT_EQ(tok.encode("abcd", false), ids_of(tok, {" ", "ab", "cd"}));
  // Inner spaces: " a" merges, " b" is no piece.
  EXPECT_EQ(tok.encode("a b", false), ids_of(tok, {" a", " ", "b"}));
  EXPECT_EQ(tok.encode("d a", true), (std::vector<int32_t>{1, id_of(tok, " d"), id_of(tok, " a")}));
}

TEST(Tokenizer, EqualScoresMergeTheLeftmostPair) {
  const Tokenizer tok = HandVocab().make();
  // xy and yx score the same: in "xyx" the pair xy comes first, in "yxy" the pair yx does.
  EXPECT_EQ(tok.encode("xyx", false), ids_of(tok, {" ", "xy", "x"}));
  EXPECT_EQ(tok.encode("yxy", false), ids_of(tok, {" ", "yx", "y"}));
  EXPECT_EQ(tok.encode("xyxy", false), ids_of(tok, {" ", "xy", "xy"}));
}

TEST(Tokenizer, EmptyTextIsOnlyBos) {
  const Tokenizer tok = HandVocab().make();
  EXPECT_EQ(tok.encode("", true), std::vector<int32_t>{1});
  EXPECT_TRUE(tok.encode("", false).empty());
  EXPECT_EQ(tok.decode(std::vector<int32_t>{1}), "");
}

TEST(Tokenizer, UnknownCharactersFallBackToBytes) {
  const Tokenizer tok = HandVocab().make();
  // "é" is U+00E9 = C3 A9, and it has no piece: one byte token each (<0x00> is id 3).
  const auto ids = tok.encode("é", true);
  EXPECT_EQ(ids, (std::vector<int32_t>{1, id_of(tok, " "), 3 + 0xC3, 3 + 0xA9}));
  EXPECT_EQ(tok.pieces()[ids[2]], "<0xC3>");
  EXPECT_EQ(tok.decode(ids), "é");
  // Byte tokens do not merge with neighbours; the text before them still does (ab beats " a").
  EXPECT_EQ(tok.encode("abé", false),
            (std::vector<int32_t>{id_of(tok, " "), id_of(tok, "ab"), 3 + 0xC3, 3 + 0xA9}));
  EXPECT_EQ(tok.encode("\n", false), (std::vector<int32_t>{id_of(tok, " "), 3 + '\n'}));
}

TEST(Tokenizer, WithoutBytePiecesUnknownCharactersBecomeUnk) {
  const Tokenizer tok = HandVocab(/*with_byte_pieces=*/false).make();
  // One <unk> per character, not per byte.
  EXPECT_EQ(tok.encode("aé", false), (std::vector<int32_t>{id_of(tok, " a"), tok.unk_id()}));
  EXPECT_EQ(tok.decode(tok.unk_id(), tok.unk_id()), "");
}

TEST(Tokenizer, DecodeStripsTheLeadingSpaceOnlyAfterBos) {
  const Tokenizer tok = HandVocab().make();
  const int32_t space_a = id_of(tok, " a");
  EXPECT_EQ(tok.decode(tok.bos_id(), space_a), "a");
  EXPECT_EQ(tok.decode(id_of(tok, "b"), space_a), " a");
  EXPECT_EQ(tok.decode(-1, space_a), " a");
  EXPECT_EQ(tok.decode(-1, tok.bos_id()), "");
  EXPECT_EQ(tok.decode(-1, tok.eos_id()), "");
  EXPECT_EQ(tok.decode(-1, 3 + 'A'), "A");
  const std::vector<int32_t> without_bos = tok.encode("a b", false);
  EXPECT_EQ(tok.decode(without_bos), " a b");
  EXPECT_EQ(tok.decode(tok.encode("a b", true)), "a b");
}

TEST(Tokenizer, OutOfRangeIdsThrow) {
  const Tokenizer tok = HandVocab().make();
  EXPECT_THROW(tok.decode(-1, -1), Error);
  EXPECT_THROW(tok.decode(-1, tok.vocab_size()), Error);
  const std::vector<int32_t> bad = {1, 5, tok.vocab_size() + 7};
  EXPECT_THROW(tok.decode(bad), Error);
}

TEST(Tokenizer, RoundTripsAsciiUtf8AndNewlines) {
  const Tokenizer tok = HandVocab().make();
  for (const std::string& text : std::vector<std::string>{
           "abc", "a b  c", " leading space", "trailing space ", "two\nlines\n", "\n\nx", "é中😀",
           "mixed é and 中文 and ab\tcd", std::string("nul\0byte", 8), "\xFF\x80 invalid utf8"}) {
    EXPECT_EQ(tok.decode(tok.encode(text, true)), text) << text;
  }
}

TEST(Tokenizer, MatchesNaiveReferenceOnHandVocabulary) {
  const Tokenizer tok = HandVocab().make();
  const std::vector<std::string> alphabet = {"a", "b",  "c", "d",  "x", "y", " ",
                                             " ", "\n", "é", "中", "😀", "z", "ab"};
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 400; ++trial) {
    const std::string text = random_text(rng, alphabet, 60);
    const auto ids = tok.encode(text, true);
    ASSERT_EQ(ids, naive_encode(tok, text, true)) << text;
    ASSERT_EQ(tok.decode(ids), text);
  }
}

TEST(Tokenizer, ConstructorRejectsInconsistentVocabularies) {
  const HandVocab v;
  EXPECT_THROW(Tokenizer({}, {}, {}, 0, 0, 0), Error);
  EXPECT_THROW(Tokenizer(v.pieces, {1.0f}, v.types, 1, 2, 0), Error);
  EXPECT_THROW(Tokenizer(v.pieces, v.scores, {1, 1}, 1, 2, 0), Error);
  const int32_t n = static_cast<int32_t>(v.pieces.size());
  EXPECT_THROW(Tokenizer(v.pieces, v.scores, v.types, n, 2, 0), Error);
  EXPECT_THROW(Tokenizer(v.pieces, v.scores, v.types, 1, -1, 0), Error);
  EXPECT_THROW(Tokenizer(v.pieces, v.scores, v.types, 1, 2, n), Error);
  auto types = v.types;
  types[3] = 9;  // no such token type
  EXPECT_THROW(Tokenizer(v.pieces, v.scores, types, 1, 2, 0), Error);
  types = v.types;
  types.back() = Tokenizer::kByte;  // "cd" is not a <0xHH> piece
  EXPECT_THROW(Tokenizer(v.pieces, v.scores, types, 1, 2, 0), Error);
  auto scores = v.scores;
  scores.back() = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THROW(Tokenizer(v.pieces, scores, v.types, 1, 2, 0), Error);
}

// ---------------------------------------------------------------------------------------------
// llama2.c tokenizer.bin

TEST(TokenizerLlama2c, LoadsPiecesWithMarksAndInfersTypes) {
  const HandVocab vocab;
  TempDir dir;
  write_file(dir / "tok.bin", llama2c_bytes(vocab));
  const auto tok =
      Tokenizer::load_llama2c((dir / "tok.bin").string(), static_cast<int>(vocab.pieces.size()));
  EXPECT_EQ(tok->pieces(), vocab.pieces);
  EXPECT_EQ(tok->scores(), vocab.scores);
  EXPECT_EQ(tok->types(), vocab.types);
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
  EXPECT_EQ(tok->unk_id(), 0);
  EXPECT_EQ(tok->encode("abc d", true), vocab.make().encode("abc d", true));
}

TEST(TokenizerLlama2c, RejectsBadFiles) {
  const HandVocab vocab;
  const int n = static_cast<int>(vocab.pieces.size());
  const std::string good = llama2c_bytes(vocab);
  TempDir dir;
  const auto path = (dir / "tok.bin").string();

  // Truncated: empty, inside the header, inside a score, inside a length, inside a piece, and
  // one byte short of the end.
  for (const size_t size : {size_t{0}, size_t{2}, size_t{4}, size_t{6}, size_t{10}, size_t{13},
                            good.size() / 2, good.size() - 1}) {
    write_file(path, good.substr(0, size));
    EXPECT_THROW(Tokenizer::load_llama2c(path, n), Error) << "truncated to " << size;
  }
  // More tokens declared than the file holds.
  write_file(path, good);
  EXPECT_THROW(Tokenizer::load_llama2c(path, n + 1), Error);
  EXPECT_NO_THROW(Tokenizer::load_llama2c(path, n));

  // Negative and absurd lengths of token 0 (its length field is at bytes 8..11).
  for (const int32_t length : {-1, std::numeric_limits<int32_t>::min(), 0x7fffffff}) {
    std::string bad = good;
    std::memcpy(bad.data() + 8, &length, sizeof(length));
    write_file(path, bad);
    EXPECT_THROW(Tokenizer::load_llama2c(path, n), Error) << length;
  }
  std::string bad_header = good;
  const int32_t negative = -5;
  std::memcpy(bad_header.data(), &negative, sizeof(negative));
  write_file(path, bad_header);
  EXPECT_THROW(Tokenizer::load_llama2c(path, n), Error);

  write_file(path, good);
  for (const int size : {0, -3, (1 << 22) + 1}) {
    EXPECT_THROW(Tokenizer::load_llama2c(path, size), Error) << size;
  }
  EXPECT_THROW(Tokenizer::load_llama2c((dir / "missing.bin").string(), n), Error);
  EXPECT_THROW(Tokenizer::load_llama2c(dir.path().string(), n), Error);  // a directory
}

TEST(TokenizerLlama2c, CorruptedFilesLoadOrThrowButNeverCrash) {
  // Random byte overwrites anywhere in a valid file: each load either succeeds (a score or piece
  // byte changed) or throws Error; sanitizer builds check for bad reads and huge allocations.
  const HandVocab vocab;
  const int n = static_cast<int>(vocab.pieces.size());
  const std::string good = llama2c_bytes(vocab);
  TempDir dir;
  const auto path = (dir / "tok.bin").string();
  std::mt19937 rng(7);
  std::uniform_int_distribution<size_t> where(0, good.size() - 1);
  std::uniform_int_distribution<int> byte(0, 255);
  int loaded = 0, rejected = 0;
  constexpr int kTrials = 60;
  for (int trial = 0; trial < kTrials; ++trial) {
    std::string bad = good;
    for (int k = 0; k < 3; ++k) bad[where(rng)] = static_cast<char>(byte(rng));
    write_file(path, bad);
    try {
      const auto tok = Tokenizer::load_llama2c(path, n);
      tok->decode(tok->encode("abc xy é", true));
      ++loaded;
    } catch (const Error&) {
      ++rejected;
    }
  }
  EXPECT_EQ(loaded + rejected, kTrials);
  EXPECT_GT(rejected, 0);  // most overwrites hit a length field or its bytes
}

TEST(TokenizerLlama2c, ErrorMessagesAreOneLine) {
  TempDir dir;
  write_file(dir / "tok.bin", std::string("\x07\x00\x00\x00\x00\x00", 6));
  try {
    Tokenizer::load_llama2c((dir / "tok.bin").string(), 512);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    EXPECT_NE(message.find("tok.bin"), std::string::npos) << message;
  }
}

// ---------------------------------------------------------------------------------------------
// The real stories260K vocabulary.

TEST(TokenizerStories, LoadsTok512) {
  PROTOKV_REQUIRE_STORIES();
  const auto tok = Tokenizer::load_llama2c(tok512_path().string(), 512);
  EXPECT_EQ(tok->vocab_size(), 512);
  EXPECT_EQ(tok->types()[0], Tokenizer::kUnknown);
  EXPECT_EQ(tok->types()[1], Tokenizer::kControl);
  EXPECT_EQ(tok->pieces()[3], "<0x00>");
  EXPECT_EQ(tok->types()[258], Tokenizer::kByte);
  EXPECT_EQ(tok->pieces()[259], kMark + "t");  // llama2.c's " t", stored SentencePiece-style
  EXPECT_EQ(tok->types()[259], Tokenizer::kNormal);
}

TEST(TokenizerStories, EncodesTheFirstSentence) {
  PROTOKV_REQUIRE_STORIES();
  const auto tok = Tokenizer::load_llama2c(tok512_path().string(), 512);
  const std::string text = "Once upon a time, there was a little girl named Lily.";
  const auto ids = tok->encode(text, true);
  EXPECT_EQ(ids, naive_encode(*tok, text, true));
  // Whole-word pieces exist and are reachable by merges (e.g. " On" + "ce" -> " Once").
  ASSERT_GE(ids.size(), 5u);
  EXPECT_EQ(ids[0], tok->bos_id());
  EXPECT_EQ(std::vector<int32_t>(ids.begin() + 1, ids.begin() + 5),
            ids_of(*tok, {" Once", " upon", " a", " time"}));
  // The ids SentencePiece 0.1.97 itself gives for this text with tok512.model (the same
  // vocabulary as a SentencePiece model), after BOS.
  EXPECT_EQ(std::vector<int32_t>(ids.begin() + 1, ids.end()),
            (std::vector<int32_t>{403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395,
                                  317, 426}));
  EXPECT_EQ(tok->decode(ids), text);
  // Token by token, as a generation loop prints them: the first piece loses its space.
  std::string streamed;
  for (size_t i = 1; i < ids.size(); ++i) streamed += tok->decode(ids[i - 1], ids[i]);
  EXPECT_EQ(streamed, text);
  EXPECT_EQ(tok->decode(ids[0], ids[1]), "Once");
  EXPECT_EQ(tok->decode(std::span(ids).subspan(1)), " " + text);
}

TEST(TokenizerStories, RoundTripsTheKnownGreedyOutput) {
  PROTOKV_REQUIRE_STORIES();
  const auto tok = Tokenizer::load_llama2c(tok512_path().string(), 512);
  const std::string text = readme_greedy_text();
  ASSERT_TRUE(text.starts_with("Once upon a time")) << text;
  ASSERT_TRUE(text.ends_with("so she")) << text;
  const auto ids = tok->encode(text, true);
  EXPECT_EQ(ids, naive_encode(*tok, text, true));
  EXPECT_EQ(tok->decode(ids), text);
  // Newlines are not in the vocabulary: they come back through the <0x0A> byte piece.
  EXPECT_NE(std::find(ids.begin(), ids.end(), 3 + '\n'), ids.end());
}

TEST(TokenizerStories, MatchesNaiveReferenceOnRandomText) {
  PROTOKV_REQUIRE_STORIES();
  const auto tok = Tokenizer::load_llama2c(tok512_path().string(), 512);
  const std::vector<std::string> words = {
      "Once", "upon", "a",     "time", "there", "was", "little", "girl", "named", "Lily",
      "Tim",  "play", "happy", "the",  "park",  "mom", "said",   "é",    "中",    "\n",
      " ",    ",",    ".",     "\"",   "'s",    "Th",  "ing",    "xq",   "😀",     "  "};
  std::vector<std::string> letters;
  for (const char* s : {"a",   "b", "e",  "h", "i", "l", "n",
                        "o",   "s", "t",  "y", "L", "O", "T",
                        " ",   " ", "\n", ",", "é", "ñ", "\xE2\x80\x9C",
                        "\xFF"}) {
    letters.emplace_back(s);
  }
  std::mt19937 rng(99);
  for (int trial = 0; trial < 300; ++trial) {
    std::string text;
    if (trial % 2 == 0) {
      text = random_text(rng, letters, 80);
    } else {
      // Words joined by spaces, like prose.
      std::uniform_int_distribution<size_t> pick(0, words.size() - 1);
      for (int w = trial % 40; w > 0; --w) text += words[pick(rng)] + " ";
    }
    const auto ids = tok->encode(text, trial % 3 != 0);
    ASSERT_EQ(ids, naive_encode(*tok, text, trial % 3 != 0)) << text;
    if (trial % 3 != 0) {
      ASSERT_EQ(tok->decode(ids), text);
    }
  }
}

}  // namespace
}  // namespace protokv
