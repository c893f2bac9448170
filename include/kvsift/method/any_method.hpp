// SPDX-License-Identifier: Apache-2.0
#pragma once

// Choosing a method by name at run time (a CLI flag, an engine config). The compositions stay
// compile-time; only the erased layer (method/erased.hpp: any_kv_method<T>, any_method<Store>,
// erased_method<M>) is virtual. make_method(name, store, budget) builds a one-tier method over a
// caller-owned store.
//
// method_registry<T> maps a name to a factory that builds the method AND its store from a
// method_config (model shape, request slots, capacity, prompt length, budget, options, head-roles
// file), and optionally to a hook that sets the parameters giving a device-resident KV fraction
// (for `kvsift eval --match resident`). default_method_registry<T>() holds the named methods;
// builtin_method_entries<T>() below is THE registration point: a new method (SyncKV,
// HeteroCache, FreeKV, ...) adds one entry there.

#include <kvsift/method/baselines.hpp>
#include <kvsift/method/dynamickv.hpp>
#include <kvsift/method/erased.hpp>
#include <kvsift/method/freekv.hpp>
#include <kvsift/method/heterocache.hpp>
#include <kvsift/method/lagkv.hpp>
#include <kvsift/method/method.hpp>
#include <kvsift/method/synckv.hpp>
#include <kvsift/store/dense.hpp>
#include <kvsift/store/paged.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <concepts>
#include <cstdio>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvsift {

// The names make_method knows, in the order tables list them: the one-tier methods (one store,
// no host pool), which a device exec runs too (device/erased.hpp).
inline std::vector<std::string> method_names() {
  return {"full_kv", "streaming_llm", "h2o", "snapkv", "pyramidkv", "quest", "lagkv", "dynamickv"};
}

// ---- the registry -------------------------------------------------------------------------

// What a registry factory builds a method from. `budget` is in tokens per head-sequence (for the
// methods with a token budget); `options` carries method-specific knobs by name (LagKV:
// "keep_fraction", "lag", "sink"; SyncKV: "memory_fraction", ...), unset ones take the paper's
// defaults; `roles_file` is a head-roles file (calibration) for the methods that need one, and
// synckv_roles / heterocache_roles are its contents, read by the caller (this header does not
// parse JSON: calibrate/roles_file.hpp's read_synckv_roles / read_heterocache_roles do, and
// synckv_roles_of / heterocache_roles_of convert).
struct method_config {
  // One layer of HeteroCache roles (heterocache<T>::layer_roles, element-type free).
  struct heterocache_layer {
    std::vector<calibrate::head_role> roles;  // [kv_heads]
    std::vector<std::int32_t> leader;         // [kv_heads]
    std::vector<float> stability;             // [kv_heads]
  };

  model_shape shape;
  int requests = 1;
  int capacity = 0;    // tokens per head-sequence the store must hold (prompt + decode)
  int prompt_len = 0;  // the prompt of request 0 (budgets derived from it)
  int budget = 0;
  std::map<std::string, double> options;
  std::string roles_file;
  std::vector<select::cluster_roles> synckv_roles;    // [layers] SyncKV clusters; empty: none
  std::vector<heterocache_layer> heterocache_roles;  // [layers] HeteroCache roles; empty: none
  std::string note;  // what a resident-fraction hook set, for tables ("B=126", "lag 16, keep 3")
  far_tier far = far_tier::recall;  // the two-tier methods' far-tier policy (the others ignore it)

  [[nodiscard]] double option(const std::string& key, double fallback) const {
    const auto it = options.find(key);
    return it == options.end() ? fallback : it->second;
  }
  // An integer option (a count, a size, a page): `key`'s value when set, `fallback` otherwise.
  // Options are doubles; the value must be a whole number in [min_value, max_value] (I's range
  // by default). Anything else (16.5, -1 for a count, 1e20, NaN) is a kvsift::error naming the
  // option, the value and the range, never a truncation or a cast out of range. Every integer
  // option the registry reads goes through here.
  template <std::integral I = int>
  [[nodiscard]] I integer_option(const std::string& key, I fallback,
                                 I min_value = std::numeric_limits<I>::lowest(),
                                 I max_value = std::numeric_limits<I>::max()) const {
    const auto it = options.find(key);
    if (it == options.end()) return fallback;
    const double v = it->second;
    // v < 2^digits: the type's upper end without rounding (double(INT64_MAX) is 2^63)
    const bool ok = std::isfinite(v) && std::trunc(v) == v &&
                    v >= static_cast<double>(min_value) && v <= static_cast<double>(max_value) &&
                    v < std::ldexp(1.0, std::numeric_limits<I>::digits);
    if (!ok) [[unlikely]] {
      char shown[32];
      const auto r = std::to_chars(shown, shown + sizeof shown, v);
      throw make_error("method_registry", "options." + key, std::string_view(shown, r.ptr),
                       "an integer in [" + std::to_string(min_value) + ", " +
                           std::to_string(max_value) + "]");
    }
    return static_cast<I>(v);
  }
};

namespace detail {

// The one-tier named methods (one store, no host pool): the ones a device exec runs too.
inline bool is_one_tier_method(std::string_view name) {
  const auto names = method_names();
  return std::find(names.begin(), names.end(), name) != names.end();
}

// THE name -> composition map of the one-tier methods, for any store and exec (store::dense on
// exec::host, thrust::dense_store on a device exec): calls f.template operator()<M>(params) with
// M the composition `name` names over Store on E and its paper-default params for c.budget
// (tokens per head-sequence; LagKV: options "sink", "lag", "keep_fraction" instead), and returns
// what f returns. Throws kvsift::error naming the known ones for any other name.
template <class Store, Exec E, class F>
decltype(auto) visit_one_tier(std::string_view name, const method_config& c, F&& f) {
  if (name == "full_kv") return f.template operator()<full_kv<Store, E>>(full_kv_params<Store, E>());
  if (name == "streaming_llm") {
    return f.template operator()<streaming_llm<Store, E>>(streaming_llm_params<Store, E>(c.budget));
  }
  if (name == "h2o") return f.template operator()<h2o<Store, E>>(h2o_params<Store, E>(c.budget));
  if (name == "snapkv") return f.template operator()<snapkv<Store, E>>(snapkv_params<Store, E>(c.budget));
  if (name == "pyramidkv") {
    return f.template operator()<pyramidkv<Store, E>>(pyramidkv_params<Store, E>(c.budget));
  }
  if (name == "quest") return f.template operator()<quest<Store, E>>(quest_params<Store, E>(c.budget));
  if (name == "lagkv") {
    return f.template operator()<lagkv<Store, E>>(lagkv_params<Store, E>(
        c.integer_option("sink", 16, 0), c.integer_option("lag", 128, 1),
        c.option("keep_fraction", 0.5)));
  }
  if (name == "dynamickv") {
    return f.template operator()<dynamickv<Store, E>>(dynamickv_params<Store, E>(c.budget));
  }
  std::string known;
  for (const auto& n : method_names()) known += (known.empty() ? "" : ", ") + n;
  throw make_error("make_method", "name", name, "one of " + known);
}

}  // namespace detail

// The named method `name` with its paper defaults for a budget of `budget` tokens per
// head-sequence. LagKV has no token budget: it keeps a fraction of each lag partition, taken
// from `keep_fraction` (default: its paper's 0.5). Throws kvsift::error for an unknown name or an
// invalid budget.
template <KvStore Store>
std::unique_ptr<any_method<Store>> make_method(std::string_view name, Store& store, int budget,
                                               double keep_fraction = 0.5) {
  if (name != "full_kv" && detail::is_one_tier_method(name)) {
    require(budget > 0, "make_method", "budget", budget, "> 0 tokens");
  }
  method_config c;
  c.budget = budget;
  c.options["keep_fraction"] = keep_fraction;
  return detail::visit_one_tier<Store, exec::host>(
      name, c, [&]<class M>(typename M::params p) -> std::unique_ptr<any_method<Store>> {
        return std::make_unique<erased_method<M>>(std::string(name), store, std::move(p));
      });
}

template <Element T>
struct method_entry {
  std::string name;
  // Builds the method and the store it owns; throws kvsift::error for invalid parameters.
  std::function<std::unique_ptr<any_kv_method<T>>(const method_config&)> make;
  // params_for_resident_fraction: `base` with the method's parameters set so that its
  // device-resident KV at the end of a prompt of base.prompt_len tokens is `fraction` of the
  // prompt's KV (to within 2% when it can be reached; the closest otherwise). Empty when the
  // method keeps all of the prompt resident by design (full_kv, Quest: they read less instead).
  std::function<method_config(method_config base, double fraction)> for_resident_fraction;
};

// name -> method_entry; lookups throw kvsift::error naming the known methods.
template <Element T>
class method_registry {
 public:
  // Adds an entry; a name already present is an error.
  void add(method_entry<T> e) {
    require(!e.name.empty() && static_cast<bool>(e.make), "method_registry::add", "entry", e.name,
            "a name and a factory");
    require(find(e.name) == nullptr, "method_registry::add", "name", e.name, "a new name");
    entries_.push_back(std::move(e));
  }
  [[nodiscard]] const method_entry<T>* find(std::string_view name) const {
    for (const auto& e : entries_) {
      if (e.name == name) return &e;
    }
    return nullptr;
  }
  [[nodiscard]] const method_entry<T>& at(std::string_view name) const {
    const auto* e = find(name);
    if (e == nullptr) {
      std::string known;
      for (const auto& x : entries_) known += (known.empty() ? "" : ", ") + x.name;
      throw make_error("method_registry", "name", name, "one of " + known);
    }
    return *e;
  }
  [[nodiscard]] std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& e : entries_) out.push_back(e.name);
    return out;
  }
  [[nodiscard]] std::unique_ptr<any_kv_method<T>> make(std::string_view name,
                                                       const method_config& c) const {
    return at(name).make(c);
  }
  // The config giving `fraction` of the prompt resident; nullopt when the method has no such
  // parameter (its resident KV is the whole prompt by design).
  [[nodiscard]] std::optional<method_config> for_resident_fraction(
      std::string_view name, const method_config& base, double fraction) const {
    require(fraction > 0.0 && fraction <= 1.0, "method_registry::for_resident_fraction",
            "fraction", fraction, "in (0, 1]");
    const auto& e = at(name);
    if (!e.for_resident_fraction) return std::nullopt;
    return e.for_resident_fraction(base, fraction);
  }

 private:
  std::vector<method_entry<T>> entries_;
};

namespace detail {

// LagKV's resident tokens after a prefill of n tokens (see method/lagkv.hpp).
inline int lagkv_resident(int n, int sink, int lag, int keep) {
  if (n < sink + 2 * lag) return n;
  return n - (((n - sink) / lag) - 1) * (lag - keep);
}

// The factory of the one-tier method `name`: a store::dense<T> for the config and the
// composition over it (visit_one_tier).
template <Element T>
auto make_dense(std::string name) {
  return [name = std::move(name)](const method_config& c) {
    require(c.capacity > 0, "method_registry", "capacity", c.capacity, "> 0 tokens");
    return visit_one_tier<store::dense<T>, exec::host>(
        name, c, [&]<class M>(typename M::params p) -> std::unique_ptr<any_kv_method<T>> {
          auto st = std::make_unique<store::dense<T>>(c.shape, c.requests, c.capacity);
          return std::make_unique<erased_method<M>>(name, std::move(st), std::move(p));
        });
  };
}

// The factory of the one-tier method `name` over a store::paged<T> with pages of `page_size`
// tokens: one pool per method, of the pages a full cache of the config needs (requests x layers
// x kv_heads x ceil(capacity / page_size)), so an eviction's freed pages show in stats().pages.
template <Element T>
auto make_paged(std::string name, int page_size) {
  return [name = std::move(name), page_size](const method_config& c) {
    require(c.capacity > 0, "method_registry", "capacity", c.capacity, "> 0 tokens");
    const std::int64_t pages = static_cast<std::int64_t>(c.requests) * c.shape.layers *
                               c.shape.kv_heads *
                               ((static_cast<std::int64_t>(c.capacity) + page_size - 1) / page_size);
    require(pages <= std::numeric_limits<int>::max(), "method_registry", "capacity", c.capacity,
            "a pool of at most 2^31 - 1 pages of " + std::to_string(page_size) + " tokens");
    return visit_one_tier<store::paged<T>, exec::host>(
        name, c, [&]<class M>(typename M::params p) -> std::unique_ptr<any_kv_method<T>> {
          auto st = std::make_unique<store::paged<T>>(c.shape, c.requests, page_size,
                                                      static_cast<int>(pages));
          return std::make_unique<erased_method<M>>(name, std::move(st), std::move(p));
        });
  };
}

// A token-budget method whose resident KV after the prompt is its budget per head-sequence.
inline method_config budget_for_fraction(method_config c, double fraction) {
  c.budget = std::max(1, static_cast<int>(std::lround(fraction * c.prompt_len)));
  c.note = "B=" + std::to_string(c.budget);
  return c;
}

inline std::string short_number(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", x);
  return b;
}

// Runs `check` (a can_implement); a kvsift::error it throws comes back as one whose message
// starts with "infeasible: " (the parameters a resident fraction asks for cannot be met with
// these roles), so a table can say so and go on.
template <class F>
void check_feasible(std::string_view method, F&& check) {
  try {
    check();
  } catch (const error& e) {
    throw error("infeasible: " + std::string(method) + " at this resident fraction: " + e.what());
  }
}

// FreeKV's dense layers [0, D) in the registry, for its factory and its resident-fraction hook
// alike. METHODS.md's default is one dense layer ([0, 1)); the registry keeps at least one layer
// sparse, because a FreeKV with every layer dense retrieves nothing (it is full_kv): unset, D =
// min(1, L - 1), so a one-layer model has no dense layer; set ("dense_layers"), D must be an
// integer in [0, L - 1].
inline int freekv_dense_layers(const method_config& c) {
  c.shape.validate("method_registry: freekv");
  const int most = c.shape.layers - 1;
  return c.integer_option("dense_layers", std::min(1, most), 0, most);
}

// FreeKV's params from a config: B = c.budget in whole pages of p (option "page_size", default
// 16 for short prompts), tau (option "tau", the paper's 0.8), dense layers from
// freekv_dense_layers; sink = window = B/4 in whole pages (freekv_params).
template <Element T>
typename freekv<T>::params freekv_params_of(const method_config& c) {
  auto p = freekv_params<T>(c.budget, c.integer_option("page_size", 16, 1), c.option("tau", 0.8),
                            freekv_dense_layers(c));
  p.far = c.far;
  return p;
}

template <Element T>
typename synckv<T>::params synckv_params_of(const method_config& c) {
  require(!c.synckv_roles.empty(), "method_registry: synckv", "synckv_roles", "none",
          "head roles (a SyncKV head-roles file, kvsift calibrate --method synckv)");
  typename synckv<T>::params p;
  p.clusters = c.synckv_roles.front().clusters();
  p.stride = c.integer_option("stride", p.stride, 1);
  p.rho = c.option("static_share", p.rho);
  p.memory_fraction = c.option("memory_fraction", p.memory_fraction);
  p.roles = c.synckv_roles;
  p.far = c.far;
  return p;
}

template <Element T>
typename heterocache<T>::params heterocache_params_of(const method_config& c) {
  require(!c.heterocache_roles.empty(), "method_registry: heterocache", "heterocache_roles",
          "none", "head roles (a HeteroCache head-roles file, kvsift calibrate --method heterocache)");
  typename heterocache<T>::params p;
  p.tau_drift = c.option("tau_drift", p.tau_drift);
  p.drift_window = c.integer_option("drift_window", p.drift_window, 1);
  p.rho = c.option("rho", p.rho);
  p.kernel = c.integer_option("kernel", p.kernel, 1);
  struct file_view {
    const std::vector<method_config::heterocache_layer>& layers;
  };
  p.roles = heterocache<T>::roles_from(file_view{c.heterocache_roles});
  p.far = c.far;
  return p;
}

}  // namespace detail

// HeteroCache roles for method_config::heterocache_roles from a roles file
// (calibrate::heterocache_roles, or any type whose layers[l] has roles, leader, stability).
template <class Roles>
std::vector<method_config::heterocache_layer> heterocache_roles_of(const Roles& file) {
  std::vector<method_config::heterocache_layer> out;
  for (const auto& l : file.layers) {
    out.push_back({std::vector<calibrate::head_role>(l.roles.begin(), l.roles.end()),
                   std::vector<std::int32_t>(l.leader.begin(), l.leader.end()),
                   std::vector<float>(l.stability.begin(), l.stability.end())});
  }
  return out;
}

// THE registration point: one entry per named method, in the order tables list them. A method
// over another store (store::tiered for SyncKV, HeteroCache, FreeKV) builds its own store in
// `make` from c.shape, c.requests and c.capacity, reads its knobs from c.options / c.roles_file,
// and states its resident-fraction parameter in `for_resident_fraction`.
template <Element T>
std::vector<method_entry<T>> builtin_method_entries() {
  using detail::budget_for_fraction;
  const auto dense = [](const char* name) { return detail::make_dense<T>(name); };
  std::vector<method_entry<T>> e;
  e.push_back({"full_kv", dense("full_kv"), {}});
  e.push_back({"streaming_llm", dense("streaming_llm"), budget_for_fraction});
  e.push_back({"h2o", dense("h2o"), budget_for_fraction});
  e.push_back({"snapkv", dense("snapkv"), budget_for_fraction});
  e.push_back({"pyramidkv", dense("pyramidkv"), budget_for_fraction});
  // Quest keeps the whole cache resident and reads `budget` tokens' pages per step.
  e.push_back({"quest", dense("quest"), {}});
  e.push_back({"lagkv", dense("lagkv"),
               // LagKV has no token budget: its resident KV is set by the kept share of each lag
               // partition. The paper's lag (128) first, then shorter lags when a prompt is too
               // short for 128 to reach the fraction (the last full partition stays raw).
               [](method_config c, double fraction) {
                 const int sink = c.integer_option("sink", 16, 0);
                 const int n = c.prompt_len;
                 const double target = fraction * n;
                 int best_lag = 128, best_keep = 64;
                 double best_err = 1e300;
                 for (int lag : {128, 64, 32, 16, 8}) {
                   for (int keep = 1; keep <= lag; ++keep) {
                     const double err = std::abs(detail::lagkv_resident(n, sink, lag, keep) - target);
                     if (err < best_err - 1e-9) {
                       best_err = err;
                       best_lag = lag;
                       best_keep = keep;
                     }
                   }
                   if (best_err <= 0.02 * n) break;  // within 2%: keep the longest lag
                 }
                 c.options["lag"] = best_lag;
                 c.options["keep_fraction"] = static_cast<double>(best_keep) / best_lag;
                 c.note = "lag " + std::to_string(best_lag) + ", keep " + std::to_string(best_keep);
                 return c;
               }});
  e.push_back({"dynamickv", dense("dynamickv"), budget_for_fraction});
  // FreeKV over store::tiered (it builds its own): B whole pages of p (option "page_size",
  // default 16 for short prompts), sink = window = B/4 in whole pages (freekv_params); dense
  // layers from detail::freekv_dense_layers, which the factory and the hook share.
  e.push_back({"freekv", [](const method_config& c) {
                 auto p = detail::freekv_params_of<T>(c);
                 auto st = std::make_unique<store::tiered<T>>(c.shape, c.requests, c.capacity,
                                                              p.page_size);
                 return std::make_unique<erased_method<freekv<T>>>("freekv", std::move(st),
                                                                   std::move(p));
               },
               // dense layers keep the whole prompt: the sparse layers make up the rest
               [](method_config c, double fraction) {
                 const int p = c.integer_option("page_size", 16, 1);
                 const int L = c.shape.layers;
                 const int D = detail::freekv_dense_layers(c);  // < L: one layer at least is sparse
                 const double share = std::max(0.0, (fraction * L - D) / (L - D));
                 c.budget = freekv_budget_for_resident(share * c.prompt_len, c.prompt_len, p);
                 c.note = "B=" + std::to_string(c.budget);
                 return c;
               }});
  // SyncKV over store::tiered (it builds its own; rows move singly): paper defaults N_r = 2,
  // m = 5, static share 0.5 (option "static_share"), M = 0.3 (option "memory_fraction"); roles
  // from c.synckv_roles (their cluster count is N_r). --match resident sets M: the resident KV
  // after the prompt is N_R n + (N - N_R) k <= M N n; M < N_R / N is infeasible.
  e.push_back({"synckv", [](const method_config& c) {
                 auto st = std::make_unique<store::tiered<T>>(c.shape, c.requests, c.capacity);
                 return std::make_unique<erased_method<synckv<T>>>(
                     "synckv", std::move(st), detail::synckv_params_of<T>(c));
               },
               [](method_config c, double fraction) {
                 c.options["memory_fraction"] = fraction;
                 const auto p = detail::synckv_params_of<T>(c);  // no roles: an error, not infeasible
                 detail::check_feasible("synckv", [&] { synckv<T>::can_implement(c.shape, p); });
                 c.note = "M=" + detail::short_number(fraction);
                 return c;
               }});
  // HeteroCache over store::tiered (it builds its own): METHODS.md defaults (tau_drift 0.5, W = 5,
  // kernel 5, rho 0.5: option "rho"); roles from c.heterocache_roles. --match resident sets
  // rho: the resident KV after the prompt is F n + sum(cap) <= rho N n; rho < F / N (F volatile
  // + pivot heads) is infeasible.
  e.push_back({"heterocache", [](const method_config& c) {
                 auto st = std::make_unique<store::tiered<T>>(c.shape, c.requests, c.capacity);
                 return std::make_unique<erased_method<heterocache<T>>>(
                     "heterocache", std::move(st), detail::heterocache_params_of<T>(c));
               },
               [](method_config c, double fraction) {
                 c.options["rho"] = fraction;
                 const auto p = detail::heterocache_params_of<T>(c);  // no roles: an error, not infeasible
                 detail::check_feasible("heterocache", [&] { heterocache<T>::can_implement(c.shape, p); });
                 c.note = "rho=" + detail::short_number(fraction);
                 return c;
               }});
  // Register new methods here, e.g.
  //   e.push_back({"name", [](const method_config& c) { ... store::tiered<T> ... }, hook});
  return e;
}

// `base`'s entries (names, order, resident-fraction hooks) with the one-tier built-in names' `make`
// replaced by the same composition over a store::paged<T> with pages of `page_size` tokens
// (detail::make_paged); the two-tier methods keep their store (store::tiered) and a user's own
// entries are kept as they are. `kvsift eval --store paged` runs on it.
template <Element T>
method_registry<T> method_registry_paged(const method_registry<T>& base, int page_size) {
  require(page_size > 0, "method_registry_paged", "page_size", page_size, "> 0 tokens");
  method_registry<T> out;
  for (const auto& name : base.names()) {
    method_entry<T> e = base.at(name);
    if (detail::is_one_tier_method(name)) e.make = detail::make_paged<T>(name, page_size);
    out.add(std::move(e));
  }
  return out;
}

// `base` with every entry built under the far-tier policy `far` (method_config::far: the two-tier
// methods read it, the others ignore it). `kvsift eval --far` runs on it.
template <Element T>
method_registry<T> method_registry_far(const method_registry<T>& base, far_tier far) {
  method_registry<T> out;
  for (const auto& name : base.names()) {
    method_entry<T> e = base.at(name);
    e.make = [make = std::move(e.make), far](const method_config& c) {
      method_config with = c;
      with.far = far;
      return make(with);
    };
    out.add(std::move(e));
  }
  return out;
}

// The registry of the named methods (built once).
template <Element T>
const method_registry<T>& default_method_registry() {
  static const method_registry<T> r = [] {
    method_registry<T> x;
    for (auto& e : builtin_method_entries<T>()) x.add(std::move(e));
    return x;
  }();
  return r;
}

}  // namespace kvsift
