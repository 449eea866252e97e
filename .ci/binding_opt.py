"""Does a binding's -O level show in a host-bound step? optim's many-small-tensors AdamW step in eager mode spends
its time in the binding's loop over 2000 tensors (checks, pointer tables). Times v3/v4 steps with the binding built
at -O1 (the default) and -O3, alternating A, B, A, B in fresh processes on one machine; prints one line per run.

    python .ci/binding_opt.py            # on the GPU machine
"""
import json
import os
import subprocess
import sys

CHILD = r"""
import json, statistics, time, torch
from lab.kernels import optim
from lab.studies.optim import host_us
torch.manual_seed(0)
dev = "cuda"
shapes = optim.many_small_shapes()
p = [torch.randn(s, device=dev) for s in shapes]
g = [torch.randn_like(t) for t in p]
m = [torch.zeros_like(t) for t in p]
v = [torch.zeros_like(t) for t in p]
st = [torch.zeros(1, device=dev) for _ in p]
hp = dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01, decoupled=True)
out = {}
for ver in ("v3", "v4"):
    step = lambda: optim.adam_step(p, g, m, v, [], st, version=ver, **hp)
    for _ in range(5):
        step()
    host = [host_us(step, reps=50) for _ in range(3)]
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(50):
        torch.cuda.synchronize(); e0.record(); step(); e1.record(); e1.synchronize(); ts.append(e0.elapsed_time(e1) * 1e3)
    out[ver] = {"host_us": min(host), "events_us": statistics.median(ts)}
print("RESULT", json.dumps(out))
"""


def main() -> int:
    for opt in ("-O1", "-O3", "-O1", "-O3"):
        env = {**os.environ, "LAB_BINDING_OPT": opt}
        r = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True)
        line = next((ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")), None)
        if line is None:
            print(f"binding {opt}: failed\n{r.stderr[-3000:]}")
            return 1
        res = json.loads(line[7:])
        print(f"binding {opt}: " + ", ".join(f"{k} host {d['host_us']:.0f} us, events {d['events_us']:.0f} us"
                                             for k, d in res.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
