// SPDX-License-Identifier: Apache-2.0
#pragma once
// Text inputs read whole (prompts, haystacks, evaluation and calibration text): bounded by
// limits::kMaxTextFileBytes, so a wrong file (a model passed as -f, say) is one line, not a
// long read into memory.
#include <cstdint>
#include <string>

namespace protokv {

// The size of the regular file at `path`; Error when it is missing, unreadable or larger than
// limits::kMaxTextFileBytes. Reads nothing of it.
uintmax_t checked_text_file_size(const std::string& path);

// The whole file, after checked_text_file_size().
std::string read_text_file(const std::string& path);

}  // namespace protokv
