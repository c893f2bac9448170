// SPDX-License-Identifier: Apache-2.0
#pragma once

// A small CPU inference engine for Llama-architecture Hugging Face models (LlamaForCausalLM),
// written as the real workload for kvsift's KV-cache compression. Header-only; float32
// arithmetic throughout; OpenMP over output rows when available.
//
//   auto model = kvsift::examples::llama_model::load("data/tiny-recall");
//   kvsift::examples::full_cache cache;
//   auto ids = kvsift::examples::byte_tokenize("The pass key is");
//   auto out = model.generate_greedy(ids, 7, cache);
//
// Forward pass (exactly what HF computes): h = embed[ids]; per layer a = rmsnorm(h) * ln_in;
// q/k/v = a W^T; RoPE (rotate_half layout) on q and k; causal softmax(q.k / sqrt(d)) v with
// GQA (query head h reads KV head h / G); o_proj; residual; m = rmsnorm(h) * ln_post;
// h += down(silu(gate m) * up m); logits = lm_head(rmsnorm(h) * norm).
//
// The KV cache is behind `kv_cache` (below), called per layer:
//   prefill:  the engine computes the prompt's K (after RoPE), V and Q (after RoPE) of a layer,
//             runs full causal attention over the prompt itself, then hands K/V/Q to
//             `cache.prefill(...)`, which stores them and may compress them (the protocol of
//             the tiny-recall README: "prompt prefilled under full attention and the stored KV
//             of every layer compressed before decoding");
//   decode:   per layer, `cache.decode(layer, q, k, v, position, out)` appends the step's
//             token and writes the attention output [q_heads, d] over whatever tokens the
//             cache keeps; then `cache.after_attention(layer, q)`.
// `full_cache` keeps everything; `attend_decode` is the GQA attention helper any cache can use
// over its kept tokens (dense rows or an index set per KV head).

#include <kvsift/core/error.hpp>
#include <kvsift/io/safetensors.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <memory>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace kvsift::examples {

// ---- configuration -----------------------------------------------------------------------------

// The fields of an HF LlamaConfig the engine uses.
struct llama_config {
  int vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_layers = 0;
  int num_q_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  float rms_norm_eps = 1e-5f;
  float rope_theta = 10000.0f;
  int max_position_embeddings = 0;
  bool tie_word_embeddings = false;

  [[nodiscard]] int group() const noexcept { return num_q_heads / num_kv_heads; }

  // Parses config.json; throws kvsift::error for missing fields or unsupported options
  // (rope_scaling, attention/MLP biases, activations other than silu).
  [[nodiscard]] static llama_config from_json(const nlohmann::json& j, const std::string& path) {
    const std::string where = "examples::llama_config of file " + path;
    auto get_int = [&](const char* key) {
      require(j.contains(key) && j[key].is_number_integer(), where, key,
              j.contains(key) ? j[key].dump() : std::string("missing"), "an integer");
      return j[key].get<int>();
    };
    llama_config c;
    c.vocab_size = get_int("vocab_size");
    c.hidden_size = get_int("hidden_size");
    c.intermediate_size = get_int("intermediate_size");
    c.num_layers = get_int("num_hidden_layers");
    c.num_q_heads = get_int("num_attention_heads");
    c.num_kv_heads = j.contains("num_key_value_heads") && !j["num_key_value_heads"].is_null()
                         ? get_int("num_key_value_heads")
                         : c.num_q_heads;
    c.head_dim = j.contains("head_dim") && !j["head_dim"].is_null()
                     ? get_int("head_dim")
                     : (c.num_q_heads > 0 ? c.hidden_size / c.num_q_heads : 0);
    if (j.contains("rms_norm_eps")) {
      c.rms_norm_eps = j["rms_norm_eps"].get<float>();
    }
    if (j.contains("rope_theta")) {
      c.rope_theta = j["rope_theta"].get<float>();
    }
    c.max_position_embeddings =
        j.contains("max_position_embeddings") ? get_int("max_position_embeddings") : 0;
    c.tie_word_embeddings = j.value("tie_word_embeddings", false);
    require(c.vocab_size > 0 && c.hidden_size > 0 && c.intermediate_size > 0 &&
                c.num_layers > 0 && c.head_dim > 0 && c.head_dim % 2 == 0,
            where, "sizes", j.dump(), "positive sizes and an even head_dim");
    require(c.num_kv_heads > 0 && c.num_q_heads % c.num_kv_heads == 0, where,
            "num_attention_heads / num_key_value_heads",
            std::to_string(c.num_q_heads) + " / " + std::to_string(c.num_kv_heads),
            "a positive multiple of num_key_value_heads");
    require(!j.contains("rope_scaling") || j["rope_scaling"].is_null(), where, "rope_scaling",
            j.contains("rope_scaling") ? j["rope_scaling"].dump() : "", "null (not supported)");
    require(!j.value("attention_bias", false), where, "attention_bias", true,
            "false (not supported)");
    require(!j.value("mlp_bias", false), where, "mlp_bias", true, "false (not supported)");
    const std::string act = j.value("hidden_act", std::string("silu"));
    require(act == "silu", where, "hidden_act", act, "silu");
    return c;
  }
};

// ---- tokens ------------------------------------------------------------------------------------

// Byte-level tokenizer of tiny-recall: token id = byte value.
[[nodiscard]] inline std::vector<int> byte_tokenize(std::string_view text) {
  std::vector<int> ids(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    ids[i] = static_cast<unsigned char>(text[i]);
  }
  return ids;
}

[[nodiscard]] inline std::string byte_detokenize(std::span<const int> ids) {
  std::string s(ids.size(), '\0');
  for (std::size_t i = 0; i < ids.size(); ++i) {
    s[i] = static_cast<char>(static_cast<unsigned char>(ids[i]));
  }
  return s;
}

// Reads pre-tokenised ids (whitespace-separated integers), for models whose tokenizer is not
// bytes: tokenise with the model's own tokenizer elsewhere and save the ids.
[[nodiscard]] inline std::vector<int> read_token_ids(const std::string& path) {
  std::ifstream in(path);
  require(static_cast<bool>(in), "examples::read_token_ids", "path", path, "a readable file");
  std::vector<int> ids;
  std::string word;
  while (in >> word) {
    std::size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(word, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    require(used == word.size() && v >= 0 && v <= INT32_MAX, "examples::read_token_ids of " + path,
            "token " + std::to_string(ids.size()), word, "a non-negative integer");
    ids.push_back(static_cast<int>(v));
  }
  return ids;
}

// ---- KV cache interface ------------------------------------------------------------------------

// The sizes of one sequence's cache, given to kv_cache::start.
struct cache_shape {
  int num_layers = 0;
  int num_q_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int prompt_len = 0;  // tokens the engine will prefill
  int max_len = 0;     // prompt_len + the most tokens that may be decoded
};

// One KV head's tokens to attend over, for attend_decode. Token t (t = 0..n-1) is row
// index[t] (or row t if index is null) of keys / values, rows `stride` floats apart.
struct kv_head_view {
  const float* keys = nullptr;         // [rows, stride], first d floats of a row are the key
  const float* values = nullptr;       // [rows, stride]
  std::int64_t stride = 0;             // floats between consecutive rows
  const std::int32_t* index = nullptr; // [n] rows to read (sorted ascending), or null for 0..n-1
  int n = 0;                           // tokens attended
};

// The KV cache behind the engine; phase 2 puts a kvsift method behind it.
//
// Lifecycle per sequence: start(shape); prefill(layer, ...) for layer 0..L-1 in order; then per
// generated token, for layer 0..L-1 in order: decode(layer, ...) then after_attention(layer, q).
// All vectors are float32, keys and queries after RoPE. Token positions are 0..prompt_len-1 for
// the prompt and prompt_len, prompt_len+1, ... for decoded tokens.
class kv_cache {
 public:
  virtual ~kv_cache() = default;

  // Begins a new sequence (drops everything stored before).
  virtual void start(const cache_shape& shape) = 0;

  // The prompt's KV of `layer`, computed by the engine, which has already run full causal
  // attention over it: k_rot, v [n, kv_heads, d]; q_rot [n, q_heads, d] (for scorers such as
  // SnapKV's observation window). The cache stores them and may compress them now. The spans
  // are only valid during the call.
  virtual void prefill(int layer, int n, std::span<const float> k_rot, std::span<const float> v,
                       std::span<const float> q_rot) = 0;

  // One decode step of `layer`: appends the new token's k [kv_heads, d], v [kv_heads, d] at
  // `position`, and writes the attention output of q [q_heads, d] over the tokens the cache keeps
  // for each KV head (the new token included) to out [q_heads, d] (softmax(q.k / sqrt(d)) v,
  // query head h reading KV head h / G). `attend_decode` does this for a list of kv_head_view.
  virtual void decode(int layer, std::span<const float> q, std::span<const float> k,
                      std::span<const float> v, int position, std::span<float> out) = 0;

  // Called after decode(layer) with the same q, once the engine has consumed `out`; evictions or
  // selections decided here take effect from the next step.
  virtual void after_attention(int layer, std::span<const float> q) {
    (void)layer;
    (void)q;
  }

  // Tokens currently kept for (layer, kv_head), counting every kept token.
  [[nodiscard]] virtual std::int64_t kept_tokens(int layer, int kv_head) const = 0;
};

// ---- kernels -----------------------------------------------------------------------------------

namespace detail {

// A native float vector as a GCC/Clang vector extension: 8 lanes with AVX, else 4 (SSE, NEON).
// Explicit so the hot loops vectorise and keep their accumulators in registers without
// -ffast-math. (v8f is the historical name: it has kW lanes.)
#if defined(__AVX__)
inline constexpr int kW = 8;
#else
inline constexpr int kW = 4;
#endif
using v8f = float __attribute__((vector_size(kW * 4)));
using v8i = std::int32_t __attribute__((vector_size(kW * 4)));

inline v8f load8(const float* p) {
  v8f v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}
inline void store8(float* p, v8f v) { __builtin_memcpy(p, &v, sizeof v); }
inline v8f splat8(float x) { return v8f{} + x; }

// y[out] = x[in] Wt[in, out] for one row (decode steps): streams Wt row by row (4 rows per
// pass) into y, which stays in L1; memory access is purely sequential.
inline void matvec(const float* x, int in, const float* Wt, int out, float* y) {
  const int full = out / kW * kW;
  std::fill(y, y + out, 0.0f);
  int k = 0;
  for (; k + 4 <= in; k += 4) {
    const float* w0 = Wt + static_cast<std::size_t>(k) * out;
    const float* w1 = w0 + out;
    const float* w2 = w1 + out;
    const float* w3 = w2 + out;
    const float x0 = x[k];
    const float x1 = x[k + 1];
    const float x2 = x[k + 2];
    const float x3 = x[k + 3];
    for (int c = 0; c < full; c += kW) {
      store8(y + c, load8(y + c) + x0 * load8(w0 + c) + x1 * load8(w1 + c) +
                        x2 * load8(w2 + c) + x3 * load8(w3 + c));
    }
    for (int c = full; c < out; ++c) {
      y[c] += x0 * w0[c] + x1 * w1[c] + x2 * w2[c] + x3 * w3[c];
    }
  }
  for (; k < in; ++k) {
    const float* w = Wt + static_cast<std::size_t>(k) * out;
    for (int c = 0; c < out; ++c) {
      y[c] += x[k] * w[c];
    }
  }
}

// Y[n, out] = X[n, in] Wt[in, out] (Wt = W^T, so y = x W^T for HF's W [out, in]).
// Tiles of 4 rows x 2 vectors of columns accumulated in registers; OpenMP over tiles for large products
// (small ones, e.g. decode steps, stay on the calling thread).
inline void matmul(const float* X, int n, int in, const float* Wt, int out, float* Y) {
  constexpr int R = 4;
  constexpr int C = 2 * kW;
  if (n == 1) {
    matvec(X, in, Wt, out, Y);
    return;
  }
  const int row_blocks = (n + R - 1) / R;
  const int col_blocks = (out + C - 1) / C;
#pragma omp parallel for collapse(2) schedule(static) if (static_cast<long>(n) * in * out > 4000000)
  for (int rb = 0; rb < row_blocks; ++rb) {
    for (int cb = 0; cb < col_blocks; ++cb) {
      const int r0 = rb * R;
      const int c0 = cb * C;
      const int rows = std::min(R, n - r0);
      const int cols = std::min(C, out - c0);
      if (cols == C) {
        v8f a0{}, a1{}, b0{}, b1{}, c0v{}, c1v{}, d0{}, d1{};
        const float* x0 = X + static_cast<std::size_t>(r0) * in;
        const float* x1 = x0 + (rows > 1 ? in : 0);
        const float* x2 = x0 + (rows > 2 ? 2 * in : 0);
        const float* x3 = x0 + (rows > 3 ? 3 * in : 0);
        for (int k = 0; k < in; ++k) {
          const float* w = Wt + static_cast<std::size_t>(k) * out + c0;
          const v8f w0 = load8(w);
          const v8f w1 = load8(w + kW);
          a0 += x0[k] * w0;
          a1 += x0[k] * w1;
          b0 += x1[k] * w0;
          b1 += x1[k] * w1;
          c0v += x2[k] * w0;
          c1v += x2[k] * w1;
          d0 += x3[k] * w0;
          d1 += x3[k] * w1;
        }
        const v8f res[R][2] = {{a0, a1}, {b0, b1}, {c0v, c1v}, {d0, d1}};
        for (int r = 0; r < rows; ++r) {
          float* y = Y + static_cast<std::size_t>(r0 + r) * out + c0;
          store8(y, res[r][0]);
          store8(y + kW, res[r][1]);
        }
      } else {
        for (int r = 0; r < rows; ++r) {
          float acc[C] = {};
          const float* x = X + static_cast<std::size_t>(r0 + r) * in;
          for (int k = 0; k < in; ++k) {
            const float* w = Wt + static_cast<std::size_t>(k) * out + c0;
            for (int c = 0; c < cols; ++c) {
              acc[c] += x[k] * w[c];
            }
          }
          std::copy(acc, acc + cols, Y + static_cast<std::size_t>(r0 + r) * out + c0);
        }
      }
    }
  }
}

// y[i] = x[i] / sqrt(mean(x^2) + eps) * w[i], per row of n rows of `dim`.
inline void rmsnorm(const float* x, int n, int dim, const float* w, float eps, float* y) {
  for (int i = 0; i < n; ++i) {
    const float* xi = x + static_cast<std::size_t>(i) * dim;
    float* yi = y + static_cast<std::size_t>(i) * dim;
    float ss = 0.0f;
    for (int c = 0; c < dim; ++c) {
      ss += xi[c] * xi[c];
    }
    const float r = 1.0f / std::sqrt(ss / static_cast<float>(dim) + eps);
    for (int c = 0; c < dim; ++c) {
      yi[c] = w[c] * (xi[c] * r);
    }
  }
}

// x = x cos + rotate_half(x) sin per head of d channels, rows = tokens at `positions`.
// cos/sin tables: [max_pos, d/2], computed as HF does in float32.
inline void rope(float* x, int n, int heads, int d, const int* positions, const float* cos_t,
                 const float* sin_t) {
  const int half_d = d / 2;
  for (int i = 0; i < n; ++i) {
    const float* cs = cos_t + static_cast<std::size_t>(positions[i]) * half_d;
    const float* sn = sin_t + static_cast<std::size_t>(positions[i]) * half_d;
    for (int h = 0; h < heads; ++h) {
      float* v = x + (static_cast<std::size_t>(i) * heads + h) * d;
      for (int c = 0; c < half_d; ++c) {
        const float a = v[c];
        const float b = v[c + half_d];
        v[c] = a * cs[c] - b * sn[c];
        v[c + half_d] = b * cs[c] + a * sn[c];
      }
    }
  }
}

// exp(x) for x <= 0 (softmax after subtracting the maximum), one vector: x = k ln2 + r,
// |r| <= ln2/2, degree-6 Taylor polynomial for e^r (relative error < 3e-7), times 2^k built in
// the exponent bits; x < -87 gives 0.
inline v8f exp8_nonpositive(v8f x) {
  const v8i tiny = x < -87.0f;
  const v8f xc = tiny ? splat8(-87.0f) : x;
  const v8f round_magic = splat8(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
  const v8f kf = (xc * 1.44269504088896341f + round_magic) - round_magic;
  const v8f r = (xc - kf * 0.693145751953125f) - kf * 1.42860682030941723212e-6f;
  v8f p = splat8(1.0f / 720.0f);
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const v8i bits = (__builtin_convertvector(kf, v8i) + 127) << 23;
  v8f scale2;
  __builtin_memcpy(&scale2, &bits, sizeof scale2);
  return tiny ? v8f{} : p * scale2;
}

// out[c] = inv * sum_t p[t] * rows[r(t)][c], r(t) = index ? index[t] : t (rows `stride` apart).
template <int NV>
inline void weighted_rows_v(const float* p, int n, const float* rows, std::int64_t stride,
                            const std::int32_t* index, float inv, float* out) {
  v8f o[NV] = {};
  for (int t = 0; t < n; ++t) {
    const float* r = rows + (index ? index[t] : t) * stride;
    const float pt = p[t];
    for (int v = 0; v < NV; ++v) {
      o[v] += pt * load8(r + v * kW);
    }
  }
  for (int v = 0; v < NV; ++v) {
    store8(out + v * kW, o[v] * inv);
  }
}

inline void weighted_rows(const float* p, int n, const float* rows, std::int64_t stride,
                          const std::int32_t* index, int d, float inv, float* out) {
  switch (d) {
    case 4 * kW:
      return weighted_rows_v<4>(p, n, rows, stride, index, inv, out);
    case 8 * kW:
      return weighted_rows_v<8>(p, n, rows, stride, index, inv, out);
    case 16 * kW:
      return weighted_rows_v<16>(p, n, rows, stride, index, inv, out);
    default:
      break;
  }
  std::fill(out, out + d, 0.0f);
  for (int t = 0; t < n; ++t) {
    const float* r = rows + (index ? index[t] : t) * stride;
    for (int c = 0; c < d; ++c) {
      out[c] += p[t] * r[c];
    }
  }
  for (int c = 0; c < d; ++c) {
    out[c] *= inv;
  }
}

// Causal attention over a whole prompt. q [n, qh, d], k/v [n, kvh, d] -> out [n, qh, d].
// Per (query head, block of 4 consecutive queries): scores 16 keys at a time in registers, a
// vectorised exp, then the weighted sum of values.
inline void prefill_attention(const float* q, const float* k, const float* v, int n, int qh,
                              int kvh, int d, float* out) {
  constexpr int QB = 4;   // queries per block
  constexpr int J = 2 * kW;  // keys per score block
  const int group = qh / kvh;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const int n_pad = (n + J - 1) / J * J + J;
  // per KV head: keys transposed [d][n_pad] (zero padded), values [n][d]
  std::vector<float> kt(static_cast<std::size_t>(kvh) * d * n_pad, 0.0f);
  std::vector<float> vv(static_cast<std::size_t>(kvh) * n * d);
  for (int t = 0; t < n; ++t) {
    for (int g = 0; g < kvh; ++g) {
      const float* kr = k + (static_cast<std::size_t>(t) * kvh + g) * d;
      const float* vr = v + (static_cast<std::size_t>(t) * kvh + g) * d;
      for (int c = 0; c < d; ++c) {
        kt[(static_cast<std::size_t>(g) * d + c) * n_pad + t] = kr[c];
        vv[(static_cast<std::size_t>(g) * n + t) * d + c] = vr[c];
      }
    }
  }
  const int qblocks = (n + QB - 1) / QB;
#pragma omp parallel
  {
    std::vector<float> s(static_cast<std::size_t>(QB) * n_pad);
    std::vector<float> qs(static_cast<std::size_t>(QB) * d);
#pragma omp for schedule(dynamic, 4) collapse(2)
    for (int h = 0; h < qh; ++h) {
      for (int bb = 0; bb < qblocks; ++bb) {
        const int b = qblocks - 1 - bb;  // longest rows first for load balance
        const int g = h / group;
        const int i0 = b * QB;
        const int nq = std::min(QB, n - i0);
        for (int r = 0; r < QB; ++r) {  // scaled queries; missing rows repeat the last one
          const int i = i0 + std::min(r, nq - 1);
          const float* qi = q + (static_cast<std::size_t>(i) * qh + h) * d;
          for (int c = 0; c < d; ++c) {
            qs[static_cast<std::size_t>(r) * d + c] = qi[c] * scale;
          }
        }
        const float* kg = kt.data() + static_cast<std::size_t>(g) * d * n_pad;
        const int m = i0 + nq;  // keys 0..m-1 cover the block's longest row
        for (int j0 = 0; j0 < m; j0 += J) {
          v8f s00{}, s01{}, s10{}, s11{}, s20{}, s21{}, s30{}, s31{};
          for (int c = 0; c < d; ++c) {
            const float* kc = kg + static_cast<std::size_t>(c) * n_pad + j0;
            const v8f k0 = load8(kc);
            const v8f k1 = load8(kc + kW);
            const float* qc = qs.data() + c;
            s00 += qc[0] * k0;
            s01 += qc[0] * k1;
            s10 += qc[d] * k0;
            s11 += qc[d] * k1;
            s20 += qc[2 * d] * k0;
            s21 += qc[2 * d] * k1;
            s30 += qc[3 * d] * k0;
            s31 += qc[3 * d] * k1;
          }
          float* sp = s.data() + j0;
          store8(sp, s00);
          store8(sp + kW, s01);
          store8(sp + n_pad, s10);
          store8(sp + n_pad + kW, s11);
          store8(sp + 2 * n_pad, s20);
          store8(sp + 2 * n_pad + kW, s21);
          store8(sp + 3 * n_pad, s30);
          store8(sp + 3 * n_pad + kW, s31);
        }
        for (int r = 0; r < nq; ++r) {
          const int i = i0 + r;
          const int len = i + 1;  // causal: keys 0..i
          float* sr = s.data() + static_cast<std::size_t>(r) * n_pad;
          float mx = -INFINITY;
          for (int j = 0; j < len; ++j) {
            mx = std::max(mx, sr[j]);
          }
          for (int j = len; j < (len + kW - 1) / kW * kW; ++j) {
            sr[j] = -INFINITY;  // masked lanes of the last vector give exp = 0
          }
          v8f vsum{};
          for (int j = 0; j < len; j += kW) {
            const v8f e = exp8_nonpositive(load8(sr + j) - mx);
            store8(sr + j, e);
            vsum += e;
          }
          float sum = 0.0f;
          for (int l = 0; l < kW; ++l) {
            sum += vsum[l];
          }
          const float* vg = vv.data() + static_cast<std::size_t>(g) * n * d;
          float* oi = out + (static_cast<std::size_t>(i) * qh + h) * d;
          weighted_rows(sr, len, vg, d, nullptr, d, 1.0f / sum, oi);
        }
      }
    }
  }
}

inline std::vector<float> transpose(const std::vector<float>& w, int rows, int cols) {
  std::vector<float> t(w.size());
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) {
      t[static_cast<std::size_t>(c) * rows + r] = w[static_cast<std::size_t>(r) * cols + c];
    }
  }
  return t;
}

}  // namespace detail

// Decode attention for one token: out[h] = softmax(q[h] . K_g / sqrt(d)) V_g over the tokens of
// heads[g], g = h / (q_heads / kv_heads). q, out [q_heads, d]; heads [kv_heads].
inline void attend_decode(std::span<const float> q, int q_heads, int d,
                          std::span<const kv_head_view> heads, std::span<float> out) {
  using detail::kW;
  using detail::v8f;
  const int kv_heads = static_cast<int>(heads.size());
  const int group = q_heads / kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const bool vec = d % kW == 0;
  std::vector<float> scores;
  for (int g = 0; g < kv_heads; ++g) {
    const kv_head_view& kv = heads[static_cast<std::size_t>(g)];
    const int n_pad = (kv.n + kW - 1) / kW * kW;
    scores.assign(static_cast<std::size_t>(group) * n_pad, -INFINITY);
    const float* q0 = q.data() + static_cast<std::size_t>(g) * group * d;
    // scores[hh][t] = q[hh] . k[t] / sqrt(d) for the group's query heads
    for (int t = 0; t < kv.n; ++t) {
      const std::int64_t row = kv.index ? kv.index[t] : t;
      const float* kr = kv.keys + row * kv.stride;
      for (int hh = 0; hh < group; ++hh) {
        const float* qh = q0 + static_cast<std::size_t>(hh) * d;
        float sc = 0.0f;
        if (vec) {
          v8f acc{};
          for (int c = 0; c < d; c += kW) {
            acc += detail::load8(qh + c) * detail::load8(kr + c);
          }
          for (int l = 0; l < kW; ++l) {
            sc += acc[l];
          }
        } else {
          for (int c = 0; c < d; ++c) {
            sc += qh[c] * kr[c];
          }
        }
        scores[static_cast<std::size_t>(hh) * n_pad + t] = sc * scale;
      }
    }
    for (int hh = 0; hh < group; ++hh) {
      float* sr = scores.data() + static_cast<std::size_t>(hh) * n_pad;
      float mx = -INFINITY;
      for (int t = 0; t < kv.n; ++t) {
        mx = std::max(mx, sr[t]);
      }
      v8f vsum{};
      for (int t = 0; t < n_pad; t += kW) {
        const v8f e = detail::exp8_nonpositive(detail::load8(sr + t) - mx);
        detail::store8(sr + t, e);
        vsum += e;
      }
      float sum = 0.0f;
      for (int l = 0; l < kW; ++l) {
        sum += vsum[l];
      }
      float* oh = out.data() + (static_cast<std::size_t>(g) * group + hh) * d;
      detail::weighted_rows(sr, kv.n, kv.values, kv.stride, kv.index, d, 1.0f / sum, oh);
    }
  }
}

// Keeps every token: per (layer, KV head) contiguous rows [tokens, d] of keys and values.
class full_cache : public kv_cache {
 public:
  void start(const cache_shape& shape) override {
    shape_ = shape;
    const auto heads = static_cast<std::size_t>(shape.num_layers * shape.num_kv_heads);
    keys_.assign(heads, {});
    values_.assign(heads, {});
    for (std::size_t i = 0; i < heads; ++i) {
      keys_[i].reserve(static_cast<std::size_t>(shape.max_len * shape.head_dim));
      values_[i].reserve(static_cast<std::size_t>(shape.max_len * shape.head_dim));
    }
  }

  void prefill(int layer, int n, std::span<const float> k_rot, std::span<const float> v,
               std::span<const float> /*q_rot*/) override {
    const int d = shape_.head_dim;
    const int kvh = shape_.num_kv_heads;
    for (int g = 0; g < kvh; ++g) {
      auto& K = keys_[slot(layer, g)];
      auto& V = values_[slot(layer, g)];
      K.clear();
      V.clear();
      for (int t = 0; t < n; ++t) {
        const std::size_t off = (static_cast<std::size_t>(t) * kvh + g) * d;
        K.insert(K.end(), k_rot.begin() + off, k_rot.begin() + off + d);
        V.insert(V.end(), v.begin() + off, v.begin() + off + d);
      }
    }
  }

  void decode(int layer, std::span<const float> q, std::span<const float> k,
              std::span<const float> v, int /*position*/, std::span<float> out) override {
    const int d = shape_.head_dim;
    std::vector<kv_head_view> views(static_cast<std::size_t>(shape_.num_kv_heads));
    for (int g = 0; g < shape_.num_kv_heads; ++g) {
      auto& K = keys_[slot(layer, g)];
      auto& V = values_[slot(layer, g)];
      K.insert(K.end(), k.begin() + g * d, k.begin() + (g + 1) * d);
      V.insert(V.end(), v.begin() + g * d, v.begin() + (g + 1) * d);
      views[static_cast<std::size_t>(g)] = {K.data(), V.data(), d, nullptr,
                                            static_cast<int>(K.size() / static_cast<std::size_t>(d))};
    }
    attend_decode(q, shape_.num_q_heads, d, views, out);
  }

  [[nodiscard]] std::int64_t kept_tokens(int layer, int kv_head) const override {
    return static_cast<std::int64_t>(keys_[slot(layer, kv_head)].size()) / shape_.head_dim;
  }

 private:
  [[nodiscard]] std::size_t slot(int layer, int g) const {
    return static_cast<std::size_t>(layer * shape_.num_kv_heads + g);
  }
  cache_shape shape_;
  std::vector<std::vector<float>> keys_;    // [layers * kv_heads][tokens * d]
  std::vector<std::vector<float>> values_;  // [layers * kv_heads][tokens * d]
};

// ---- the model ---------------------------------------------------------------------------------

// Timings of one generate_greedy call.
struct generation_stats {
  int prompt_tokens = 0;
  int generated_tokens = 0;
  double prefill_seconds = 0.0;
  double decode_seconds = 0.0;  // all decode steps (the first generated token comes from prefill)
};

class llama_model {
 public:
  // Loads `dir`/config.json and `dir`/model.safetensors (F32, F16 or BF16 weights, converted to
  // float). Throws kvsift::error naming the file and tensor for anything missing or mis-shaped.
  [[nodiscard]] static llama_model load(const std::string& dir) {
    const std::string cfg_path = dir + "/config.json";
    std::ifstream in(cfg_path);
    require(static_cast<bool>(in), "examples::llama_model::load", "config", cfg_path,
            "a readable config.json");
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      throw make_error("examples::llama_model::load", "config " + cfg_path, e.what(),
                       "valid JSON");
    }
    llama_model m;
    m.cfg_ = llama_config::from_json(j, cfg_path);
    const auto f = io::safetensors_file::open(dir + "/model.safetensors");
    m.load_weights(f);
    return m;
  }

  [[nodiscard]] const llama_config& config() const noexcept { return cfg_; }

  // Prefills `ids` (positions 0..n-1) under full causal attention, handing each layer's K/V/Q to
  // cache.prefill after cache.start(...); returns the logits [vocab] of the last position.
  // `max_new` sizes cache_shape::max_len.
  [[nodiscard]] std::vector<float> prefill(std::span<const int> ids, kv_cache& cache,
                                           int max_new = 0) const {
    const int n = static_cast<int>(ids.size());
    require(n > 0, "examples::llama_model::prefill", "ids.size()", n, "at least 1 token");
    check_ids(ids, "examples::llama_model::prefill");
    require(n + max_new <= cfg_.max_position_embeddings,
            "examples::llama_model::prefill", "prompt + new tokens", n + max_new,
            "at most max_position_embeddings = " + std::to_string(cfg_.max_position_embeddings));
    cache.start({cfg_.num_layers, cfg_.num_q_heads, cfg_.num_kv_heads, cfg_.head_dim, n,
                 n + max_new});
    const int H = cfg_.hidden_size;
    const int d = cfg_.head_dim;
    const int qd = cfg_.num_q_heads * d;
    const int kd = cfg_.num_kv_heads * d;
    const int I = cfg_.intermediate_size;
    const auto N = static_cast<std::size_t>(n);
    std::vector<float> h(N * H), a(N * H), qkv(N * (qd + 2 * kd)), q(N * qd), k(N * kd),
        v(N * kd), att(N * qd), gu(N * 2 * I), act(N * I), tmp(N * H);
    std::vector<int> pos(N);
    for (int i = 0; i < n; ++i) {
      pos[static_cast<std::size_t>(i)] = i;
      std::copy_n(embed_.begin() + static_cast<std::ptrdiff_t>(ids[i]) * H, H,
                  h.begin() + static_cast<std::ptrdiff_t>(i) * H);
    }
    for (int l = 0; l < cfg_.num_layers; ++l) {
      const layer& L = layers_[static_cast<std::size_t>(l)];
      detail::rmsnorm(h.data(), n, H, L.ln_in.data(), cfg_.rms_norm_eps, a.data());
      detail::matmul(a.data(), n, H, L.wqkv_t.data(), qd + 2 * kd, qkv.data());
      for (std::size_t i = 0; i < N; ++i) {
        const float* row = qkv.data() + i * (qd + 2 * kd);
        std::copy_n(row, qd, q.data() + i * qd);
        std::copy_n(row + qd, kd, k.data() + i * kd);
        std::copy_n(row + qd + kd, kd, v.data() + i * kd);
      }
      detail::rope(q.data(), n, cfg_.num_q_heads, d, pos.data(), cos_.data(), sin_.data());
      detail::rope(k.data(), n, cfg_.num_kv_heads, d, pos.data(), cos_.data(), sin_.data());
      detail::prefill_attention(q.data(), k.data(), v.data(), n, cfg_.num_q_heads,
                                cfg_.num_kv_heads, d, att.data());
      cache.prefill(l, n, k, v, q);
      detail::matmul(att.data(), n, qd, L.wo_t.data(), H, tmp.data());
      for (std::size_t i = 0; i < N * H; ++i) {
        h[i] += tmp[i];
      }
      mlp(L, h.data(), n, a, gu, act, tmp);
    }
    return final_logits(h.data() + (N - 1) * H);
  }

  // One decode step: token `id` at `position` through every layer (cache.decode, then
  // cache.after_attention per layer); returns the logits [vocab].
  [[nodiscard]] std::vector<float> decode(int id, int position, kv_cache& cache) const {
    check_ids(std::span<const int>(&id, 1), "examples::llama_model::decode");
    require(position >= 0 && position < cfg_.max_position_embeddings,
            "examples::llama_model::decode", "position", position,
            "0 <= position < max_position_embeddings");
    const int H = cfg_.hidden_size;
    const int d = cfg_.head_dim;
    const int qd = cfg_.num_q_heads * d;
    const int kd = cfg_.num_kv_heads * d;
    const int I = cfg_.intermediate_size;
    std::vector<float> h(embed_.begin() + static_cast<std::ptrdiff_t>(id) * H,
                         embed_.begin() + static_cast<std::ptrdiff_t>(id + 1) * H);
    std::vector<float> a(H), qkv(qd + 2 * kd), att(qd), gu(2 * I), act(I), tmp(H);
    for (int l = 0; l < cfg_.num_layers; ++l) {
      const layer& L = layers_[static_cast<std::size_t>(l)];
      detail::rmsnorm(h.data(), 1, H, L.ln_in.data(), cfg_.rms_norm_eps, a.data());
      detail::matmul(a.data(), 1, H, L.wqkv_t.data(), qd + 2 * kd, qkv.data());
      detail::rope(qkv.data(), 1, cfg_.num_q_heads, d, &position, cos_.data(), sin_.data());
      detail::rope(qkv.data() + qd, 1, cfg_.num_kv_heads, d, &position, cos_.data(),
                   sin_.data());
      const std::span<const float> q(qkv.data(), static_cast<std::size_t>(qd));
      cache.decode(l, q, {qkv.data() + qd, static_cast<std::size_t>(kd)},
                   {qkv.data() + qd + kd, static_cast<std::size_t>(kd)}, position, att);
      cache.after_attention(l, q);
      detail::matmul(att.data(), 1, qd, L.wo_t.data(), H, tmp.data());
      for (int i = 0; i < H; ++i) {
        h[static_cast<std::size_t>(i)] += tmp[static_cast<std::size_t>(i)];
      }
      mlp(L, h.data(), 1, a, gu, act, tmp);
    }
    return final_logits(h.data());
  }

  // Greedy decoding: prefill `prompt`, then `n_new` argmax tokens (the first from the prefill
  // logits). Returns the generated ids; `step_logits`, if given, receives each step's logits.
  [[nodiscard]] std::vector<int> generate_greedy(std::span<const int> prompt, int n_new,
                                                 kv_cache& cache,
                                                 generation_stats* stats = nullptr,
                                                 std::vector<std::vector<float>>* step_logits =
                                                     nullptr) const {
    using clock = std::chrono::steady_clock;
    const auto t0 = clock::now();
    std::vector<float> logits = prefill(prompt, cache, n_new);
    const auto t1 = clock::now();
    std::vector<int> out;
    out.reserve(static_cast<std::size_t>(std::max(n_new, 0)));
    int position = static_cast<int>(prompt.size());
    for (int s = 0; s < n_new; ++s) {
      const int next = argmax(logits);
      out.push_back(next);
      if (step_logits) {
        step_logits->push_back(logits);
      }
      if (s + 1 < n_new) {
        logits = decode(next, position++, cache);
      }
    }
    const auto t2 = clock::now();
    if (stats) {
      stats->prompt_tokens = static_cast<int>(prompt.size());
      stats->generated_tokens = n_new;
      stats->prefill_seconds = std::chrono::duration<double>(t1 - t0).count();
      stats->decode_seconds = std::chrono::duration<double>(t2 - t1).count();
    }
    return out;
  }

  // Index of the largest logit (the first one on ties, as torch.argmax).
  [[nodiscard]] static int argmax(std::span<const float> logits) {
    return static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }

 private:
  struct layer {
    std::vector<float> ln_in, ln_post;  // [H]
    std::vector<float> wqkv_t;          // [H, qd + 2 kd]: q, k, v projections transposed
    std::vector<float> wo_t;            // [qd, H]
    std::vector<float> wgu_t;           // [H, 2 I]: gate then up, transposed
    std::vector<float> wdown_t;         // [I, H]
  };

  void check_ids(std::span<const int> ids, const char* where) const {
    for (std::size_t i = 0; i < ids.size(); ++i) {
      require(ids[i] >= 0 && ids[i] < cfg_.vocab_size, where, "ids[" + std::to_string(i) + "]",
              ids[i], "a token id in [0, vocab_size = " + std::to_string(cfg_.vocab_size) + ")");
    }
  }

  // h += down(silu(gate(m)) * up(m)), m = rmsnorm(h) * ln_post, over n rows.
  void mlp(const layer& L, float* h, int n, std::vector<float>& a, std::vector<float>& gu,
           std::vector<float>& act, std::vector<float>& tmp) const {
    const int H = cfg_.hidden_size;
    const int I = cfg_.intermediate_size;
    detail::rmsnorm(h, n, H, L.ln_post.data(), cfg_.rms_norm_eps, a.data());
    detail::matmul(a.data(), n, H, L.wgu_t.data(), 2 * I, gu.data());
    for (std::size_t i = 0; i < static_cast<std::size_t>(n); ++i) {
      const float* g = gu.data() + i * 2 * I;
      const float* u = g + I;
      float* o = act.data() + i * I;
      for (int c = 0; c < I; ++c) {
        o[c] = g[c] / (1.0f + std::exp(-g[c])) * u[c];
      }
    }
    detail::matmul(act.data(), n, I, L.wdown_t.data(), H, tmp.data());
    for (std::size_t i = 0; i < static_cast<std::size_t>(n) * H; ++i) {
      h[i] += tmp[i];
    }
  }

  [[nodiscard]] std::vector<float> final_logits(const float* h_last) const {
    const int H = cfg_.hidden_size;
    std::vector<float> a(static_cast<std::size_t>(H)), logits(static_cast<std::size_t>(cfg_.vocab_size));
    detail::rmsnorm(h_last, 1, H, norm_.data(), cfg_.rms_norm_eps, a.data());
    detail::matmul(a.data(), 1, H, lm_head_t_.data(), cfg_.vocab_size, logits.data());
    return logits;
  }

  void load_weights(const io::safetensors_file& f) {
    const std::int64_t H = cfg_.hidden_size;
    const std::int64_t I = cfg_.intermediate_size;
    const std::int64_t V = cfg_.vocab_size;
    const std::int64_t qd = static_cast<std::int64_t>(cfg_.num_q_heads) * cfg_.head_dim;
    const std::int64_t kd = static_cast<std::int64_t>(cfg_.num_kv_heads) * cfg_.head_dim;
    auto get = [&](const std::string& name, io::shape_t shape) { return f.to_float(name, shape); };
    embed_ = get("model.embed_tokens.weight", {V, H});
    norm_ = get("model.norm.weight", {H});
    const bool has_head = f.contains("lm_head.weight");
    require(has_head || cfg_.tie_word_embeddings, "examples::llama_model::load of " + f.path(),
            "tensor \"lm_head.weight\"", "missing", "present unless tie_word_embeddings");
    lm_head_t_ = detail::transpose(has_head ? get("lm_head.weight", {V, H}) : embed_,
                                   static_cast<int>(V), static_cast<int>(H));
    layers_.resize(static_cast<std::size_t>(cfg_.num_layers));
    for (int l = 0; l < cfg_.num_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      layer& L = layers_[static_cast<std::size_t>(l)];
      L.ln_in = get(p + "input_layernorm.weight", {H});
      L.ln_post = get(p + "post_attention_layernorm.weight", {H});
      std::vector<float> qkv = get(p + "self_attn.q_proj.weight", {qd, H});
      const auto wk = get(p + "self_attn.k_proj.weight", {kd, H});
      const auto wv = get(p + "self_attn.v_proj.weight", {kd, H});
      qkv.insert(qkv.end(), wk.begin(), wk.end());
      qkv.insert(qkv.end(), wv.begin(), wv.end());
      L.wqkv_t = detail::transpose(qkv, static_cast<int>(qd + 2 * kd), static_cast<int>(H));
      L.wo_t = detail::transpose(get(p + "self_attn.o_proj.weight", {H, qd}),
                                 static_cast<int>(H), static_cast<int>(qd));
      std::vector<float> gu = get(p + "mlp.gate_proj.weight", {I, H});
      const auto up = get(p + "mlp.up_proj.weight", {I, H});
      gu.insert(gu.end(), up.begin(), up.end());
      L.wgu_t = detail::transpose(gu, static_cast<int>(2 * I), static_cast<int>(H));
      L.wdown_t = detail::transpose(get(p + "mlp.down_proj.weight", {H, I}),
                                    static_cast<int>(H), static_cast<int>(I));
    }
    // RoPE tables as HF computes them in float32: inv_freq = 1 / theta^(2i/d),
    // angle = float(p) * inv_freq, cos/sin of the float angle.
    const int half_d = cfg_.head_dim / 2;
    // no max_position_embeddings in config.json: tables for 8192 positions
    if (cfg_.max_position_embeddings <= 0) {
      cfg_.max_position_embeddings = 8192;
    }
    const int max_pos = cfg_.max_position_embeddings;
    cos_.resize(static_cast<std::size_t>(max_pos) * half_d);
    sin_.resize(cos_.size());
    for (int i = 0; i < half_d; ++i) {
      const float inv = 1.0f / std::pow(cfg_.rope_theta, static_cast<float>(2 * i) /
                                                             static_cast<float>(cfg_.head_dim));
      for (int p = 0; p < max_pos; ++p) {
        const float ang = static_cast<float>(p) * inv;
        cos_[static_cast<std::size_t>(p) * half_d + i] = static_cast<float>(std::cos(static_cast<double>(ang)));
        sin_[static_cast<std::size_t>(p) * half_d + i] = static_cast<float>(std::sin(static_cast<double>(ang)));
      }
    }
  }

  llama_config cfg_;
  std::vector<float> embed_;      // [V, H]
  std::vector<float> norm_;       // [H]
  std::vector<float> lm_head_t_;  // [H, V]
  std::vector<layer> layers_;
  std::vector<float> cos_, sin_;  // [max_pos, d/2]
};

}  // namespace kvsift::examples
