// SPDX-License-Identifier: Apache-2.0
#pragma once
// Greedy pair merging, the core both encoders share: SentencePiece's scored pieces
// (tokenizer.cpp, the best score merges first) and byte-level BPE's ranked merges (bpe.cpp, the
// lowest rank merges first). The word is a doubly linked list of symbols; a heap of candidate
// merges makes it O(n log n). Ties go to the leftmost pair (llama.cpp / SentencePiece rule).
#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

namespace protokv::tokenizer {

// One entry of the linked list: a span of the word being encoded.
struct MergeSymbol {
  uint32_t start = 0;
  uint32_t length = 0;  // 0 once merged into its left neighbour
  int32_t prev = -1;
  int32_t next = -1;
  int32_t id = -1;        // -1: the span is no token (the caller falls back to bytes)
  bool mergeable = true;  // llama2.c byte-fallback symbols never merge
};

// What merging two neighbours gives: the merged token and its priority (higher merges first:
// a SentencePiece score, or minus a BPE merge rank; double holds both exactly).
struct MergeChoice {
  double priority;
  int32_t merged_id;
};

// A candidate merge of symbol `left` with its right neighbour. Entries go stale when either side
// changes; they are discarded when popped (lazy deletion).
struct MergeCandidate {
  double priority;
  int32_t left;
  int32_t right;
  uint32_t merged_length;
  int32_t merged_id;
};

// Max-heap order: higher priority first, then the leftmost pair.
struct MergeCandidateLess {
  bool operator()(const MergeCandidate& a, const MergeCandidate& b) const {
    if (a.priority != b.priority) return a.priority < b.priority;
    return a.left > b.left;
  }
};

// Merges neighbours until no pair merges. `find_merge(left, right)` returns the MergeChoice for
// two adjacent symbols, or nothing when they do not merge. `heap` is scratch space (reused
// across calls to avoid allocations).
template <typename FindMerge>
void merge_pairs(std::vector<MergeSymbol>& symbols, std::vector<MergeCandidate>& heap,
                 FindMerge&& find_merge) {
  heap.clear();
  auto consider_pair = [&](int32_t left) {
    if (left < 0) return;
    const int32_t right = symbols[left].next;
    if (right < 0) return;
    const MergeSymbol& a = symbols[left];
    const MergeSymbol& b = symbols[right];
    if (!a.mergeable || !b.mergeable) return;
    const std::optional<MergeChoice> choice = find_merge(a, b);
    if (!choice) return;
    heap.push_back(
        MergeCandidate{choice->priority, left, right, a.length + b.length, choice->merged_id});
    std::push_heap(heap.begin(), heap.end(), MergeCandidateLess{});
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(symbols.size()); ++i) consider_pair(i);

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), MergeCandidateLess{});
    const MergeCandidate best = heap.back();
    heap.pop_back();
    MergeSymbol& left = symbols[best.left];
    MergeSymbol& right = symbols[best.right];
    if (left.length == 0 || right.length == 0 || left.next != best.right ||
        left.length + right.length != best.merged_length) {
      continue;  // stale
    }
    left.length = best.merged_length;
    left.id = best.merged_id;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = best.left;
    right.length = 0;
    consider_pair(left.prev);
    consider_pair(best.left);
  }
}

// Appends the token ids of the merged list in order; a symbol that is no token goes to
// `fallback(symbol)`, which appends what the encoder uses instead (byte pieces or <unk> for
// SentencePiece, the single bytes that are tokens for byte-level BPE).
template <typename Fallback>
void emit_merged(const std::vector<MergeSymbol>& symbols, std::vector<int32_t>& out,
                 Fallback&& fallback) {
  for (int32_t i = symbols.empty() ? -1 : 0; i >= 0; i = symbols[i].next) {
    const MergeSymbol& s = symbols[i];
    if (s.id >= 0) {
      out.push_back(s.id);
    } else {
      fallback(s);
    }
  }
}

}  // namespace protokv::tokenizer
