// SPDX-License-Identifier: Apache-2.0
// Code shown in README.md and docs/ is cut from tests between `// example-begin NAME` and
// `// example-end NAME` markers; this test fails when a document's copy drifts from the test.
// Every relative link of README.md and docs/**/*.md must name a file or folder of the repository.

#include <catch2/catch_test_macros.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// NAME -> the lines between its markers, with the common indentation removed.
std::map<std::string, std::string> examples_in(const std::string& text) {
  std::map<std::string, std::string> out;
  std::istringstream in(text);
  std::string line, name, body;
  std::size_t indent = std::string::npos;
  std::vector<std::string> lines;
  while (std::getline(in, line)) {
    const auto b = line.find("// example-begin ");
    const auto e = line.find("// example-end ");
    if (b != std::string::npos) {
      name = line.substr(b + 17);
      lines.clear();
      indent = std::string::npos;
    } else if (e != std::string::npos && !name.empty()) {
      std::string joined;
      for (const auto& l : lines) {
        joined += (l.size() >= indent ? l.substr(indent) : std::string()) + "\n";
      }
      out[name] = joined;
      name.clear();
    } else if (!name.empty()) {
      lines.push_back(line);
      const auto first = line.find_first_not_of(' ');
      if (first != std::string::npos) indent = std::min(indent, first);
    }
  }
  return out;
}

}  // namespace

TEST_CASE("documents quote their examples verbatim from the tests", "[docs]") {
  const std::filesystem::path root = KVSIFT_SOURCE_DIR;
  std::map<std::string, std::string> examples;
  for (const auto& entry : std::filesystem::directory_iterator(root / "tests")) {
    if (entry.path().extension() == ".cpp") examples.merge(examples_in(read_file(entry.path())));
  }
  std::vector<std::filesystem::path> docs{root / "README.md"};
  if (std::filesystem::exists(root / "docs" / "methods")) {
    for (const auto& entry : std::filesystem::directory_iterator(root / "docs" / "methods")) {
      docs.push_back(entry.path());
    }
  }
  int quoted = 0;
  for (const auto& doc : docs) {
    const std::string text = read_file(doc);
    // a document that announces an example must contain it exactly
    std::size_t at = 0;
    while ((at = text.find("<!-- example: ", at)) != std::string::npos) {
      const auto end = text.find(" -->", at);
      const std::string name = text.substr(at + 14, end - at - 14);
      CAPTURE(doc.string(), name);
      REQUIRE(examples.count(name) == 1);
      CHECK(text.find(examples[name]) != std::string::npos);
      ++quoted;
      at = end;
    }
  }
  CHECK(quoted >= 1);  // the README quotes at least the composition example
}

TEST_CASE("relative links in README.md and docs/ resolve inside the repository", "[docs]") {
  namespace fs = std::filesystem;
  const fs::path root = fs::weakly_canonical(fs::path(KVSIFT_SOURCE_DIR));
  std::vector<fs::path> docs{root / "README.md"};
  for (const auto& entry : fs::recursive_directory_iterator(root / "docs")) {
    if (entry.is_regular_file() && entry.path().extension() == ".md") docs.push_back(entry.path());
  }
  int links = 0;
  for (const auto& doc : docs) {
    const std::string text = read_file(doc);
    // Markdown links `](target)` outside code spans and fenced blocks; a target ends at ')' or ' '
    // (a title follows a space).
    bool fenced = false;
    std::istringstream in(text);
    std::string line;
    int line_no = 0;
    while (std::getline(in, line)) {
      ++line_no;
      const auto first = line.find_first_not_of(' ');
      if (first != std::string::npos && line.compare(first, 3, "```") == 0) {
        fenced = !fenced;
        continue;
      }
      if (fenced) continue;
      bool in_code = false;
      for (std::size_t i = 0; i < line.size(); ++i) {
        if (line[i] == '`') in_code = !in_code;
        if (in_code || line.compare(i, 2, "](") != 0) continue;
        const auto start = i + 2;
        const auto end = line.find_first_of(") ", start);
        if (end == std::string::npos) continue;
        std::string target = line.substr(start, end - start);
        if (target.size() >= 2 && target.front() == '<' && target.back() == '>') {
          target = target.substr(1, target.size() - 2);
        }
        if (target.rfind("http://", 0) == 0 || target.rfind("https://", 0) == 0 ||
            target.rfind("mailto:", 0) == 0 || target.empty() || target.front() == '#') {
          continue;
        }
        if (const auto hash = target.find('#'); hash != std::string::npos) target.resize(hash);
        const fs::path resolved = fs::weakly_canonical(doc.parent_path() / target);
        const std::string rel = resolved.lexically_relative(root).generic_string();
        CAPTURE(doc.lexically_relative(root).generic_string(), line_no, target);
        CHECK(fs::exists(resolved));
        CHECK((!rel.empty() && rel.rfind("..", 0) != 0));  // nothing outside the repository
        ++links;
      }
    }
  }
  CHECK(links >= 10);
}
