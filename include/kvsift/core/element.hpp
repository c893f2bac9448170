// SPDX-License-Identifier: Apache-2.0
#pragma once

// Element types for KV storage: float, half (IEEE binary16) and bfloat16. They are storage
// formats only; every computation converts to float. Conversions from float round to nearest,
// ties to even, exactly as the hardware converts; NaN stays NaN, overflow becomes infinity.

#include <kvsift/core/config.hpp>

#include <bit>
#include <cstdint>
#include <string_view>
#include <type_traits>

namespace kvsift {

namespace detail {

KVSIFT_HOST_DEVICE inline std::uint32_t float_bits(float f) {
  std::uint32_t u;
  __builtin_memcpy(&u, &f, sizeof u);
  return u;
}

KVSIFT_HOST_DEVICE inline float bits_float(std::uint32_t u) {
  float f;
  __builtin_memcpy(&f, &u, sizeof f);
  return f;
}

KVSIFT_HOST_DEVICE inline std::uint16_t float_to_half_bits(float f) {
  const std::uint32_t x = float_bits(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or nan
    return static_cast<std::uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
  }
  if (abs >= 0x477ff000u) {  // rounds to >= 65520: overflow to infinity
    return static_cast<std::uint16_t>(sign | 0x7c00u);
  }
  if (abs < 0x38800000u) {  // subnormal half (or zero): scale into the integer grid of 2^-24
    // value / 2^-24, rounded to nearest even; exact in float because of the magic addition
    const float magic = bits_float(0x4b000000u);  // 2^23: forces rounding at unit 1
    const float scaled = bits_float(abs) * bits_float(0x4b800000u);  // * 2^24
    const std::uint32_t r = float_bits(scaled + magic) - 0x4b000000u;
    return static_cast<std::uint16_t>(sign | r);
  }
  // normal: rebias exponent, round mantissa 23 -> 10 bits to nearest even
  std::uint32_t m = abs + 0xc8000000u;  // exponent - 112
  m += 0x0fffu + ((m >> 13) & 1u);
  return static_cast<std::uint16_t>(sign | (m >> 13));
}

KVSIFT_HOST_DEVICE inline float half_bits_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  const std::uint32_t man = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: man * 2^-24
    const float v = static_cast<float>(man) * bits_float(0x33800000u);
    return bits_float(float_bits(v) | sign);
  }
  if (exp == 31) {
    return bits_float(sign | 0x7f800000u | (man << 13));
  }
  return bits_float(sign | ((exp + 112u) << 23) | (man << 13));
}

KVSIFT_HOST_DEVICE inline std::uint16_t float_to_bfloat16_bits(float f) {
  const std::uint32_t x = float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) {  // nan: keep it quiet
    return static_cast<std::uint16_t>((x >> 16) | 0x40u);
  }
  const std::uint32_t rounded = x + 0x7fffu + ((x >> 16) & 1u);
  return static_cast<std::uint16_t>(rounded >> 16);
}

}  // namespace detail

// IEEE-754 binary16 storage type.
struct half {
  std::uint16_t bits = 0;
  half() = default;
  KVSIFT_HOST_DEVICE explicit half(float f) : bits(detail::float_to_half_bits(f)) {}
  KVSIFT_HOST_DEVICE explicit operator float() const { return detail::half_bits_to_float(bits); }
  KVSIFT_HOST_DEVICE static half from_bits(std::uint16_t b) {
    half h;
    h.bits = b;
    return h;
  }
  friend bool operator==(half a, half b) = default;
};

// bfloat16 storage type: the upper 16 bits of a binary32.
struct bfloat16 {
  std::uint16_t bits = 0;
  bfloat16() = default;
  KVSIFT_HOST_DEVICE explicit bfloat16(float f) : bits(detail::float_to_bfloat16_bits(f)) {}
  KVSIFT_HOST_DEVICE explicit operator float() const {
    return detail::bits_float(static_cast<std::uint32_t>(bits) << 16);
  }
  KVSIFT_HOST_DEVICE static bfloat16 from_bits(std::uint16_t b) {
    bfloat16 h;
    h.bits = b;
    return h;
  }
  friend bool operator==(bfloat16 a, bfloat16 b) = default;
};

static_assert(sizeof(half) == 2 && sizeof(bfloat16) == 2);

// An element type kvsift stores KV in.
template <class T>
concept Element = std::is_same_v<T, float> || std::is_same_v<T, half> ||
                  std::is_same_v<T, bfloat16>;

namespace detail {
// Whether row[0, n) holds only finite numbers, from the bits: a value is NaN or infinite exactly
// when its exponent field is all ones, and then adding the exponent's lowest bit to the field
// carries into the sign bit. One OR over every element's carry, no branch and no compare: the
// scan vectorises on any x86-64. The boundary checks run it on every step (method/lifecycle.hpp,
// validate_finite) before searching element by element only to name an offender.
template <class T>
bool all_finite(const T* row, int n) {
  if constexpr (std::is_same_v<T, float>) {
    std::uint32_t carry = 0;
    for (int j = 0; j < n; ++j) carry |= (float_bits(row[j]) & 0x7f800000u) + 0x00800000u;
    return (carry & 0x80000000u) == 0;
  } else {  // half (exponent 0x7c00) or bfloat16 (0x7f80): the 16-bit pattern
    constexpr std::uint16_t exponent = std::is_same_v<T, half> ? 0x7c00u : 0x7f80u;
    constexpr std::uint16_t lowest = exponent & -exponent;
    std::uint16_t carry = 0;
    for (int j = 0; j < n; ++j) carry |= static_cast<std::uint16_t>((row[j].bits & exponent) + lowest);
    return (carry & 0x8000u) == 0;
  }
}
// Whether row[0, n) holds a NaN, from the bits: a NaN's magnitude bits exceed +inf's, so
// subtracting them from +inf's borrows into the top bit. One OR, no branch per element.
inline bool any_nan(const float* row, int n) {
  std::uint32_t borrow = 0;
  for (int j = 0; j < n; ++j) borrow |= 0x7f800000u - (float_bits(row[j]) & 0x7fffffffu);
  return (borrow >> 31) != 0;
}
}  // namespace detail

template <Element T>
KVSIFT_HOST_DEVICE inline float to_float(T x) {
  return static_cast<float>(x);
}

template <Element T>
KVSIFT_HOST_DEVICE inline T from_float(float x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else {
    return T(x);
  }
}

template <Element T>
inline constexpr std::string_view element_name = std::is_same_v<T, float> ? "f32"
                                                 : std::is_same_v<T, half> ? "f16"
                                                                           : "bf16";

}  // namespace kvsift
