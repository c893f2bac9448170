// SPDX-License-Identifier: Apache-2.0
// The repository stands alone: its tests read the in-tree copies of the project's shared files
// (tests/conformance/vectors, data/tiny-recall, data/recall-8kv, data/eval). Where the shared
// folder exists beside the repository (KVSIFT_SHARED_DIR), these tests check that the copies
// still agree with it, file for file; without it they are skipped.

#include <catch2/catch_test_macros.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

const fs::path shared_dir = KVSIFT_SHARED_DIR;
const fs::path source_dir = KVSIFT_SOURCE_DIR;

std::string bytes_of(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Every regular file under `root`, as paths relative to it.
std::set<std::string> files_under(const fs::path& root) {
  std::set<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    if (e.is_regular_file()) out.insert(fs::relative(e.path(), root).generic_string());
  }
  return out;
}

// `copy` holds every file of `original`, byte for byte; with `exact`, nothing else (ORIGIN.md
// aside). A model folder may hold files made here from it (e.g. head-roles files from
// `kvsift calibrate`): those are not in the shared folder.
void check_same_tree(const fs::path& original, const fs::path& copy, bool exact,
                     const std::vector<std::string>& only = {}) {
  REQUIRE(fs::is_directory(original));
  REQUIRE(fs::is_directory(copy));
  auto want = files_under(original);
  auto have = files_under(copy);
  have.erase("ORIGIN.md");
  if (!only.empty()) {
    std::set<std::string> keep;
    for (const auto& f : want) {
      for (const auto& o : only) {
        if (f == o || f.rfind(o + "/", 0) == 0) keep.insert(f);
      }
    }
    want = keep;
    std::set<std::string> have_keep;
    for (const auto& f : have) {
      for (const auto& o : only) {
        if (f == o || f.rfind(o + "/", 0) == 0) have_keep.insert(f);
      }
    }
    have = have_keep;
  }
  CAPTURE(original.string(), copy.string());
  if (exact) {
    CHECK(want == have);
  } else {
    CHECK(std::includes(have.begin(), have.end(), want.begin(), want.end()));
  }
  for (const auto& f : want) {
    if (!have.count(f)) continue;
    CAPTURE(f);
    CHECK(bytes_of(original / f) == bytes_of(copy / f));
  }
}

// The first `lines` lines of `original`, as `copy` holds them.
std::string first_lines(const fs::path& p, int lines) {
  std::ifstream in(p, std::ios::binary);
  std::string out, line;
  for (int i = 0; i < lines && std::getline(in, line); ++i) out += line + "\n";
  return out;
}

}  // namespace

TEST_CASE("in-tree copies agree with the shared folder (skipped without it)", "[shared]") {
  if (!fs::is_directory(shared_dir)) {
    SKIP("no shared folder at " << shared_dir.string() << ": the in-tree copies are all there is");
  }
  SECTION("conformance vectors: tests/conformance/vectors") {
    check_same_tree(shared_dir / "conformance", source_dir / "tests" / "conformance" / "vectors",
                    /*exact=*/true, {"SPEC.md", "cases"});
  }
  SECTION("models: data/tiny-recall and data/recall-8kv") {
    for (const char* m : {"tiny-recall", "recall-8kv"}) {
      check_same_tree(shared_dir / "models" / m, source_dir / "data" / m, /*exact=*/false);
    }
  }
  // Evaluation protocol v2 (shared/eval/v2/README.md): the separator space that began every
  // answer ends the prompt. data/ ships only the v2 prompts.
  SECTION("recall-8kv prompts: data/eval/recall-8kv are shared/eval/v2/recall-8kv") {
    check_same_tree(shared_dir / "eval" / "v2" / "recall-8kv",
                    source_dir / "data" / "eval" / "recall-8kv", /*exact=*/true);
  }
  SECTION("tiny-recall prompts: data/eval/{passkey,chain}.jsonl are the first 12 lines of v2") {
    for (const char* t : {"passkey.jsonl", "chain.jsonl"}) {
      CAPTURE(t);
      const auto copy = bytes_of(source_dir / "data" / "eval" / t);
      CHECK(std::count(copy.begin(), copy.end(), '\n') == 12);
      CHECK(copy == first_lines(shared_dir / "eval" / "v2" / "tiny-recall" / t, 12));
      CHECK(copy != first_lines(shared_dir / "eval" / t, 12));  // not the v1 prompts
    }
  }
}
