// SPDX-License-Identifier: Apache-2.0
#pragma once
// Memory checks before the large allocations a request implies: a model or a KV cache that cannot
// fit is one error line up front, not an OOM kill part-way through.
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

namespace protokv {

// What this process can still take, as the system reports it: the least of MemAvailable
// (/proc/meminfo: free memory plus the page cache the kernel can reclaim), the cgroup v2 limit
// (memory.max less memory.current) and RLIMIT_AS less the address space already mapped.
// `source` names the bound that decides.
struct AvailableMemory {
  uint64_t bytes = std::numeric_limits<uint64_t>::max();
  std::string source = "no limit known";
};
AvailableMemory available_memory();

// Error "<what> needs ~X GiB of memory but only Y GiB is available (<source>)" when `needed` is
// more than `available.bytes`.
void check_memory_fits(std::string_view what, uint64_t needed, const AvailableMemory& available);

}  // namespace protokv
