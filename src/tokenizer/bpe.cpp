// SPDX-License-Identifier: Apache-2.0
// Byte-level BPE as llama.cpp's llm_tokenizer_bpe and Hugging Face's BPE model do it: split the
// text with the pre-tokenizer regexes, map each word's bytes to GPT-2's printable alphabet, then
// merge adjacent symbols in merge-rank order (lowest rank first, leftmost on ties).
//
// Unicode categories (\p{L}, \p{N}, \s, case-insensitive contractions) come from ICU's regex
// engine, which works directly on UTF-8 through UText; see docs/tokenizers.md.
#include "tokenizer/bpe.h"

#include <unicode/unorm2.h>
#include <unicode/uregex.h>
#include <unicode/ustring.h>
#include <unicode/utext.h>

#include <algorithm>
#include <array>
#include <map>

#include "core/text.h"
#include "protokv/error.h"
#include "tokenizer/pair_merge.h"
#include "tokenizer/pieces.h"

namespace protokv::tokenizer {

namespace {

struct ByteAlphabet {
  std::array<std::string, 256> encoded;  // byte -> UTF-8 of its character
  std::map<uint32_t, uint8_t> decoded;   // code point -> byte

  ByteAlphabet() {
    auto printable = [](int b) {
      return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    uint32_t next_extra = 256;
    for (int b = 0; b < 256; ++b) {
      const uint32_t cp = printable(b) ? static_cast<uint32_t>(b) : next_extra++;
      text::append_utf8(cp, encoded[b]);
      decoded[cp] = static_cast<uint8_t>(b);
    }
  }
};

const ByteAlphabet& alphabet() {
  static const ByteAlphabet table;
  return table;
}

std::u16string to_utf16(std::string_view utf8) {
  UErrorCode status = U_ZERO_ERROR;
  int32_t length = 0;
  u_strFromUTF8WithSub(nullptr, 0, &length, utf8.data(), static_cast<int32_t>(utf8.size()), 0xFFFD,
                       nullptr, &status);
  std::u16string out(static_cast<size_t>(length), u'\0');
  status = U_ZERO_ERROR;
  u_strFromUTF8WithSub(out.data(), length, nullptr, utf8.data(), static_cast<int32_t>(utf8.size()),
                       0xFFFD, nullptr, &status);
  PROTOKV_CHECK(U_SUCCESS(status), "text is not convertible to UTF-16: {}", u_errorName(status));
  return out;
}

std::string to_utf8(std::u16string_view utf16) {
  UErrorCode status = U_ZERO_ERROR;
  int32_t length = 0;
  u_strToUTF8(nullptr, 0, &length, utf16.data(), static_cast<int32_t>(utf16.size()), &status);
  std::string out(static_cast<size_t>(length), '\0');
  status = U_ZERO_ERROR;
  u_strToUTF8(out.data(), length, nullptr, utf16.data(), static_cast<int32_t>(utf16.size()),
              &status);
  PROTOKV_CHECK(U_SUCCESS(status), "text is not convertible to UTF-8: {}", u_errorName(status));
  return out;
}

// Unicode NFC (Hugging Face normalizer "NFC", Qwen2/3).
std::string nfc(std::string_view text) {
  if (std::all_of(text.begin(), text.end(), [](char c) { return (c & 0x80) == 0; })) {
    return std::string(text);
  }
  UErrorCode status = U_ZERO_ERROR;
  const UNormalizer2* normalizer = unorm2_getNFCInstance(&status);
  PROTOKV_CHECK(U_SUCCESS(status), "ICU NFC normalizer unavailable: {}", u_errorName(status));
  const std::u16string in = to_utf16(text);
  if (unorm2_isNormalized(normalizer, in.data(), static_cast<int32_t>(in.size()), &status) &&
      U_SUCCESS(status)) {
    return std::string(text);
  }
  status = U_ZERO_ERROR;
  const int32_t length =
      unorm2_normalize(normalizer, in.data(), static_cast<int32_t>(in.size()), nullptr, 0, &status);
  std::u16string out(static_cast<size_t>(length), u'\0');
  status = U_ZERO_ERROR;
  unorm2_normalize(normalizer, in.data(), static_cast<int32_t>(in.size()), out.data(), length,
                   &status);
  PROTOKV_CHECK(U_SUCCESS(status), "NFC normalisation failed: {}", u_errorName(status));
  return to_utf8(out);
}

// llama.cpp's regexes (src/llama-vocab.cpp, llm_tokenizer_bpe), by pre-tokenizer type.
constexpr const char* kLlama3 =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
    "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr const char* kQwen2 =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
    "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr const char* kGpt2 =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";
// Singleton-decomposition characters (U+1F7D, U+1FBE, U+1FD3, U+1FDB, U+2126, U+212A) are
// escaped so that no editor or tool can NFC-normalise them into other code points.
// clang-format off
// (clang-format re-splits this literal on every pass: it miscounts multi-byte characters.)
constexpr const char* kDeepseekLlmLetters =
    "\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ"
    "-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷ"
    "ᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-\\x{1F7D}ᾀ-ᾴ"
    "ᾶ-ᾼ\\x{1FBE}ῂ-ῄῆ-ῌῐ-\\x{1FD3}ῖ-\\x{1FDB}ῠ-Ῥῲ-ῴ"
    "ῶ-ῼℂℇℊ-ℓℕℙ-ℝℤ\\x{2126}ℨ\\x{212A}-ℭℯ-ℴℹℼ"
    "-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ"
    "-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻"
    "𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+";
// clang-format on

}  // namespace

std::string byte_level_encode(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() + bytes.size() / 2);
  for (const char c : bytes) out += alphabet().encoded[static_cast<uint8_t>(c)];
  return out;
}

std::string byte_level_decode(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    const size_t length = utf8_char_length(text, pos);
    const auto lead = static_cast<uint8_t>(text[pos]);
    uint32_t cp = lead;
    if (length == 2 && (lead & 0xE0u) == 0xC0u) {
      cp = ((lead & 0x1Fu) << 6) | (static_cast<uint8_t>(text[pos + 1]) & 0x3Fu);
    } else if (length != 1) {
      cp = 0xFFFFFFFFu;  // 3- and 4-byte characters are outside the alphabet
    }
    const auto it = alphabet().decoded.find(cp);
    if (it != alphabet().decoded.end()) {
      out.push_back(static_cast<char>(it->second));
    } else {
      out.append(text.substr(pos, length));
    }
    pos += length;
  }
  return out;
}

std::vector<std::string> pre_tokenizer_regexes(std::string_view name, bool& ignore_merges) {
  ignore_merges = false;
  if (name == "llama-bpe" || name == "llama3" || name == "dbrx" || name == "smaug-bpe") {
    ignore_merges = name == "llama-bpe" || name == "llama3";
    return {kLlama3};
  }
  if (name == "qwen2" || name == "stablelm2") return {kQwen2};
  if (name == "deepseek-llm") {
    return {"[\\r\\n]", kDeepseekLlmLetters,        "\\s?[!-/:-~！-／：-～‘-‟　-。]+",
            "\\s+$",    "[一-龥ࠀ-一가-퟿]+", "\\p{N}+"};
  }
  if (name == "deepseek-coder") {
    return {"[\\r\\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", "[一-龥ࠀ-一가-퟿]+", "\\p{N}"};
  }
  if (name == "falcon") {
    return {"[\\p{P}\\$\\+<=>\\^~\\|`]+", kGpt2, "[0-9][0-9][0-9]"};
  }
  if (name == "starcoder" || name == "refact" || name == "command-r" || name == "smollm" ||
      name == "codeshell" || name == "exaone" || name == "minerva-7b") {
    return {"\\p{N}", kGpt2};
  }
  if (name == "gpt-2" || name == "mpt" || name == "olmo" || name == "jais") return {kGpt2};
  if (name == "default" || name.empty()) {
    return {"[\\p{P}\\$\\+<=>\\^~\\|]+", kGpt2, "\\p{N}+", "[0-9][0-9][0-9]"};
  }
  fail("unknown pre-tokenizer '{}' (tokenizer.ggml.pre)", name);
}

std::string pre_tokenizer_name_for(const std::vector<std::string>& regexes) {
  // The tokenizer.json originals of llama.cpp's rewritten Llama 3 / Qwen2 regexes
  // (convert_hf_to_gguf names them by vocabulary hash; these are the regexes those vocabularies
  // ship).
  if (regexes.size() == 1) {
    const std::string hf_head = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|";
    const std::string hf_tail = "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
    if (regexes[0] == hf_head + "\\p{N}{1,3}" + hf_tail) return "llama-bpe";
    if (regexes[0] == hf_head + "\\p{N}" + hf_tail) return "qwen2";
  }
  for (const char* name : {"llama-bpe", "qwen2", "gpt-2", "deepseek-llm", "deepseek-coder",
                           "falcon", "starcoder", "default"}) {
    bool ignore = false;
    if (pre_tokenizer_regexes(name, ignore) == regexes) return name;
  }
  return "";
}

struct BytePairEncoder::Regex {
  URegularExpression* compiled = nullptr;
  std::string source;
  ~Regex() {
    if (compiled != nullptr) uregex_close(compiled);
  }
};

BytePairEncoder::BytePairEncoder(const protokv::Tokenizer::Impl& t) {
  PROTOKV_CHECK(!t.pre_regexes.empty(), "byte-level BPE tokenizer has no pre-tokenizer regex");
  for (const std::string& source : t.pre_regexes) {
    auto regex = std::make_unique<Regex>();
    regex->source = source;
    const std::u16string pattern = to_utf16(source);
    UParseError where{};
    UErrorCode status = U_ZERO_ERROR;
    regex->compiled = uregex_open(reinterpret_cast<const UChar*>(pattern.data()),
                                  static_cast<int32_t>(pattern.size()), 0, &where, &status);
    PROTOKV_CHECK(U_SUCCESS(status), "pre-tokenizer regex does not compile ({} at offset {}): {}",
                  u_errorName(status), where.offset, source);
    regexes_.push_back(std::move(regex));
  }
  PROTOKV_CHECK(!t.merges.empty(), "byte-level BPE tokenizer has no merges");
  merges_.reserve(t.merges.size() * 2);
  for (size_t rank = 0; rank < t.merges.size(); ++rank) {
    const std::string& merge = t.merges[rank];
    const size_t space = merge.find(' ', 1);
    PROTOKV_CHECK(space != std::string::npos && space + 1 < merge.size(),
                  "BPE merge {} '{}' is not two tokens separated by a space", rank, merge);
    const std::string_view left(merge.data(), space);
    const std::string_view right(merge.data() + space + 1, merge.size() - space - 1);
    const int32_t left_id = t.index.find(left);
    const int32_t right_id = t.index.find(right);
    const int32_t merged_id = t.index.find(std::string(left) + std::string(right));
    // Hugging Face rejects such merges at load; llama.cpp can never use them either.
    if (left_id < 0 || right_id < 0 || merged_id < 0) continue;
    const uint64_t key = (static_cast<uint64_t>(left_id) << 32) | static_cast<uint32_t>(right_id);
    merges_.try_emplace(key, Merge{static_cast<int32_t>(rank), merged_id});
  }
}

BytePairEncoder::~BytePairEncoder() = default;

void BytePairEncoder::split(std::string_view text,
                            std::vector<std::pair<size_t, size_t>>& words) const {
  words.assign(1, {0, text.size()});
  if (text.empty()) return;
  UErrorCode status = U_ZERO_ERROR;
  // ICU handles in RAII holders: an error thrown mid-way must not leak them.
  const std::unique_ptr<UText, decltype(&utext_close)> utext(
      utext_openUTF8(nullptr, text.data(), static_cast<int64_t>(text.size()), &status),
      &utext_close);
  PROTOKV_CHECK(U_SUCCESS(status), "cannot open text for the pre-tokenizer: {}",
                u_errorName(status));
  std::vector<std::pair<size_t, size_t>> next;
  for (const auto& regex : regexes_) {
    // A private matcher: URegularExpression holds match state, so encode() stays thread-safe.
    const std::unique_ptr<URegularExpression, decltype(&uregex_close)> matcher(
        uregex_clone(regex->compiled, &status), &uregex_close);
    PROTOKV_CHECK(U_SUCCESS(status), "pre-tokenizer regex failed: {}", u_errorName(status));
    uregex_setUText(matcher.get(), utext.get(), &status);
    PROTOKV_CHECK(U_SUCCESS(status), "pre-tokenizer regex failed: {}", u_errorName(status));
    next.clear();
    for (const auto& [begin, end] : words) {
      // Each word is matched on its own (region bounds are opaque, as in Hugging Face's Split).
      uregex_setRegion64(matcher.get(), static_cast<int64_t>(begin), static_cast<int64_t>(end),
                         &status);
      size_t pos = begin;
      while (uregex_findNext(matcher.get(), &status) && U_SUCCESS(status)) {
        const auto match_begin = static_cast<size_t>(uregex_start64(matcher.get(), 0, &status));
        const auto match_end = static_cast<size_t>(uregex_end64(matcher.get(), 0, &status));
        if (match_end == match_begin) continue;
        if (match_begin > pos) next.emplace_back(pos, match_begin);  // unmatched text, isolated
        next.emplace_back(match_begin, match_end);
        pos = match_end;
      }
      PROTOKV_CHECK(U_SUCCESS(status), "pre-tokenizer regex failed: {}", u_errorName(status));
      if (pos < end) next.emplace_back(pos, end);
    }
    words.swap(next);
  }
}

void BytePairEncoder::encode_word(const protokv::Tokenizer::Impl& t, std::string_view raw_word,
                                  std::vector<int32_t>& out) const {
  const std::string word = byte_level_encode(raw_word);
  if (t.ignore_merges) {
    if (const int32_t id = t.index.find(word); id >= 0) {
      out.push_back(id);
      return;
    }
  }
  std::vector<MergeSymbol> symbols;
  symbols.reserve(word.size() / 2 + 1);
  for (size_t pos = 0; pos < word.size();) {
    const size_t length = utf8_char_length(word, pos);
    const auto index = static_cast<int32_t>(symbols.size());
    symbols.push_back({static_cast<uint32_t>(pos), static_cast<uint32_t>(length), index - 1,
                       pos + length < word.size() ? index + 1 : -1,
                       t.index.find(std::string_view(word).substr(pos, length))});
    pos += length;
  }
  std::vector<MergeCandidate> heap;
  // The lowest-ranked merge of two adjacent tokens first.
  merge_pairs(symbols, heap,
              [&](const MergeSymbol& left, const MergeSymbol& right) -> std::optional<MergeChoice> {
                if (left.id < 0 || right.id < 0) return std::nullopt;
                const uint64_t key =
                    (static_cast<uint64_t>(left.id) << 32) | static_cast<uint32_t>(right.id);
                const auto it = merges_.find(key);
                if (it == merges_.end()) return std::nullopt;
                return MergeChoice{-static_cast<double>(it->second.rank), it->second.merged_id};
              });
  // llama.cpp: a symbol that is no token falls back to its single bytes that are tokens.
  emit_merged(symbols, out, [&](const MergeSymbol& s) {
    for (uint32_t b = s.start; b < s.start + s.length; ++b) {
      if (const int32_t id = t.index.find(std::string_view(word).substr(b, 1)); id >= 0) {
        out.push_back(id);
      }
    }
  });
}

void BytePairEncoder::encode(const protokv::Tokenizer::Impl& t, std::string_view text,
                             std::vector<int32_t>& out) const {
  const std::string normalized = t.nfc_normalize ? nfc(text) : std::string(text);
  std::vector<std::pair<size_t, size_t>> words;
  split(normalized, words);
  // Words repeat a lot in real text: remember each distinct word's ids for this call (a local
  // cache keeps encode() const and thread-safe). Keys view `normalized`, which outlives the map.
  std::unordered_map<std::string_view, std::pair<size_t, size_t>> seen;  // word -> ids in `out`
  for (const auto& [begin, end] : words) {
    const std::string_view word = std::string_view(normalized).substr(begin, end - begin);
    if (const auto it = seen.find(word); it != seen.end()) {
      const auto [first, count] = it->second;
      for (size_t i = 0; i < count; ++i) out.push_back(out[first + i]);
      continue;
    }
    const size_t first = out.size();
    encode_word(t, word, out);
    seen.emplace(word, std::pair{first, out.size() - first});
  }
}

}  // namespace protokv::tokenizer

namespace protokv {

void Tokenizer::Impl::encode_bpe(std::string_view text, std::vector<int32_t>& out) const {
  bpe->encode(*this, text, out);
}

}  // namespace protokv
