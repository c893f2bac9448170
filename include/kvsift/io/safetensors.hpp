// SPDX-License-Identifier: Apache-2.0
#pragma once

// safetensors reader and writer (https://huggingface.co/docs/safetensors): an 8-byte
// little-endian header length N, N bytes of JSON mapping each tensor name to
// {"dtype", "shape", "data_offsets": [begin, end)} (offsets relative to the data section that
// follows the header), an optional "__metadata__" object of string -> string, then the data.
//
// Reading: `safetensors_file::open(path)` reads the whole file into memory once and validates
// the header (every tensor's byte range lies inside the data section and matches
// dtype x shape). Tensors are then read by name: `raw(name)` gives the bytes,
// `to_float(name)` converts F32 / F16 / BF16 (exactly, through kvsift::half / bfloat16) and
// I32 to float, `to_int32(name)` reads I32. Every failure throws kvsift::error naming the
// file, the tensor, the value found and what was expected (missing tensor, unsupported dtype,
// truncated file, shape mismatch, malformed header).
//
// Writing: `write_safetensors(path, tensors, metadata)` with a name -> {dtype, shape, bytes}
// map; `make_tensor(values, shape, dtype)` converts floats into F32 / F16 / BF16 bytes.
// Tensors are written in name order, the header padded with spaces to a multiple of 8 bytes
// so that the data section is 8-byte aligned, as the Hugging Face writer does.
//
// Host only; no network. Needs nlohmann-json.

#include <kvsift/core/element.hpp>
#include <kvsift/core/error.hpp>

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvsift::io {

// Element types the reader converts. `other` is any dtype the header names that kvsift does not
// convert (F64, I64, U8, ...): such a tensor can be listed and read raw, not converted.
enum class dtype { f32, f16, bf16, i32, other };

// Size in bytes of one element (0 for `other`).
[[nodiscard]] constexpr std::size_t dtype_size(dtype t) noexcept {
  switch (t) {
    case dtype::f32:
    case dtype::i32:
      return 4;
    case dtype::f16:
    case dtype::bf16:
      return 2;
    case dtype::other:
      return 0;
  }
  return 0;
}

// The safetensors spelling ("F32", "F16", "BF16", "I32").
[[nodiscard]] constexpr std::string_view dtype_name(dtype t) noexcept {
  switch (t) {
    case dtype::f32:
      return "F32";
    case dtype::f16:
      return "F16";
    case dtype::bf16:
      return "BF16";
    case dtype::i32:
      return "I32";
    case dtype::other:
      return "other";
  }
  return "other";
}

[[nodiscard]] constexpr dtype parse_dtype(std::string_view s) noexcept {
  if (s == "F32") {
    return dtype::f32;
  }
  if (s == "F16") {
    return dtype::f16;
  }
  if (s == "BF16") {
    return dtype::bf16;
  }
  if (s == "I32") {
    return dtype::i32;
  }
  return dtype::other;
}

// Sizes in safetensors are unsigned 64-bit; kvsift keeps them as int64 for arithmetic.
using shape_t = std::vector<std::int64_t>;

[[nodiscard]] inline std::string shape_string(const shape_t& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) {
    out += (i ? ", " : "") + std::to_string(s[i]);
  }
  return out + "]";
}

// Elements of a shape. A negative extent or a product past INT64_MAX (a hostile header) is a
// kvsift::error, never a wrapped count.
[[nodiscard]] inline std::int64_t shape_numel(const shape_t& s) {
  std::int64_t n = 1;
  for (auto e : s) {
    if (e < 0 || (e > 0 && n > std::numeric_limits<std::int64_t>::max() / e)) [[unlikely]] {
      throw make_error("io::shape_numel", "shape", shape_string(s),
                       "non-negative extents whose product fits int64");
    }
    n *= e;
  }
  return n;
}

// One entry of a safetensors header.
struct tensor_info {
  std::string name;
  dtype type = dtype::other;
  std::string dtype_text;   // as written in the header, e.g. "F32" or "F64"
  shape_t shape;            // row-major extents; [] is a scalar
  std::size_t offset = 0;   // byte offset in the data section
  std::size_t nbytes = 0;   // byte length (== numel * dtype_size for convertible dtypes)
  [[nodiscard]] std::int64_t numel() const { return shape_numel(shape); }
};

// A tensor to write: element type, shape and its little-endian bytes.
struct tensor_data {
  dtype type = dtype::f32;
  shape_t shape;
  std::vector<std::byte> bytes;  // [numel(shape) * dtype_size(type)]
};

using tensor_map = std::map<std::string, tensor_data>;

namespace detail {

inline std::string where_file(std::string_view fn, const std::string& path) {
  std::string w = "io::";
  w += fn;
  w += " of file ";
  w += path;
  return w;
}

inline std::string tensor_arg(std::string_view name, std::string_view what) {
  std::string a = "tensor \"";
  a += name;
  a += "\"";
  if (!what.empty()) {
    a += " ";
    a += what;
  }
  return a;
}

// Little-endian loads (the format is little-endian; x86 and ARM Linux are too, but keep it
// explicit so a big-endian host would still read correctly).
inline std::uint16_t load_u16(const std::byte* p) noexcept {
  return static_cast<std::uint16_t>(std::to_integer<unsigned>(p[0]) |
                                    (std::to_integer<unsigned>(p[1]) << 8));
}

inline std::uint32_t load_u32(const std::byte* p) noexcept {
  return std::to_integer<std::uint32_t>(p[0]) | (std::to_integer<std::uint32_t>(p[1]) << 8) |
         (std::to_integer<std::uint32_t>(p[2]) << 16) |
         (std::to_integer<std::uint32_t>(p[3]) << 24);
}

inline void store_u32(std::byte* p, std::uint32_t v) noexcept {
  for (int i = 0; i < 4; ++i) {
    p[i] = static_cast<std::byte>((v >> (8 * i)) & 0xffu);
  }
}

inline void store_u16(std::byte* p, std::uint16_t v) noexcept {
  p[0] = static_cast<std::byte>(v & 0xffu);
  p[1] = static_cast<std::byte>((v >> 8) & 0xffu);
}

}  // namespace detail

// A safetensors file read into memory. Cheap to move; tensors are views into one buffer.
class safetensors_file {
 public:
  // The largest header read, as the reference implementation (safetensors' MAX_HEADER_SIZE):
  // a larger length field is a corrupt or hostile file, rejected before any parse.
  static constexpr std::uint64_t max_header_bytes = 100'000'000;

  // Reads and validates `path`. Throws kvsift::error if the file cannot be opened, is shorter
  // than its header says, has malformed JSON, or a tensor's byte range is out of bounds or
  // disagrees with its dtype and shape.
  [[nodiscard]] static safetensors_file open(const std::string& path) {
    std::ifstream in(path, std::ios::binary | std::ios::ate);
    require(static_cast<bool>(in), detail::where_file("safetensors_file::open", path), "path",
            path, "a readable file");
    const auto size = static_cast<std::streamoff>(in.tellg());
    std::vector<std::byte> buf(static_cast<std::size_t>(size));
    in.seekg(0);
    if (size > 0) {
      in.read(reinterpret_cast<char*>(buf.data()), size);
    }
    require(static_cast<bool>(in), detail::where_file("safetensors_file::open", path), "path",
            path, "a file that can be read to the end");
    return from_bytes(std::move(buf), path);
  }

  // Parses an in-memory image of a file; `path` only labels error messages.
  [[nodiscard]] static safetensors_file from_bytes(std::vector<std::byte> buf,
                                                   std::string path = "<memory>") {
    const std::string where = detail::where_file("safetensors_file::open", path);
    require(buf.size() >= 8, where, "file size", buf.size(),
            "at least 8 bytes (the header length); the file is truncated");
    std::uint64_t hlen = 0;
    for (int i = 7; i >= 0; --i) {
      hlen = (hlen << 8) | std::to_integer<std::uint64_t>(buf[static_cast<std::size_t>(i)]);
    }
    require(hlen <= max_header_bytes, where, "header length", hlen,
            "at most " + std::to_string(max_header_bytes) +
                " bytes (the safetensors format's header limit)");
    require(hlen <= buf.size() - 8, where, "header length", hlen,
            "at most the " + std::to_string(buf.size() - 8) +
                " bytes after the length field; the file is truncated");
    nlohmann::json header;
    try {
      header = nlohmann::json::parse(reinterpret_cast<const char*>(buf.data() + 8),
                                     reinterpret_cast<const char*>(buf.data() + 8 + hlen));
    } catch (const nlohmann::json::exception& e) {
      throw make_error(where, "header", std::string(e.what()), "a JSON object");
    }
    require(header.is_object(), where, "header", header.type_name(), "a JSON object");

    safetensors_file f;
    f.path_ = std::move(path);
    f.data_begin_ = 8 + static_cast<std::size_t>(hlen);
    const std::size_t data_size = buf.size() - f.data_begin_;
    for (auto it = header.begin(); it != header.end(); ++it) {
      const std::string& name = it.key();
      const nlohmann::json& e = it.value();
      if (name == "__metadata__") {
        require(e.is_object(), where, "__metadata__", e.dump(), "an object of strings");
        for (auto m = e.begin(); m != e.end(); ++m) {
          f.metadata_[m.key()] = m.value().is_string() ? m.value().get<std::string>()
                                                       : m.value().dump();
        }
        continue;
      }
      const bool well_formed = e.is_object() && e.contains("dtype") && e["dtype"].is_string() &&
                               e.contains("shape") && e["shape"].is_array() &&
                               e.contains("data_offsets") && e["data_offsets"].is_array() &&
                               e["data_offsets"].size() == 2 &&
                               e["data_offsets"][0].is_number_unsigned() &&
                               e["data_offsets"][1].is_number_unsigned();
      require(well_formed, where, detail::tensor_arg(name, "header entry"), e.dump(),
              "{\"dtype\": str, \"shape\": [int...], \"data_offsets\": [begin, end]}");
      tensor_info t;
      t.name = name;
      t.dtype_text = e["dtype"].get<std::string>();
      t.type = parse_dtype(t.dtype_text);
      for (const auto& d : e["shape"]) {
        require(d.is_number_unsigned(), where, detail::tensor_arg(name, "shape"), e["shape"].dump(),
                "non-negative integer extents");
        t.shape.push_back(static_cast<std::int64_t>(d.get<std::uint64_t>()));
      }
      const auto begin = e["data_offsets"][0].get<std::uint64_t>();
      const auto end = e["data_offsets"][1].get<std::uint64_t>();
      require(begin <= end, where, detail::tensor_arg(name, "data_offsets"),
              e["data_offsets"].dump(), "begin <= end");
      require(end <= data_size, where, detail::tensor_arg(name, "data_offsets"),
              e["data_offsets"].dump(),
              "an end within the data section of " + std::to_string(data_size) +
                  " bytes; the file is truncated");
      t.offset = static_cast<std::size_t>(begin);
      t.nbytes = static_cast<std::size_t>(end - begin);
      if (t.type != dtype::other) {
        const auto numel = static_cast<std::uint64_t>(t.numel());  // throws on overflow
        require(numel <= data_size / dtype_size(t.type), where, detail::tensor_arg(name, "shape"),
                shape_string(t.shape), [&] {
                  return "at most " + std::to_string(data_size / dtype_size(t.type)) +
                         " elements (the data section's size)";
                });
        const auto want = numel * dtype_size(t.type);
        require(t.nbytes == want, where, detail::tensor_arg(name, "byte length"), t.nbytes,
                std::to_string(want) + " bytes for " + t.dtype_text + " " +
                    shape_string(t.shape));
      }
      f.index_.emplace(name, std::move(t));
    }
    f.buf_ = std::move(buf);
    return f;
  }

  [[nodiscard]] const std::string& path() const noexcept { return path_; }
  [[nodiscard]] const std::map<std::string, std::string>& metadata() const noexcept {
    return metadata_;
  }
  [[nodiscard]] bool contains(std::string_view name) const {
    return index_.find(std::string(name)) != index_.end();
  }
  // All tensor names, sorted.
  [[nodiscard]] std::vector<std::string> names() const {
    std::vector<std::string> out;
    out.reserve(index_.size());
    for (const auto& [k, v] : index_) {
      out.push_back(k);
    }
    return out;
  }

  // The header entry of `name`; throws kvsift::error if the file has no such tensor.
  [[nodiscard]] const tensor_info& info(std::string_view name) const {
    auto it = index_.find(std::string(name));
    if (it == index_.end()) {
      throw make_error(where("tensor"), detail::tensor_arg(name, ""), "missing",
                       "a tensor of that name (the file has " + std::to_string(index_.size()) +
                           " tensors" + name_hint() + ")");
    }
    return it->second;
  }

  // Checks that `name` has exactly `shape`; throws kvsift::error naming both shapes otherwise.
  void require_shape(std::string_view name, const shape_t& shape) const {
    const tensor_info& t = info(name);
    require(t.shape == shape, where("tensor"), detail::tensor_arg(name, "shape"),
            shape_string(t.shape), shape_string(shape));
  }

  // The raw little-endian bytes of `name`.
  [[nodiscard]] std::span<const std::byte> raw(std::string_view name) const {
    const tensor_info& t = info(name);
    return {buf_.data() + data_begin_ + t.offset, t.nbytes};
  }

  // `name` converted to float (F32, F16, BF16 exactly; I32 by value). If `shape` is given, the
  // tensor must have exactly that shape.
  [[nodiscard]] std::vector<float> to_float(std::string_view name,
                                            const shape_t* shape = nullptr) const {
    const tensor_info& t = info(name);
    if (shape) {
      require_shape(name, *shape);
    }
    require(t.type != dtype::other, where("to_float"), detail::tensor_arg(name, "dtype"),
            t.dtype_text, "one of F32, F16, BF16, I32");
    const std::byte* p = buf_.data() + data_begin_ + t.offset;
    const auto n = static_cast<std::size_t>(t.numel());
    std::vector<float> out(n);
    switch (t.type) {
      case dtype::f32:
        for (std::size_t i = 0; i < n; ++i) {
          out[i] = kvsift::detail::bits_float(detail::load_u32(p + 4 * i));
        }
        break;
      case dtype::f16:
        for (std::size_t i = 0; i < n; ++i) {
          out[i] = static_cast<float>(half::from_bits(detail::load_u16(p + 2 * i)));
        }
        break;
      case dtype::bf16:
        for (std::size_t i = 0; i < n; ++i) {
          out[i] = static_cast<float>(bfloat16::from_bits(detail::load_u16(p + 2 * i)));
        }
        break;
      case dtype::i32:
        for (std::size_t i = 0; i < n; ++i) {
          out[i] = static_cast<float>(static_cast<std::int32_t>(detail::load_u32(p + 4 * i)));
        }
        break;
      case dtype::other:
        break;
    }
    return out;
  }

  [[nodiscard]] std::vector<float> to_float(std::string_view name, const shape_t& shape) const {
    return to_float(name, &shape);
  }

  // `name` as int32; the tensor must be I32.
  [[nodiscard]] std::vector<std::int32_t> to_int32(std::string_view name) const {
    const tensor_info& t = info(name);
    require(t.type == dtype::i32, where("to_int32"), detail::tensor_arg(name, "dtype"),
            t.dtype_text, "I32");
    const std::byte* p = buf_.data() + data_begin_ + t.offset;
    std::vector<std::int32_t> out(static_cast<std::size_t>(t.numel()));
    for (std::size_t i = 0; i < out.size(); ++i) {
      out[i] = static_cast<std::int32_t>(detail::load_u32(p + 4 * i));
    }
    return out;
  }

  // All tensors as writer input (for copying or re-encoding a file).
  [[nodiscard]] tensor_map tensors() const {
    tensor_map m;
    for (const auto& [k, t] : index_) {
      require(t.type != dtype::other, where("tensors"), detail::tensor_arg(k, "dtype"),
              t.dtype_text, "one of F32, F16, BF16, I32");
      auto r = raw(k);
      m.emplace(k, tensor_data{t.type, t.shape, {r.begin(), r.end()}});
    }
    return m;
  }

 private:
  [[nodiscard]] std::string where(std::string_view fn) const {
    return detail::where_file(std::string("safetensors_file::") + std::string(fn), path_);
  }
  [[nodiscard]] std::string name_hint() const {
    std::string h;
    int k = 0;
    for (const auto& [name, t] : index_) {
      if (k == 3) {
        h += ", ...";
        break;
      }
      h += (k++ ? ", '" : ": '") + name + "'";
    }
    return h;
  }

  std::string path_;
  std::vector<std::byte> buf_;
  std::size_t data_begin_ = 0;
  std::map<std::string, tensor_info> index_;
  std::map<std::string, std::string> metadata_;
};

// Encodes floats as a tensor of `type` (F32, F16 or BF16, rounding to nearest even; I32
// truncates toward zero). values.size() must equal numel(shape).
[[nodiscard]] inline tensor_data make_tensor(std::span<const float> values, shape_t shape,
                                             dtype type = dtype::f32) {
  require(type != dtype::other, "io::make_tensor", "type", dtype_name(type),
          "one of F32, F16, BF16, I32");
  require(static_cast<std::int64_t>(values.size()) == shape_numel(shape), "io::make_tensor",
          "values.size()", values.size(), "numel of shape " + shape_string(shape));
  tensor_data t{type, std::move(shape), std::vector<std::byte>(values.size() * dtype_size(type))};
  std::byte* p = t.bytes.data();
  for (std::size_t i = 0; i < values.size(); ++i) {
    switch (type) {
      case dtype::f32:
        detail::store_u32(p + 4 * i, kvsift::detail::float_bits(values[i]));
        break;
      case dtype::f16:
        detail::store_u16(p + 2 * i, half(values[i]).bits);
        break;
      case dtype::bf16:
        detail::store_u16(p + 2 * i, bfloat16(values[i]).bits);
        break;
      case dtype::i32:
        detail::store_u32(p + 4 * i,
                          static_cast<std::uint32_t>(static_cast<std::int32_t>(values[i])));
        break;
      case dtype::other:
        break;
    }
  }
  return t;
}

// The file image of `tensors` (+ optional string metadata).
[[nodiscard]] inline std::vector<std::byte> encode_safetensors(
    const tensor_map& tensors, const std::map<std::string, std::string>& metadata = {}) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    header["__metadata__"] = metadata;
  }
  std::size_t offset = 0;
  for (const auto& [name, t] : tensors) {
    require(t.type != dtype::other, "io::write_safetensors", detail::tensor_arg(name, "dtype"),
            dtype_name(t.type), "one of F32, F16, BF16, I32");
    const auto want = static_cast<std::size_t>(shape_numel(t.shape)) * dtype_size(t.type);
    require(t.bytes.size() == want, "io::write_safetensors",
            detail::tensor_arg(name, "bytes.size()"), t.bytes.size(),
            std::to_string(want) + " bytes for " + std::string(dtype_name(t.type)) + " " +
                shape_string(t.shape));
    header[name] = {{"dtype", std::string(dtype_name(t.type))},
                    {"shape", t.shape},
                    {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');
  std::vector<std::byte> out(8 + h.size() + offset);
  std::uint64_t hl = h.size();
  for (int i = 0; i < 8; ++i) {
    out[static_cast<std::size_t>(i)] = static_cast<std::byte>((hl >> (8 * i)) & 0xffu);
  }
  std::memcpy(out.data() + 8, h.data(), h.size());
  std::size_t pos = 8 + h.size();
  for (const auto& [name, t] : tensors) {
    if (!t.bytes.empty()) {
      std::memcpy(out.data() + pos, t.bytes.data(), t.bytes.size());
    }
    pos += t.bytes.size();
  }
  return out;
}

// Writes `tensors` to `path` (validated completely before the file is opened).
inline void write_safetensors(const std::string& path, const tensor_map& tensors,
                              const std::map<std::string, std::string>& metadata = {}) {
  const std::vector<std::byte> image = encode_safetensors(tensors, metadata);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  require(static_cast<bool>(out), detail::where_file("write_safetensors", path), "path", path,
          "a writable file");
  out.write(reinterpret_cast<const char*>(image.data()),
            static_cast<std::streamsize>(image.size()));
  require(static_cast<bool>(out), detail::where_file("write_safetensors", path), "path", path,
          "a file that can be written completely");
}

}  // namespace kvsift::io
