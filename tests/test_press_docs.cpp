// SPDX-License-Identifier: Apache-2.0
// The docs' press tables cannot drift from the press table: docs/methods.md holds
// press_markdown_table() verbatim between its markers (tools/update_press_docs.sh regenerates it),
// and the README's methods table has a row for every registered press.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>

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

TEST(PressDocs, MarkdownTablesHaveOneRowPerPressAndPerOption) {
  const std::string tables = press_markdown_table();
  const size_t blank = tables.find("\n\n");
  ASSERT_NE(blank, std::string::npos);
  // Lines that are table rows ("| ...").
  const auto count_rows = [](std::string_view text) {
    size_t rows = 0;
    for (size_t start = 0; start < text.size();) {
      const size_t end = std::min(text.find('\n', start), text.size());
      rows += text.substr(start, end - start).starts_with("| ");
      start = end + 1;
    }
    return rows;
  };
  const std::string_view methods = std::string_view(tables).substr(0, blank);
  EXPECT_EQ(count_rows(methods), press_names().size() + 2);  // and the header and separator
  size_t options = 0;
  for (const auto& name : press_names()) {
    EXPECT_NE(methods.find("| `" + name + "` |"), std::string::npos) << name;
    for (const auto& spec : press_option_specs(name)) {
      EXPECT_NE(tables.find(fmt::format("| `{}` | `{}` | ", name, spec.key)), std::string::npos)
          << name << " " << spec.key;
      ++options;
    }
  }
  EXPECT_EQ(count_rows(std::string_view(tables).substr(blank)), options + 2);
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
