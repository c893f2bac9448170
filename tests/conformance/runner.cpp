// SPDX-License-Identifier: Apache-2.0
// kvsift-conformance DIR [--backend cpu|thrust|cuda] [--kinds K1,K2,...] [--ids ID1,ID2,...]
// kvsift-conformance --list-kinds [--backend cpu|thrust|cuda]
// Runs the selected cases of DIR/INDEX.json through the registered handlers (SPEC §4). DIR is any
// directory of cases: ctest passes the in-tree copy tests/conformance/vectors/cases (CMake cache
// variable KVSIFT_CONFORMANCE_DIR), ../shared/conformance/cases works as well.
// --backend picks whose handlers run (runner.hpp); cpu, the default, prints SPEC §4's summary
// unchanged. Another backend runs only its own handlers, lists the kinds it has no path for and
// counts their cases apart ("N passed, M failed, K no thrust path"); they never pass.

#include "runner.hpp"

#include <kvsift/core/error.hpp>

#include <bit>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <set>
#include <sstream>

namespace kvsift::conformance {
namespace fs = std::filesystem;

// ---- API -----------------------------------------------------------------------------------

std::int64_t tensor::numel() const {
  std::int64_t n = 1;
  for (const std::int64_t s : shape) {
    n *= s;
  }
  return n;
}

std::int64_t tensor::dim(std::size_t i) const {
  if (i >= shape.size()) {
    throw runner_error("dim " + std::to_string(i) + " of a rank-" + std::to_string(shape.size()) +
                       " tensor");
  }
  return shape[i];
}

const tensor& case_data::in(std::string_view name) const {
  const auto it = inputs.find(std::string(name));
  if (it == inputs.end()) {
    throw runner_error("missing input '" + std::string(name) + "'");
  }
  return it->second;
}

bool case_data::has_input(std::string_view name) const {
  return inputs.contains(std::string(name));
}

bool case_data::has_param(std::string_view name) const {
  return params.is_object() && params.contains(name);
}

namespace {
const nlohmann::json& param(const case_data& c, std::string_view name,
                            bool ok(const nlohmann::json&), const char* what) {
  if (!c.has_param(name)) {
    throw runner_error("missing param '" + std::string(name) + "'");
  }
  const nlohmann::json& v = c.params.at(std::string(name));
  if (!ok(v)) {
    throw runner_error("param '" + std::string(name) + "' = " + v.dump() + " is not " + what);
  }
  return v;
}
}  // namespace

double case_data::param_d(std::string_view name) const {
  const auto number = [](const nlohmann::json& v) { return v.is_number(); };
  return param(*this, name, number, "a number").get<double>();
}

std::int64_t case_data::param_i(std::string_view name) const {
  const auto integral = [](const nlohmann::json& v) {
    return v.is_number_integer() ||
           (v.is_number_float() && std::trunc(v.get<double>()) == v.get<double>());
  };
  const nlohmann::json& v = param(*this, name, integral, "an integer");
  return v.is_number_integer() ? v.get<std::int64_t>() : static_cast<std::int64_t>(v.get<double>());
}

std::string case_data::param_s(std::string_view name) const {
  const auto string = [](const nlohmann::json& v) { return v.is_string(); };
  return param(*this, name, string, "a string").get<std::string>();
}

namespace {
template <class T>
tensor make_tensor(const std::string& name, const char* dtype, std::vector<std::int64_t> shape,
                   std::vector<T> values) {
  tensor t{dtype, std::move(shape), {}, {}};
  if (t.numel() < 0 || static_cast<std::size_t>(t.numel()) != values.size()) {
    throw runner_error("output '" + name + "' has " + std::to_string(values.size()) +
                       " values for " + std::to_string(t.numel()) + " elements");
  }
  if constexpr (std::is_same_v<T, float>) {
    t.f32 = std::move(values);
  } else {
    t.i32 = std::move(values);
  }
  return t;
}
}  // namespace

void outputs::put_f32(const std::string& name, std::vector<std::int64_t> shape,
                      std::vector<float> values) {
  produced_[name] = make_tensor(name, "f32", std::move(shape), std::move(values));
}

void outputs::put_i32(const std::string& name, std::vector<std::int64_t> shape,
                      std::vector<std::int32_t> values) {
  produced_[name] = make_tensor(name, "i32", std::move(shape), std::move(values));
}

const char* backend_name(backend b) {
  switch (b) {
    case backend::cpu: return "cpu";
    case backend::thrust: return "thrust";
    case backend::cuda: return "cuda";
  }
  return "?";
}

std::map<std::string, handler>& registry(backend b) {
  static std::map<backend, std::map<std::string, handler>> handlers;
  return handlers[b];
}

registrar::registrar(std::string kind, handler h) : registrar(backend::cpu, std::move(kind), std::move(h)) {}

registrar::registrar(backend b, std::string kind, handler h) {
  if (!registry(b).emplace(kind, std::move(h)).second) {
    std::fprintf(stderr, "kvsift-conformance: kind '%s' registered twice for backend %s\n",
                 kind.c_str(), backend_name(b));
    std::abort();
  }
}

std::map<backend, std::string>& available_backends() {
  static std::map<backend, std::string> backends{{backend::cpu, "cpu (the reference backend)"}};
  return backends;
}

std::map<backend, std::function<std::string()>>& backend_probes() {
  static std::map<backend, std::function<std::string()>> probes;
  return probes;
}

backend_available::backend_available(backend b, std::string description,
                                     std::function<std::string()> unusable) {
  available_backends()[b] = std::move(description);
  if (unusable) {
    backend_probes()[b] = std::move(unusable);
  }
}

// ---- loading -------------------------------------------------------------------------------

namespace {

nlohmann::ordered_json read_json(const fs::path& path) {
  std::ifstream f(path);
  if (!f) {
    throw runner_error("cannot open " + path.string());
  }
  try {
    return nlohmann::ordered_json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    throw runner_error(path.string() + ": " + e.what());
  }
}

std::string shape_str(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    s += i ? ", " : "";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

tensor read_tensor(const fs::path& dir, const std::string& name, const nlohmann::ordered_json& j) {
  tensor t{
      j.at("dtype").get<std::string>(), j.at("shape").get<std::vector<std::int64_t>>(), {}, {}};
  if (t.dtype != "f32" && t.dtype != "i32") {
    throw runner_error(name + ": unknown dtype '" + t.dtype + "'");
  }
  const fs::path path = dir / j.at("file").get<std::string>();
  std::error_code ec;
  const std::uintmax_t bytes = fs::file_size(path, ec);
  if (ec) {
    throw runner_error(name + ": cannot read " + path.string() + ": " + ec.message());
  }
  const std::int64_t n = t.numel();
  if (n < 0 || bytes != 4 * static_cast<std::uintmax_t>(n)) {
    throw runner_error(name + ": " + path.filename().string() + " has " + std::to_string(bytes) +
                       " bytes, shape " + shape_str(t.shape) + " needs 4*" + std::to_string(n));
  }
  static_assert(std::endian::native == std::endian::little, "tensor files are little-endian");
  const auto read_into = [&](auto& values) {
    values.resize(static_cast<std::size_t>(n));
    std::ifstream f(path, std::ios::binary);
    if (n > 0 &&
        !f.read(reinterpret_cast<char*>(values.data()), static_cast<std::streamsize>(bytes))) {
      throw runner_error(name + ": short read from " + path.string());
    }
  };
  t.dtype == "f32" ? read_into(t.f32) : read_into(t.i32);
  return t;
}

case_data load_case(const fs::path& dir) {
  const nlohmann::ordered_json j = read_json(dir / "case.json");
  case_data c;
  c.id = j.at("id").get<std::string>();
  c.kind = j.at("kind").get<std::string>();
  c.params = nlohmann::json(j.value("params", nlohmann::ordered_json::object()));
  c.expect_error = j.value("expect_error", false);
  if (j.contains("tolerance")) {
    c.rtol = j["tolerance"].value("rtol", 0.0);
    c.atol = j["tolerance"].value("atol", 0.0);
  }
  const auto inputs = j.value("inputs", nlohmann::ordered_json::object());
  const auto expected = j.value("expected", nlohmann::ordered_json::object());
  for (const auto& [name, t] : inputs.items()) {
    c.inputs.emplace(name, read_tensor(dir, name, t));
  }
  for (const auto& [name, t] : expected.items()) {
    c.expected.emplace(name, read_tensor(dir, name, t));
    c.expected_order.push_back(name);
  }
  return c;
}

// ---- comparing -----------------------------------------------------------------------------

template <class T> std::string num(T v) {  // shortest round-trip form: 0.00218, 1e-06, 204
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

std::string index_str(const std::string& name, const std::vector<std::int64_t>& shape,
                      std::int64_t flat) {
  std::vector<std::int64_t> idx(shape.size());
  for (std::size_t d = shape.size(); d-- > 0;) {
    idx[d] = flat % shape[d];
    flat /= shape[d];
  }
  std::string s = name + "[";
  for (std::size_t d = 0; d < idx.size(); ++d) {
    s += d ? "," : "";
    s += std::to_string(idx[d]);
  }
  return s + "]";
}

// The first mismatch between the produced and the expected tensors, or nullopt.
std::optional<std::string> compare(const case_data& c, const outputs& out) {
  for (const std::string& name : c.expected_order) {
    const tensor& exp = c.expected.at(name);
    const auto it = out.all().find(name);
    if (it == out.all().end()) {
      return name + " not produced";
    }
    const tensor& got = it->second;
    if (got.dtype != exp.dtype) {
      return name + " dtype " + got.dtype + ", expected " + exp.dtype;
    }
    if (got.shape != exp.shape) {
      return name + " shape " + shape_str(got.shape) + ", expected " + shape_str(exp.shape);
    }
    for (std::int64_t i = 0; i < exp.numel(); ++i) {
      const auto k = static_cast<std::size_t>(i);
      if (exp.dtype == "i32" && got.i32[k] != exp.i32[k]) {
        return index_str(name, exp.shape, i) + " expected " + num(exp.i32[k]) + " got " +
               num(got.i32[k]);
      }
      if (exp.dtype == "f32") {
        const double e = exp.f32[k], g = got.f32[k];
        if (!(std::abs(g - e) <= c.atol + c.rtol * std::abs(e))) {  // NaN fails here
          return index_str(name, exp.shape, i) + " expected " + num(exp.f32[k]) + " got " +
                 num(got.f32[k]) + " (tol " + num(c.atol) + " + " + num(c.rtol) + "*|exp|)";
        }
      }
    }
  }
  return std::nullopt;
}

std::string describe_current_exception() {
  try {
    throw;
  } catch (const kvsift::error& e) {
    return std::string("threw kvsift::error: ") + e.what();
  } catch (const runner_error& e) {
    return std::string("runner error: ") + e.what();
  } catch (const std::exception& e) {
    return std::string("threw std::exception: ") + e.what();
  } catch (...) {
    return "threw a non-standard exception";
  }
}

// Runs one case through `h`; returns the failure message, or nullopt when it passes.
std::optional<std::string> run_case(const fs::path& dir, const handler& h) {
  case_data c;
  try {
    c = load_case(dir);
  } catch (...) {
    return "cannot load case: " + describe_current_exception();
  }
  outputs out;
  try {
    h(c, out);
  } catch (const kvsift::error&) {
    if (c.expect_error) {
      return std::nullopt;
    }
    return describe_current_exception();
  } catch (...) {
    return (c.expect_error ? "expected kvsift::error, " : "") + describe_current_exception();
  }
  if (c.expect_error) {
    return "expected kvsift::error, nothing thrown";
  }
  return compare(c, out);
}

// ---- command line --------------------------------------------------------------------------

// A comma-separated list; empty items are dropped, so "" selects nothing.
std::set<std::string> split_list(const std::string& s) {
  std::set<std::string> items;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) {
    if (!item.empty()) {
      items.insert(item);
    }
  }
  return items;
}

int usage() {
  std::cerr << "usage: kvsift-conformance DIR [--backend cpu|thrust|cuda] [--kinds K1,K2,...] [--ids ID1,ID2,...]\n"
               "       kvsift-conformance --list-kinds [--backend cpu|thrust|cuda]\n"
               "  DIR: a directory of cases, e.g. tests/conformance/vectors/cases\n"
               "  --backend: whose handlers run the cases (default cpu). A kind with no handler for\n"
               "    the backend is not run and is counted as \"no <backend> path\", never as passed.\n"
               "  exit status: 0 all selected cases passed; 1 a case failed; 2 usage error or the\n"
               "    backend is not in this build; 3 none failed but some kinds have no path for the\n"
               "    backend; 4 the backend is built but cannot run here (cuda without a GPU)\n";
  return 2;
}

std::optional<backend> parse_backend(std::string_view s) {
  for (const backend b : {backend::cpu, backend::thrust, backend::cuda}) {
    if (s == backend_name(b)) return b;
  }
  return std::nullopt;
}

// The runners built from these sources, for the message naming where a backend lives.
const char* where_backend_lives(backend b) {
  switch (b) {
    case backend::thrust:
      return "the Thrust handlers are compiled into kvsift-conformance-thrust-cpp and "
             "kvsift-conformance-thrust-omp (CMake option KVSIFT_ENABLE_THRUST and CCCL 3.x)";
    case backend::cuda:
      return "the Thrust handlers under Thrust's CUDA system are compiled into "
             "kvsift-conformance-cuda (CMake option KVSIFT_ENABLE_CUDA, nvcc and CCCL 3.x)";
    case backend::cpu:
      break;
  }
  return "";
}

}  // namespace
}  // namespace kvsift::conformance

int main(int argc, char** argv) {
  namespace kc = kvsift::conformance;
  std::optional<std::string> dir;
  std::optional<std::set<std::string>> kinds, ids;
  kc::backend be = kc::backend::cpu;
  bool list_kinds = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--list-kinds") {
      list_kinds = true;
    } else if (arg == "--backend") {
      const auto b = i + 1 < argc ? kc::parse_backend(argv[++i]) : std::nullopt;
      if (!b) {
        std::cerr << "kvsift-conformance: --backend takes cpu, thrust or cuda\n";
        return kc::usage();
      }
      be = *b;
    } else if (arg == "--kinds" || arg == "--ids") {
      // A missing value (as when CMake expands an empty kind list) means an empty filter.
      const bool has_value = i + 1 < argc && std::string_view(argv[i + 1]).rfind("--", 0) != 0;
      (arg == "--kinds" ? kinds : ids) = kc::split_list(has_value ? argv[++i] : "");
    } else if (!arg.starts_with("--") && !dir) {
      dir = arg;
    } else {
      return kc::usage();
    }
  }
  const char* const bname = kc::backend_name(be);
  if (!kc::available_backends().contains(be)) {
    std::cerr << "kvsift-conformance: backend '" << bname
              << "' is not available in this runner; " << kc::where_backend_lives(be) << '\n';
    return 2;
  }
  const auto& handlers = kc::registry(be);
  if (list_kinds) {
    // stdout: the kinds this backend runs; stderr (not the CPU's): the kinds it has no path for
    for (const auto& [kind, h] : handlers) {
      std::cout << kind << '\n';
    }
    if (be != kc::backend::cpu) {
      std::cerr << "# backend: " << kc::available_backends().at(be) << '\n';
      for (const auto& [kind, h] : kc::registry(kc::backend::cpu)) {
        if (!handlers.contains(kind)) std::cerr << "# no " << bname << " path: " << kind << '\n';
      }
    }
    return 0;
  }
  if (!dir) {
    return kc::usage();
  }
  // running cases needs what the backend runs on (listing its kinds does not)
  if (const auto probe = kc::backend_probes().find(be); probe != kc::backend_probes().end()) {
    if (const std::string why = probe->second(); !why.empty()) {
      std::cerr << "kvsift-conformance: backend '" << bname << "' cannot run here: " << why
                << " (skipped)\n";
      return 4;
    }
  }

  int passed = 0, failed = 0, no_path = 0;
  std::map<std::string, int> no_path_kinds;  // kind -> selected cases not run
  try {
    const auto index = kc::read_json(kc::fs::path(*dir) / "INDEX.json");
    for (const auto& entry : index.at("cases")) {
      const auto id = entry.at("id").get<std::string>();
      const auto kind = entry.at("kind").get<std::string>();
      if ((kinds && !kinds->contains(kind)) || (ids && !ids->contains(id))) {
        continue;
      }
      const auto h = handlers.find(kind);
      std::optional<std::string> failure;
      if (h != handlers.end()) {
        failure = kc::run_case(kc::fs::path(*dir) / id, h->second);
      } else if (be != kc::backend::cpu && kc::registry(kc::backend::cpu).contains(kind)) {
        ++no_path;  // known kind, no handler of this backend: not run, not passed
        ++no_path_kinds[kind];
        continue;
      } else {
        failure = "no handler for kind";  // SPEC §4: an unknown kind is a failure
      }
      if (failure) {
        std::cout << "FAIL " << id << " (" << kind << "): " << *failure << '\n';
        ++failed;
      } else {
        ++passed;
      }
    }
  } catch (const std::exception& e) {
    std::cerr << "kvsift-conformance: " << *dir << "/INDEX.json: " << e.what() << '\n';
    return 1;
  }
  if (be == kc::backend::cpu) {
    std::cout << passed << " passed, " << failed << " failed\n";  // SPEC §4, unchanged
    return failed == 0 ? 0 : 1;
  }
  std::string upper(bname);
  for (char& ch : upper) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  for (const auto& [kind, n] : no_path_kinds) {
    std::cout << "NO " << upper << " PATH " << kind << ": " << n << (n == 1 ? " case" : " cases")
              << " not run\n";
  }
  std::cout << "backend " << kc::available_backends().at(be) << '\n';
  std::cout << passed << " passed, " << failed << " failed, " << no_path << " no " << bname
            << " path\n";
  return failed != 0 ? 1 : no_path != 0 ? 3 : 0;
}
