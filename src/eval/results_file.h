// SPDX-License-Identifier: Apache-2.0
#pragma once
// A results file of JSON lines that a stopped evaluation resumes from: a header line
// {"header": ...} describing the configuration, then one record per line, appended and flushed
// as each is produced. The long-context evaluations (one line per run and sample) and
// `eval fidelity` (one line per sample) share it.
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace protokv::eval {

// The records of an interrupted run at `path` (none when the file is absent or empty). Throws
// Error when the header differs from `header` (another configuration) or a complete line is not
// a JSON object. A last line cut by the interruption is dropped and the file truncated before
// it, so that appending continues on a clean line.
std::vector<nlohmann::json> read_results_file(const std::string& path,
                                              const nlohmann::json& header);

// The header of the results file at `path` (what its first line holds under "header"); Error
// when the file is missing or does not start with one.
nlohmann::json read_results_header(const std::string& path);

// A whole JSON file holding one object (a run's config.json or results.json); Error naming the
// file when it is missing, too large, or not a JSON object.
nlohmann::json read_json_object_file(const std::string& path);

class ResultsFileWriter {
 public:
  // Appends to `path` when resuming a file that has content, else starts it with the header.
  ResultsFileWriter(const std::string& path, const nlohmann::json& header, bool resume);
  void append(const nlohmann::json& record);

 private:
  std::ofstream out_;
};

}  // namespace protokv::eval
