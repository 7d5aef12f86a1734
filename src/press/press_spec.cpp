// SPDX-License-Identifier: Apache-2.0
// PressSpec: the immutable options of a press and the factory of its per-session states. parse()
// lives beside the press table in registry.cpp.
#include "protokv/press_spec.h"

#include <nlohmann/json.hpp>
#include <utility>

#include "protokv/error.h"

namespace protokv {

PressSpec::PressSpec(std::string text, Factory factory) : factory_(std::move(factory)) {
  PROTOKV_CHECK(static_cast<bool>(factory_), "press spec '{}' has no factory", text);
  // One state made here tells the name and the resolved options; sessions make their own.
  const std::unique_ptr<Press> probe = factory_();
  PROTOKV_CHECK(probe != nullptr, "press spec '{}' made no press", text);
  name_ = probe->name();
  text_ = text.empty() ? name_ : std::move(text);
  config_ = std::make_shared<const nlohmann::json>(probe->config());
}

std::shared_ptr<const PressSpec> PressSpec::from_factory(Factory factory) {
  return std::make_shared<const PressSpec>("", std::move(factory));
}

}  // namespace protokv
