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

}  // namespace protokv::server
