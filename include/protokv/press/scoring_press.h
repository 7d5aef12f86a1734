// SPDX-License-Identifier: Apache-2.0
#pragma once
// A press that is "score, then keep": a Scorer rates every prefix entry of every KV head, an
// allocator turns the budget into per-head counts, and the selector keeps the best entries plus
// the observation window (DESIGN §5). Kept entries are written in ascending position order.
#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "protokv/press.h"
#include "protokv/press/allocator.h"
#include "protokv/press/scores.h"

namespace protokv::press {

class Scorer {
 public:
  virtual ~Scorer() = default;
  virtual std::string name() const = 0;
  // The scorer's resolved options.
  virtual void add_config(nlohmann::json& out) const = 0;
  virtual void begin(const SequenceInfo& /*info*/) {}
  // Fills out.score (and out.tie / out.group if it uses them) for prefix entries [0, n - window)
  // of every KV head. Called only when n - window >= 1.
  virtual void score(const LayerView& layer, int64_t window, LayerScores& out) = 0;
  // After head `h` of layer `layer` kept the token indices `kept` (ascending, window included).
  // Called concurrently for different heads.
  virtual void on_kept(int /*layer*/, int /*h*/, const std::vector<int32_t>& /*kept*/) {}
  // What the scorer observed since begin() (e.g. ProtoKV's cluster statistics); null if nothing.
  virtual nlohmann::json diagnostics() const;
};

class ScoringPress : public Press {
 public:
  ScoringPress(std::string name, std::unique_ptr<Scorer> scorer, int64_t window,
               AllocatorConfig allocator);

  std::string name() const override { return name_; }
  nlohmann::json config() const override;
  void begin(const SequenceInfo& info, const Budget& budget) override;
  void compress_prefill(const LayerView& layer, LayerCache& out) override;

  int64_t window() const { return window_; }
  const AllocatorConfig& allocator() const { return allocator_; }
  Scorer& scorer() { return *scorer_; }
  const Scorer& scorer() const { return *scorer_; }

 protected:
  // After head `h` of `layer` kept the token indices `kept` (ascending, window included).
  virtual void on_kept(int /*layer*/, int /*h*/, const std::vector<int32_t>& /*kept*/) {}
  const SequenceInfo& info() const { return info_; }
  // For a press whose kept window depends on the budget (h2o:decode=1); before begin().
  void set_window(int64_t window) { window_ = window; }

 private:
  std::string name_;
  std::unique_ptr<Scorer> scorer_;
  int64_t window_;
  AllocatorConfig allocator_;
  SequenceInfo info_;
  Budget budget_;
  LayerScores scores_;
};

// Keeps every prefill entry of `layer` (budget >= prompt length).
void keep_all(const LayerView& layer, LayerCache& out);

}  // namespace protokv::press
