// SPDX-License-Identifier: Apache-2.0
#include "eval/report/table.h"
#include <fmt/format.h>

#include <algorithm>

#include "protokv/error.h"

namespace protokv::eval {

size_t display_width(const std::string& text) {
  size_t width = 0;
  for (unsigned char c : text) {
    if ((c & 0xC0) != 0x80) ++width;  // count every byte that starts a code point
  }
  return width;
}

void Table::add_column(std::string header, Align align) {
  headers_.push_back(std::move(header));
  aligns_.push_back(align);
}

void Table::add_row(std::vector<std::string> cells) {
  PROTOKV_CHECK(cells.size() == headers_.size(), "table row has {} cells for {} columns",
                cells.size(), headers_.size());
  rows_.push_back(std::move(cells));
}

std::string Table::render() const {
  std::vector<size_t> widths(headers_.size());
  for (size_t c = 0; c < headers_.size(); ++c) {
    widths[c] = display_width(headers_[c]);
    for (const auto& row : rows_) widths[c] = std::max(widths[c], display_width(row[c]));
  }
  std::string out;
  const auto append_line = [&](const std::vector<std::string>& cells) {
    std::string line;
    for (size_t c = 0; c < cells.size(); ++c) {
      const std::string pad(widths[c] - display_width(cells[c]), ' ');
      if (c > 0) line += "  ";
      line += aligns_[c] == Align::kRight ? pad + cells[c] : cells[c] + pad;
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + '\n';
  };
  append_line(headers_);
  std::vector<std::string> rule(headers_.size());
  for (size_t c = 0; c < headers_.size(); ++c) rule[c] = std::string(widths[c], '-');
  append_line(rule);
  for (const auto& row : rows_) append_line(row);
  return out;
}

}  // namespace protokv::eval
