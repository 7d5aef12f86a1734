// SPDX-License-Identifier: Apache-2.0
#include "io/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "protokv/error.h"

namespace protokv {

std::shared_ptr<const void> map_file(const std::string& path, size_t min_size,
                                     std::string_view what, size_t* size) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("cannot open {}: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    fail("cannot stat {}: {}", path, std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("{}: not a regular file", path);
  }
  *size = static_cast<size_t>(st.st_size);
  if (*size < min_size) {
    ::close(fd);
    fail("{}: not {} (only {} bytes)", path, what, *size);
  }
  void* addr = ::mmap(nullptr, *size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int err = errno;
  ::close(fd);  // the mapping stays valid after close
  if (addr == MAP_FAILED) fail("cannot map {}: {}", path, std::strerror(err));
  const size_t length = *size;
  return std::shared_ptr<const void>(
      addr, [length](const void* p) { ::munmap(const_cast<void*>(p), length); });
}

}  // namespace protokv
