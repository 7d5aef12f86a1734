// SPDX-License-Identifier: Apache-2.0
// protokv_fuzz_seeds OUT_DIR [TARGET...]: writes each target's seed corpus into OUT_DIR/TARGET/
// (every target when none is named), from the repository's fixtures and shared/ (fuzz_target.h).
// protokv_fuzz_seeds --list: the targets' names, one per line.
// protokv_fuzz_seeds --run TARGET FILE...: runs the target on each file (a corpus entry, a
// finding) and prints whether it was accepted or refused, with the error.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string_view>

#include "fuzz_target.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR [TARGET...]\n", argv[0]);
    return 2;
  }
  if (std::string_view(argv[1]) == "--list") {
    for (const auto& target : protokv::fuzz::targets())
      std::printf("%.*s\n", static_cast<int>(target.name.size()), target.name.data());
    return 0;
  }
  try {
    if (std::string_view(argv[1]) == "--run" && argc >= 3) {
      const auto& target = protokv::fuzz::find_target(argv[2]);
      for (int i = 3; i < argc; ++i) {
        const std::string bytes = protokv::fuzz::read_file_bytes(argv[i]);
        const auto outcome = target.run(
            protokv::fuzz::Bytes(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
        if (outcome == protokv::fuzz::Outcome::kAccepted)
          std::printf("%s: accepted\n", argv[i]);
        else
          std::printf("%s: refused: %s\n", argv[i], protokv::fuzz::last_refusal().c_str());
      }
      return 0;
    }
    const std::filesystem::path out = argv[1];
    std::vector<const protokv::fuzz::Target*> chosen;
    for (int i = 2; i < argc; ++i) chosen.push_back(&protokv::fuzz::find_target(argv[i]));
    if (chosen.empty())
      for (const auto& target : protokv::fuzz::targets()) chosen.push_back(&target);
    for (const auto* target : chosen) {
      const std::filesystem::path dir = out / std::string(target->name);
      std::filesystem::create_directories(dir);
      target->write_seeds(dir, protokv::fuzz::shared_dir());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "protokv_fuzz_seeds: %s\n", e.what());
    return 1;
  }
  return 0;
}
