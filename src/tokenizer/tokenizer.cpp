// SPDX-License-Identifier: Apache-2.0
// Tokenizer facade (special-token splitting, BOS, decoding) and the SentencePiece encoder.
#include "protokv/tokenizer.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

#include "core/text.h"
#include "protokv/error.h"
#include "tokenizer/bpe.h"
#include "tokenizer/impl.h"
#include "tokenizer/pair_merge.h"
#include "tokenizer/pieces.h"

namespace protokv {

namespace tokenizer {

void PieceIndex::build(const std::vector<std::string>& pieces, const std::vector<bool>& include,
                       bool last_duplicate_wins) {
  pieces_ = &pieces;
  slots_.assign(std::bit_ceil(2 * pieces.size() + 2), Slot{});  // load factor <= 1/2
  const size_t mask = slots_.size() - 1;
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (!include[i] || pieces[i].empty()) continue;
    const uint64_t hash = hash_bytes(pieces[i]);
    size_t slot = hash & mask;
    while (slots_[slot].id >= 0) {
      if (slots_[slot].hash == hash && pieces[slots_[slot].id] == pieces[i]) break;
      slot = (slot + 1) & mask;
    }
    if (slots_[slot].id < 0 || last_duplicate_wins) {
      slots_[slot] = Slot{hash, static_cast<int32_t>(i)};
    }
  }
}

int32_t PieceIndex::find(std::string_view text) const {
  if (slots_.empty()) return -1;
  const uint64_t hash = hash_bytes(text);
  const size_t mask = slots_.size() - 1;
  for (size_t slot = hash & mask;; slot = (slot + 1) & mask) {
    const Slot& entry = slots_[slot];
    if (entry.id < 0) return -1;
    if (entry.hash == hash && (*pieces_)[entry.id] == text) return entry.id;
  }
}

}  // namespace tokenizer

namespace {

// Token texts llama.cpp (llama-vocab.cpp, load) treats as end of generation, in its order.
// clang-format off
constexpr std::string_view kEndOfGenerationTexts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<｜end▁of▁sentence｜>", "[e~["};
// clang-format on

}  // namespace

Tokenizer::Tokenizer(std::vector<std::string> pieces, std::vector<float> scores,
                     std::vector<int32_t> types, int32_t bos_id, int32_t eos_id, int32_t unk_id)
    : impl_(std::make_unique<Impl>()) {
  impl_->model = Model::kSentencePiece;
  impl_->llama2c_compat = true;
  impl_->pieces = std::move(pieces);
  impl_->scores = std::move(scores);
  impl_->types = std::move(types);
  impl_->bos_id = bos_id;
  impl_->eos_id = eos_id;
  impl_->unk_id = unk_id;
  const size_t n = impl_->pieces.size();
  for (auto [name, id] : {std::pair{"BOS", bos_id}, {"EOS", eos_id}, {"unknown", unk_id}}) {
    PROTOKV_CHECK(id >= 0 && static_cast<size_t>(id) < n,
                  "tokenizer {} token id {} out of range (vocabulary size {})", name, id, n);
  }
  impl_->finish();
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {
  impl_->finish();
}

Tokenizer::~Tokenizer() = default;

void Tokenizer::Impl::finish() {
  const size_t n = pieces.size();
  PROTOKV_CHECK(n > 0 && n <= static_cast<size_t>(kMaxVocabSize),
                "tokenizer vocabulary size {} out of range (1..{})", n, kMaxVocabSize);
  if (scores.empty()) scores.assign(n, 0.0f);
  PROTOKV_CHECK(scores.size() == n, "tokenizer has {} pieces but {} scores", n, scores.size());
  PROTOKV_CHECK(types.size() == n, "tokenizer has {} pieces but {} token types", n, types.size());
  for (auto [name, id] : {std::pair{"BOS", bos_id}, {"EOS", eos_id}, {"unknown", unk_id}}) {
    PROTOKV_CHECK(id >= -1 && id < static_cast<int64_t>(n),
                  "tokenizer {} token id {} out of range (vocabulary size {})", name, id, n);
  }

  // The vocabulary's end-of-generation texts. llama.cpp (llama-vocab.cpp, load) also forces them
  // to control type even where the GGUF says otherwise (Gemma 3 stores "</s>" as user-defined):
  // they then stay unmatched in plain text and decode to "" unless specials are rendered. Gemma 4
  // keeps "</s>" as ordinary text when "<|tool_response>" ends generation.
  std::vector<int32_t> end_texts;
  if (!llama2c_compat) {
    bool has_tool_response = false;
    int32_t end_of_sequence_text = -1;
    for (size_t i = 0; i < n; ++i) {
      const std::string_view piece = pieces[i];
      if (piece.empty() ||
          std::ranges::find(kEndOfGenerationTexts, piece) == std::end(kEndOfGenerationTexts)) {
        continue;
      }
      end_texts.push_back(static_cast<int32_t>(i));
      has_tool_response |= piece == "<|tool_response>";
      if (piece == "</s>") end_of_sequence_text = static_cast<int32_t>(i);
    }
    if (llama_cpp_rules) {
      if (has_tool_response && end_of_sequence_text >= 0) {
        std::erase(end_texts, end_of_sequence_text);
        types[end_of_sequence_text] = kNormal;
      }
      for (const int32_t id : end_texts) types[id] = kControl;
    }
  }

  byte_tokens.fill(-1);
  texts.assign(n, std::string());
  std::vector<bool> indexed(n, false);
  for (size_t i = 0; i < n; ++i) {
    const std::string& piece = pieces[i];
    // NaN would break the strict ordering the merge queue relies on.
    PROTOKV_CHECK(!std::isnan(scores[i]), "tokenizer score of token {} is NaN", i);
    const int32_t type = types[i];
    PROTOKV_CHECK(type >= kUndefined && type <= kByte, "tokenizer token {} has invalid type {}", i,
                  type);
    // llama2.c matches only normal and user-defined pieces; llama.cpp looks up every token.
    indexed[i] = !llama2c_compat || type == kNormal || type == kUserDefined;
    if (type == kControl || type == kUserDefined || type == kUnknown) {
      if (!llama2c_compat && !piece.empty()) special_tokens.push_back(static_cast<int32_t>(i));
    }
    switch (type) {
      case kNormal:
      case kUserDefined:
        if (model == Model::kSentencePiece) {
          texts[i] = tokenizer::markers_to_spaces(piece);
        } else if (type == kNormal) {
          texts[i] = tokenizer::byte_level_decode(piece);
        } else {
          texts[i] = piece;  // added tokens hold plain text
        }
        break;
      case kByte: {
        const int byte = tokenizer::parse_byte_piece(piece);
        PROTOKV_CHECK(byte >= 0, "tokenizer token {} has byte type but piece '{}' is not <0xHH>", i,
                      piece);
        if (byte_tokens[byte] < 0) byte_tokens[byte] = static_cast<int32_t>(i);
        texts[i] = std::string(1, static_cast<char>(byte));
        break;
      }
      default:
        break;  // never produced from text by the model; decodes to ""
    }
  }
  index.build(pieces, indexed, /*last_duplicate_wins=*/!llama2c_compat);
  for (size_t i = 0; i < n; ++i) {
    if (!indexed[i] || index.find(pieces[i]) != static_cast<int32_t>(i)) continue;
    max_piece_bytes = std::max(max_piece_bytes, pieces[i].size());
    if (model == Model::kSentencePiece) {
      words_are_independent &= !tokenizer::has_marker_after_other_char(pieces[i]);
    }
  }
  // llama.cpp matches special tokens longest first.
  std::stable_sort(special_tokens.begin(), special_tokens.end(),
                   [&](int32_t a, int32_t b) { return pieces[a].size() > pieces[b].size(); });

  if (eos_id >= 0) end_of_generation.push_back(eos_id);
  for (const int32_t id : end_texts) {
    if (types[id] != kControl && types[id] != kUserDefined) continue;  // tokenizer.json: text
    if (std::find(end_of_generation.begin(), end_of_generation.end(), id) ==
        end_of_generation.end()) {
      end_of_generation.push_back(id);
    }
  }

  if (model == Model::kByteLevelBpe) {
    bpe = std::make_shared<tokenizer::BytePairEncoder>(*this);
  }
}

namespace {

using tokenizer::MergeSymbol;

struct SpmScratch {
  std::vector<MergeSymbol> symbols;
  std::vector<tokenizer::MergeCandidate> heap;
};

void spm_segment(const Tokenizer::Impl& t, std::string_view segment, SpmScratch& scratch,
                 std::vector<int32_t>& out) {
  std::vector<MergeSymbol>& symbols = scratch.symbols;
  symbols.clear();

  auto push_symbol = [&](size_t start, size_t length, int32_t id, bool mergeable) {
    MergeSymbol s;
    s.start = static_cast<uint32_t>(start);
    s.length = static_cast<uint32_t>(length);
    s.prev = static_cast<int32_t>(symbols.size()) - 1;
    s.id = id;
    s.mergeable = mergeable;
    if (!symbols.empty()) symbols.back().next = static_cast<int32_t>(symbols.size());
    symbols.push_back(s);
  };
  // Initial symbols: one per UTF-8 character.
  for (size_t pos = 0; pos < segment.size();) {
    const size_t length = tokenizer::utf8_char_length(segment, pos);
    const int32_t id = t.index.find(segment.substr(pos, length));
    if (id >= 0 || !t.llama2c_compat) {
      // llama.cpp: a character without a piece still merges; it falls back to bytes at the end.
      push_symbol(pos, length, id, true);
    } else {
      // llama2.c: bytes up front, never merged; <unk> when a byte has no piece.
      bool all_bytes_known = true;
      for (size_t b = pos; b < pos + length; ++b) {
        all_bytes_known &= t.byte_tokens[static_cast<uint8_t>(segment[b])] >= 0;
      }
      if (all_bytes_known) {
        for (size_t b = pos; b < pos + length; ++b) {
          push_symbol(b, 1, t.byte_tokens[static_cast<uint8_t>(segment[b])], false);
        }
      } else {
        push_symbol(pos, length, t.unk_id, false);
      }
    }
    pos += length;
  }

  // BPE: repeatedly merge the adjacent pair whose merged piece scores best.
  tokenizer::merge_pairs(
      symbols, scratch.heap,
      [&](const MergeSymbol& a, const MergeSymbol& b) -> std::optional<tokenizer::MergeChoice> {
        const size_t merged_length = size_t{a.length} + b.length;
        if (merged_length > t.max_piece_bytes) return std::nullopt;
        const int32_t id = t.index.find(segment.substr(a.start, merged_length));
        if (id < 0) return std::nullopt;
        return tokenizer::MergeChoice{t.scores[id], id};
      });

  // Only single characters stay without a piece: byte fallback, <unk> without byte pieces.
  tokenizer::emit_merged(symbols, out, [&](const MergeSymbol& s) {
    for (uint32_t b = s.start; b < s.start + s.length; ++b) {
      const int32_t byte_id = t.byte_tokens[static_cast<uint8_t>(segment[b])];
      PROTOKV_CHECK(byte_id >= 0 || t.unk_id >= 0,
                    "tokenizer cannot encode byte 0x{:02X}: no byte piece and no <unk>",
                    static_cast<uint8_t>(segment[b]));
      out.push_back(byte_id >= 0 ? byte_id : t.unk_id);
    }
  });
}

}  // namespace

void Tokenizer::Impl::encode_spm(std::string_view text, bool prefix_space,
                                 std::vector<int32_t>& out) const {
  // SentencePiece escaping: optional dummy-prefix space, every space -> "▁".
  std::string normalized;
  normalized.reserve(text.size() + text.size() / 4 + 3);
  if (prefix_space) normalized.append(tokenizer::kSpaceMarker);
  for (const char c : text) {
    if (c == ' ') {
      normalized.append(tokenizer::kSpaceMarker);
    } else {
      normalized.push_back(c);
    }
  }
  PROTOKV_CHECK(normalized.size() < static_cast<size_t>(std::numeric_limits<int32_t>::max()),
                "text of {} bytes is too long to tokenize", text.size());
  SpmScratch scratch;
  const std::string_view all(normalized);
  if (!words_are_independent) {
    spm_segment(*this, all, scratch, out);
    return;
  }
  // Word starts: a marker that does not follow another marker. See words_are_independent.
  const std::string_view marker = tokenizer::kSpaceMarker;
  size_t segment_start = 0;
  for (size_t pos = all.find(marker, 1); pos != std::string_view::npos;
       pos = all.find(marker, pos + marker.size())) {
    if (pos >= marker.size() && all.compare(pos - marker.size(), marker.size(), marker) == 0) {
      continue;
    }
    spm_segment(*this, all.substr(segment_start, pos - segment_start), scratch, out);
    segment_start = pos;
  }
  spm_segment(*this, all.substr(segment_start), scratch, out);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, const EncodeOptions& options) const {
  const Impl& t = *impl_;
  std::vector<int32_t> tokens;
  if (options.add_bos && t.bos_id >= 0) tokens.push_back(t.bos_id);
  if (text.empty()) return tokens;
  tokens.reserve(tokens.size() + text.size() / 3);

  // Fragments of the text: runs of plain text and special tokens (llama.cpp's
  // tokenizer_st_partition: each special token, longest first, splits every text run).
  struct Fragment {
    int32_t token;  // -1: text [begin, end)
    size_t begin, end;
  };
  std::vector<Fragment> fragments{{-1, 0, text.size()}};
  std::vector<Fragment> next;
  for (const int32_t special : t.special_tokens) {
    if (!options.parse_special && t.types[special] != kUserDefined) continue;
    const std::string& piece = t.pieces[special];
    bool found = false;
    for (const Fragment& f : fragments) {
      if (f.token >= 0 || f.end - f.begin < piece.size()) continue;
      if (text.substr(f.begin, f.end - f.begin).find(piece) != std::string_view::npos) {
        found = true;
        break;
      }
    }
    if (!found) continue;
    next.clear();
    for (const Fragment& f : fragments) {
      if (f.token >= 0) {
        next.push_back(f);
        continue;
      }
      size_t pos = f.begin;
      for (size_t hit; (hit = text.substr(0, f.end).find(piece, pos)) != std::string_view::npos;
           pos = hit + piece.size()) {
        if (hit > pos) next.push_back({-1, pos, hit});
        next.push_back({special, hit, hit + piece.size()});
      }
      if (pos < f.end) next.push_back({-1, pos, f.end});
    }
    fragments.swap(next);
  }

  bool prev_special = true;  // SentencePiece: dummy prefix at the start and after a special
  for (const Fragment& f : fragments) {
    if (f.token >= 0) {
      tokens.push_back(f.token);
      prev_special = true;
      continue;
    }
    const std::string_view run = text.substr(f.begin, f.end - f.begin);
    if (t.model == Model::kSentencePiece) {
      t.encode_spm(run, t.add_space_prefix && prev_special, tokens);
    } else {
      t.encode_bpe(run, tokens);
    }
    prev_special = false;
  }
  return tokens;
}

std::string Tokenizer::decode(int32_t prev, int32_t token) const {
  const Impl& t = *impl_;
  PROTOKV_CHECK(token >= 0 && token < vocab_size(), "token id {} out of range (vocabulary size {})",
                token, vocab_size());
  const std::string& text = t.texts[token];
  // SentencePiece: the dummy-prefix space of the first piece after BOS is not part of the text.
  if (t.model == Model::kSentencePiece && prev >= 0 && prev == t.bos_id && !text.empty() &&
      text[0] == ' ') {
    return text.substr(1);
  }
  return text;
}

std::string Tokenizer::decode(std::span<const int32_t> tokens) const {
  std::string out;
  int32_t prev = -1;
  for (const int32_t token : tokens) {
    out += decode(prev, token);
    prev = token;
  }
  return out;
}

Tokenizer::Model Tokenizer::model() const {
  return impl_->model;
}
int32_t Tokenizer::vocab_size() const {
  return static_cast<int32_t>(impl_->pieces.size());
}
int32_t Tokenizer::bos_id() const {
  return impl_->bos_id;
}
int32_t Tokenizer::eos_id() const {
  return impl_->eos_id;
}
int32_t Tokenizer::unk_id() const {
  return impl_->unk_id;
}
bool Tokenizer::add_bos() const {
  return impl_->add_bos && impl_->bos_id >= 0;
}
const std::vector<int32_t>& Tokenizer::end_of_generation_ids() const {
  return impl_->end_of_generation;
}
bool Tokenizer::is_end_of_generation(int32_t token) const {
  const auto& ids = impl_->end_of_generation;
  return std::find(ids.begin(), ids.end(), token) != ids.end();
}
const std::string& Tokenizer::chat_template() const {
  return impl_->chat_template;
}
const std::vector<std::string>& Tokenizer::pieces() const {
  return impl_->pieces;
}
const std::vector<float>& Tokenizer::scores() const {
  return impl_->scores;
}
const std::vector<int32_t>& Tokenizer::types() const {
  return impl_->types;
}
int32_t Tokenizer::find_token(std::string_view piece) const {
  const auto it = std::find(impl_->pieces.begin(), impl_->pieces.end(), piece);
  return it == impl_->pieces.end() ? -1 : static_cast<int32_t>(it - impl_->pieces.begin());
}

std::shared_ptr<Tokenizer> make_tokenizer(std::unique_ptr<Tokenizer::Impl> impl) {
  struct Access : Tokenizer {
    explicit Access(std::unique_ptr<Impl> i) : Tokenizer(std::move(i)) {}
  };
  return std::make_shared<Access>(std::move(impl));
}

std::string Utf8StreamBuffer::push(std::string_view bytes) {
  pending_.append(bytes);
  // Hold back a trailing lead byte whose continuation bytes have not all arrived yet.
  size_t keep = 0;
  const size_t n = pending_.size();
  for (size_t back = 1; back <= std::min<size_t>(4, n); ++back) {
    const auto c = static_cast<uint8_t>(pending_[n - back]);
    if ((c & 0xC0u) == 0x80u) continue;  // continuation byte: look further back
    // A lead byte (0 for one no sequence starts with) whose sequence is longer than what is here.
    if (static_cast<size_t>(text::utf8_sequence_length(c)) > back) keep = back;
    break;
  }
  std::string ready = pending_.substr(0, n - keep);
  pending_.erase(0, n - keep);
  return ready;
}

std::string Utf8StreamBuffer::flush() {
  std::string rest;
  rest.swap(pending_);
  return rest;
}

}  // namespace protokv
