// SPDX-License-Identifier: Apache-2.0
// The docs' press tables cannot drift from the press table: docs/methods.md holds
// press_markdown_table() verbatim between its markers (tools/update_press_docs.sh regenerates it),
// and the README's methods table has a row for every registered press.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "protokv/press_registry.h"

namespace protokv {
namespace {

std::string read_repo_file(const std::string& relative) {
  const std::filesystem::path path = std::filesystem::path(PROTOKV_SOURCE_DIR) / relative;
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(PressDocs, MarkdownTableHasOneRowPerPress) {
  const std::string table = press_markdown_table();
  size_t rows = 0;
  for (size_t at = table.find('\n'); at != std::string::npos; at = table.find('\n', at + 1)) ++rows;
  EXPECT_EQ(rows, press_names().size() + 2);  // header and separator
  for (const auto& name : press_names())
    EXPECT_NE(table.find("| `" + name + "` |"), std::string::npos) << name;
}

TEST(PressDocs, MethodsTableMatchesPressTable) {
  const std::string doc = read_repo_file("docs/methods.md");
  const size_t begin = doc.find(kPressTableBegin);
  const size_t end = doc.find(kPressTableEnd);
  ASSERT_NE(begin, std::string::npos) << "docs/methods.md lacks the press-table begin marker";
  ASSERT_NE(end, std::string::npos) << "docs/methods.md lacks the press-table end marker";
  const size_t first = doc.find('\n', begin) + 1;
  ASSERT_LE(first, end);
  EXPECT_EQ(doc.substr(first, end - first), press_markdown_table())
      << "docs/methods.md is stale: run tools/update_press_docs.sh";
}

TEST(PressDocs, ReadmeMethodsTableNamesEveryPress) {
  const std::string readme = read_repo_file("README.md");
  for (const auto& name : press_names())
    EXPECT_NE(readme.find("| `" + name + "` |"), std::string::npos)
        << "README.md's methods table has no row for " << name;
}

}  // namespace
}  // namespace protokv
