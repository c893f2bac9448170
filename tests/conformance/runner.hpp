// SPDX-License-Identifier: Apache-2.0
#pragma once

// The conformance runner's handler API (see shared/conformance/SPEC.md).
//
// Each kind family lives in its own tests/conformance/kinds_<family>.cpp, which registers one
// handler per kind with a static registrar:
//
//   namespace kc = kvsift::conformance;
//   const kc::registrar reg{"budget.fraction", [](const kc::case_data& c, kc::outputs& out) {
//     out.put_i32("budget", {1}, {compute(c.param_i("n"), c.param_d("keep_fraction"))});
//   }};
//
// A handler reads the case's params and inputs, calls the library and puts every expected
// output. The runner compares them (SPEC §4); for `expect_error` cases it only checks that
// the handler threw kvsift::error. Add the kind to tests/conformance/kinds.cmake so ctest runs it.
//
// Backends (`--backend cpu|thrust|cuda`). The registrar above registers the CPU handler. A
// handler for another backend is registered with the backend first:
//
//   const kc::registrar reg{kc::backend::thrust, "select.topk", [](...) { ... }};
//
// Thrust handlers live in tests/conformance/thrust/ and are compiled only into the Thrust runners
// (kvsift-conformance-thrust-cpp / -omp), which also mark the backend available with a
// kc::backend_available. A kind with no handler for the selected backend is never run through
// another backend's handler: the runner counts it as "no <backend> path". Every backend's outputs
// go through the same comparison (SPEC §4).

#include <kvsift/core/view.hpp>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace kvsift::conformance {

// A problem in the runner or a handler (missing param, bad file, wrong output size). It is
// deliberately not a kvsift::error, so it never satisfies an `expect_error` case.
struct runner_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// One tensor: `dtype` "f32" fills `f32`, "i32" fills `i32`; elements in C order.
struct tensor {
  std::string dtype;
  std::vector<std::int64_t> shape;
  std::vector<float> f32;
  std::vector<std::int32_t> i32;

  [[nodiscard]] std::int64_t numel() const;             // prod(shape); 1 for shape []
  [[nodiscard]] std::int64_t dim(std::size_t i) const;  // shape[i], runner_error if i >= rank
  [[nodiscard]] std::size_t rank() const { return shape.size(); }
};

// One loaded case. Accessors throw runner_error naming what is missing.
struct case_data {
  std::string id, kind;
  nlohmann::json params;
  std::map<std::string, tensor> inputs, expected;
  std::vector<std::string> expected_order;  // expected names as listed in case.json
  bool expect_error = false;
  double rtol = 0.0, atol = 0.0;

  [[nodiscard]] const tensor& in(std::string_view name) const;
  [[nodiscard]] bool has_input(std::string_view name) const;
  [[nodiscard]] bool has_param(std::string_view name) const;
  [[nodiscard]] double param_d(std::string_view name) const;        // any JSON number
  [[nodiscard]] std::int64_t param_i(std::string_view name) const;  // an integral number
  [[nodiscard]] std::string param_s(std::string_view name) const;   // a JSON string
};

// The tensors a handler produced. put_* throws runner_error unless values.size() == prod(shape).
class outputs {
 public:
  void put_f32(const std::string& name, std::vector<std::int64_t> shape, std::vector<float> values);
  void put_i32(const std::string& name, std::vector<std::int64_t> shape,
               std::vector<std::int32_t> values);
  [[nodiscard]] const std::map<std::string, tensor>& all() const { return produced_; }

 private:
  std::map<std::string, tensor> produced_;
};

using handler = std::function<void(const case_data&, outputs&)>;

enum class backend { cpu, thrust, cuda };
[[nodiscard]] const char* backend_name(backend b);

// kind -> handler of one backend (the CPU's by default). Registering a (kind, backend) twice
// aborts at start-up with a message.
[[nodiscard]] std::map<std::string, handler>& registry(backend b = backend::cpu);

struct registrar {
  registrar(std::string kind, handler h);  // the CPU handler
  registrar(backend b, std::string kind, handler h);
};

// Backends compiled into this runner, with a description ("thrust (THRUST_DEVICE_SYSTEM_CPP)").
// The CPU backend is always there; another is there only when something registers it.
[[nodiscard]] std::map<backend, std::string>& available_backends();

// `unusable`, when given, says why the backend cannot run on this machine (e.g. no GPU), or
// returns an empty string when it can; the runner then exits 4 (ctest: skipped).
struct backend_available {
  backend_available(backend b, std::string description,
                    std::function<std::string()> unusable = {});
};
[[nodiscard]] std::map<backend, std::function<std::string()>>& backend_probes();

// Helpers shared by the kind handlers.
inline int dim(const tensor& t, std::size_t i) { return static_cast<int>(t.dim(i)); }
inline int param(const case_data& c, const char* name) { return static_cast<int>(c.param_i(name)); }
// A [heads, tokens, d] array (the vectors' layout) as the token-major view the library takes.
inline kvsift::kv_view<const float, kvsift::nhd> head_major(const float* data, int heads,
                                                            int tokens, int d) {
  return {data, tokens, heads, d, d, static_cast<std::int64_t>(tokens) * d};
}

}  // namespace kvsift::conformance
