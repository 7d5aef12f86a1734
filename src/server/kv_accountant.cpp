// SPDX-License-Identifier: Apache-2.0
#include "server/kv_accountant.h"

#include <algorithm>
#include <utility>

namespace protokv::server {

KvAccountant::Reservation::Reservation(Reservation&& other) noexcept
    : owner_(std::exchange(other.owner_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

KvAccountant::Reservation& KvAccountant::Reservation::operator=(Reservation&& other) noexcept {
  if (this != &other) {
    release();
    owner_ = std::exchange(other.owner_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

KvAccountant::Reservation::~Reservation() {
  release();
}

bool KvAccountant::Reservation::resize(size_t bytes) {
  if (owner_ == nullptr || !owner_->change(bytes_, bytes)) return false;
  bytes_ = bytes;
  return true;
}

void KvAccountant::Reservation::release() {
  if (owner_ != nullptr) owner_->change(bytes_, 0);
  owner_ = nullptr;
  bytes_ = 0;
}

std::optional<KvAccountant::Reservation> KvAccountant::try_reserve(size_t bytes) {
  if (!change(0, bytes)) return std::nullopt;
  return Reservation(this, bytes);
}

size_t KvAccountant::in_use() const {
  std::lock_guard lock(mutex_);
  return in_use_;
}

bool KvAccountant::change(size_t from, size_t to) {
  std::lock_guard lock(mutex_);
  const size_t others = in_use_ - from;
  if (to > from && cap_ != 0 && (to > cap_ || others > cap_ - to)) return false;
  in_use_ = others + to;
  return true;
}

size_t full_kv_bytes(const ModelConfig& config, int64_t n_tokens) {
  const auto per_entry = static_cast<size_t>(config.n_kv_heads) *
                         static_cast<size_t>(config.head_dim()) * 2 * sizeof(float);
  size_t total = 0;
  for (int l = 0; l < config.n_layers; ++l) {
    const int64_t kept = config.is_local_layer(l) && config.sliding_window > 0
                             ? std::min<int64_t>(n_tokens, config.sliding_window)
                             : n_tokens;
    total += static_cast<size_t>(std::max<int64_t>(kept, 0)) * per_entry;
  }
  return total;
}

}  // namespace protokv::server
