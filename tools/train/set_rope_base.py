# SPDX-License-Identifier: Apache-2.0
"""Writes llama.rope.freq_base (a float32 already present) in a GGUF file, in place:
  python3 tools/train/set_rope_base.py model.gguf 500000
`protokv convert` of a llama2.c checkpoint writes 10000 (the format has no theta field)."""

import struct
import sys

KEY = b"llama.rope.freq_base"


def main():
    path, base = sys.argv[1], float(sys.argv[2])
    with open(path, "r+b") as f:
        data = f.read(1 << 20)  # the metadata sits in the header
        at = data.find(struct.pack("<Q", len(KEY)) + KEY)
        if at < 0:
            raise SystemExit(f"{path}: no {KEY.decode()} key")
        at += 8 + len(KEY)
        (value_type,) = struct.unpack_from("<I", data, at)
        if value_type != 6:  # GGUF_TYPE_FLOAT32
            raise SystemExit(f"{path}: {KEY.decode()} is not a float32 (type {value_type})")
        f.seek(at + 4)
        f.write(struct.pack("<f", base))


if __name__ == "__main__":
    main()
