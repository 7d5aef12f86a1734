// SPDX-License-Identifier: Apache-2.0
#pragma once
// Small English word lists for the synthetic long-context tasks (NIAH keys, RULER's needle keys
// and common-words task). RULER draws from the `wonderwords` package's noun/adjective/verb lists
// (thousands of words); these are short hand-written lists committed as data in
// longctx_words.cpp, so the tasks need no download. Fewer words only means fewer distinct keys.
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace protokv::eval {

std::span<const std::string_view> word_nouns();
std::span<const std::string_view> word_adjectives();
std::span<const std::string_view> word_verbs();

// RULER's needle keys: "adjective-noun" (sorted, distinct).
const std::vector<std::string>& adjective_noun_keys();

// A uniform integer in [lo, hi] from a seeded engine (std::uniform_int_distribution is not
// specified identically across standard libraries; this is, so runs repeat everywhere).
int64_t uniform_int(std::mt19937_64& rng, int64_t lo, int64_t hi);

// Fisher-Yates shuffle with uniform_int (portable, unlike std::shuffle).
template <typename T>
void portable_shuffle(std::vector<T>& v, std::mt19937_64& rng) {
  for (size_t i = v.size(); i > 1; --i) {
    const auto j = static_cast<size_t>(uniform_int(rng, 0, static_cast<int64_t>(i) - 1));
    std::swap(v[i - 1], v[j]);
  }
}

// k distinct indices of [0, n), in draw order.
std::vector<int64_t> sample_indices(std::mt19937_64& rng, int64_t n, int64_t k);

// A random 7-digit number as text (RULER's generate_random_number).
std::string random_number_text(std::mt19937_64& rng, int digits = 7);
// A random version-4 UUID in canonical form.
std::string random_uuid(std::mt19937_64& rng);

}  // namespace protokv::eval
