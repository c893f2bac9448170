// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

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

namespace detail {
// The throw, out of line of the check, so a passing require() costs a branch and nothing else.
template <class V>
[[noreturn, gnu::cold, gnu::noinline]] void fail(std::string_view where, std::string_view arg,
                                                 const V& value, std::string_view expected) {
  throw make_error(where, arg, value, expected);
}
}  // namespace detail

// Validates at an API boundary: throws make_error(...) unless `ok`. `expected` is a text, or a
// callable returning one (`[&] { return "in [0, " + std::to_string(n) + ")"; }`) that runs only
// when the check fails: hot paths (decode, append) build no message unless they throw.
template <class V>
void require(bool ok, std::string_view where, std::string_view arg, const V& value,
             std::string_view expected) {
  if (!ok) [[unlikely]] {
    detail::fail(where, arg, value, expected);
  }
}
template <class V, class Expected>
  requires std::invocable<Expected&> &&
           std::convertible_to<std::invoke_result_t<Expected&>, std::string>
void require(bool ok, std::string_view where, std::string_view arg, const V& value,
             Expected&& expected) {
  if (!ok) [[unlikely]] {
    const std::string text = expected();
    detail::fail(where, arg, value, text);
  }
}
// Both `arg` (an indexed name, say) and `expected` built only on failure.
template <class V, class Arg, class Expected>
  requires std::invocable<Arg&> && std::convertible_to<std::invoke_result_t<Arg&>, std::string> &&
           std::invocable<Expected&> &&
           std::convertible_to<std::invoke_result_t<Expected&>, std::string>
void require(bool ok, std::string_view where, Arg&& arg, const V& value, Expected&& expected) {
  if (!ok) [[unlikely]] {
    const std::string a = arg();
    const std::string text = expected();
    detail::fail(where, a, value, text);
  }
}

// Original positions are int32: `tokens` tokens from `first_position` on (the next one at
// first_position + tokens) must fit, or the append is an error, never a wrapped position.
inline void require_positions_fit(std::string_view where, std::string_view arg,
                                  std::int32_t first_position, std::int64_t tokens) {
  require(tokens >= 0 && first_position <= std::numeric_limits<std::int32_t>::max() - tokens, where,
          arg, first_position, [&] {
            return "<= INT32_MAX - " + std::to_string(tokens) +
                   " (int32 positions: the token after these must have a position too)";
          });
}

// The product of `factors` when every one is >= 0 and the product is <= `limit`; std::nullopt
// otherwise. Each multiplication is checked before it is done, so nothing wraps: for the sizes a
// constructor allocates from a shape, where a wrapped product would build a store too small for
// it. `limit` is usually max_allocation_bytes with sizeof(T) among the factors.
template <std::integral... N>
[[nodiscard]] constexpr std::optional<std::uint64_t> checked_product(std::uint64_t limit,
                                                                     N... factors) {
  if ((std::cmp_less(factors, 0) || ...)) return std::nullopt;
  if (((factors == 0) || ...)) return 0;
  std::uint64_t p = 1;
  const auto times = [&](std::uint64_t f) {
    if (p > limit / f) return false;
    p *= f;
    return true;
  };
  if (!(times(static_cast<std::uint64_t>(factors)) && ...)) return std::nullopt;
  return p;
}

// The most bytes one array can have (std::vector's and pointer arithmetic's limit).
inline constexpr std::uint64_t max_allocation_bytes =
    static_cast<std::uint64_t>(std::numeric_limits<std::ptrdiff_t>::max());

}  // namespace kvsift
