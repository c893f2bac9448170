// SPDX-License-Identifier: Apache-2.0
// Code shown in README.md and docs/ is cut from tests between `// example-begin NAME` and
// `// example-end NAME` markers; this test fails when a document's copy drifts from the test.

#include <catch2/catch_test_macros.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

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
