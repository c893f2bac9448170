// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>

namespace kvsift {

// Thrown for every invalid input at a public entry point. The message names the argument, the
// value received and what was expected; no store has been modified when it is thrown.
class error : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

namespace detail {

template <class V>
[[nodiscard]] std::string describe_value(const V& value) {
  std::ostringstream os;
  if constexpr (std::is_same_v<V, bool>) {
    os << (value ? "true" : "false");
  } else {
    os << value;
  }
  return os.str();
}

}  // namespace detail

// Builds "kvsift: <where>: argument '<arg>' = <value>, expected <expected>".
template <class V>
[[nodiscard]] error make_error(std::string_view where, std::string_view arg, const V& value,
                               std::string_view expected) {
  std::string msg = "kvsift: ";
  msg += where;
  msg += ": argument '";
  msg += arg;
  msg += "' = ";
  msg += detail::describe_value(value);
  msg += ", expected ";
  msg += expected;
  return error(msg);
}

// Validates at an API boundary: throws make_error(...) unless `ok`.
template <class V>
void require(bool ok, std::string_view where, std::string_view arg, const V& value,
             std::string_view expected) {
  if (!ok) {
    throw make_error(where, arg, value, expected);
  }
}

}  // namespace kvsift
