"""Where ``gpuflame run``'s extra CPU time goes on the demo: each part run alone, min and median of N.

Parts: a bare interpreter, the in-process imports, torch and transformers,
the launcher around ``python -c pass``, the demo bare and under ``gpuflame
run``, ``gpuflame.start()``/``stop()`` around the demo through the API (and
the number of history events), and the launcher's read, merge and write of
that file. CPU time (user + system) from ``wait4``, torch on one thread.

    python bench/bench_run_parts.py TREE [ROUNDS]
"""

import json
import os
import subprocess
import sys
import tempfile

PY = sys.executable
TREE = sys.argv[1]
DEMO = os.path.join(TREE, "examples", "demo.py")
env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.path.join(TREE, "src"))
out = tempfile.mkdtemp()


def cpu(cmd, capture=False):
    out = subprocess.PIPE if capture else subprocess.DEVNULL
    p = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.PIPE)
    _, st, ru = os.wait4(p.pid, 0)
    data = p.stdout.read().decode() if capture else ""
    assert os.waitstatus_to_exitcode(st) == 0, p.stderr.read().decode()
    return ru.ru_utime + ru.ru_stime, data


API = r"""
import sys, time, runpy, json
import gpuflame
t0 = time.process_time()
gpuflame.start(sys.argv[1], backend="torch")
t1 = time.process_time()
sys.argv = [sys.argv[2]]
runpy.run_path(sys.argv[0], run_name="__main__")
t2 = time.process_time()
gpuflame.stop()
t3 = time.process_time()
p = gpuflame.load(__import__("os").environ["OUTF"])
print(json.dumps({"start": t1 - t0, "stop": t3 - t2, "events": p.history.events() if p.history else 0}))
"""
MERGE = r"""
import sys, time, json
t0 = time.process_time()
from gpuflame.formats import load, save
from gpuflame.model import merge
t1 = time.process_time()
p = load(sys.argv[1])
t2 = time.process_time()
m = merge([p], peaks="final")
t3 = time.process_time()
save(m, sys.argv[2])
t4 = time.process_time()
print(json.dumps({"import": t1 - t0, "load": t2 - t1, "merge": t3 - t2, "save": t4 - t3}))
"""
rows = {}


def add(k, v):
    rows.setdefault(k, []).append(v)


for _ in range(int(sys.argv[2]) if len(sys.argv) > 2 else 3):
    add("pass", cpu([PY, "-c", "pass"])[0])
    add("import autostart", cpu([PY, "-c", "import gpuflame.capture.autostart"])[0])
    add("import gpuflame", cpu([PY, "-c", "import gpuflame"])[0])
    add("import torch,transformers", cpu([PY, "-c", "import torch, transformers"])[0])
    add("run pass", cpu([PY, "-m", "gpuflame", "run", "--force", "-o", f"{out}/p.pb.gz", "--", PY, "-c", "pass"])[0])
    add("bare demo", cpu([PY, DEMO])[0])
    add("run demo", cpu([PY, "-m", "gpuflame", "run", "--force", "-o", f"{out}/d.pb.gz", "--", PY, DEMO])[0])
    env["OUTF"] = f"{out}/api.pb.gz"
    c, data = cpu([PY, "-c", API, f"{out}/api.pb.gz", DEMO], capture=True)
    for k, v in json.loads(data.splitlines()[-1]).items():
        add("api " + k, v)
    c, data = cpu([PY, "-c", MERGE, f"{out}/api.pb.gz", f"{out}/m.pb.gz"], capture=True)
    for k, v in json.loads(data.splitlines()[-1]).items():
        add("launcher " + k, v)
for k, v in rows.items():
    print(f"{k:28} min {min(v):.3f}  median {sorted(v)[len(v) // 2]:.3f}")
