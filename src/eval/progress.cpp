// SPDX-License-Identifier: Apache-2.0
#include "eval/progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "eval/report/table.h"

namespace protokv::eval {

bool Progress::stderr_is_terminal() {
  return ::isatty(STDERR_FILENO) == 1;
}

Progress::Progress(std::string label, int64_t total, bool enabled, ProgressSink sink)
    : label_(std::move(label)),
      total_(std::max<int64_t>(total, 1)),
      active_(enabled && (sink != nullptr || stderr_is_terminal())),
      sink_(enabled ? std::move(sink) : nullptr) {
  draw();
}

Progress::~Progress() {
  finish();
}

void Progress::advance(int64_t steps, const std::string& detail) {
  done_ = std::min(total_, done_ + steps);
  if (!detail.empty()) detail_ = detail;
  draw();
}

void Progress::set_detail(const std::string& detail) {
  detail_ = detail;
  draw();
}

void Progress::draw() {
  if (!active_) return;
  if (sink_) {
    sink_(done_, total_, detail_);
    return;
  }
  // Redraw at most ~10 times a second, but always show the last step.
  const double now = timer_.ms();
  if (now - last_draw_ms_ < 100.0 && done_ < total_) return;
  last_draw_ms_ = now;
  constexpr int kBarWidth = 24;
  const int filled = static_cast<int>(kBarWidth * done_ / total_);
  std::string bar(static_cast<size_t>(filled), '#');
  bar.resize(kBarWidth, '.');
  std::string line = fmt::format("{} [{}] {}/{} {:.0f}s", label_, bar, done_, total_, now / 1000.0);
  // ETA from the mean time per finished step so far.
  if (done_ > 0 && done_ < total_)
    line += fmt::format(" ETA {:.0f}s", now / 1000.0 * static_cast<double>(total_ - done_) /
                                            static_cast<double>(done_));
  if (!detail_.empty()) line += "  " + detail_;
  // Keep the line short enough not to wrap on an 80-column terminal.
  if (display_width(line) > 79) line.resize(79);
  std::fprintf(stderr, "\r\033[K%s", line.c_str());
  std::fflush(stderr);
}

void Progress::finish() {
  if (!active_) return;
  if (sink_) {
    active_ = false;
    return;
  }
  std::fprintf(stderr, "\r\033[K");
  std::fflush(stderr);
  active_ = false;
}

}  // namespace protokv::eval
