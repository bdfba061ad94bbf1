"""AMX-INT8 tiles against the VNNI tiles over the quantized GEMM's panels (1 thread,
interleaved rounds, medians): prints and saves benchmarks/results/amxint8_gemm_vs_vnni.json.
Needs a CPU with amx_int8 (the engine is set directly: INFERPATH_AMX_INT8 is not read)."""
import json
import statistics
import sys
import time

import inferpath  # noqa: F401  (first: its thread policy)
import torch
sys.path.insert(0, str(__import__("pathlib").Path(__file__).parents[1] / "tests"))
from gguf import GGMLQuantizationType as Q
from test_quantized import random_weight
from inferpath.kernels import build, ops
from inferpath.kernels.repacked import kernel_type
torch.set_num_threads(1)
lib = build._library("avx512")[0]
fn = build.native_quant_matmul()
res = []
for qt, n, k in [(Q.Q4_1, 1536, 576), (Q.Q4_K, 1536, 1536), (Q.Q6_K, 1536, 1536), (Q.Q8_0, 1536, 1536)]:
    w = random_weight(qt, n, k, seed=0)
    for m in [16, 64, 512]:
        x = torch.randn(m, k)
        t = {0: [], 2: []}
        for r in range(7):
            for e in (0, 2):
                lib.inferpath_amx_int8_use(e)
                s = time.perf_counter(); ops.run_quant_matmul(fn, x, w.data, kernel_type(w), None, n); t[e].append(time.perf_counter() - s)
        v, a = statistics.median(t[0]) * 1e3, statistics.median(t[2]) * 1e3
        res.append(dict(qtype=qt.name, n=n, k=k, rows=m, vnni_ms=round(v, 3), amx_ms=round(a, 3), ratio=round(v / a, 2)))
        print(res[-1])
build._forget_decisions()
json.dump(res, open("benchmarks/results/amxint8_gemm_vs_vnni.json", "w"), indent=1)
