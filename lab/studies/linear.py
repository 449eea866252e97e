"""linear's study: what the compiler made of each rung (`kernel_report`), read off the built CUDA units.

Registers, static shared memory and stack (spills) from cuobjdump's resource report, and counts of the SASS
instructions that tell the rungs apart: FFMA (SIMT math), LDS.128 (vectorised shared loads), LDGSTS (cp.async),
LDSM (ldmatrix), HMMA (mma.sync), HGMMA (wgmma), UTMALDG (TMA). notebooks/02_matmul_to_linear.ipynb prints it.
"""
from __future__ import annotations

import re
import subprocess

from .. import build
from ..kernels.linear import FAMILY

# version (with its precision where a version runs two; the gemv op's kernel named with its op) -> substring of its
# kernel's symbol (the templated variants the launchers pick at 4096³)
KERNELS = {
    "v1": "v1_naive", "v2": "v2_coalesced", "v3": "v3_smem_tiles", "v4": "v4_blocktile_1d", "v5": "v5_blocktile_2d",
    "v6": "v6_vectorizedILb1", "v7": "v7_warptileILb1", "v8": "async_copy_warptileILi2E",
    "v9": "async_copy_warptileILi4E", "v10 tf32": "v10_mma_syncIfLb1", "v10 bf16": "v10_mma_syncI13__nv_bfloat16Lb1",
    "v11 tf32": "v11_wgmmaIfLi256", "v11 bf16": "v11_wgmmaI13__nv_bfloat16Li256", "gemv v1": "gemv_v1ILi1ELi12ELb1ELb1",
}
SASS_OPS = ("FFMA", "LDS.128", "LDS", "STS", "LDG", "LDGSTS", "LDSM", "HMMA", "HGMMA", "UTMALDG", "BAR.SYNC")


def kernel_report() -> list[dict]:
    """Per version: registers, static shared memory, stack (spills) from the compiler's resource report, and counts
    of the SASS instructions that tell the rungs apart (FFMA, LDS.128, LDGSTS, HMMA, HGMMA, ...). Needs a CUDA build
    and cuobjdump (in $CUDA_HOME/bin or on PATH)."""
    usage = build.resource_usage(FAMILY)
    res = {}
    for m in re.finditer(r"Function (\S+):\s*\n\s*REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", usage):
        res[m.group(1)] = {"registers": int(m.group(2)), "stack": int(m.group(3)), "smem_static": int(m.group(4)),
                           "local": int(m.group(5))}
    cuobjdump = build.cuda_tool("cuobjdump") or "cuobjdump"
    # the kernels live in the CUDA units (one library per unit and variant), not in the binding
    sass = "".join(subprocess.run([cuobjdump, "-sass", str(t.artifact)], capture_output=True, text=True).stdout
                   for t in build.spec(FAMILY, "cuda").units if t.kind == "cuda")
    bodies = {}
    for chunk in sass.split("Function : ")[1:]:
        name, _, body = chunk.partition("\n")
        bodies[name.strip()] = body
    rows = []
    for v, key in KERNELS.items():
        sym = next((s for s in res if key in s), None)
        body = next((b for s, b in bodies.items() if key in s), "")
        ops = re.findall(r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", body, re.M)
        counts = {op: sum(1 for o in ops if o == op or o.startswith(op + ".")) for op in SASS_OPS}
        counts["LDS"] -= counts["LDS.128"]
        rows.append({"version": v, "kernel": key, **(res.get(sym) or {}), **counts})
    return rows
