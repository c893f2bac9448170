// SPDX-License-Identifier: Apache-2.0
#pragma once

// Sub-commands of the kvsift CLI. Each takes the arguments after its name.

#include <string>
#include <vector>

namespace kvsift::cli {

int eval_trace(const std::vector<std::string>& args);
int eval(const std::vector<std::string>& args);
int trace_prompts(const std::vector<std::string>& args);    // trace.cpp (calibration traces)
int calibrate_heads(const std::vector<std::string>& args);  // calibrate.cpp (head-roles files)

// --name value lookup over a command's arguments; `fallback` when absent.
std::string option(const std::vector<std::string>& args, const std::string& name,
                   const std::string& fallback);
bool flag(const std::vector<std::string>& args, const std::string& name);
// Comma-separated list.
std::vector<std::string> split_list(const std::string& s);

}  // namespace kvsift::cli
