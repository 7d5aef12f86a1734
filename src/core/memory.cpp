// SPDX-License-Identifier: Apache-2.0
#include "protokv/memory.h"

#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>
#include <fstream>
#include <optional>
#include <sstream>

#include "core/units.h"
#include "protokv/error.h"

namespace protokv {
namespace {

// The value of `key` ("MemAvailable:", "VmSize:") in a /proc file of "key value kB" lines.
std::optional<uint64_t> proc_kib(const char* path, std::string_view key) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) != 0) continue;
    std::istringstream fields(line.substr(key.size()));
    uint64_t kib = 0;
    if (fields >> kib) return kib * 1024;
  }
  return std::nullopt;
}

std::optional<uint64_t> read_number(const std::string& path) {
  std::ifstream in(path);
  uint64_t value = 0;
  if (in >> value) return value;  // "max" (no limit) does not parse
  return std::nullopt;
}

// cgroup v2: the "0::/path" line of /proc/self/cgroup names this process's group.
std::optional<uint64_t> cgroup_room() {
  std::ifstream in("/proc/self/cgroup");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("0::", 0) != 0) continue;
    const std::string dir = "/sys/fs/cgroup" + line.substr(3);
    const auto max = read_number(dir + "/memory.max");
    const auto current = read_number(dir + "/memory.current");
    if (!max || !current) return std::nullopt;
    return *max > *current ? *max - *current : 0;
  }
  return std::nullopt;
}

}  // namespace

AvailableMemory available_memory() {
  AvailableMemory available;
  const auto consider = [&](std::optional<uint64_t> bytes, const char* source) {
    if (bytes && *bytes < available.bytes) available = {*bytes, source};
  };
  consider(proc_kib("/proc/meminfo", "MemAvailable:"), "MemAvailable in /proc/meminfo");
  consider(cgroup_room(), "the cgroup's memory.max");
  rlimit as{};
  if (getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY) {
    const uint64_t mapped = proc_kib("/proc/self/status", "VmSize:").value_or(0);
    consider(as.rlim_cur > mapped ? as.rlim_cur - mapped : 0, "RLIMIT_AS (ulimit -v)");
  }
  return available;
}

void check_memory_fits(std::string_view what, uint64_t needed, const AvailableMemory& available) {
  if (needed <= available.bytes) return;
  fail("{} needs ~{} of memory but only {} is available ({})", what,
       format_bytes(static_cast<double>(needed)),
       format_bytes(static_cast<double>(available.bytes)), available.source);
}

}  // namespace protokv
