// SPDX-License-Identifier: Apache-2.0
#pragma once
// The server's KV memory accountant (`protokv serve --kv-memory`): a hard cap on the KV bytes that
// all sessions together may hold. A request reserves an upper bound of what it can ever hold
// before its prefill starts and is admitted only if that fits; once its prefill has compressed
// the cache, the reservation shrinks to what the cache really holds plus the growth its remaining
// tokens can add. Reservations are RAII: a finished, failed or cancelled request releases its
// bytes when its reservation is destroyed.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>

#include "protokv/model.h"

namespace protokv::server {

class KvAccountant {
 public:
  // cap_bytes = 0: no cap (everything is admitted; the bytes are still counted).
  explicit KvAccountant(size_t cap_bytes) : cap_(cap_bytes) {}
  KvAccountant(const KvAccountant&) = delete;
  KvAccountant& operator=(const KvAccountant&) = delete;

  class Reservation {
   public:
    Reservation() = default;
    Reservation(Reservation&& other) noexcept;
    Reservation& operator=(Reservation&& other) noexcept;
    ~Reservation();
    size_t bytes() const { return bytes_; }
    bool valid() const { return owner_ != nullptr; }
    // Shrinks (or grows, if the cap allows) to `bytes`; false (nothing changed) when growing
    // would exceed the cap.
    bool resize(size_t bytes);
    void release();

   private:
    friend class KvAccountant;
    Reservation(KvAccountant* owner, size_t bytes) : owner_(owner), bytes_(bytes) {}
    KvAccountant* owner_ = nullptr;
    size_t bytes_ = 0;
  };

  // A reservation of `bytes` when they fit under the cap beside the others, else nullopt.
  std::optional<Reservation> try_reserve(size_t bytes);
  // Whether `bytes` could ever fit (with nothing else reserved).
  bool could_fit(size_t bytes) const { return cap_ == 0 || bytes <= cap_; }
  size_t cap() const { return cap_; }
  size_t in_use() const;

 private:
  bool change(size_t from, size_t to);
  const size_t cap_;
  mutable std::mutex mutex_;
  size_t in_use_ = 0;
};

}  // namespace protokv::server
