// SPDX-License-Identifier: Apache-2.0
#pragma once
// Plain-text tables with aligned columns for terminal reports.
#include <string>
#include <vector>

namespace protokv::eval {

class Table {
 public:
  enum class Align { kLeft, kRight };

  void add_column(std::string header, Align align = Align::kRight);
  // One cell per column; throws Error on a mismatched count.
  void add_row(std::vector<std::string> cells);
  // Header, a dashed rule, then the rows; columns separated by two spaces; each line ends in '\n'.
  std::string render() const;
  size_t rows() const { return rows_.size(); }
  size_t columns() const { return headers_.size(); }

 private:
  std::vector<std::string> headers_;
  std::vector<Align> aligns_;
  std::vector<std::vector<std::string>> rows_;
};

// Display width of UTF-8 text in terminal columns (one per code point; enough for our labels).
size_t display_width(const std::string& text);

}  // namespace protokv::eval
