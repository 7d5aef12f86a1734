// SPDX-License-Identifier: Apache-2.0
#pragma once
// Read-only memory mapping of a whole model file: weights are used in place, never read whole.
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

namespace protokv {

// Maps `path` privately and read-only; the mapping is released when the last owner goes away.
// Throws Error when the file cannot be opened or mapped, is not a regular file, or is shorter
// than `min_size` bytes ("<path>: not <what> (only N bytes)").
std::shared_ptr<const void> map_file(const std::string& path, size_t min_size,
                                     std::string_view what, size_t* size);

}  // namespace protokv
