// SPDX-License-Identifier: Apache-2.0
// press_help(): the methods, what they keep, their options with defaults, and where they are
// approximate or differ from the reference code, generated from the press table (each entry's
// paragraph lives beside its press). docs/methods.md says the same at length.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "press/entry.h"
#include "protokv/press_registry.h"

namespace protokv {
namespace {

constexpr size_t kNameColumn = 15;  // "streaming_llm  ": the widest name and two spaces
constexpr size_t kLineWidth = 90;   // as the hand-wrapped paragraphs

// The first line behind the name, every further line indented to the name column.
std::string indent_paragraph(std::string_view name, const std::string& paragraph) {
  // A name as wide as the column gets a line of its own.
  std::string out = name.size() + 1 < kNameColumn
                        ? fmt::format("{:<{}}", name, kNameColumn)
                        : fmt::format("{}\n{:<{}}", name, "", kNameColumn);
  size_t start = 0;
  while (start < paragraph.size()) {
    size_t end = paragraph.find('\n', start);
    if (end == std::string::npos) end = paragraph.size();
    if (start != 0) out.append(kNameColumn, ' ');
    out.append(paragraph, start, end - start);
    out += '\n';
    start = end + 1;
  }
  return out;
}

// Greedy word wrap at `width`.
std::string wrap(const std::string& text, size_t width = kLineWidth) {
  std::string out, line;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find(' ', pos);
    if (end == std::string::npos) end = text.size();
    const std::string word = text.substr(pos, end - pos);
    if (!line.empty() && line.size() + 1 + word.size() > width) {
      out += line + '\n';
      line.clear();
    }
    line += (line.empty() ? "" : " ") + word;
    pos = end + 1;
  }
  return out + line + '\n';
}

// "a", "a and b", "a, b, c".
std::string list_names(const std::vector<std::string>& names) {
  if (names.size() == 2) return names[0] + " and " + names[1];
  return fmt::format("{}", fmt::join(names, ", "));
}

// A help paragraph as one Markdown table cell: lines joined by spaces, '|' escaped.
std::string markdown_cell(const std::string& paragraph) {
  std::string cell;
  for (char c : paragraph) {
    if (c == '\n') {
      if (!cell.empty() && cell.back() != ' ') cell += ' ';
    } else if (c == '|') {
      cell += "\\|";
    } else {
      cell += c;
    }
  }
  while (!cell.empty() && cell.back() == ' ') cell.pop_back();
  return cell;
}

// "window=8 (1..4096): observation window w ... [SnapKV Eq. 4]", one per row, wrapped to fit
// behind the name column.
std::string option_lines(const std::vector<press::OptionSpec>& schema,
                         const std::string& heading = "Options:") {
  if (schema.empty()) return "No options.\n";
  std::string text = heading + '\n';
  for (const press::OptionSpec& spec : schema) {
    std::string line = fmt::format("{}={} ({}): {}", spec.key, press::default_text(spec),
                                   press::range_text(spec), spec.help);
    if (!spec.reference.empty()) line += fmt::format(" [{}]", spec.reference);
    // Continuation lines of one option are indented under its key.
    const std::string wrapped = wrap(line, kLineWidth - kNameColumn - 2);
    size_t start = 0;
    while (start < wrapped.size()) {
      const size_t end = wrapped.find('\n', start);
      text += (start == 0 ? "  " : "    ") + wrapped.substr(start, end - start) + '\n';
      start = end + 1;
    }
  }
  return text;
}

std::string allocator_cell(const press::PressEntry& entry) {
  switch (entry.allocator_role) {
    case press::AllocatorRole::None:
      return "none";
    case press::AllocatorRole::Composes:
      return "any (default uniform)";
    case press::AllocatorRole::Is:
      break;
  }
  return press::to_string(entry.fixed_allocator);
}

}  // namespace

std::string press_markdown_table() {
  std::string table = "| method | allocator | what it keeps |\n| --- | --- | --- |\n";
  for (const press::PressEntry* entry : press::press_table())
    table += fmt::format("| `{}` | {} | {} |\n", entry->name, allocator_cell(*entry),
                         markdown_cell(entry->help()));
  table +=
      "\nTheir options (`--press NAME:key=value,...`; pyramidkv's and adakv's include their "
      "allocator's):\n\n| method | option | default | values | what it does | source |\n"
      "| --- | --- | --- | --- | --- | --- |\n";
  for (const press::PressEntry* entry : press::press_table())
    for (const press::OptionSpec& spec : press_option_specs(entry->name))
      table += fmt::format(
          "| `{}` | `{}` | {} | {} | {} | {} |\n", entry->name, spec.key,
          markdown_cell(press::default_text(spec)), markdown_cell(press::range_text(spec)),
          markdown_cell(std::string(spec.help)), markdown_cell(std::string(spec.reference)));
  return table;
}

std::string press_help() {
  std::string text =
      "Presses (NAME[:key=value,...]; a budget B = entries kept per KV head per layer,\n"
      "window and sinks included; a ratio r keeps floor(n*r)). A budget >= the prompt length\n"
      "compresses nothing. Selection is per KV head (GQA: the group's query-head scores are\n"
      "reduced, gqa=mean|max|sum), so memory really shrinks; the reference code (KVCache-Factory)\n"
      "repeats K/V per query head instead and stores group-times more.\n\n";
  std::vector<std::string> composes, is_allocator, takes_none;
  for (const press::PressEntry* entry : press::press_table()) {
    const std::string name(entry->name);
    // pyramidkv and adakv read snapkv's options and their allocator's: name the press whose
    // rows they repeat instead of listing them again.
    const std::string options =
        entry->options_of.empty()
            ? option_lines(press_option_specs(entry->name))
            : option_lines(press::allocator_option_specs(entry->fixed_allocator),
                           fmt::format("Options: those of {}, and", entry->options_of));
    text += indent_paragraph(entry->name, entry->help() + options) + '\n';
    switch (entry->allocator_role) {
      case press::AllocatorRole::None:
        takes_none.push_back(name);
        break;
      case press::AllocatorRole::Composes:
        composes.push_back(name);
        break;
      case press::AllocatorRole::Is:
        is_allocator.push_back(name);
        break;
    }
  }
  // "beta=20", "floor=0.2, normalise=0": an allocator's options with their defaults.
  const auto allocator_options = [](press::AllocatorKind kind) {
    std::vector<std::string> items;
    for (const press::OptionSpec& spec : press::allocator_option_specs(kind))
      items.push_back(fmt::format("{}={}", spec.key, press::default_text(spec)));
    return fmt::format("{}", fmt::join(items, ", "));
  };
  text += wrap(fmt::format(
      "Allocators: uniform (every head keeps B), pyramid (the pyramidkv rule, option {}), adakv "
      "(options {}). Any of {} composes with any allocator; {} are snapkv with their allocator, "
      "so another allocator is an error. {} take none.",
      allocator_options(press::AllocatorKind::Pyramid),
      allocator_options(press::AllocatorKind::AdaKv), list_names(composes),
      list_names(is_allocator), list_names(takes_none)));
  return text;
}

}  // namespace protokv
