// SPDX-License-Identifier: Apache-2.0
#pragma once

// Which head-roles file `kvsift eval` gives SyncKV and HeteroCache: --roles FILE when that file
// is for the method, else the model's shipped <dir>/roles-<method>.json.

#include <kvsift/core/error.hpp>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

namespace kvsift::cli {

// The "method" of a head-roles file given as --roles FILE: "synckv" or "heterocache". Throws
// kvsift::error (argument --roles, the path, what was expected) when the file cannot be read,
// does not parse as JSON or is not an object, and (argument --roles FILE "method") when its
// "method" is missing, not a string, or another name — never a silent fallback to the model's
// shipped roles (issue 26 item 13).
inline std::string roles_file_method(const std::string& roles_file) {
  constexpr std::string_view where = "kvsift eval";
  std::ifstream in(roles_file);
  require(static_cast<bool>(in), where, "--roles", roles_file, "a readable head-roles file");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw make_error(where, "--roles", roles_file,
                     std::string("a head-roles JSON file (kvsift calibrate); it does not parse: ") +
                         e.what());
  }
  require(j.is_object(), where, "--roles", roles_file,
          "a head-roles JSON object (kvsift calibrate)");
  const std::string arg = "--roles " + roles_file + " \"method\"";
  require(j.contains("method"), where, arg, "missing", "\"synckv\" or \"heterocache\"");
  const auto& m = j.at("method");
  require(m.is_string(), where, arg, m.dump(), "a string, \"synckv\" or \"heterocache\"");
  const auto name = m.get<std::string>();
  require(name == "synckv" || name == "heterocache", where, arg, m.dump(),
          "\"synckv\" or \"heterocache\"");
  return name;
}

// The head-roles file of `method` ("synckv" / "heterocache") for a model: --roles FILE when that
// file is for this method (its "method", checked by roles_file_method), else the model's shipped
// <dir>/roles-<method>.json when it exists; "" when neither (the method then reports that it
// has no roles).
inline std::string roles_path(const std::string& model_dir, const std::string& roles_file,
                              const std::string& method) {
  if (!roles_file.empty() && roles_file_method(roles_file) == method) return roles_file;
  const auto shipped = std::filesystem::path(model_dir) / ("roles-" + method + ".json");
  return std::filesystem::exists(shipped) ? shipped.string() : std::string();
}

}  // namespace kvsift::cli
