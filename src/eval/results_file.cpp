// SPDX-License-Identifier: Apache-2.0
#include "eval/results_file.h"

#include <cstdio>
#include <filesystem>

#include "io/text_file.h"
#include "protokv/error.h"

namespace protokv::eval {

std::vector<nlohmann::json> read_results_file(const std::string& path,
                                              const nlohmann::json& header) {
  std::vector<nlohmann::json> records;
  std::ifstream in(path, std::ios::binary);
  if (!in.good()) return records;  // nothing yet: a fresh start
  std::string line;
  int64_t line_no = 0;
  size_t good_bytes = 0;
  bool truncated_tail = false;
  while (std::getline(in, line)) {
    ++line_no;
    const bool complete = !in.eof();  // the line ended in '\n'
    if (line.empty()) {
      good_bytes += 1;
      continue;
    }
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      PROTOKV_CHECK(!complete, "{} line {}: not valid JSON; cannot resume from this file", path,
                    line_no);
      truncated_tail = true;
      break;
    }
    if (line_no == 1) {
      PROTOKV_CHECK(j.contains("header"), "{}: not a protokv results file (no header line)", path);
      PROTOKV_CHECK(j["header"] == header,
                    "{} was written with another configuration ({}); write elsewhere or start "
                    "afresh instead of resuming (now: {})",
                    path, j["header"].dump(), header.dump());
    } else {
      records.push_back(std::move(j));
    }
    good_bytes += line.size() + (complete ? 1 : 0);
    if (!complete) {
      // A valid last line without '\n': keep it and add the newline.
      std::ofstream fix(path, std::ios::app | std::ios::binary);
      fix << '\n';
      good_bytes += 1;
    }
  }
  in.close();
  if (truncated_tail) {
    std::filesystem::resize_file(path, good_bytes);
    std::fprintf(stderr, "protokv: warning: %s: dropped an incomplete last line\n", path.c_str());
  }
  return records;
}

nlohmann::json read_results_header(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  PROTOKV_CHECK(in.good(), "{}: missing", path);
  std::string line;
  std::getline(in, line);
  const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  PROTOKV_CHECK(
      !j.is_discarded() && j.is_object() && j.contains("header") && j["header"].is_object(),
      "{}: not a protokv results file (no header line)", path);
  return j["header"];
}

nlohmann::json read_json_object_file(const std::string& path) {
  std::error_code ec;
  PROTOKV_CHECK(std::filesystem::is_regular_file(path, ec),
                "{}: missing (not a finished protokv eval folder)", path);
  nlohmann::json j =
      nlohmann::json::parse(read_text_file(path), nullptr, /*allow_exceptions=*/false);
  PROTOKV_CHECK(!j.is_discarded() && j.is_object(), "{}: not a JSON object", path);
  return j;
}

ResultsFileWriter::ResultsFileWriter(const std::string& path, const nlohmann::json& header,
                                     bool resume) {
  std::error_code ec;
  const bool fresh =
      !resume || !std::filesystem::exists(path) || std::filesystem::file_size(path, ec) == 0;
  out_.open(path, fresh ? std::ios::trunc | std::ios::binary : std::ios::app | std::ios::binary);
  PROTOKV_CHECK(out_.good(), "cannot write {}", path);
  if (fresh) append({{"header", header}});
}

void ResultsFileWriter::append(const nlohmann::json& record) {
  out_ << record.dump() << '\n' << std::flush;
  PROTOKV_CHECK(out_.good(), "cannot write a record: disk full?");
}

}  // namespace protokv::eval
