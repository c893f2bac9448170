// SPDX-License-Identifier: Apache-2.0
#pragma once

// The head-roles file: what offline calibration (kvsift calibrate) produces and SyncKV /
// HeteroCache read (DESIGN.md "Calibration"). JSON, versioned; docs/calibration.md documents it:
//
//   {
//     "format": "kvsift-head-roles", "version": 1,
//     "method": "synckv" | "heterocache",
//     "model": {"layers": L, "q_heads": Hq, "kv_heads": H, "head_dim": d,
//               "config_hash": "fnv1a64:<16 hex digits of config.json's bytes>" (or "")},
//     "parameters": {...},                 // what calibration used (free-form, documented)
//     "layers": [                          // L entries, layer 0 first
//       synckv:      {"assign": [H ints], "representatives": [N_r ints],
//                     "similarity": [[H floats] x H] (optional)}
//       heterocache: {"roles": [H ints: 0 anchor, 1 volatile, 2 pivot, 3 satellite],
//                     "leader": [H ints], "stability": [H floats],
//                     "similarity": [[H floats] x H] (optional)}
//     ]
//   }
//
// Reading validates everything before returning: format, version, method, the model fields
// against the model it will run with, the sizes of every per-layer array and the consistency
// of the roles (a representative belongs to its cluster, a satellite's leader is a pivot ...).
// Every failure is a kvsift::error naming the file and the field, e.g.
// "argument 'model.kv_heads' = 2, expected the model's kv_heads = 8".

#include <kvsift/calibrate/star_cluster.hpp>
#include <kvsift/core/error.hpp>
#include <kvsift/core/shape.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace kvsift::calibrate {

inline constexpr std::string_view roles_format = "kvsift-head-roles";
inline constexpr int roles_version = 1;

// The model a roles file was calibrated on.
struct model_fingerprint {
  int layers = 0;
  int q_heads = 0;
  int kv_heads = 0;
  int head_dim = 0;
  std::string config_hash;  // "fnv1a64:<hex>" of config.json, or "" (not checked)

  [[nodiscard]] model_shape shape() const { return {layers, q_heads, kv_heads, head_dim}; }
};

// "fnv1a64:" + 16 hex digits of the FNV-1a 64-bit hash of `bytes`.
[[nodiscard]] inline std::string fnv1a64_hex(std::string_view bytes) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (const char c : bytes) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ull;
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return std::string("fnv1a64:") + buf;
}

// The config_hash of a model directory's config.json (its bytes as stored).
[[nodiscard]] inline std::string config_hash_of(const std::string& config_json_path) {
  std::ifstream in(config_json_path, std::ios::binary);
  require(static_cast<bool>(in), "calibrate::config_hash_of", "path", config_json_path,
          "a readable file");
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return fnv1a64_hex(bytes);
}

// SyncKV: per layer the k-means cluster of every KV head and each cluster's R-head.
struct synckv_layer_roles {
  std::vector<std::int32_t> assign;           // [H] cluster 0..N_r-1
  std::vector<std::int32_t> representatives;  // [N_r] R-head of each cluster
  std::vector<float> similarity;              // [H * H] mean overlap S, or empty
};
struct synckv_roles {
  model_fingerprint model;
  nlohmann::json parameters = nlohmann::json::object();
  std::vector<synckv_layer_roles> layers;  // [L]

  [[nodiscard]] bool is_representative(int layer, int head) const {
    const auto& r = layers.at(static_cast<std::size_t>(layer)).representatives;
    for (const auto x : r) {
      if (x == head) return true;
    }
    return false;
  }
  // The R-head whose attention `head` follows (itself for an R-head).
  [[nodiscard]] int representative_of(int layer, int head) const {
    const auto& l = layers.at(static_cast<std::size_t>(layer));
    return l.representatives.at(static_cast<std::size_t>(l.assign.at(static_cast<std::size_t>(head))));
  }
};

// HeteroCache: per layer the role, leader and stability of every KV head.
struct heterocache_layer_roles {
  std::vector<head_role> roles;      // [H]
  std::vector<std::int32_t> leader;  // [H] a satellite's pivot, a pivot itself, else -1
  std::vector<float> stability;      // [H] s_h
  std::vector<float> similarity;     // [H * H] prefill overlap, or empty
};
struct heterocache_roles {
  model_fingerprint model;
  nlohmann::json parameters = nlohmann::json::object();
  std::vector<heterocache_layer_roles> layers;  // [L]
};

namespace detail {

inline std::string field(int layer, std::string_view name) {
  return "layers[" + std::to_string(layer) + "]." + std::string(name);
}

inline void check_model(const model_fingerprint& m, std::string_view where) {
  require(m.layers > 0, where, "model.layers", m.layers, "> 0");
  require(m.kv_heads > 0, where, "model.kv_heads", m.kv_heads, "> 0");
  require(m.q_heads > 0 && m.q_heads % m.kv_heads == 0, where, "model.q_heads", m.q_heads,
          "a positive multiple of kv_heads");
  require(m.head_dim > 0, where, "model.head_dim", m.head_dim, "> 0");
}

inline void check_similarity(const std::vector<float>& s, int H, int layer,
                             std::string_view where) {
  require(s.empty() || s.size() == static_cast<std::size_t>(H) * H, where,
          field(layer, "similarity") + " size", s.size(),
          "empty or kv_heads^2 = " + std::to_string(H * H));
}

// A float as the shortest double that reads back as the same float ("%.9g"), so the file shows
// 0.149000004 rather than 0.14900000393390656 and still round-trips exactly.
inline nlohmann::json float_json(float v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(v));
  return std::strtod(buf, nullptr);
}

inline nlohmann::json floats_json(std::span<const float> v) {
  nlohmann::json a = nlohmann::json::array();
  for (const float x : v) a.push_back(float_json(x));
  return a;
}

inline nlohmann::json matrix_json(const std::vector<float>& s, int H) {
  nlohmann::json rows = nlohmann::json::array();
  for (int i = 0; i < H && !s.empty(); ++i) {
    rows.push_back(floats_json(std::span<const float>(s).subspan(static_cast<std::size_t>(i) * H,
                                                                static_cast<std::size_t>(H))));
  }
  return rows;
}

// Indented JSON with arrays of numbers on one line and the roles file's keys in reading order.
inline void pretty(const nlohmann::json& j, std::string& out, int indent) {
  static const char* const order[] = {"format",    "version",         "method",    "model",
                                      "parameters", "layers",         "q_heads",   "kv_heads",
                                      "head_dim",  "config_hash",     "assign",    "representatives",
                                      "roles",     "leader",          "stability", "similarity"};
  const std::string pad(static_cast<std::size_t>(indent + 1) * 2, ' ');
  const std::string close(static_cast<std::size_t>(indent) * 2, ' ');
  if (j.is_array()) {
    bool flat = true;
    for (const auto& e : j) flat = flat && e.is_primitive();
    if (flat || j.empty()) {
      out += j.dump();
      return;
    }
    out += "[\n";
    for (std::size_t i = 0; i < j.size(); ++i) {
      out += pad;
      pretty(j[i], out, indent + 1);
      out += i + 1 < j.size() ? ",\n" : "\n";
    }
    out += close + "]";
  } else if (j.is_object() && !j.empty()) {
    std::vector<std::string> keys;
    for (const char* k : order) {
      if (j.contains(k)) keys.emplace_back(k);
    }
    for (const auto& [k, v] : j.items()) {
      if (std::find(keys.begin(), keys.end(), k) == keys.end()) keys.push_back(k);
    }
    out += "{\n";
    for (std::size_t i = 0; i < keys.size(); ++i) {
      out += pad + nlohmann::json(keys[i]).dump() + ": ";
      pretty(j[keys[i]], out, indent + 1);
      out += i + 1 < keys.size() ? ",\n" : "\n";
    }
    out += close + "}";
  } else {
    out += j.dump();
  }
}

inline nlohmann::json header_json(std::string_view method, const model_fingerprint& m,
                                  const nlohmann::json& parameters) {
  return {{"format", std::string(roles_format)},
          {"version", roles_version},
          {"method", std::string(method)},
          {"model",
           {{"layers", m.layers},
            {"q_heads", m.q_heads},
            {"kv_heads", m.kv_heads},
            {"head_dim", m.head_dim},
            {"config_hash", m.config_hash}}},
          {"parameters", parameters},
          {"layers", nlohmann::json::array()}};
}

// Whether `v` converts to T without undefined behaviour: nlohmann's get<int>() of 1e30 or
// get<float>() of 1e300 is an out-of-range floating conversion (found by fuzz/roles_file.cpp).
// Integers must be JSON integers within T's range; floats finite JSON numbers within T's range.
template <class T>
bool representable(const nlohmann::json& v) {
  if constexpr (std::is_integral_v<T>) {
    if (v.is_number_unsigned()) {
      return v.get<std::uint64_t>() <= static_cast<std::uint64_t>(std::numeric_limits<T>::max());
    }
    return v.is_number_integer() && v.get<std::int64_t>() >= std::numeric_limits<T>::min() &&
           v.get<std::int64_t>() <= std::numeric_limits<T>::max();
  } else if constexpr (std::is_floating_point_v<T>) {
    return !v.is_number_float() ||
           std::abs(v.get<double>()) <= static_cast<double>(std::numeric_limits<T>::max());
  } else if constexpr (requires { typename T::value_type; } && !std::is_same_v<T, std::string>) {
    return !v.is_array() || std::all_of(v.begin(), v.end(), [](const nlohmann::json& e) {
      return representable<typename T::value_type>(e);
    });
  } else {
    return true;
  }
}

// Typed access to a JSON field, with an error naming it.
template <class T>
T get(const nlohmann::json& j, std::string_view key, const std::string& name,
      std::string_view where, std::string_view expected) {
  require(j.is_object() && j.contains(key), where, name, "missing", expected);
  require(representable<T>(j.at(std::string(key))), where, name, j.at(std::string(key)).dump(),
          expected);
  try {
    return j.at(std::string(key)).get<T>();
  } catch (const nlohmann::json::exception&) {
    throw make_error(where, name, j.at(std::string(key)).dump(), expected);
  }
}

inline nlohmann::json parse_file(const std::string& path, std::string_view where) {
  std::ifstream in(path);
  require(static_cast<bool>(in), where, "path", path, "a readable roles file");
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw make_error(where, "path", path, std::string("valid JSON (") + e.what() + ")");
  }
}

// Reads format/version/method/model/parameters and checks the model against `expected`
// (fields <= 0 and an empty config_hash are not checked).
inline model_fingerprint read_header(const nlohmann::json& j, std::string_view method,
                                     const model_fingerprint& expected, std::string_view where,
                                     nlohmann::json& parameters) {
  const auto fmt = get<std::string>(j, "format", "format", where, "\"kvsift-head-roles\"");
  require(fmt == roles_format, where, "format", fmt, "\"kvsift-head-roles\"");
  const int version = get<int>(j, "version", "version", where, "an integer");
  require(version == roles_version, where, "version", version,
          std::to_string(roles_version) + " (the version this kvsift reads)");
  const auto m = get<std::string>(j, "method", "method", where, "a string");
  require(m == method, where, "method", m, "\"" + std::string(method) + "\"");
  require(j.contains("model") && j["model"].is_object(), where, "model", "missing",
          "an object");
  const auto& jm = j["model"];
  model_fingerprint f;
  f.layers = get<int>(jm, "layers", "model.layers", where, "an integer");
  f.q_heads = get<int>(jm, "q_heads", "model.q_heads", where, "an integer");
  f.kv_heads = get<int>(jm, "kv_heads", "model.kv_heads", where, "an integer");
  f.head_dim = get<int>(jm, "head_dim", "model.head_dim", where, "an integer");
  require(!jm.contains("config_hash") || jm["config_hash"].is_string(), where,
          "model.config_hash", jm.contains("config_hash") ? jm["config_hash"].dump() : "",
          "a string");
  f.config_hash = jm.value("config_hash", std::string());
  check_model(f, where);
  const auto same = [&](const char* name, int got, int want) {
    require(want <= 0 || got == want, where, std::string("model.") + name, got,
            std::string("the model's ") + name + " = " + std::to_string(want));
  };
  same("layers", f.layers, expected.layers);
  same("q_heads", f.q_heads, expected.q_heads);
  same("kv_heads", f.kv_heads, expected.kv_heads);
  same("head_dim", f.head_dim, expected.head_dim);
  require(expected.config_hash.empty() || f.config_hash.empty() ||
              f.config_hash == expected.config_hash,
          where, "model.config_hash", f.config_hash,
          "the model's config.json hash " + expected.config_hash);
  parameters = j.value("parameters", nlohmann::json::object());
  require(j.contains("layers") && j["layers"].is_array(), where, "layers", "missing",
          "an array");
  require(j["layers"].size() == static_cast<std::size_t>(f.layers), where, "layers size",
          j["layers"].size(), "model.layers = " + std::to_string(f.layers));
  return f;
}

inline std::vector<float> read_matrix(const nlohmann::json& l, int layer, int H,
                                      std::string_view where) {
  std::vector<float> s;
  if (!l.contains("similarity")) {
    return s;
  }
  const auto rows = get<std::vector<std::vector<float>>>(
      l, "similarity", field(layer, "similarity"), where, "an array of kv_heads rows");
  require(rows.size() == static_cast<std::size_t>(H), where, field(layer, "similarity") + " rows",
          rows.size(), "kv_heads = " + std::to_string(H));
  for (std::size_t i = 0; i < rows.size(); ++i) {
    require(rows[i].size() == static_cast<std::size_t>(H), where,
            field(layer, "similarity[" + std::to_string(i) + "]") + " size", rows[i].size(),
            "kv_heads = " + std::to_string(H));
    s.insert(s.end(), rows[i].begin(), rows[i].end());
  }
  return s;
}

}  // namespace detail

// Throws kvsift::error naming the first inconsistent field.
inline void validate(const synckv_roles& r, std::string_view where = "calibrate::synckv_roles") {
  detail::check_model(r.model, where);
  require(r.layers.size() == static_cast<std::size_t>(r.model.layers), where, "layers size",
          r.layers.size(), "model.layers = " + std::to_string(r.model.layers));
  const int H = r.model.kv_heads;
  for (int l = 0; l < r.model.layers; ++l) {
    const auto& x = r.layers[static_cast<std::size_t>(l)];
    require(x.assign.size() == static_cast<std::size_t>(H), where,
            detail::field(l, "assign") + " size", x.assign.size(),
            "kv_heads = " + std::to_string(H));
    const auto C = static_cast<int>(x.representatives.size());
    require(C >= 1 && C <= H, where, detail::field(l, "representatives") + " size", C,
            "1..kv_heads");
    for (int h = 0; h < H; ++h) {
      const int a = x.assign[static_cast<std::size_t>(h)];
      require(a >= 0 && a < C, where, detail::field(l, "assign[" + std::to_string(h) + "]"), a,
              "a cluster 0.." + std::to_string(C - 1));
    }
    for (int c = 0; c < C; ++c) {
      const int rep = x.representatives[static_cast<std::size_t>(c)];
      require(rep >= 0 && rep < H && x.assign[static_cast<std::size_t>(rep)] == c, where,
              detail::field(l, "representatives[" + std::to_string(c) + "]"), rep,
              "a head of cluster " + std::to_string(c));
    }
    detail::check_similarity(x.similarity, H, l, where);
  }
}

inline void validate(const heterocache_roles& r,
                     std::string_view where = "calibrate::heterocache_roles") {
  detail::check_model(r.model, where);
  require(r.layers.size() == static_cast<std::size_t>(r.model.layers), where, "layers size",
          r.layers.size(), "model.layers = " + std::to_string(r.model.layers));
  const int H = r.model.kv_heads;
  for (int l = 0; l < r.model.layers; ++l) {
    const auto& x = r.layers[static_cast<std::size_t>(l)];
    const auto H_ = static_cast<std::size_t>(H);
    require(x.roles.size() == H_, where, detail::field(l, "roles") + " size", x.roles.size(),
            "kv_heads = " + std::to_string(H));
    require(x.leader.size() == H_, where, detail::field(l, "leader") + " size", x.leader.size(),
            "kv_heads = " + std::to_string(H));
    require(x.stability.size() == H_, where, detail::field(l, "stability") + " size",
            x.stability.size(), "kv_heads = " + std::to_string(H));
    for (int h = 0; h < H; ++h) {
      const auto role = x.roles[static_cast<std::size_t>(h)];
      const int code = static_cast<int>(role);
      require(code >= 0 && code <= 3, where, detail::field(l, "roles[" + std::to_string(h) + "]"),
              code, "0 anchor, 1 volatile, 2 pivot or 3 satellite");
      const int lead = x.leader[static_cast<std::size_t>(h)];
      const std::string name = detail::field(l, "leader[" + std::to_string(h) + "]");
      if (role == head_role::pivot) {
        require(lead == h, where, name, lead, "the pivot itself (" + std::to_string(h) + ")");
      } else if (role == head_role::satellite) {
        require(lead >= 0 && lead < H && lead != h &&
                    x.roles[static_cast<std::size_t>(lead)] == head_role::pivot,
                where, name, lead, "a pivot of the same layer");
      } else {
        require(lead == -1, where, name, lead, "-1 for an anchor or volatile head");
      }
    }
    detail::check_similarity(x.similarity, H, l, where);
  }
}

[[nodiscard]] inline nlohmann::json to_json(const synckv_roles& r) {
  validate(r, "calibrate::to_json");
  auto j = detail::header_json("synckv", r.model, r.parameters);
  for (const auto& x : r.layers) {
    nlohmann::json l = {{"assign", x.assign}, {"representatives", x.representatives}};
    if (!x.similarity.empty()) l["similarity"] = detail::matrix_json(x.similarity, r.model.kv_heads);
    j["layers"].push_back(std::move(l));
  }
  return j;
}

[[nodiscard]] inline nlohmann::json to_json(const heterocache_roles& r) {
  validate(r, "calibrate::to_json");
  auto j = detail::header_json("heterocache", r.model, r.parameters);
  for (const auto& x : r.layers) {
    std::vector<int> codes;
    for (const auto role : x.roles) codes.push_back(static_cast<int>(role));
    nlohmann::json l = {{"roles", codes},
                        {"leader", x.leader},
                        {"stability", detail::floats_json(x.stability)}};
    if (!x.similarity.empty()) l["similarity"] = detail::matrix_json(x.similarity, r.model.kv_heads);
    j["layers"].push_back(std::move(l));
  }
  return j;
}

// Parses a roles document; `expected` is the model it will run with (fields <= 0 or an empty
// config_hash are not checked). `source` names the file in error messages.
[[nodiscard]] inline synckv_roles synckv_roles_from_json(const nlohmann::json& j,
                                                         const model_fingerprint& expected = {},
                                                         std::string_view source = "json") {
  const std::string where = "calibrate::read_synckv_roles of " + std::string(source);
  synckv_roles r;
  r.model = detail::read_header(j, "synckv", expected, where, r.parameters);
  for (int l = 0; l < r.model.layers; ++l) {
    const auto& jl = j["layers"][static_cast<std::size_t>(l)];
    synckv_layer_roles x;
    x.assign = detail::get<std::vector<std::int32_t>>(jl, "assign", detail::field(l, "assign"),
                                                      where, "an array of ints");
    x.representatives = detail::get<std::vector<std::int32_t>>(
        jl, "representatives", detail::field(l, "representatives"), where, "an array of ints");
    x.similarity = detail::read_matrix(jl, l, r.model.kv_heads, where);
    r.layers.push_back(std::move(x));
  }
  validate(r, where);
  return r;
}

[[nodiscard]] inline heterocache_roles heterocache_roles_from_json(
    const nlohmann::json& j, const model_fingerprint& expected = {},
    std::string_view source = "json") {
  const std::string where = "calibrate::read_heterocache_roles of " + std::string(source);
  heterocache_roles r;
  r.model = detail::read_header(j, "heterocache", expected, where, r.parameters);
  for (int l = 0; l < r.model.layers; ++l) {
    const auto& jl = j["layers"][static_cast<std::size_t>(l)];
    heterocache_layer_roles x;
    const auto codes = detail::get<std::vector<int>>(jl, "roles", detail::field(l, "roles"),
                                                     where, "an array of role codes 0..3");
    for (std::size_t h = 0; h < codes.size(); ++h) {
      require(codes[h] >= 0 && codes[h] <= 3, where,
              detail::field(l, "roles[" + std::to_string(h) + "]"), codes[h],
              "0 anchor, 1 volatile, 2 pivot or 3 satellite");
      x.roles.push_back(static_cast<head_role>(codes[h]));
    }
    x.leader = detail::get<std::vector<std::int32_t>>(jl, "leader", detail::field(l, "leader"),
                                                      where, "an array of ints");
    x.stability = detail::get<std::vector<float>>(jl, "stability", detail::field(l, "stability"),
                                                  where, "an array of numbers");
    x.similarity = detail::read_matrix(jl, l, r.model.kv_heads, where);
    r.layers.push_back(std::move(x));
  }
  validate(r, where);
  return r;
}

[[nodiscard]] inline synckv_roles read_synckv_roles(const std::string& path,
                                                    const model_fingerprint& expected = {}) {
  return synckv_roles_from_json(detail::parse_file(path, "calibrate::read_synckv_roles"),
                                expected, path);
}
[[nodiscard]] inline heterocache_roles read_heterocache_roles(
    const std::string& path, const model_fingerprint& expected = {}) {
  return heterocache_roles_from_json(detail::parse_file(path, "calibrate::read_heterocache_roles"),
                                     expected, path);
}

// Writes `r` (validated first) as indented JSON.
template <class Roles>
  requires std::is_same_v<Roles, synckv_roles> || std::is_same_v<Roles, heterocache_roles>
void write_roles(const std::string& path, const Roles& r) {
  std::string text;
  detail::pretty(to_json(r), text, 0);
  text += "\n";
  std::ofstream out(path, std::ios::trunc);
  require(static_cast<bool>(out), "calibrate::write_roles", "path", path, "a writable file");
  out << text;
  require(static_cast<bool>(out), "calibrate::write_roles", "path", path,
          "a file that can be written completely");
}

}  // namespace kvsift::calibrate
