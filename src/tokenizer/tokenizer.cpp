// SentencePiece-style BPE over scored pieces: construction, encoding, decoding.
#include "protokv/tokenizer.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

#include "protokv/error.h"
#include "tokenizer/pieces.h"

namespace protokv {

Tokenizer::Tokenizer(std::vector<std::string> pieces, std::vector<float> scores,
                     std::vector<int32_t> types, int32_t bos_id, int32_t eos_id, int32_t unk_id)
    : pieces_(std::move(pieces)),
      scores_(std::move(scores)),
      types_(std::move(types)),
      bos_id_(bos_id),
      eos_id_(eos_id),
      unk_id_(unk_id) {
  const size_t n = pieces_.size();
  PROTOKV_CHECK(n > 0 && n <= static_cast<size_t>(kMaxVocabSize),
                "tokenizer vocabulary size {} out of range (1..{})", n, kMaxVocabSize);
  PROTOKV_CHECK(scores_.size() == n, "tokenizer has {} pieces but {} scores", n, scores_.size());
  PROTOKV_CHECK(types_.size() == n, "tokenizer has {} pieces but {} token types", n, types_.size());
  for (auto [name, id] : {std::pair{"BOS", bos_id_}, {"EOS", eos_id_}, {"unknown", unk_id_}}) {
    PROTOKV_CHECK(id >= 0 && static_cast<size_t>(id) < n,
                  "tokenizer {} token id {} out of range (vocabulary size {})", name, id, n);
  }

  std::fill(std::begin(byte_tokens_), std::end(byte_tokens_), -1);
  texts_.resize(n);
  piece_slots_.resize(std::bit_ceil(2 * n));  // load factor <= 1/2
  for (size_t i = 0; i < n; ++i) {
    const std::string& piece = pieces_[i];
    // NaN would break the strict ordering the merge queue relies on.
    PROTOKV_CHECK(!std::isnan(scores_[i]), "tokenizer score of token {} is NaN", i);
    switch (types_[i]) {
      case kNormal:
      case kUserDefined:
        texts_[i] = tokenizer::markers_to_spaces(piece);
        // The first of duplicated pieces wins, as in SentencePiece's piece table.
        if (!piece.empty() && find_piece(piece) < 0) {
          const uint64_t hash = tokenizer::hash_bytes(piece);
          const size_t mask = piece_slots_.size() - 1;
          size_t slot = hash & mask;
          while (piece_slots_[slot].id >= 0) slot = (slot + 1) & mask;
          piece_slots_[slot] = PieceSlot{hash, static_cast<int32_t>(i)};
          max_piece_bytes_ = std::max(max_piece_bytes_, piece.size());
          words_are_independent_ &= !tokenizer::has_marker_after_other_char(piece);
        }
        break;
      case kByte: {
        const int byte = tokenizer::parse_byte_piece(piece);
        PROTOKV_CHECK(byte >= 0, "tokenizer token {} has byte type but piece '{}' is not <0xHH>", i,
                      piece);
        if (byte_tokens_[byte] < 0) byte_tokens_[byte] = static_cast<int32_t>(i);
        texts_[i] = std::string(1, static_cast<char>(byte));
        break;
      }
      case kUndefined:
      case kUnknown:
      case kControl:
      case kUnused:
        break;  // never produced from text; decodes to ""
      default:
        fail("tokenizer token {} has invalid type {}", i, types_[i]);
    }
  }
}

int32_t Tokenizer::find_piece(std::string_view text) const {
  const uint64_t hash = tokenizer::hash_bytes(text);
  const size_t mask = piece_slots_.size() - 1;
  for (size_t slot = hash & mask;; slot = (slot + 1) & mask) {
    const PieceSlot& entry = piece_slots_[slot];
    if (entry.id < 0) return -1;
    if (entry.hash == hash && pieces_[entry.id] == text) return entry.id;
  }
}

namespace {

// One entry of the encoder's doubly linked list of symbols: a span of the normalised text.
struct Symbol {
  uint32_t start = 0;
  uint32_t length = 0;  // 0 once merged into its left neighbour
  int32_t prev = -1;
  int32_t next = -1;
  int32_t id = -1;
  bool mergeable = true;  // byte-fallback symbols never merge (their pieces are "<0xHH>")
};

// A candidate merge of symbol `left` with its right neighbour. Entries go stale when either side
// changes; they are discarded when popped (lazy deletion).
struct Candidate {
  float score;
  int32_t left;
  int32_t right;
  uint32_t merged_length;
  int32_t merged_id;
};

// Max-heap order: higher score first, then the leftmost pair (llama2.c / SentencePiece tie rule).
// Symbol indices grow left to right and merging never reorders them.
struct CandidateLess {
  bool operator()(const Candidate& a, const Candidate& b) const {
    if (a.score != b.score) return a.score < b.score;
    return a.left > b.left;
  }
};

}  // namespace

struct Tokenizer::EncodeScratch {
  std::vector<Symbol> symbols;
  std::vector<Candidate> heap;
};

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_bos) const {
  std::vector<int32_t> tokens;
  if (add_bos) tokens.push_back(bos_id_);
  if (text.empty()) return tokens;

  const std::string normalized = tokenizer::normalize_for_encoding(text);
  PROTOKV_CHECK(normalized.size() < static_cast<size_t>(std::numeric_limits<int32_t>::max()),
                "text of {} bytes is too long to tokenize", text.size());
  tokens.reserve(tokens.size() + normalized.size() / 2);
  EncodeScratch scratch;
  const std::string_view all(normalized);
  if (!words_are_independent_) {
    encode_segment(all, scratch, tokens);
    return tokens;
  }
  // Word starts: a marker that does not follow another marker. See words_are_independent_.
  const std::string_view marker = tokenizer::kSpaceMarker;
  size_t segment_start = 0;
  for (size_t pos = all.find(marker, marker.size()); pos != std::string_view::npos;
       pos = all.find(marker, pos + marker.size())) {
    if (all.compare(pos - marker.size(), marker.size(), marker) == 0) continue;
    encode_segment(all.substr(segment_start, pos - segment_start), scratch, tokens);
    segment_start = pos;
  }
  encode_segment(all.substr(segment_start), scratch, tokens);
  return tokens;
}

void Tokenizer::encode_segment(std::string_view segment, EncodeScratch& scratch,
                               std::vector<int32_t>& out) const {
  std::vector<Symbol>& symbols = scratch.symbols;
  std::vector<Candidate>& heap = scratch.heap;
  symbols.clear();
  heap.clear();

  // Initial symbols: one per UTF-8 character, or one per byte where the character has no piece.
  auto push_symbol = [&](size_t start, size_t length, int32_t id, bool mergeable) {
    Symbol s;
    s.start = static_cast<uint32_t>(start);
    s.length = static_cast<uint32_t>(length);
    s.prev = static_cast<int32_t>(symbols.size()) - 1;
    s.id = id;
    s.mergeable = mergeable;
    if (!symbols.empty()) symbols.back().next = static_cast<int32_t>(symbols.size());
    symbols.push_back(s);
  };
  for (size_t pos = 0; pos < segment.size();) {
    const size_t length = tokenizer::utf8_char_length(segment, pos);
    if (const int32_t id = find_piece(segment.substr(pos, length)); id >= 0) {
      push_symbol(pos, length, id, true);
    } else {
      bool all_bytes_known = true;
      for (size_t b = pos; b < pos + length; ++b) {
        all_bytes_known &= byte_tokens_[static_cast<uint8_t>(segment[b])] >= 0;
      }
      if (all_bytes_known) {
        for (size_t b = pos; b < pos + length; ++b) {
          push_symbol(b, 1, byte_tokens_[static_cast<uint8_t>(segment[b])], false);
        }
      } else {
        push_symbol(pos, length, unk_id_, false);  // no byte fallback in this vocabulary
      }
    }
    pos += length;
  }

  // BPE: repeatedly merge the best-scoring adjacent pair. A heap of candidate pairs over the
  // linked list makes this O(n log n) instead of llama2.c's O(n^2) rescans.
  auto consider_pair = [&](int32_t left) {
    if (left < 0) return;
    const int32_t right = symbols[left].next;
    if (right < 0) return;
    const Symbol& a = symbols[left];
    const Symbol& b = symbols[right];
    if (!a.mergeable || !b.mergeable) return;
    const size_t merged_length = size_t{a.length} + b.length;
    if (merged_length > max_piece_bytes_) return;
    // Adjacent symbols are contiguous in the text, so the merged piece is one span of it.
    const int32_t id = find_piece(segment.substr(a.start, merged_length));
    if (id < 0) return;
    heap.push_back(Candidate{scores_[id], left, right, static_cast<uint32_t>(merged_length), id});
    std::push_heap(heap.begin(), heap.end(), CandidateLess{});
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(symbols.size()); ++i) consider_pair(i);

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), CandidateLess{});
    const Candidate best = heap.back();
    heap.pop_back();
    Symbol& left = symbols[best.left];
    Symbol& right = symbols[best.right];
    // Stale when either side was merged away, or the right side grew by a later merge.
    if (left.length == 0 || right.length == 0 || left.next != best.right ||
        left.length + right.length != best.merged_length) {
      continue;
    }
    left.length = best.merged_length;
    left.id = best.merged_id;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = best.left;
    right.length = 0;
    consider_pair(left.prev);
    consider_pair(best.left);
  }

  for (int32_t i = symbols.empty() ? -1 : 0; i >= 0; i = symbols[i].next) {
    out.push_back(symbols[i].id);
  }
}

std::string Tokenizer::decode(int32_t prev, int32_t token) const {
  PROTOKV_CHECK(token >= 0 && token < vocab_size(), "token id {} out of range (vocabulary size {})",
                token, vocab_size());
  const std::string& text = texts_[token];
  // llama2.c: the dummy-prefix space of the first piece after BOS is not part of the text.
  if (prev == bos_id_ && !text.empty() && text[0] == ' ') return text.substr(1);
  return text;
}

std::string Tokenizer::decode(std::span<const int32_t> tokens) const {
  std::string out;
  int32_t prev = -1;
  for (const int32_t token : tokens) {
    PROTOKV_CHECK(token >= 0 && token < vocab_size(),
                  "token id {} out of range (vocabulary size {})", token, vocab_size());
    const std::string& text = texts_[token];
    const size_t skip = (prev == bos_id_ && !text.empty() && text[0] == ' ') ? 1 : 0;
    out.append(text, skip);
    prev = token;
  }
  return out;
}

}  // namespace protokv
