// SPDX-License-Identifier: Apache-2.0
// protokv._core: the C++ library as seen from Python (nanobind). Thin on purpose: objects and
// calls of the library's public API (include/protokv/), with the GIL released around every
// forward pass; the OpenAI-shaped results, stop strings and press classes live in the Python
// package (python/protokv/), which is where a Python user reads them.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "eval/fidelity.h"
#include "eval/longctx_bench.h"
#include "eval/results_file.h"
#include "kernels/blas_core.h"
#include "kernels/isa.h"
#include "protokv/engine.h"
#include "protokv/error.h"
#include "protokv/generate.h"
#include "protokv/json_keys.h"
#include "protokv/model.h"
#include "protokv/press/allocator.h"
#include "protokv/press/options.h"
#include "protokv/press/scoring_press.h"
#include "protokv/press_registry.h"
#include "protokv/press_spec.h"
#include "protokv/sampler.h"
#include "protokv/threads.h"
#include "protokv/timer.h"
#include "protokv/tokenizer.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace protokv::python {
namespace {

using FloatArray = nb::ndarray<nb::numpy, float>;
using ConstFloatView = nb::ndarray<nb::numpy, const float, nb::ndim<1>>;
using IntArray = nb::ndarray<nb::numpy, int32_t>;

// A numpy array that owns a copy of `values` (shape `shape`).
template <class T>
nb::ndarray<nb::numpy, T> owned_array(std::vector<T> values, std::initializer_list<size_t> shape) {
  auto* data = new std::vector<T>(std::move(values));
  nb::capsule owner(data, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return nb::ndarray<nb::numpy, T>(data->data(), shape.size(), shape.begin(), owner);
}

// JSON (the library's configs and stats) to Python objects.
nb::object to_python(const nlohmann::json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null:
      return nb::none();
    case nlohmann::json::value_t::boolean:
      return nb::bool_(j.get<bool>());
    case nlohmann::json::value_t::number_integer:
    case nlohmann::json::value_t::number_unsigned:
      return nb::int_(j.get<int64_t>());
    case nlohmann::json::value_t::number_float:
      return nb::float_(j.get<double>());
    case nlohmann::json::value_t::string:
      return nb::str(j.get_ref<const std::string&>().c_str());
    case nlohmann::json::value_t::array: {
      nb::list out;
      for (const auto& v : j) out.append(to_python(v));
      return out;
    }
    default: {
      nb::dict out;
      for (const auto& [k, v] : j.items()) out[k.c_str()] = to_python(v);
      return out;
    }
  }
}

class Model {
 public:
  Model(const std::string& path, int n_threads, int64_t n_ctx, const std::string& chat_format)
      : n_threads_(n_threads) {
    {
      nb::gil_scoped_release release;
      loaded_ = load_model(path);
    }
    PROTOKV_CHECK(loaded_.tokenizer != nullptr, "{}: the model file carries no tokenizer", path);
    const int64_t trained = loaded_.weights.config.context_length;
    PROTOKV_CHECK(n_ctx >= 0 && n_ctx <= trained,
                  "n_ctx must be in [0, {}] (the model's context; 0: all of it), got {}", trained,
                  n_ctx);
    n_ctx_ = n_ctx == 0 ? trained : n_ctx;
    PROTOKV_CHECK(n_threads >= 0 && n_threads <= kMaxThreads,
                  "n_threads must be in [0, {}], got {}", kMaxThreads, n_threads);
    try {
      chat_ = chat_format.empty() ? detect_chat_template(loaded_.tokenizer->chat_template())
                                  : chat_template_from_name(chat_format);
    } catch (const Error& e) {
      if (!chat_format.empty()) throw;
      chat_error_ = e.what();
    }
  }

  const LoadedModel& loaded() const { return loaded_; }
  const ModelConfig& config() const { return loaded_.weights.config; }
  const Tokenizer& tokenizer() const { return *loaded_.tokenizer; }
  int n_threads() const { return n_threads_; }
  int64_t n_ctx() const { return n_ctx_; }
  // Every compute call runs on the calling thread's OpenMP setting, set here each time (OpenMP
  // thread counts are per thread, and Python may call from any thread).
  void use_threads() const { set_threads(n_threads_); }

  std::vector<int32_t> tokenize(const std::string& text, bool add_bos, bool special) const {
    return tokenizer().encode(text, Tokenizer::EncodeOptions{add_bos, special});
  }
  nb::bytes detokenize(const std::vector<int32_t>& ids) const {
    for (int32_t id : ids)
      PROTOKV_CHECK(id >= 0 && id < tokenizer().vocab_size(), "token id {} out of range [0, {})",
                    id, tokenizer().vocab_size());
    const std::string text = tokenizer().decode(ids);
    return nb::bytes(text.data(), text.size());
  }
  std::string chat_format() const {
    return chat_ ? std::string(chat_template_name(*chat_)) : std::string();
  }
  std::string render_chat(const std::vector<std::pair<std::string, std::string>>& messages,
                          bool add_generation_prompt) const {
    PROTOKV_CHECK(chat_.has_value(), "no chat template: {} (Model(..., chat_format=NAME))",
                  chat_error_);
    std::vector<ChatMessage> chat;
    for (const auto& [role, content] : messages) chat.push_back({role, content});
    return protokv::render_chat(*chat_, chat, add_generation_prompt);
  }

 private:
  LoadedModel loaded_;
  int n_threads_ = 0;
  int64_t n_ctx_ = 0;
  std::optional<ChatTemplate> chat_;
  std::string chat_error_;
};

std::shared_ptr<const PressSpec> parse_press(const std::optional<std::string>& press,
                                             const std::string& alloc) {
  if (!press || press->empty() || *press == "full") {
    PROTOKV_CHECK(alloc.empty(), "an allocator ('{}') needs a press", alloc);
    return nullptr;
  }
  return PressSpec::parse(*press, alloc);
}

Budget make_budget(const std::shared_ptr<const PressSpec>& spec, std::optional<int64_t> budget,
                   std::optional<double> ratio) {
  PROTOKV_CHECK(!(budget && ratio), "give budget or ratio, not both");
  Budget b;
  if (budget) b.entries = *budget;
  if (ratio) b.ratio = *ratio;
  if (spec == nullptr) return {};  // the full cache ignores a budget (SessionOptions::budget)
  PROTOKV_CHECK(budget || ratio, "press '{}' needs a budget (entries per KV head) or a ratio",
                spec->name());
  b.validate();
  return b;
}

// --- presses written in Python ---

// A Python object reference whose last owner may be a thread without the GIL (an engine thread
// destroying a session's press state): the reference is dropped with the GIL taken.
class PyRef {
 public:
  explicit PyRef(nb::object object) : object_(std::move(object)) {}
  ~PyRef() {
    nb::gil_scoped_acquire gil;
    object_.reset();
  }
  const nb::object& get() const { return object_; }

 private:
  nb::object object_;
};

// A Scorer (scoring_press.h) that asks Python: `callback(layer, keys, values, window_queries,
// positions)` returns float32 [n_kv_heads, n - window] scores of the prefix entries, higher =
// keep (python/protokv/presses.py's ScorerPress checks the shape and dtype). The engine's
// allocator and selector do the rest, exactly as for the C++ scorers.
class PythonScorer : public press::Scorer {
 public:
  PythonScorer(std::shared_ptr<const PyRef> callback, std::string name)
      : callback_(std::move(callback)), name_(std::move(name)) {}
  std::string name() const override { return name_; }
  void add_config(nlohmann::json& out) const override { out["python"] = name_; }

  void score(const LayerView& layer, int64_t window, press::LayerScores& out) override {
    const auto n = static_cast<size_t>(layer.n_tokens);
    const auto d = static_cast<size_t>(layer.head_dim);
    const auto kv_heads = static_cast<size_t>(layer.n_kv_heads);
    const auto heads = static_cast<size_t>(layer.n_heads);
    const int64_t n_prefix = layer.n_tokens - window;
    const auto w = static_cast<size_t>(std::max<int64_t>(window, 1));
    nb::gil_scoped_acquire gil;
    // Copies, so that a score() that keeps its arguments never reads freed engine memory.
    std::vector<float> queries(heads * w * d);
    for (size_t h = 0; h < heads; ++h)
      std::memcpy(queries.data() + h * w * d, layer.q_head(static_cast<int>(h)) + (n - w) * d,
                  w * d * sizeof(float));
    nb::object result = callback_->get()(
        layer.layer,
        owned_array(std::vector<float>(layer.k, layer.k + kv_heads * n * d), {kv_heads, n, d}),
        owned_array(std::vector<float>(layer.v, layer.v + kv_heads * n * d), {kv_heads, n, d}),
        owned_array(std::move(queries), {heads, w, d}),
        owned_array(std::vector<int32_t>(layer.positions, layer.positions + n), {n}));
    auto scores = nb::cast<nb::ndarray<const float, nb::ndim<2>, nb::c_contig>>(result);
    PROTOKV_CHECK(scores.shape(0) == kv_heads && scores.shape(1) == static_cast<size_t>(n_prefix),
                  "{}.score() returned shape ({}, {}); expected ({}, {})", name_, scores.shape(0),
                  scores.shape(1), kv_heads, n_prefix);
    out.reset(layer.n_kv_heads, n_prefix, false, false);
    std::memcpy(out.score.data(), scores.data(), kv_heads * n_prefix * sizeof(float));
  }

 private:
  std::shared_ptr<const PyRef> callback_;
  std::string name_;
};

// A press the Python package made (a ScorerPress subclass), as a spec sessions instantiate.
struct PressHandle {
  std::shared_ptr<const PressSpec> spec;
  std::string name;
};

PressHandle make_python_press(nb::object callback, const std::string& name, int64_t window,
                              const std::string& alloc, const std::string& alloc_options) {
  PROTOKV_CHECK(window >= 0, "{}: window must be >= 0, got {}", name, window);
  const press::AllocatorKind kind =
      alloc.empty() ? press::AllocatorKind::Uniform : press::parse_allocator(alloc);
  press::OptionReader options(name, alloc_options, press::allocator_option_specs(kind));
  const press::AllocatorConfig allocator = press::read_allocator_options(kind, options);
  options.finish();
  auto ref = std::make_shared<const PyRef>(std::move(callback));
  return PressHandle{PressSpec::from_factory([ref, name, window, allocator] {
                       return std::make_unique<press::ScoringPress>(
                           name, std::make_unique<PythonScorer>(ref, name), window, allocator);
                     }),
                     name};
}

class PySession {
 public:
  PySession(const Model& model, nb::handle press, std::optional<int64_t> budget,
            std::optional<double> ratio, const std::string& alloc, int64_t ubatch,
            bool compress_local_layers, const std::string& cache_type_k,
            const std::string& cache_type_v, bool llama_cpp_arithmetic,
            bool llama_cpp_flash_attention, int llama_cpp_threads)
      : model_(model) {
    PROTOKV_CHECK(ubatch >= 0, "ubatch must be >= 0, got {}", ubatch);
    SessionOptions options;
    if (nb::isinstance<PressHandle>(press)) {
      PROTOKV_CHECK(alloc.empty(), "a Python press takes its allocator when it is made");
      options.press = nb::cast<const PressHandle&>(press).spec;
      press_text_ = nb::cast<const PressHandle&>(press).name;
    } else {
      options.press = parse_press(press.is_none() ? std::optional<std::string>()
                                                  : std::optional(nb::cast<std::string>(press)),
                                  alloc);
      press_text_ = options.press ? options.press->text() : "full";
    }
    options.budget = make_budget(options.press, budget, ratio);
    options.ubatch = ubatch;
    options.compress_local_layers = compress_local_layers;
    options.cache_type = {kv_cache_type_from_name(cache_type_k),
                          kv_cache_type_from_name(cache_type_v)};
    options.llama_cpp_arithmetic = llama_cpp_arithmetic;
    options.llama_cpp_flash_attention = llama_cpp_flash_attention;
    options.llama_cpp_threads = llama_cpp_threads;
    session_ = std::make_unique<Session>(model.loaded().weights, options);
  }

  Session& session() { return *session_; }
  const Model& model() const { return model_; }
  const std::string& press_text() const { return press_text_; }

  void check_fits(size_t n_new, bool reset) const {
    const int64_t start = reset ? 0 : session_->n_past();
    if (start + static_cast<int64_t>(n_new) <= model_.n_ctx()) return;
    if (reset) fail("a prompt of {} tokens is longer than n_ctx = {}", n_new, model_.n_ctx());
    fail("{} more tokens after {} do not fit n_ctx = {}", n_new, start, model_.n_ctx());
  }
  void prefill(const std::vector<int32_t>& ids) {
    check_fits(ids.size(), true);
    nb::gil_scoped_release release;
    model_.use_threads();
    session_->prefill(ids);
  }
  void append(const std::vector<int32_t>& ids) {
    check_fits(ids.size(), false);
    nb::gil_scoped_release release;
    model_.use_threads();
    session_->append(ids);
  }
  void decode(int32_t token) {
    check_fits(1, false);
    nb::gil_scoped_release release;
    model_.use_threads();
    session_->decode(token);
  }

 private:
  const Model& model_;
  std::string press_text_;
  std::unique_ptr<Session> session_;
};

// A read-only view of the session's logits (the buffer is allocated once per session and
// overwritten by each prefill/append/decode), kept alive by the Python session object.
ConstFloatView logits_view(nb::handle self) {
  PySession& s = nb::cast<PySession&>(self);
  const std::span<const float> logits = s.session().logits();
  const size_t shape[1] = {logits.size()};
  return ConstFloatView(logits.data(), 1, shape, self);
}

nb::list kv_of_layer(PySession& s, int layer) {
  const KvCache& cache = s.session().cache();
  PROTOKV_CHECK(layer >= 0 && layer < cache.n_layers(), "layer {} out of range [0, {})", layer,
                cache.n_layers());
  nb::list heads;
  const int d = cache.head_dim();
  for (int h = 0; h < cache.n_kv_heads(); ++h) {
    const HeadCache& head = cache.layer(layer).heads[h];
    const size_t n = static_cast<size_t>(head.size());
    // Copies as F32 (the cache's rows move as it grows or is compressed, and may be quantised).
    std::vector<float> keys(n * d), values(n * d);
    head.read_values(0, head.size(), values.data());
    for (size_t i = 0; i < n; ++i) {
      // PoD: a shared entry's key is the same entry's key at the lender layer.
      const auto e = static_cast<int64_t>(i);
      const HeadCache& holder =
          head.key_is_shared(e) ? cache.layer(head.key_lender()).heads[h] : head;
      holder.read_keys(e, 1, keys.data() + i * d);
    }
    const std::span<const int32_t> pos = head.positions();
    nb::dict entry;
    entry["keys"] = owned_array(std::move(keys), {n, static_cast<size_t>(d)});
    entry["values"] = owned_array(std::move(values), {n, static_cast<size_t>(d)});
    entry["positions"] = owned_array(std::vector<int32_t>(pos.begin(), pos.end()), {n});
    if (head.has_log_weights()) {
      const std::span<const float> w = head.log_weights();
      entry["log_weights"] = owned_array(std::vector<float>(w.begin(), w.end()), {n});
    }
    heads.append(entry);
  }
  return heads;
}

nb::dict prefill_stats_dict(const PrefillStats& p) {
  nb::dict d;
  d["n_tokens"] = p.n_tokens;
  d["prefill_ms"] = p.prefill_ms;
  d["compress_ms"] = p.compress_ms;
  d[json_keys::kPeakKvBytes] = p.peak_kv_bytes;
  d[json_keys::kKvBytes] = p.kv_bytes;
  d["decode_attended_kv_bytes"] = p.decode_attended_kv_bytes;
  return d;
}

// generate() one token at a time, so that Python can stream, stop on strings and stop early.
class PyGeneration {
 public:
  PyGeneration(PySession& session, const std::vector<int32_t>& prompt,
               const std::vector<int32_t>& fed_after, int max_tokens, float temperature, int top_k,
               float top_p, uint64_t seed, bool ignore_eos)
      : session_(session),
        sampler_(SamplerOptions{temperature, top_k, top_p, seed}),
        generation_(session.session(), session.model().tokenizer(), sampler_,
                    GenerateOptions{max_tokens, ignore_eos}) {
    PromptTokens tokens{prompt, fed_after};
    session.check_fits(static_cast<size_t>(tokens.total()), true);
    // Never past n_ctx: the reply stops there (finish_reason "length").
    max_context_ = session.model().n_ctx();
    nb::gil_scoped_release release;
    session.model().use_threads();
    generation_.start(tokens);
  }

  // The next token and its bytes, or None once generation has stopped.
  std::optional<std::pair<int32_t, nb::bytes>> next() {
    // The token returned last needs a forward pass at position n_past(): not past n_ctx.
    if (emitted_ > 0 && !generation_.finished() && session_.session().n_past() >= max_context_)
      stopped_at_ctx_ = true;
    if (stopped_at_ctx_) return std::nullopt;
    int32_t token = -1;
    std::string piece;
    bool more = false;
    {
      nb::gil_scoped_release release;
      session_.model().use_threads();
      more = generation_.step([&](int32_t t, std::string_view p) {
        token = t;
        piece = p;
      });
    }
    if (!more) return std::nullopt;
    ++emitted_;
    return std::make_pair(token, nb::bytes(piece.data(), piece.size()));
  }

  nb::dict result() const {
    const GenerateResult& r = generation_.result();
    nb::dict d;
    d["tokens"] = r.tokens;
    d["stopped"] =
        stopped_at_ctx_ ? std::string("context_full") : std::string(stop_reason_name(r.stopped));
    d["finished"] = generation_.finished() || stopped_at_ctx_;
    d["prefill"] = prefill_stats_dict(r.prefill);
    d["question_tokens"] = r.question_tokens;
    d["question_ms"] = r.question_ms;
    d["decode_steps"] = r.decode_steps;
    d["decode_ms"] = r.decode_ms;
    return d;
  }

 private:
  PySession& session_;
  Sampler sampler_;
  Generation generation_;
  int64_t max_context_ = 0;
  int64_t emitted_ = 0;
  bool stopped_at_ctx_ = false;
};

// A progress sink that calls `callback(done, total, detail)` (a tqdm bar's updater) with the
// GIL taken; an exception it raises (KeyboardInterrupt, say) stops the evaluation.
eval::ProgressSink python_progress(nb::object callback) {
  if (callback.is_none()) return {};
  auto ref = std::make_shared<const PyRef>(std::move(callback));
  return [ref](int64_t done, int64_t total, const std::string& detail) {
    nb::gil_scoped_acquire gil;
    ref->get()(done, total, detail);
  };
}

// `protokv eval fidelity` on samples cut from `text`: the same report as the CLI's --json.
nb::object eval_fidelity(const Model& model, const std::string& text,
                         const std::vector<std::string>& presses,
                         const std::vector<int64_t>& budgets,
                         const std::vector<double>& memory_shares, const std::string& alloc,
                         const std::string& cache_type_k, const std::string& cache_type_v,
                         int samples, int64_t prompt_len, int64_t continuation,
                         const std::string& reference, bool attention_metrics, bool share_prefill,
                         const std::string& out, bool resume, const std::string& shard,
                         bool progress, nb::object progress_callback) {
  PROTOKV_CHECK(samples >= 1 && samples <= 10000, "samples must be in [1, 10000], got {}", samples);
  PROTOKV_CHECK(prompt_len >= 2, "prompt_len must be at least 2, got {}", prompt_len);
  PROTOKV_CHECK(continuation >= 1, "continuation must be at least 1, got {}", continuation);
  PROTOKV_CHECK(!presses.empty() && !(budgets.empty() && memory_shares.empty()),
                "give at least one press and one budget or kv_memory_share");
  for (int64_t b : budgets) PROTOKV_CHECK(b > 0, "budgets must be > 0, got {}", b);
  PROTOKV_CHECK(!resume || !out.empty(), "resume=True needs out= (the folder to resume from)");
  eval::FidelityOptions options;
  options.presses = presses;
  options.budgets = budgets;
  options.memory_shares = memory_shares;
  options.alloc = alloc;
  options.cache_type = {kv_cache_type_from_name(cache_type_k),
                        kv_cache_type_from_name(cache_type_v)};
  options.reference = reference;
  options.continuation = continuation;
  options.attention_metrics = attention_metrics;
  options.share_prefill = share_prefill;
  if (!shard.empty()) options.shard = eval::EvalShard::parse(shard);
  options.progress = progress;
  options.progress_sink = python_progress(std::move(progress_callback));
  std::string dir;
  if (!out.empty()) {  // as the CLI's --out: samples.jsonl as each sample finishes, then the rest
    dir = eval::open_fidelity_out_dir(out, model.loaded().path, prompt_len, continuation, samples,
                                      resume, options);
  }
  nlohmann::json report;
  {
    nb::gil_scoped_release release;
    model.use_threads();
    const std::vector<eval::FidelitySample> cut =
        eval::samples_from_text(model.tokenizer(), text, prompt_len, continuation, samples);
    eval::FidelityReport r = eval::run_fidelity(model.loaded().weights, cut, options);
    r.config["model"] = model.loaded().path;
    r.config["model_format"] = model.loaded().format;
    r.config["tokenizer"] = "embedded";
    r.config["text_source"] = "python";
    r.config["threads"] = num_threads();
    if (!dir.empty()) eval::write_report_dir(r, dir);
    report = eval::to_json(r);
  }
  return to_python(report);
}

// `protokv eval merge`: the shards' folders of one eval (fidelity, niah, ruler or longbench)
// joined into the report of one run; the dict --json prints.
nb::object eval_merge(const std::vector<std::string>& dirs, const std::string& out) {
  PROTOKV_CHECK(!dirs.empty(), "merge: give the shards' folders");
  nlohmann::json report;
  {
    nb::gil_scoped_release release;
    const nlohmann::json config =
        eval::read_json_object_file((std::filesystem::path(dirs[0]) / "config.json").string());
    if (config.contains("teacher_forcing"))
      report = eval::to_json(eval::merge_fidelity_runs(dirs, out));
    else
      report = eval::merge_longctx_runs(dirs, out).results;
  }
  return to_python(report);
}

// What eval.niah / ruler / longbench share (python/protokv/eval.py fills every key): the runs
// (press specs or Python presses x budgets / ratios) and the harness's options.
eval::LongctxBenchmarkRun longctx_run(const nb::dict& args) {
  auto get = [&](const char* key) {
    PROTOKV_CHECK(args.contains(key), "internal: eval run without '{}'", key);
    return args[key];
  };
  const std::string mode = nb::cast<std::string>(get("mode"));
  PROTOKV_CHECK(mode == "query-aware" || mode == "query-agnostic",
                "mode must be query-aware or query-agnostic, got '{}'", mode);
  const auto budgets = nb::cast<std::vector<int64_t>>(get("budgets"));
  const auto ratios = nb::cast<std::vector<double>>(get("ratios"));
  const auto memory_shares = nb::cast<std::vector<double>>(get("memory_shares"));
  for (int64_t b : budgets) PROTOKV_CHECK(b > 0, "budgets must be > 0, got {}", b);
  for (double r : ratios) PROTOKV_CHECK(r > 0.0 && r <= 1.0, "ratios must be in (0, 1], got {}", r);
  // Press names for the run labels; a Python press is attached to its runs after.
  std::vector<std::string> names;
  std::vector<std::pair<std::string, std::shared_ptr<const PressSpec>>> objects;
  for (nb::handle press : nb::cast<nb::list>(get("presses"))) {
    std::string name;
    if (nb::isinstance<PressHandle>(press)) {
      const auto& handle = nb::cast<const PressHandle&>(press);
      name = handle.name;
      objects.emplace_back(name, handle.spec);
    } else {
      name = nb::cast<std::string>(press);
    }
    PROTOKV_CHECK(std::find(names.begin(), names.end(), name) == names.end(),
                  "press {} is given twice (run labels must differ)", name);
    names.push_back(name);
  }
  eval::LongctxBenchmarkRun run;
  run.options.runs = eval::make_run_specs(names, budgets, ratios, memory_shares);
  for (auto& spec : run.options.runs)
    for (const auto& [name, object] : objects)
      if (spec.press == name) spec.press_object = object;
  run.options.alloc = nb::cast<std::string>(get("alloc"));
  run.options.query_agnostic = mode == "query-agnostic";
  run.options.reference = nb::cast<std::string>(get("reference"));
  run.options.resume = nb::cast<bool>(get("resume"));
  run.options.share_prefill = nb::cast<bool>(get("share_prefill"));
  run.options.batch_decode = nb::cast<bool>(get("batch_decode"));
  run.options.cache_type = {kv_cache_type_from_name(nb::cast<std::string>(get("cache_type_k"))),
                            kv_cache_type_from_name(nb::cast<std::string>(get("cache_type_v")))};
  run.options.progress = nb::cast<bool>(get("progress"));
  run.options.progress_sink = python_progress(nb::borrow(get("progress_callback")));
  run.out_dir = nb::cast<std::string>(get("out"));
  run.limit = nb::cast<int64_t>(get("limit"));
  if (const auto shard = nb::cast<std::string>(get("shard")); !shard.empty())
    run.shard = eval::EvalShard::parse(shard);
  run.config["tokenizer"] = "embedded";
  return run;
}

// Runs a benchmark with the GIL released; returns the results dict (as the CLI's --json) and
// the text tables.
template <class Benchmark>
std::pair<nb::object, std::string> run_benchmark(const Model& model, eval::LongctxBenchmarkRun run,
                                                 const Benchmark& benchmark) {
  eval::LongctxReport report;
  {
    nb::gil_scoped_release release;
    model.use_threads();
    if constexpr (std::is_same_v<Benchmark, eval::NiahBenchmark>)
      report = eval::run_niah_benchmark(model.loaded(), benchmark, std::move(run));
    else if constexpr (std::is_same_v<Benchmark, eval::RulerBenchmark>)
      report = eval::run_ruler_benchmark(model.loaded(), benchmark, std::move(run));
    else
      report = eval::run_longbench_benchmark(model.loaded(), benchmark, std::move(run));
  }
  return {to_python(report.results), report.text};
}

std::pair<nb::object, std::string> eval_niah(const Model& model, const nb::dict& run,
                                             const std::vector<int64_t>& lengths,
                                             const std::vector<double>& depths,
                                             const std::string& needle, const std::string& question,
                                             int max_new_tokens, int samples,
                                             const std::string& haystack,
                                             const std::string& haystack_kind, uint64_t seed) {
  eval::NiahBenchmark b;
  b.niah.lengths = lengths;
  b.niah.depths = depths;
  b.niah.needle = needle;
  b.niah.question = question;
  b.niah.max_new_tokens = max_new_tokens;
  b.niah.samples_per_cell = samples;
  b.niah.seed = seed;
  b.haystack_text = haystack;
  b.haystack_kind = haystack_kind;
  return run_benchmark(model, longctx_run(run), b);
}

// ruler(protocol="kvpress"): the run's settings the protocol fixes must be left unset (empty
// lists; mode and reference "", Python's None), then take the protocol's
// (eval::KvpressRulerProtocol).
void apply_kvpress_protocol(nb::dict& run, const std::vector<int64_t>& lengths) {
  using P = eval::KvpressRulerProtocol;
  std::vector<std::string> given;
  for (const char* key : {"budgets", "ratios", "memory_shares"})
    if (nb::len(nb::object(run[key])) > 0) given.emplace_back(key);
  if (!lengths.empty()) given.emplace_back("lengths");
  for (const char* key : {"mode", "reference"})
    if (!nb::cast<std::string>(run[key]).empty()) given.emplace_back(key);
  P::refuse_given(given);
  run["mode"] = P::kMode;
  run["reference"] = P::kReference;
  run["ratios"] = std::vector<double>(std::begin(P::kKeptShares), std::end(P::kKeptShares));
  // Python presses (PressHandle) stay where they are; the reference joins first when missing.
  nb::list presses = nb::cast<nb::list>(run["presses"]);
  bool has_full = false;
  for (nb::handle p : presses)
    has_full = has_full || (nb::isinstance<nb::str>(p) && nb::cast<std::string>(p) == "full");
  if (!has_full) {
    nb::list with_full;
    with_full.append(P::kReference);
    for (nb::handle p : presses) with_full.append(p);
    run["presses"] = with_full;
  }
}

std::pair<nb::object, std::string> eval_ruler(const Model& model, nb::dict run,
                                              const std::vector<std::string>& tasks,
                                              const std::vector<int64_t>& lengths, int samples,
                                              const std::string& haystack, const std::string& squad,
                                              const std::string& hotpotqa, uint64_t seed,
                                              const std::string& protocol) {
  PROTOKV_CHECK(protocol.empty() || protocol == "kvpress",
                "protocol: '{}' is not a known protocol (kvpress)", protocol);
  eval::RulerBenchmark b;
  if (protocol == "kvpress") {
    apply_kvpress_protocol(run, lengths);
    b.kvpress_protocol = true;
  }
  b.ruler.tasks = tasks;
  b.ruler.lengths = lengths;
  b.ruler.samples = samples;
  b.ruler.seed = seed;
  b.ruler.essay_text = haystack;
  b.ruler.squad_path = squad;
  b.ruler.hotpotqa_path = hotpotqa;
  return run_benchmark(model, longctx_run(run), b);
}

std::pair<nb::object, std::string> eval_longbench(const Model& model, const nb::dict& run,
                                                  const std::string& data_dir,
                                                  const std::vector<std::string>& datasets,
                                                  bool longbench_e, int64_t max_length) {
  eval::LongbenchBenchmark b{data_dir, datasets, longbench_e, max_length};
  eval::check_longbench_benchmark(b);
  return run_benchmark(model, longctx_run(run), b);
}

}  // namespace
}  // namespace protokv::python

NB_MODULE(_core, m) {
  using namespace protokv;
  using namespace protokv::python;
  m.doc() = "protokv's C++ engine (use the protokv package, not this module)";
  nb::exception<Error>(m, "Error", PyExc_ValueError);
  m.attr("__version__") = PROTOKV_VERSION;

  m.def("press_names", &press_names, "Names of every registered press, in display order.");
  m.def("press_help", &press_help, "The presses' help text (as `protokv help-presses`).");
  m.def(
      "press_options",
      [](const std::string& name) {
        // The press's option schema as dicts (key, type, default, values, help, reference):
        // the Python classes' signatures and docstrings are made from it.
        nb::list rows;
        for (const press::OptionSpec& spec : press_option_specs(name)) {
          nb::dict row;
          row["key"] = std::string(spec.key);
          row["default"] = press::default_text(spec);
          row["values"] = press::range_text(spec);
          row["help"] = std::string(spec.help);
          row["reference"] = std::string(spec.reference);
          rows.append(row);
        }
        return rows;
      },
      nb::arg("name"), "The options of press `name`: key, default, values, help, reference.");
  m.def(
      "press_config",
      [](const std::string& spec, const std::string& alloc) {
        return to_python(PressSpec::parse(spec, alloc)->config());
      },
      "spec"_a, "alloc"_a = "",
      "The resolved configuration (every option, defaults filled in) of a press spec "
      "NAME[:key=value,...]; raises protokv.Error for an unknown press or option.");
  m.def("set_threads", &set_threads, "n"_a);
  m.def(
      "kernel_variants",
      [] {
        std::vector<std::string> available;
        for (kernels::Isa isa : kernels::available_isas())
          available.emplace_back(kernels::isa_name(isa));
        return std::make_pair(available, std::string(kernels::isa_name(kernels::active_isa())));
      },
      "The kernel variants this CPU runs (scalar first) and the active one (the widest, or "
      "PROTOKV_ISA's); raises protokv.Error when PROTOKV_ISA names one it cannot run.");
  m.def(
      "blas_core",
      [] {
        const kernels::BlasCore core = kernels::blas_core();
        return std::make_pair(core.name, core.better);
      },
      "OpenBLAS's core type (the GEMM kernels it runs) and the better one for this CPU, or an "
      "empty string when its choice is as good (kernels/blas_core.h).");

  m.def("eval_fidelity", &eval_fidelity, "model"_a, "text"_a, "presses"_a, "budgets"_a,
        "memory_shares"_a, "alloc"_a, "cache_type_k"_a, "cache_type_v"_a, "samples"_a,
        "prompt_len"_a, "continuation"_a, "reference"_a, "attention_metrics"_a, "share_prefill"_a,
        "out"_a, "resume"_a, "shard"_a, "progress"_a, "progress_callback"_a.none());
  m.def("eval_merge", &eval_merge, "dirs"_a, "out"_a);
  m.def("eval_niah", &eval_niah, "model"_a, "run"_a, "lengths"_a, "depths"_a, "needle"_a,
        "question"_a, "max_new_tokens"_a, "samples"_a, "haystack"_a, "haystack_kind"_a, "seed"_a);
  m.def("eval_ruler", &eval_ruler, "model"_a, "run"_a, "tasks"_a, "lengths"_a, "samples"_a,
        "haystack"_a, "squad"_a, "hotpotqa"_a, "seed"_a, "protocol"_a);
  m.def("eval_longbench", &eval_longbench, "model"_a, "run"_a, "data_dir"_a, "datasets"_a, "e"_a,
        "max_length"_a);

  nb::class_<Model>(m, "Model")
      .def(nb::init<const std::string&, int, int64_t, const std::string&>(), "path"_a,
           "n_threads"_a = 0, "n_ctx"_a = 0, "chat_format"_a = "")
      .def("tokenize", &Model::tokenize, "text"_a, "add_bos"_a, "special"_a)
      .def("detokenize", &Model::detokenize, "ids"_a)
      .def("render_chat", &Model::render_chat, "messages"_a, "add_generation_prompt"_a = true)
      .def_prop_ro("n_threads", &Model::n_threads)
      .def_prop_ro("n_ctx", &Model::n_ctx)
      .def_prop_ro("n_ctx_train", [](const Model& m) { return m.config().context_length; })
      .def_prop_ro("n_vocab", [](const Model& m) { return m.config().vocab_size; })
      .def_prop_ro("n_layers", [](const Model& m) { return m.config().n_layers; })
      .def_prop_ro("n_kv_heads", [](const Model& m) { return m.config().n_kv_heads; })
      .def_prop_ro("head_dim", [](const Model& m) { return m.config().head_dim(); })
      .def_prop_ro("architecture", [](const Model& m) { return m.config().architecture; })
      .def_prop_ro("path", [](const Model& m) { return m.loaded().path; })
      .def_prop_ro("chat_format", &Model::chat_format)
      .def_prop_ro("add_bos", [](const Model& m) { return m.tokenizer().add_bos(); })
      .def_prop_ro("token_bos", [](const Model& m) { return m.tokenizer().bos_id(); })
      .def_prop_ro("token_eos", [](const Model& m) { return m.tokenizer().eos_id(); })
      .def("is_end_of_generation",
           [](const Model& m, int32_t t) { return m.tokenizer().is_end_of_generation(t); });

  nb::class_<PressHandle>(m, "PressHandle");
  m.def("python_press", &make_python_press, "callback"_a, "name"_a, "window"_a, "alloc"_a,
        "alloc_options"_a,
        "A scoring press whose scores come from callback(layer, keys, values, window_queries, "
        "positions) (protokv.ScorerPress builds it).");

  nb::class_<PySession>(m, "Session")
      .def(nb::init<const Model&, nb::handle, std::optional<int64_t>, std::optional<double>,
                    const std::string&, int64_t, bool, const std::string&, const std::string&, bool,
                    bool, int>(),
           "model"_a, "press"_a = nb::none(), "budget"_a = nb::none(), "ratio"_a = nb::none(),
           "alloc"_a = "", "ubatch"_a = 0, "compress_local_layers"_a = false,
           "cache_type_k"_a = "f32", "cache_type_v"_a = "f32", "llama_cpp_arithmetic"_a = false,
           "llama_cpp_flash_attention"_a = false, "llama_cpp_threads"_a = 1, nb::keep_alive<1, 2>())
      .def(
          "prefill",
          [](nb::handle self, const std::vector<int32_t>& ids) {
            nb::cast<PySession&>(self).prefill(ids);
            return logits_view(self);
          },
          "ids"_a)
      .def(
          "append",
          [](nb::handle self, const std::vector<int32_t>& ids) {
            nb::cast<PySession&>(self).append(ids);
            return logits_view(self);
          },
          "ids"_a)
      .def(
          "decode",
          [](nb::handle self, int32_t token) {
            nb::cast<PySession&>(self).decode(token);
            return logits_view(self);
          },
          "token"_a)
      .def("logits", &logits_view)
      .def("kv", &kv_of_layer, "layer"_a)
      .def("kv_bytes", [](PySession& s) { return s.session().cache().kv_bytes(); })
      .def_prop_ro("n_past", [](PySession& s) { return s.session().n_past(); })
      .def_prop_ro("press", &PySession::press_text)
      .def("prefill_stats",
           [](PySession& s) { return prefill_stats_dict(s.session().prefill_stats()); })
      .def("reset", [](PySession& s) { s.session().reset(); });

  nb::class_<PyGeneration>(m, "Generation")
      .def(nb::init<PySession&, const std::vector<int32_t>&, const std::vector<int32_t>&, int,
                    float, int, float, uint64_t, bool>(),
           "session"_a, "prompt"_a, "fed_after"_a, "max_tokens"_a, "temperature"_a, "top_k"_a,
           "top_p"_a, "seed"_a, "ignore_eos"_a, nb::keep_alive<1, 2>())
      .def("next", &PyGeneration::next)
      .def("result", &PyGeneration::result);
}
