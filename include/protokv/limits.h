// SPDX-License-Identifier: Apache-2.0
#pragma once
// Every bound protokv enforces on what it reads or is asked to do, in one place (docs/security.md
// says why each exists). Input beyond a bound is refused with one line (protokv::Error) before
// anything is allocated for it: a count in a file header, a size in a flag, never trusted.
#include <cstddef>
#include <cstdint>

namespace protokv::limits {

// ---- model shape (ModelConfig::validate) ----
inline constexpr int kMaxModelDim = 1 << 16;  // embedding length; the feed-forward up to 8x
inline constexpr int kMaxLayers = 1024;
inline constexpr int kMaxVocab = 1 << 22;  // model and tokenizer vocabularies (4M tokens)
inline constexpr int kMaxContext = 1 << 24;
inline constexpr int kMaxTensorDims = 4;  // GGUF tensors, read and written

// ---- GGUF files (io/gguf_reader.cpp) ----
inline constexpr size_t kMaxGgufKeyLength = size_t{1} << 16;
inline constexpr size_t kMaxGgufStringLength = size_t{1} << 26;  // 64 MiB; chat templates are KiB
inline constexpr size_t kMaxGgufTensorNameLength = 1024;
// In memory a metadata array element costs ~50 bytes against 1 on disk; capping the total keeps
// a hostile file from making us allocate hundreds of times its size. Real vocabularies and merge
// lists stay well below this.
inline constexpr uint64_t kMaxGgufArrayElements = uint64_t{1} << 22;
inline constexpr int kMaxGgufArrayDepth = 4;
inline constexpr uint64_t kMaxGgufAlignment = uint64_t{1} << 24;

// ---- safetensors checkpoints (io/safetensors.cpp) ----
// The reference implementation (safetensors' Rust crate) refuses headers above 100 MB; a real
// header is a few hundred kilobytes even for the largest checkpoints.
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = uint64_t{100} << 20;

// ---- calibration profiles (press/calibration_profile.cpp) ----
inline constexpr int64_t kMaxProfileLayers = 1 << 12;
inline constexpr int64_t kMaxProfileHeads = 1 << 12;
inline constexpr int64_t kMaxProfileHeadDim = 1 << 14;

// ---- requests and flags ----
// A text input (prompt file, haystack, eval text) beyond this is a mistake (a model file passed
// as -f, say), not a prompt.
inline constexpr uint64_t kMaxTextFileBytes = uint64_t{1} << 28;
// More threads is a typo, not a machine.
inline constexpr int kMaxThreads = 1024;
// More (press, budget) runs than this in one evaluation is a mistake in a list, not a study: each
// run holds a session and answers every sample.
inline constexpr size_t kMaxEvalRuns = 256;
// `--shard I/N`: a job array of more shards than this is a typo (a sample id passed as N, say).
inline constexpr int64_t kMaxEvalShards = 100000;
inline constexpr int64_t kMaxCalibrationSamples = 4096;
// `make-model` refuses to write models larger than this.
inline constexpr uint64_t kMaxRandomModelBytes = uint64_t{64} << 30;

// ---- the server (server/*, `protokv serve`) ----
// A request body beyond --max-body is answered 413 before it is parsed. The default holds a
// 128K-token prompt (under 1 MiB of text) many times over; the largest allowed is a mistake's
// limit, not a prompt's.
inline constexpr size_t kDefaultMaxRequestBodyBytes = size_t{8} << 20;
inline constexpr size_t kMinRequestBodyBytes = 1024;
inline constexpr size_t kMaxRequestBodyBytes = size_t{1} << 30;
inline constexpr size_t kMaxStopSequences = 4;  // OpenAI's limit
// Sessions decoding at once (--parallel): each holds its own KV cache and an HTTP thread.
inline constexpr int kMaxParallelSessions = 1024;

}  // namespace protokv::limits
