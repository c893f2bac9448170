// SPDX-License-Identifier: Apache-2.0
#pragma once

// What offline calibration needs of one prompt, recorded from the example engine or read from
// a calibration trace file (kvsift trace writes it; docs/calibration.md documents the schema):
//
//   p<i>.keys        F32 [layers, n + T, kv_heads, d]   keys after RoPE, prompt then decode steps
//   p<i>.values      F32 [layers, n + T, kv_heads, d]
//   p<i>.queries     F32 [layers, W + T, q_heads, d]    the last W prefill queries (after RoPE),
//                                                       then the query of each decode step
//   p<i>.ids         I32 [n + T]                        prompt tokens, then the greedy tokens
//   p<i>.prompt_len  I32 [1] = n,   p<i>.window I32 [1] = W,   p<i>.steps I32 [1] = T
//   __metadata__: format "kvsift-calibration-trace", version "1", layers, q_heads, kv_heads,
//                 head_dim, prompts, config_hash
//
// Decode step t (1..T) appends the t-th greedy token at position n + t - 1; its query attends to
// the n + t tokens 0..n+t-1 (METHODS.md "Decode steps").

#include "../engine/llama.hpp"

#include <kvsift/calibrate/roles_file.hpp>
#include <kvsift/core/error.hpp>
#include <kvsift/core/shape.hpp>
#include <kvsift/io/safetensors.hpp>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace kvsift::cli {

inline constexpr const char* trace_format = "kvsift-calibration-trace";

struct prompt_trace {
  model_shape shape;
  int n = 0;       // prompt tokens
  int window = 0;  // W: prefill queries kept (the last W)
  int steps = 0;   // T: decode steps
  std::vector<std::int32_t> ids;    // [n + T]
  std::vector<float> keys, values;  // [L, n + T, H, d]
  std::vector<float> queries;       // [L, W + T, Hq, d]

  [[nodiscard]] int tokens() const { return n + steps; }
  // keys of layer l, token-major [n + T, H, d]
  [[nodiscard]] std::span<const float> layer_keys(int l) const {
    const auto per = static_cast<std::size_t>(tokens()) * shape.kv_heads * shape.head_dim;
    return {keys.data() + static_cast<std::size_t>(l) * per, per};
  }
  // query [Hq, d] of layer l: row W - 1 is the last prefill query, row W + t - 1 decode step t
  [[nodiscard]] std::span<const float> query(int l, int row) const {
    const auto per = static_cast<std::size_t>(shape.q_heads) * shape.head_dim;
    return {queries.data() + (static_cast<std::size_t>(l) * (window + steps) + row) * per, per};
  }
};

// A full_cache that also records the K/V/Q calibration needs.
class recording_cache : public examples::kv_cache {
 public:
  recording_cache(int window, int steps) : window_(window), steps_(steps) {}

  void start(const examples::cache_shape& s) override {
    inner_.start(s);
    t_.shape = {s.num_layers, s.num_q_heads, s.num_kv_heads, s.head_dim};
    t_.n = s.prompt_len;
    t_.window = std::min(window_, s.prompt_len);
    t_.steps = steps_;
    const auto kv = static_cast<std::size_t>(s.num_layers) * (t_.n + steps_) * s.num_kv_heads *
                    s.head_dim;
    t_.keys.assign(kv, 0.0f);
    t_.values.assign(kv, 0.0f);
    t_.queries.assign(static_cast<std::size_t>(s.num_layers) * (t_.window + steps_) *
                          s.num_q_heads * s.head_dim,
                      0.0f);
    step_.assign(static_cast<std::size_t>(s.num_layers), 0);
  }

  void prefill(int layer, int n, std::span<const float> k_rot, std::span<const float> v,
               std::span<const float> q_rot) override {
    const auto kvrow = static_cast<std::size_t>(t_.shape.kv_heads) * t_.shape.head_dim;
    const auto qrow = static_cast<std::size_t>(t_.shape.q_heads) * t_.shape.head_dim;
    std::copy_n(k_rot.begin(), static_cast<std::size_t>(n) * kvrow, kv_at(t_.keys, layer, 0));
    std::copy_n(v.begin(), static_cast<std::size_t>(n) * kvrow, kv_at(t_.values, layer, 0));
    const int W = t_.window;
    std::copy_n(q_rot.begin() + static_cast<std::ptrdiff_t>((n - W) * qrow), W * qrow,
                t_.queries.begin() + static_cast<std::ptrdiff_t>(
                                         static_cast<std::size_t>(layer) * (W + t_.steps) * qrow));
    inner_.prefill(layer, n, k_rot, v, q_rot);
  }

  void decode(int layer, std::span<const float> q, std::span<const float> k,
              std::span<const float> v, int position, std::span<float> out) override {
    const int t = step_[static_cast<std::size_t>(layer)]++;  // 0-based decode step
    require(t < t_.steps, "kvsift trace", "decode step", t + 1,
            "at most " + std::to_string(t_.steps));
    std::copy(k.begin(), k.end(), kv_at(t_.keys, layer, t_.n + t));
    std::copy(v.begin(), v.end(), kv_at(t_.values, layer, t_.n + t));
    const auto qrow = static_cast<std::size_t>(t_.shape.q_heads) * t_.shape.head_dim;
    std::copy(q.begin(), q.end(),
              t_.queries.begin() +
                  static_cast<std::ptrdiff_t>(
                      (static_cast<std::size_t>(layer) * (t_.window + t_.steps) + t_.window + t) *
                      qrow));
    inner_.decode(layer, q, k, v, position, out);
  }

  [[nodiscard]] std::int64_t kept_tokens(int layer, int kv_head) const override {
    return inner_.kept_tokens(layer, kv_head);
  }

  [[nodiscard]] prompt_trace take() { return std::move(t_); }

 private:
  [[nodiscard]] std::vector<float>::iterator kv_at(std::vector<float>& a, int layer, int token) {
    const auto row = static_cast<std::size_t>(t_.shape.kv_heads) * t_.shape.head_dim;
    return a.begin() + static_cast<std::ptrdiff_t>(
                           (static_cast<std::size_t>(layer) * t_.tokens() + token) * row);
  }
  int window_, steps_;
  examples::full_cache inner_;
  prompt_trace t_;
  std::vector<int> step_;
};

// Runs `ids` through the engine: prefill, then `steps` greedy decode steps (fewer if the model's
// max_position_embeddings would be exceeded).
inline prompt_trace record_prompt(const examples::llama_model& model, std::span<const int> ids,
                                  int steps, int window) {
  const int n = static_cast<int>(ids.size());
  steps = std::max(0, std::min(steps, model.config().max_position_embeddings - n));
  recording_cache cache(window, steps);
  std::vector<float> logits = model.prefill(ids, cache, steps);
  std::vector<std::int32_t> all(ids.begin(), ids.end());
  for (int t = 1; t <= steps; ++t) {
    const int next = examples::llama_model::argmax(logits);
    all.push_back(next);
    logits = model.decode(next, n + t - 1, cache);
  }
  prompt_trace tr = cache.take();
  tr.ids = std::move(all);
  return tr;
}

// "p<i>." (built step by step: GCC 12's -Wrestrict misfires on "p" + to_string(p) + ".").
inline std::string trace_prefix(int p) {
  std::string s = "p";
  s += std::to_string(p);
  s += '.';
  return s;
}

// An I32 tensor of shape [values.size()].
inline io::tensor_data i32_tensor(const std::vector<std::int32_t>& values) {
  io::tensor_data t{io::dtype::i32, {static_cast<std::int64_t>(values.size())},
                    std::vector<std::byte>(values.size() * 4)};
  for (std::size_t i = 0; i < values.size(); ++i) {
    io::detail::store_u32(t.bytes.data() + 4 * i, static_cast<std::uint32_t>(values[i]));
  }
  return t;
}

// Adds prompt `p`'s tensors to `out` (the schema above).
inline void add_trace(io::tensor_map& out, int p, const prompt_trace& t) {
  const std::string pre = trace_prefix(p);
  const auto& s = t.shape;
  const io::shape_t kv{s.layers, t.tokens(), s.kv_heads, s.head_dim};
  out[pre + "keys"] = io::make_tensor(t.keys, kv);
  out[pre + "values"] = io::make_tensor(t.values, kv);
  out[pre + "queries"] =
      io::make_tensor(t.queries, {s.layers, t.window + t.steps, s.q_heads, s.head_dim});
  out[pre + "ids"] = i32_tensor(t.ids);
  out[pre + "prompt_len"] = i32_tensor({t.n});
  out[pre + "window"] = i32_tensor({t.window});
  out[pre + "steps"] = i32_tensor({t.steps});
}

inline std::map<std::string, std::string> trace_metadata(const calibrate::model_fingerprint& m,
                                                         int prompts) {
  return {{"format", trace_format},
          {"version", "1"},
          {"layers", std::to_string(m.layers)},
          {"q_heads", std::to_string(m.q_heads)},
          {"kv_heads", std::to_string(m.kv_heads)},
          {"head_dim", std::to_string(m.head_dim)},
          {"prompts", std::to_string(prompts)},
          {"config_hash", m.config_hash}};
}

// An opened calibration trace file: the model it was recorded on and its prompts.
struct trace_file {
  io::safetensors_file file;
  calibrate::model_fingerprint model;
  int prompts = 0;

  [[nodiscard]] static trace_file open(const std::string& path) {
    trace_file f{io::safetensors_file::open(path), {}, 0};
    const auto& md = f.file.metadata();
    const std::string where = "kvsift calibrate --traces " + path;
    const auto get = [&](const char* key) {
      const auto it = md.find(key);
      require(it != md.end(), where, std::string("__metadata__.") + key, "missing",
              "present (a kvsift calibration trace)");
      return it->second;
    };
    require(get("format") == trace_format, where, "__metadata__.format", get("format"),
            trace_format);
    require(get("version") == "1", where, "__metadata__.version", get("version"), "1");
    // A decimal int >= 0, all of the text (std::stoi threw std::invalid_argument or
    // std::out_of_range here: fuzz/regressions/calibration_trace).
    const auto get_int = [&](const char* key) {
      const std::string v = get(key);
      int out = -1;
      const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
      require(ec == std::errc() && end == v.data() + v.size() && out >= 0, where,
              std::string("__metadata__.") + key, v, "a non-negative decimal integer that fits int");
      return out;
    };
    f.model.layers = get_int("layers");
    f.model.q_heads = get_int("q_heads");
    f.model.kv_heads = get_int("kv_heads");
    f.model.head_dim = get_int("head_dim");
    f.model.config_hash = md.count("config_hash") ? md.at("config_hash") : "";
    f.prompts = get_int("prompts");
    // A model shape profiling can use: q_heads / kv_heads is the GQA group size (kv_heads = 0
    // divided by zero in kvsift calibrate --traces: issue 26 item 12).
    for (const auto& [key, v] : {std::pair<const char*, int>{"layers", f.model.layers},
                                 {"q_heads", f.model.q_heads},
                                 {"kv_heads", f.model.kv_heads},
                                 {"head_dim", f.model.head_dim}}) {
      require(v >= 1, where, std::string("__metadata__.") + key, v, ">= 1");
    }
    require(f.model.q_heads % f.model.kv_heads == 0, where, "__metadata__.kv_heads",
            f.model.kv_heads,
            "a number that divides q_heads (" + std::to_string(f.model.q_heads) + ")");
    return f;
  }

  [[nodiscard]] prompt_trace prompt(int p) const {
    const std::string pre = trace_prefix(p);
    prompt_trace t;
    t.shape = model.shape();
    const std::string where = "kvsift calibrate --traces, prompt " + std::to_string(p);
    // One I32 element (.at(0) threw std::out_of_range on an empty tensor: fuzz/regressions).
    const auto scalar = [&](const std::string& name) {
      const auto v = file.to_int32(name);
      require(v.size() == 1, where, name + " size", v.size(), "1 (an I32 [1] tensor)");
      return v[0];
    };
    t.n = scalar(pre + "prompt_len");
    t.window = scalar(pre + "window");
    t.steps = scalar(pre + "steps");
    // Checked before tokens() = n + steps is formed (it overflowed int for n near INT_MAX).
    require(t.n > 0 && t.window >= 1 && t.window <= t.n && t.steps >= 0 &&
                t.steps <= std::numeric_limits<int>::max() - t.n,
            where, "prompt_len / window / steps",
            std::to_string(t.n) + " / " + std::to_string(t.window) + " / " +
                std::to_string(t.steps),
            "n > 0, 1 <= window <= n, steps >= 0, n + steps fits int");
    t.keys = file.to_float(pre + "keys");
    t.values = file.to_float(pre + "values");
    t.queries = file.to_float(pre + "queries");
    t.ids = file.to_int32(pre + "ids");
    const auto& s = t.shape;
    const auto kv = static_cast<std::size_t>(s.layers) * t.tokens() * s.kv_heads * s.head_dim;
    require(t.keys.size() == kv && t.values.size() == kv, where, pre + "keys size",
            t.keys.size(), "layers * (n + T) * kv_heads * d = " + std::to_string(kv));
    require(t.queries.size() == static_cast<std::size_t>(s.layers) * (t.window + t.steps) *
                                    s.q_heads * s.head_dim,
            where, pre + "queries size", t.queries.size(), "layers * (W + T) * q_heads * d");
    return t;
  }
};

// A model directory's fingerprint: shape from config.json, and its hash.
inline calibrate::model_fingerprint fingerprint_of(const examples::llama_model& m,
                                                   const std::string& dir) {
  const auto& c = m.config();
  return {c.num_layers, c.num_q_heads, c.num_kv_heads, c.head_dim,
          calibrate::config_hash_of(dir + "/config.json")};
}

// `path` as given if it exists, else relative to the source tree (as kvsift eval does).
inline std::string resolve_path(const std::string& path) {
  namespace fs = std::filesystem;
  if (fs::exists(path)) return path;
  const fs::path p(path);
  if (p.is_relative()) {
    const fs::path in_tree = fs::path(KVSIFT_SOURCE_DIR) / p;
    if (fs::exists(in_tree)) return in_tree.string();
  }
  return path;
}

// A non-negative integer option.
inline int int_option(const std::string& cmd, const std::string& name, const std::string& s) {
  std::size_t used = 0;
  long v = -1;
  try {
    v = std::stol(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  require(used == s.size() && v >= 0 && v < (1L << 30), cmd, name, s, "a non-negative integer");
  return static_cast<int>(v);
}

}  // namespace kvsift::cli
