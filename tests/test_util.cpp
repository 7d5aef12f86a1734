// SPDX-License-Identifier: Apache-2.0
#include "test_util.h"

#include <sys/wait.h>

#include <fstream>
#include <random>
#include <sstream>

namespace protokv::testing {

CommandResult run_protokv(const std::string& args, const std::string& environment) {
  TempDir dir;
  const auto out_path = dir / "stdout";
  const auto err_path = dir / "stderr";
  const std::string command = environment + (environment.empty() ? "'" : " '") + PROTOKV_BINARY +
                              "' " + args + " >'" + out_path.string() + "' 2>'" +
                              err_path.string() + "' </dev/null";
  CommandResult result;
  const int status = std::system(command.c_str());
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  auto slurp = [](const std::filesystem::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  result.out = slurp(out_path);
  result.err = slurp(err_path);
  return result;
}

std::vector<int32_t> random_tokens(int n, int vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> dist(0, vocab - 1);
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  for (auto& t : tokens) t = dist(rng);
  return tokens;
}

}  // namespace protokv::testing
