// SPDX-License-Identifier: Apache-2.0
#pragma once
// A press spec: a method with its options, parsed and validated once, immutable, shareable between
// sessions and threads. A Press object is one sequence's state (scores, decode-time statistics,
// clusters); every Session creates its own from the spec at prefill (SessionOptions::press), so
// one spec serves any number of sessions, one after the other or interleaved.
#include <functional>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>

#include "protokv/press.h"

namespace protokv {

class PressSpec {
 public:
  // Makes one fresh press state; called once per prefill of every session using the spec.
  using Factory = std::function<std::unique_ptr<Press>()>;

  // Parses "NAME[:key=value,...]" through the registry (press/registry.cpp); `alloc` (empty = the
  // method's default) picks the budget allocator for scoring presses. Throws Error for an unknown
  // press or option, a malformed value, or options that contradict each other.
  static std::shared_ptr<const PressSpec> parse(std::string_view text, std::string_view alloc = "");
  // A spec for a press type outside the registry (tests, tools): `factory` makes each state.
  static std::shared_ptr<const PressSpec> from_factory(Factory factory);

  // The method's name as its presses report it (e.g. "pyramidkv").
  const std::string& name() const { return name_; }
  // Every option with its resolved value, as Press::config() reports it.
  const nlohmann::json& config() const { return *config_; }
  // The text the spec was parsed from ("snapkv:window=8"); the name for a factory spec.
  const std::string& text() const { return text_; }
  // A fresh per-sequence press with these options, in its initial state.
  std::unique_ptr<Press> instantiate() const { return factory_(); }

  // Use parse() or from_factory(): the constructor only stores what they validated.
  PressSpec(std::string text, Factory factory);

 private:
  std::string text_;
  std::string name_;
  std::shared_ptr<const nlohmann::json> config_;
  Factory factory_;
};

}  // namespace protokv
