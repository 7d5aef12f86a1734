// SPDX-License-Identifier: Apache-2.0
#pragma once
// The JSON keys of KV-cache memory that protokv writes (docs/json.md), one constant per meaning,
// so that every writer and reader spells a key one way. The spellings are historical and kept:
// renaming a key would break every results file written so far. Which one a document carries
// says what was measured:
namespace protokv::json_keys {

// Keys and values held right after prefill (after compression), in bytes, exact; `generate`
// calls it kv_bytes_after_prefill.
inline constexpr const char* kKvBytes = "kv_bytes";
inline constexpr const char* kKvBytesAfterPrefill = "kv_bytes_after_prefill";
// What the full cache holds for the same prompt (the 100% of the shares below): one meaning, two
// spellings (generate and the server; long-context records).
inline constexpr const char* kKvBytesFull = "kv_bytes_full";
inline constexpr const char* kFullKvBytes = "full_kv_bytes";
// The most bytes held at once during prefill (before compression frees them): one meaning, two
// spellings (long-context records and Python; generate and bench).
inline constexpr const char* kPeakKvBytes = "peak_kv_bytes";
inline constexpr const char* kKvBytesPeakPrefill = "kv_bytes_peak_prefill";
// Bytes at the end of generation (the prefill's plus the generated tokens').
inline constexpr const char* kKvBytesEnd = "kv_bytes_end";
// Bytes the decode attention read (below the stored bytes for a recall press such as clusterkv):
// the mean over a fidelity run's decode steps ...
inline constexpr const char* kKvBytesAttended = "kv_bytes_attended";
// ... and at the last decode step: one meaning, two spellings (long-context records and the
// demo; generate).
inline constexpr const char* kAttendedKvBytes = "attended_kv_bytes";
inline constexpr const char* kKvBytesAttendedLastStep = "kv_bytes_attended_last_step";
// The stored and attended bytes over the full cache's kv_bytes on the same sample.
inline constexpr const char* kStoredShare = "stored_share";
inline constexpr const char* kAttendedShare = "attended_share";

}  // namespace protokv::json_keys
