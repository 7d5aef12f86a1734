// SPDX-License-Identifier: Apache-2.0
// protokv-dump-logits: llama.cpp's logits for given token ids, teacher-forced (by default in one
// batch), for the fixtures of tests/test_llama_cpp_oracle.cpp. Built by tools/llama_cpp/build.sh
// against the llama.cpp it builds (not part of protokv's build).
//
//   protokv-dump-logits [--prompt K [--last-prompt-logits]] [--flash-attn] MODEL.gguf OUT.logits
//                       TOKEN_ID...
//   protokv-dump-logits --max-diff A.logits B.logits    # prints max |logit A - logit B|
//
// The context keeps K/V in F32 and by default runs without flash attention, so the reference
// carries only the rounding of the weights and of llama.cpp's own kernels (e.g. int8 activations in
// quantised mat-muls), not of an F16 cache. `--prompt K` evaluates the first K tokens in one batch
// and each later one alone, as llama-completion generates (its mat-vec kernels, not its batched
// ones);
// `--last-prompt-logits` asks the batch for its last row's logits only, as llama-completion does
// (llama.cpp then runs the last layer's FFN on that row alone; the other prompt rows are written
// as zeros with argmax -1). `--flash-attn` turns llama.cpp's flash attention on (llama-completion's
// default on a CPU).
//
// OUT.logits (little-endian): "PKVLOGIT", uint32 version (1), uint32 n_tokens, uint32 n_vocab,
// int32 tokens[n_tokens], int32 argmax[n_tokens], float32 logits[n_tokens][n_vocab].
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "llama.h"

namespace {

void quiet_log(enum ggml_log_level level, const char* text, void*) {
  if (level >= GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
}

int die(const std::string& message) {
  std::fprintf(stderr, "protokv-dump-logits: error: %s\n", message.c_str());
  return 1;
}

// The logits of a .logits file (empty on a malformed one).
std::vector<float> read_logits(const char* path) {
  std::vector<float> out;
  std::FILE* in = std::fopen(path, "rb");
  if (in == nullptr) return out;
  char magic[8];
  uint32_t header[3];
  if (std::fread(magic, 1, 8, in) == 8 && std::memcmp(magic, "PKVLOGIT", 8) == 0 &&
      std::fread(header, sizeof(uint32_t), 3, in) == 3 && header[0] == 1 &&
      std::fseek(in, static_cast<long>(header[1]) * 8, SEEK_CUR) == 0) {
    out.resize(static_cast<size_t>(header[1]) * header[2]);
    if (std::fread(out.data(), sizeof(float), out.size(), in) != out.size()) out.clear();
  }
  std::fclose(in);
  return out;
}

int max_diff(const char* a_path, const char* b_path) {
  const std::vector<float> a = read_logits(a_path), b = read_logits(b_path);
  if (a.empty() || a.size() != b.size()) return die("unreadable or mismatched logits files");
  double worst = 0.0;
  for (size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
  std::printf("%.3g\n", worst);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && std::strcmp(argv[1], "--max-diff") == 0) return max_diff(argv[2], argv[3]);
  int first = 1;
  long prompt_tokens = -1;  // all in one batch
  bool flash_attn = false;
  bool last_prompt_logits = false;
  for (; first < argc && argv[first][0] == '-' && argv[first][1] == '-'; ++first) {
    if (std::strcmp(argv[first], "--flash-attn") == 0) {
      flash_attn = true;
    } else if (std::strcmp(argv[first], "--last-prompt-logits") == 0) {
      last_prompt_logits = true;
    } else if (std::strcmp(argv[first], "--prompt") == 0) {
      if (first + 1 >= argc) return die("--prompt needs a token count");
      char* end = nullptr;
      errno = 0;
      prompt_tokens = std::strtol(argv[++first], &end, 10);
      if (end == argv[first] || *end != '\0' || errno != 0 || prompt_tokens < 1 ||
          prompt_tokens > INT32_MAX)
        return die(std::string("--prompt needs a positive count, not ") + argv[first]);
    } else {
      return die(std::string("unknown option ") + argv[first]);
    }
  }
  if (argc - first < 3) {
    std::fprintf(stderr,
                 "usage: %s [--prompt K [--last-prompt-logits]] [--flash-attn] MODEL.gguf "
                 "OUT.logits TOKEN_ID...\n",
                 argv[0]);
    return 1;
  }
  const std::string model_path = argv[first];
  const std::string out_path = argv[first + 1];
  std::vector<llama_token> tokens;
  for (int i = first + 2; i < argc; ++i) {
    char* end = nullptr;
    errno = 0;
    const long id = std::strtol(argv[i], &end, 10);
    if (end == argv[i] || *end != '\0' || errno != 0 || id < 0 || id > INT32_MAX)
      return die(std::string("bad token id ") + argv[i]);
    tokens.push_back(static_cast<llama_token>(id));
  }
  const auto n_tokens = static_cast<int32_t>(tokens.size());

  llama_log_set(quiet_log, nullptr);
  llama_backend_init();
  llama_model_params model_params = llama_model_default_params();
  model_params.n_gpu_layers = 0;
  model_params.progress_callback = [](float, void*) { return true; };  // no progress dots
  llama_model* model = llama_model_load_from_file(model_path.c_str(), model_params);
  if (model == nullptr) return die("cannot load " + model_path);
  const llama_vocab* vocab = llama_model_get_vocab(model);
  const int32_t n_vocab = llama_vocab_n_tokens(vocab);
  for (const llama_token t : tokens)
    if (t >= n_vocab) return die("token id " + std::to_string(t) + " out of range");

  llama_context_params ctx_params = llama_context_default_params();
  ctx_params.n_ctx = static_cast<uint32_t>(n_tokens);
  ctx_params.n_batch = static_cast<uint32_t>(n_tokens);
  ctx_params.n_ubatch = static_cast<uint32_t>(n_tokens);
  ctx_params.n_seq_max = 1;
  ctx_params.n_threads = 1;
  ctx_params.n_threads_batch = 1;
  ctx_params.type_k = GGML_TYPE_F32;
  ctx_params.type_v = GGML_TYPE_F32;
  ctx_params.flash_attn_type =
      flash_attn ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
  llama_context* ctx = llama_init_from_model(model, ctx_params);
  if (ctx == nullptr) return die("cannot create a context");

  std::vector<float> logits(static_cast<size_t>(n_tokens) * static_cast<size_t>(n_vocab));
  std::vector<int32_t> argmax(static_cast<size_t>(n_tokens), -1);
  llama_batch batch = llama_batch_init(n_tokens, 0, 1);
  const int32_t batch_size =
      prompt_tokens < 0 ? n_tokens : static_cast<int32_t>(std::min<long>(prompt_tokens, n_tokens));
  // Teacher forcing: logits at every position, from one batch of `batch_size` tokens and then
  // one token per llama_decode.
  for (int32_t start = 0; start < n_tokens;) {
    const int32_t count = start == 0 ? batch_size : 1;
    for (int32_t i = 0; i < count; ++i) {
      batch.token[i] = tokens[static_cast<size_t>(start + i)];
      batch.pos[i] = start + i;
      batch.n_seq_id[i] = 1;
      batch.seq_id[i][0] = 0;
      batch.logits[i] = !last_prompt_logits || i == count - 1;
    }
    batch.n_tokens = count;
    if (llama_decode(ctx, batch) != 0) return die("llama_decode failed");
    for (int32_t i = last_prompt_logits ? count - 1 : 0; i < count; ++i) {
      const float* row = llama_get_logits_ith(ctx, i);
      if (row == nullptr) return die("no logits for position " + std::to_string(start + i));
      const size_t at = static_cast<size_t>(start + i);
      std::memcpy(logits.data() + at * n_vocab, row, sizeof(float) * n_vocab);
      int32_t best = 0;
      for (int32_t v = 1; v < n_vocab; ++v)
        if (row[v] > row[best]) best = v;
      argmax[at] = best;
    }
    start += count;
  }

  std::FILE* out = std::fopen(out_path.c_str(), "wb");
  if (out == nullptr) return die("cannot write " + out_path);
  const uint32_t header[3] = {1, static_cast<uint32_t>(n_tokens), static_cast<uint32_t>(n_vocab)};
  bool ok = std::fwrite("PKVLOGIT", 1, 8, out) == 8;
  ok = ok && std::fwrite(header, sizeof(uint32_t), 3, out) == 3;
  ok = ok && std::fwrite(tokens.data(), sizeof(int32_t), tokens.size(), out) == tokens.size();
  ok = ok && std::fwrite(argmax.data(), sizeof(int32_t), argmax.size(), out) == argmax.size();
  ok = ok && std::fwrite(logits.data(), sizeof(float), logits.size(), out) == logits.size();
  ok = (std::fclose(out) == 0) && ok;
  if (!ok) return die("short write to " + out_path);

  llama_batch_free(batch);
  llama_free(ctx);
  llama_model_free(model);
  llama_backend_free();
  return 0;
}
