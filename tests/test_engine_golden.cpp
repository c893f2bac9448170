// SPDX-License-Identifier: Apache-2.0
// The example Llama engine against the golden outputs of the shipped models (data/tiny-recall,
// data/recall-8kv: 8 KV heads and a BOS byte; data/recall-agree: recall-8kv's shape, heads that
// agree), the KV-cache call protocol, and the safetensors
// reader/writer (round trip and error paths). Everything is read from the repository's data/.

#include <kvsift/io/safetensors.hpp>

#include "../examples/engine/eval_harness.hpp"
#include "../examples/engine/llama.hpp"

#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace ex = kvsift::examples;
namespace io = kvsift::io;

namespace {

const std::string data_dir = std::string(KVSIFT_SOURCE_DIR) + "/data";
const std::string tiny_recall_dir = data_dir + "/tiny-recall";

const ex::llama_model& tiny_recall() {
  static const ex::llama_model model = ex::llama_model::load(tiny_recall_dir);
  return model;
}

const ex::llama_model& recall_8kv() {
  static const ex::llama_model model = ex::llama_model::load(data_dir + "/recall-8kv");
  return model;
}

const ex::llama_model& recall_agree() {
  static const ex::llama_model model = ex::llama_model::load(data_dir + "/recall-agree");
  return model;
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("kvsift_test_engine_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

std::vector<std::byte> read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> c((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> b(c.size());
  std::memcpy(b.data(), c.data(), c.size());
  return b;
}

void write_all(const std::string& path, const std::vector<std::byte>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// A safetensors image with a hand-written header (for dtypes the writer refuses).
std::vector<std::byte> raw_image(const std::string& header, std::size_t data_bytes) {
  std::vector<std::byte> out(8 + header.size() + data_bytes);
  for (int i = 0; i < 8; ++i) {
    out[static_cast<std::size_t>(i)] = static_cast<std::byte>((header.size() >> (8 * i)) & 0xff);
  }
  std::memcpy(out.data() + 8, header.data(), header.size());
  return out;
}

// Records the calls the engine makes and forwards them to a full cache.
class recording_cache : public ex::kv_cache {
 public:
  void start(const ex::cache_shape& s) override {
    shape = s;
    ++starts;
    inner.start(s);
  }
  void prefill(int layer, int n, std::span<const float> k, std::span<const float> v,
               std::span<const float> q) override {
    calls.push_back("prefill " + std::to_string(layer) + " " + std::to_string(n));
    CHECK(k.size() == static_cast<std::size_t>(n * shape.num_kv_heads * shape.head_dim));
    CHECK(v.size() == k.size());
    CHECK(q.size() == static_cast<std::size_t>(n * shape.num_q_heads * shape.head_dim));
    inner.prefill(layer, n, k, v, q);
  }
  void decode(int layer, std::span<const float> q, std::span<const float> k,
              std::span<const float> v, int position, std::span<float> out) override {
    calls.push_back("decode " + std::to_string(layer) + " " + std::to_string(position));
    CHECK(q.size() == static_cast<std::size_t>(shape.num_q_heads * shape.head_dim));
    CHECK(k.size() == static_cast<std::size_t>(shape.num_kv_heads * shape.head_dim));
    CHECK(out.size() == q.size());
    inner.decode(layer, q, k, v, position, out);
  }
  void after_attention(int layer, std::span<const float> q) override {
    calls.push_back("after " + std::to_string(layer));
    CHECK(q.size() == static_cast<std::size_t>(shape.num_q_heads * shape.head_dim));
  }
  std::int64_t kept_tokens(int layer, int kv_head) const override {
    return inner.kept_tokens(layer, kv_head);
  }

  ex::full_cache inner;
  ex::cache_shape shape;
  int starts = 0;
  std::vector<std::string> calls;
};

}  // namespace

TEST_CASE("engine: the shipped models match their golden logits and greedy continuations",
          "[engine][golden]") {
  const std::string model_name = GENERATE("tiny-recall", "recall-8kv", "recall-agree");
  const std::string task = GENERATE("passkey", "chain", "filler");
  CAPTURE(model_name, task);
  std::ifstream in(data_dir + "/" + model_name + "/golden/" + task + ".json");
  REQUIRE(in);
  const auto golden = nlohmann::json::parse(in);
  const auto ids = golden["prompt_ids"].get<std::vector<int>>();
  const auto ref_logits = golden["last_logits"].get<std::vector<float>>();
  const auto ref_greedy = golden["greedy_ids"].get<std::vector<int>>();
  const auto ref_step_max = golden["greedy_step_max_logit"].get<std::vector<float>>();
  REQUIRE(ex::byte_tokenize(golden["prompt"].get<std::string>()) == ids);

  const auto& model = model_name == "tiny-recall"  ? tiny_recall()
                      : model_name == "recall-8kv" ? recall_8kv()
                                                   : recall_agree();
  if (model_name != "tiny-recall") {
    // 8 KV heads, one per query head (G = 1), and every prompt starts with the BOS byte 0x02
    CHECK(model.config().num_kv_heads == 8);
    CHECK(model.config().num_q_heads == 8);
    REQUIRE(!ids.empty());
    CHECK(ids.front() == 2);
  } else {
    CHECK(model.config().num_kv_heads == 2);
  }
  ex::full_cache cache;
  std::vector<std::vector<float>> steps;
  const auto greedy = model.generate_greedy(ids, static_cast<int>(ref_greedy.size()), cache,
                                            nullptr, &steps);
  REQUIRE(steps.size() == ref_greedy.size());
  const auto& logits = steps.front();
  REQUIRE(logits.size() == ref_logits.size());
  float max_diff = 0.0f;
  for (std::size_t i = 0; i < logits.size(); ++i) {
    max_diff = std::max(max_diff, std::abs(logits[i] - ref_logits[i]));
  }
  CAPTURE(max_diff);
  CHECK(max_diff <= 1e-3f);
  CHECK(ex::llama_model::argmax(logits) == golden["last_logits_argmax"].get<int>());
  CHECK(greedy == ref_greedy);
  for (std::size_t s = 0; s < steps.size(); ++s) {
    CAPTURE(s);
    CHECK(std::abs(steps[s][static_cast<std::size_t>(greedy[s])] - ref_step_max[s]) <= 2e-3f);
  }
  // every layer and KV head kept the whole sequence (prompt + decoded tokens but the last)
  for (int h = 0; h < model.config().num_kv_heads; ++h) {
    CHECK(cache.kept_tokens(model.config().num_layers - 1, h) ==
          static_cast<std::int64_t>(ids.size() + ref_greedy.size() - 1));
  }
}

TEST_CASE("engine: recall-8kv answers its shipped passkey prompts with the full cache",
          "[engine][eval]") {
  const auto items = ex::load_eval_jsonl(data_dir + "/eval/recall-8kv/passkey.jsonl");
  REQUIRE(items.size() == 36);
  std::vector<ex::eval_item> subset;
  for (const auto& it : items) {  // one prompt of each context length keeps the test short
    if (subset.size() < 3 && (subset.empty() || subset.back().context_len != it.context_len)) {
      subset.push_back(it);
    }
  }
  for (const auto& it : subset) CHECK(it.prompt.front() == '\x02');  // the BOS byte
  ex::full_cache cache;
  const auto results = ex::run_eval(recall_8kv(), subset, cache);
  REQUIRE(results.size() == subset.size());
  for (const auto& r : results) {
    CAPTURE(r.id, r.output, r.answer);
    CHECK(r.exact);
  }
}

TEST_CASE("engine: the KV cache is called per layer in the documented order", "[engine]") {
  const auto& model = tiny_recall();
  const auto& cfg = model.config();
  recording_cache cache;
  const auto ids = ex::byte_tokenize("hello world, hello");
  const int n = static_cast<int>(ids.size());
  (void)model.generate_greedy(ids, 3, cache);
  CHECK(cache.starts == 1);
  CHECK(cache.shape.num_layers == cfg.num_layers);
  CHECK(cache.shape.prompt_len == n);
  CHECK(cache.shape.max_len == n + 3);
  std::vector<std::string> expected;
  for (int l = 0; l < cfg.num_layers; ++l) {
    expected.push_back("prefill " + std::to_string(l) + " " + std::to_string(n));
  }
  for (int pos = n; pos < n + 2; ++pos) {  // 3 new tokens: the first comes from the prefill
    for (int l = 0; l < cfg.num_layers; ++l) {
      expected.push_back("decode " + std::to_string(l) + " " + std::to_string(pos));
      expected.push_back("after " + std::to_string(l));
    }
  }
  CHECK(cache.calls == expected);

  // decoding token by token equals prefilling the whole sequence (the cache is exact)
  ex::full_cache c1;
  ex::full_cache c2;
  auto logits = model.prefill(std::span<const int>(ids).first(static_cast<std::size_t>(n - 1)), c1, 1);
  logits = model.decode(ids.back(), n - 1, c1);
  const auto ref = model.prefill(ids, c2);
  for (std::size_t i = 0; i < ref.size(); ++i) {
    CHECK(std::abs(logits[i] - ref[i]) <= 1e-4f);
  }
  REQUIRE_THROWS_AS(model.prefill(std::vector<int>{1, 300}, c1), kvsift::error);
  REQUIRE_THROWS_AS(model.prefill(std::vector<int>{}, c1), kvsift::error);
}

TEST_CASE("engine: token id files and the byte tokenizer", "[engine]") {
  const std::string path = temp_path("ids.txt");
  {
    std::ofstream out(path);
    out << "1 2\n 300\t4\n";
  }
  CHECK(ex::read_token_ids(path) == std::vector<int>{1, 2, 300, 4});
  {
    std::ofstream out(path);
    out << "1 x2 3";
  }
  REQUIRE_THROWS_AS(ex::read_token_ids(path), kvsift::error);
  REQUIRE_THROWS_AS(ex::read_token_ids(path + ".missing"), kvsift::error);
  std::filesystem::remove(path);
  const std::string text = "K7 -> Q2. \xff";
  CHECK(ex::byte_detokenize(ex::byte_tokenize(text)) == text);
  CHECK(ex::byte_tokenize("A")[0] == 65);
}

TEST_CASE("eval harness: scoring of passkey and chain answers", "[engine][eval]") {
  CHECK(ex::hop_count(" H3 G6 O2.", " H3 G6 O2.") == 3);
  CHECK(ex::hop_count(" H3 G6 O2.", " H3 G6 O1.") == 2);
  CHECK(ex::hop_count(" H3 G6 O2.", " H3 G5 O2.") == 1);
  CHECK(ex::hop_count(" H3 G6 O2.", " X3 G6 O2.") == 0);
  CHECK(ex::hop_count(" H3 G6 O2.", " H3") == 1);
  CHECK(ex::hop_count(" H3 G6 O2.", " H3 G6 O2,") == 2);  // only a final "." is ignored

  const auto items = ex::load_eval_jsonl(std::string(KVSIFT_SOURCE_DIR) + "/data/eval/chain.jsonl");
  REQUIRE(items.size() == 12);
  CHECK(items[0].task == "chain");
  CHECK(items[0].answer.size() == 9);  // protocol v2: the separator space ends the prompt
  CHECK(static_cast<int>(items[0].prompt.size() + items[0].answer.size()) == items[0].context_len);
  REQUIRE_THROWS_AS(ex::load_eval_jsonl(temp_path("missing.jsonl")), kvsift::error);
}

TEST_CASE("eval harness: full cache answers the shipped passkey prompts", "[engine][eval]") {
  const auto items =
      ex::load_eval_jsonl(std::string(KVSIFT_SOURCE_DIR) + "/data/eval/passkey.jsonl");
  std::vector<ex::eval_item> subset;
  for (const auto& it : items) {  // one prompt of each context length keeps the test short
    if (subset.size() < 3 && (subset.empty() || subset.back().context_len != it.context_len)) {
      subset.push_back(it);
    }
  }
  ex::full_cache cache;
  const auto results = ex::run_eval(tiny_recall(), subset, cache);
  REQUIRE(results.size() == subset.size());
  for (const auto& r : results) {
    CAPTURE(r.id, r.output, r.answer);
    CHECK(r.exact);
  }
}

TEST_CASE("safetensors: writer and reader round trip every dtype", "[io][safetensors]") {
  const std::vector<float> values = {0.0f, 1.0f, -2.5f, 3.14159f, 65504.0f, 1e-3f};
  io::tensor_map m;
  m["a.f32"] = io::make_tensor(values, {2, 3}, io::dtype::f32);
  m["b.f16"] = io::make_tensor(values, {3, 2}, io::dtype::f16);
  m["c.bf16"] = io::make_tensor(values, {6}, io::dtype::bf16);
  m["d.i32"] = io::make_tensor(std::vector<float>{-7.0f, 0.0f, 42.0f}, {3}, io::dtype::i32);
  m["e.empty"] = io::make_tensor(std::vector<float>{}, {0, 4}, io::dtype::f32);
  const std::string path = temp_path("roundtrip.safetensors");
  io::write_safetensors(path, m, {{"format", "pt"}});

  const auto f = io::safetensors_file::open(path);
  CHECK(f.names() == std::vector<std::string>{"a.f32", "b.f16", "c.bf16", "d.i32", "e.empty"});
  CHECK(f.metadata().at("format") == "pt");
  CHECK(f.info("a.f32").shape == io::shape_t{2, 3});
  CHECK(f.to_float("a.f32") == values);
  const auto h = f.to_float("b.f16", io::shape_t{3, 2});
  const auto b = f.to_float("c.bf16");
  for (std::size_t i = 0; i < values.size(); ++i) {
    CHECK(h[i] == static_cast<float>(kvsift::half(values[i])));
    CHECK(b[i] == static_cast<float>(kvsift::bfloat16(values[i])));
  }
  CHECK(f.to_int32("d.i32") == std::vector<std::int32_t>{-7, 0, 42});
  CHECK(f.to_float("d.i32") == std::vector<float>{-7.0f, 0.0f, 42.0f});
  CHECK(f.to_float("e.empty").empty());
  // header padded so the data section is 8-byte aligned
  const auto bytes = read_all(path);
  std::uint64_t hlen = 0;
  std::memcpy(&hlen, bytes.data(), 8);
  CHECK(hlen % 8 == 0);
  // re-encoding what was read reproduces the file
  CHECK(io::encode_safetensors(f.tensors(), f.metadata()) == bytes);
  std::filesystem::remove(path);
}

TEST_CASE("safetensors: errors name the file, the tensor and what was expected",
          "[io][safetensors]") {
  io::tensor_map m;
  m["w"] = io::make_tensor(std::vector<float>(12, 1.0f), {3, 4});
  const std::string path = temp_path("errors.safetensors");
  io::write_safetensors(path, m);
  const auto good = read_all(path);
  const auto f = io::safetensors_file::open(path);

  SECTION("missing tensor") {
    REQUIRE_THROWS_AS(f.info("nope"), kvsift::error);
    try {
      (void)f.to_float("nope");
      FAIL("no throw");
    } catch (const kvsift::error& e) {
      const std::string msg = e.what();
      CHECK(msg.find(path) != std::string::npos);
      CHECK(msg.find("\"nope\"") != std::string::npos);
      CHECK(msg.find("missing") != std::string::npos);
    }
  }
  SECTION("shape mismatch") {
    REQUIRE_THROWS_AS(f.to_float("w", io::shape_t{4, 3}), kvsift::error);
    try {
      f.require_shape("w", {4, 3});
    } catch (const kvsift::error& e) {
      const std::string msg = e.what();
      CHECK(msg.find("[3, 4]") != std::string::npos);
      CHECK(msg.find("[4, 3]") != std::string::npos);
    }
  }
  SECTION("truncated file: data cut short") {
    auto cut = good;
    cut.resize(cut.size() - 4);
    write_all(path, cut);
    REQUIRE_THROWS_AS(io::safetensors_file::open(path), kvsift::error);
    try {
      (void)io::safetensors_file::open(path);
    } catch (const kvsift::error& e) {
      CHECK(std::string(e.what()).find("truncated") != std::string::npos);
    }
  }
  SECTION("truncated file: header cut short, and shorter than the length field") {
    auto cut = good;
    cut.resize(20);
    REQUIRE_THROWS_AS(io::safetensors_file::from_bytes(cut, "cut"), kvsift::error);
    cut.resize(5);
    REQUIRE_THROWS_AS(io::safetensors_file::from_bytes(cut, "cut"), kvsift::error);
  }
  SECTION("unsupported dtype is listed but not converted") {
    const auto img =
        raw_image(R"({"x":{"dtype":"F64","shape":[2],"data_offsets":[0,16]}})", 16);
    const auto g = io::safetensors_file::from_bytes(img, "f64");
    CHECK(g.info("x").dtype_text == "F64");
    CHECK(g.raw("x").size() == 16);
    REQUIRE_THROWS_AS(g.to_float("x"), kvsift::error);
    REQUIRE_THROWS_AS(f.to_int32("w"), kvsift::error);
  }
  SECTION("byte length disagrees with dtype x shape, malformed JSON") {
    REQUIRE_THROWS_AS(io::safetensors_file::from_bytes(
                          raw_image(R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8)),
                      kvsift::error);
    REQUIRE_THROWS_AS(io::safetensors_file::from_bytes(raw_image(R"({"x": )", 0)), kvsift::error);
    REQUIRE_THROWS_AS(io::safetensors_file::open(path + ".missing"), kvsift::error);
  }
  SECTION("the writer validates before writing") {
    io::tensor_map bad;
    bad["v"] = io::tensor_data{io::dtype::f32, {4}, std::vector<std::byte>(12)};
    REQUIRE_THROWS_AS(io::encode_safetensors(bad), kvsift::error);
    REQUIRE_THROWS_AS(io::make_tensor(std::vector<float>(3), {2, 2}), kvsift::error);
  }
  SECTION("a model directory with a mis-shaped weight") {
    const std::string dir = temp_path("bad_model");
    std::filesystem::create_directories(dir);
    std::filesystem::copy_file(tiny_recall_dir + "/config.json", dir + "/config.json",
                               std::filesystem::copy_options::overwrite_existing);
    io::write_safetensors(dir + "/model.safetensors", m);
    try {
      (void)ex::llama_model::load(dir);
      FAIL("no throw");
    } catch (const kvsift::error& e) {
      CHECK(std::string(e.what()).find("model.embed_tokens.weight") != std::string::npos);
    }
    std::filesystem::remove_all(dir);
  }
  std::filesystem::remove(path);
}
