// SPDX-License-Identifier: Apache-2.0
// kvsift — the command-line front end: evaluates compression methods on KV traces and on a real
// model. `kvsift help` lists the commands.

#include "commands.hpp"

#include <kvsift/core/error.hpp>

#include <cstdio>
#include <exception>
#include <sstream>
#include <string>
#include <vector>

namespace kvsift::cli {

std::string option(const std::vector<std::string>& args, const std::string& name,
                   const std::string& fallback) {
  for (std::size_t i = 0; i + 1 < args.size(); ++i) {
    if (args[i] == name) return args[i + 1];
  }
  return fallback;
}

bool flag(const std::vector<std::string>& args, const std::string& name) {
  for (const auto& a : args) {
    if (a == name) return true;
  }
  return false;
}

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

}  // namespace kvsift::cli

namespace {

void usage() {
  std::puts(
      "usage: kvsift <command> [options]\n"
      "\n"
      "commands:\n"
      "  eval-trace [--trace FILE.safetensors] [--methods m1,m2] [--budget F] [--seed S]\n"
      "             [--steps T] [--context N]\n"
      "      runs every method at a budget (fraction of the prompt kept) over a KV trace\n"
      "      (default: a generated trace with a fixed seed) and prints resident KV %,\n"
      "      attention-output error vs full KV, attention-mass recall and time per step.\n"
      "  eval [--model DIR] [--prompts F1.jsonl,F2.jsonl] [--methods m1,m2] [--budgets 0.25,0.5]\n"
      "       [--json] [--json-out FILE] [--plot FILE.svg] [--limit N] [--kernel library|engine]\n"
      "       [--exec host|thrust-cpp|thrust-omp]\n"
      "      runs a real model's evaluation prompts with each method and budget (defaults: both\n"
      "      shipped models on their shipped protocol-v2 prompts, every method, budget 0.25);\n"
      "      `kvsift eval --help` lists the defaults.\n"
      "  trace --model DIR --prompts F.jsonl [--steps T] --out FILE.safetensors\n"
      "      runs prompts plus T decode steps and writes what calibration needs (docs/calibration.md).\n"
      "  calibrate --method synckv|heterocache --model DIR (--prompts F.jsonl | --traces FILE)\n"
      "            [--steps T] --out roles.json\n"
      "      computes head roles offline (METHODS.md's profiling) and writes a head-roles file.\n"
      "  help  this text");
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "help" || args[0] == "--help" || args[0] == "-h") {
    usage();
    return args.empty() ? 2 : 0;
  }
  const std::string cmd = args[0];
  args.erase(args.begin());
  try {
    if (cmd == "eval-trace") return kvsift::cli::eval_trace(args);
    if (cmd == "eval") return kvsift::cli::eval(args);
    if (cmd == "trace") return kvsift::cli::trace_prompts(args);
    if (cmd == "calibrate") return kvsift::cli::calibrate_heads(args);
  } catch (const kvsift::error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvsift: %s\n", e.what());
    return 1;
  }
  std::fprintf(stderr, "kvsift: unknown command '%s'\n", cmd.c_str());
  usage();
  return 2;
}
