"""Bytes per element the memory plan counts with (pure)."""

FP32 = 4
BF16 = 2
TOKEN_ID = 8  # int64 token ids and targets
WIRE_BYTES = {"float32": 4.0, "bfloat16": 2.0, "float16": 2.0, "int8": 1.0, "int4": 0.5}
# Encoded snapshot bytes per float32 element, upper ends (the docs measure shuffle-zstd at
# 1.16x and int8-zstd at 3.9x fewer bytes than raw; trained weights compress better than these).
CODEC_BYTES = {"raw": 4.0, "zstd": 4.0, "shuffle-zstd": 4.0, "bf16-shuffle-zstd": 2.0, "int8-zstd": 1.05,
               "int4-zstd": 0.55, "int2-zstd": 0.31}
PRECISION_BYTES = {"float32": FP32, "bfloat16": BF16}
OPTIMIZER_STEP_TENSORS = 1  # AdamW's temporary (foreach: the denominator), at most a float32 copy of the parameters
