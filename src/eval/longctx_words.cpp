// SPDX-License-Identifier: Apache-2.0
#include "eval/longctx_words.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <set>
#include <unordered_set>

#include "protokv/error.h"

namespace protokv::eval {
namespace {

// Hand-written lists (common English words), not a copy of any package's list.
constexpr std::array<std::string_view, 120> kNouns = {
    "apple",    "anchor",    "arrow",      "badge",   "banana",    "basket",  "beacon",   "bicycle",
    "blanket",  "boat",      "bottle",     "bridge",  "brush",     "bucket",  "button",   "cabin",
    "camera",   "candle",    "canyon",     "carpet",  "castle",    "cherry",  "circle",   "cloud",
    "compass",  "cookie",    "cottage",    "crayon",  "crystal",   "curtain", "desert",   "diamond",
    "dolphin",  "dragon",    "drum",       "eagle",   "engine",    "falcon",  "feather",  "fence",
    "forest",   "fountain",  "garden",     "glacier", "globe",     "guitar",  "hammer",   "harbor",
    "helmet",   "island",    "jacket",     "jungle",  "kettle",    "kitten",  "ladder",   "lantern",
    "lemon",    "library",   "lighthouse", "lizard",  "magnet",    "mango",   "marble",   "meadow",
    "mirror",   "monkey",    "mountain",   "needle",  "ocean",     "orange",  "orchard",  "otter",
    "paddle",   "palace",    "panda",      "parrot",  "pebble",    "pencil",  "pepper",   "piano",
    "pillow",   "planet",    "pocket",     "pond",    "puzzle",    "rabbit",  "radio",    "river",
    "rocket",   "saddle",    "sandal",     "school",  "shadow",    "shell",   "silver",   "spoon",
    "squirrel", "staircase", "statue",     "stone",   "sunflower", "teapot",  "temple",   "thunder",
    "ticket",   "tiger",     "tower",      "tractor", "trumpet",   "tunnel",  "umbrella", "valley",
    "violin",   "wagon",     "walnut",     "window",  "wizard",    "yacht",   "zebra",    "zipper"};

constexpr std::array<std::string_view, 64> kAdjectives = {
    "ancient", "bitter", "brave",   "bright", "broad",    "calm",   "careful",  "cheerful",
    "clever",  "cold",   "curious", "damp",   "dark",     "deep",   "delicate", "dusty",
    "eager",   "early",  "elegant", "empty",  "fancy",    "fast",   "fierce",   "fragile",
    "frozen",  "gentle", "giant",   "golden", "graceful", "green",  "happy",    "heavy",
    "hidden",  "honest", "huge",    "humble", "icy",      "jolly",  "kind",     "lazy",
    "little",  "lively", "loud",    "lucky",  "magnetic", "mighty", "narrow",   "noble",
    "odd",     "old",    "pale",    "polite", "proud",    "quiet",  "rapid",    "rough",
    "shiny",   "silent", "smooth",  "sour",   "steady",   "tender", "wild",     "young"};

constexpr std::array<std::string_view, 48> kVerbs = {
    "accept",  "admire", "arrive",  "balance", "borrow",   "breathe",  "build",   "carry",
    "chase",   "climb",  "collect", "deliver", "dig",      "discover", "dream",   "explain",
    "explore", "float",  "follow",  "gather",  "glow",     "guide",    "hurry",   "imagine",
    "invent",  "juggle", "jump",    "knit",    "laugh",    "listen",   "measure", "melt",
    "observe", "paint",  "polish",  "promise", "question", "repair",   "scatter", "sing",
    "sketch",  "steer",  "swim",    "travel",  "whisper",  "wander",   "wonder",  "wrestle"};

}  // namespace

std::span<const std::string_view> word_nouns() {
  return kNouns;
}
std::span<const std::string_view> word_adjectives() {
  return kAdjectives;
}
std::span<const std::string_view> word_verbs() {
  return kVerbs;
}

const std::vector<std::string>& adjective_noun_keys() {
  static const std::vector<std::string> keys = [] {
    std::set<std::string> all;
    for (auto adj : kAdjectives)
      for (auto noun : kNouns) all.insert(fmt::format("{}-{}", adj, noun));
    return std::vector<std::string>(all.begin(), all.end());
  }();
  return keys;
}

int64_t uniform_int(std::mt19937_64& rng, int64_t lo, int64_t hi) {
  const uint64_t span = static_cast<uint64_t>(hi - lo) + 1;
  if (span == 0) return static_cast<int64_t>(rng());  // the whole 64-bit range
  // Rejection sampling: no modulo bias.
  const uint64_t limit = UINT64_MAX - UINT64_MAX % span;
  uint64_t x;
  do {
    x = rng();
  } while (x >= limit);
  return lo + static_cast<int64_t>(x % span);
}

std::vector<int64_t> sample_indices(std::mt19937_64& rng, int64_t n, int64_t k) {
  PROTOKV_CHECK(k <= n, "cannot draw {} distinct items from {}", k, n);
  std::vector<int64_t> out;
  std::unordered_set<int64_t> seen;
  while (static_cast<int64_t>(out.size()) < k) {
    const int64_t i = uniform_int(rng, 0, n - 1);
    if (seen.insert(i).second) out.push_back(i);
  }
  return out;
}

std::string random_number_text(std::mt19937_64& rng, int digits) {
  int64_t lo = 1;
  for (int i = 1; i < digits; ++i) lo *= 10;
  return std::to_string(uniform_int(rng, lo, lo * 10 - 1));
}

std::string random_uuid(std::mt19937_64& rng) {
  uint64_t hi = rng(), lo = rng();
  hi = (hi & ~uint64_t{0xF000}) | uint64_t{0x4000};            // version 4
  lo = (lo & ~(uint64_t{0xC} << 60)) | (uint64_t{0x8} << 60);  // RFC 4122 variant
  return fmt::format("{:08x}-{:04x}-{:04x}-{:04x}-{:012x}", hi >> 32, (hi >> 16) & 0xFFFF,
                     hi & 0xFFFF, lo >> 48, lo & 0xFFFFFFFFFFFFULL);
}

}  // namespace protokv::eval
