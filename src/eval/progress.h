// SPDX-License-Identifier: Apache-2.0
#pragma once
// A one-line progress bar on stderr for long runs. Silent when stderr is not a terminal or when
// the caller asks for quiet, so logs and pipes stay clean. A caller with its own display (the
// Python package's tqdm bar) gives a sink instead, which gets every step.
#include <cstdint>
#include <functional>
#include <string>

#include "protokv/timer.h"

namespace protokv::eval {

// Called after every step with the steps done, the total and the current item; runs on the
// thread that advances the progress.
using ProgressSink = std::function<void(int64_t done, int64_t total, const std::string& detail)>;

class Progress {
 public:
  // enabled = false forces silence; otherwise it draws only if stderr is a TTY. With a sink,
  // nothing is drawn: the sink gets each step (when enabled).
  Progress(std::string label, int64_t total, bool enabled = true, ProgressSink sink = {});
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // Advances by `steps` and sets the text shown after the bar (e.g. the current item).
  void advance(int64_t steps = 1, const std::string& detail = "");
  void set_detail(const std::string& detail);
  // Clears the line; called by the destructor too.
  void finish();
  bool active() const { return active_; }

  // True when progress should be drawn: stderr is a TTY and not quiet.
  static bool stderr_is_terminal();

 private:
  void draw();

  std::string label_;
  int64_t total_;
  int64_t done_ = 0;
  std::string detail_;
  bool active_;
  ProgressSink sink_;
  Timer timer_;
  double last_draw_ms_ = -1e9;
};

}  // namespace protokv::eval
