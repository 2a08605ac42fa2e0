"""Peak resident memory of quantizing and exporting a decoder, per stage (issue 46: a
quantized 1B decoder must export on a 24 GB machine).

    OMP_NUM_THREADS=1 .venv/bin/python bench/export_memory.py base 16a4w_block /tmp/x.opf
    .venv/bin/python bench/export_memory.py base 8da4w /tmp/x.opf --copies   # the old flow

``bench/llm_models.build(CONFIG)``, quantized with VARIANT (float32, a PT2E scheme such as
16a4w_block / 16a8w / w4 / w8 with one 64-token calibration prompt, or 8da4w / 8da8w) and
exported as bench/int_weights.py does (a dynamic prefill and a one-token decode method,
backends=["cpu"], 4-bit weights packed), then saved. Each stage's peak is the process's
VmHWM, reset between stages through /proc/self/clear_refs (Linux); the result line gives
the highest over the float32 weights and the saved file's sha256. Without ``--copies``
the float model is let go after quantizing (``keep_float_model=False``,
``quantize_dynamic(inplace=True)``) and both methods export the one converted model;
``--copies`` is bench/int_weights.py's earlier flow (a deep copy per method, the float
model kept). ``PEAKSTACK=1`` also prints the Python stack at each stage's highest RSS
sample (a thread reading /proc/self/statm every 5 ms); ``ALLSTEPS=1`` marks every export
pass. Results: bench/results/export_memory-amd-epyc-zen4.md.
"""
import os, sys, time, pathlib, warnings
HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) / 1024
def reset():
    with open("/proc/self/clear_refs", "w") as f: f.write("5")
def _sampler():
    """A thread sampling RSS; ``take()``: the highest sample since the last take and the
    main thread's stack then."""
    import threading, traceback
    page = os.sysconf("SC_PAGE_SIZE")
    fd = os.open("/proc/self/statm", os.O_RDONLY)
    main = threading.main_thread().ident
    state = {"best": 0.0, "stack": None}
    lock = threading.Lock()
    def rss():
        return int(os.pread(fd, 100, 0).split()[1]) * page / 2**20
    def run():
        while True:
            r = rss()
            if r > state["best"] + 2:
                frame = sys._current_frames().get(main)
                stack = [f for f in (traceback.extract_stack(frame) if frame else [])
                         if any(k in f.filename for k in ("opforge", "torchao", "torch/"))]
                del frame  # a frame held here would keep its locals (the model) alive
                with lock:
                    state["best"], state["stack"] = r, stack[-8:]
            time.sleep(0.005)
    threading.Thread(target=run, daemon=True).start()
    class Sampler:
        def take(self):
            with lock:
                best, stack = state["best"], state["stack"]
                state["best"], state["stack"] = rss(), None
            return best, stack
    return Sampler()


T0 = time.perf_counter(); last = ["import"]; peaks = {}
SAMPLER = None
if os.environ.get("PEAKSTACK"):
    SAMPLER = _sampler()
def mark(name):
    hwm, rss = status("VmHWM"), status("VmRSS")
    peaks[last[0]] = max(peaks.get(last[0], 0), hwm)
    print(f"  {last[0]:38s} peak {hwm:7.0f} MB  now {rss:7.0f} MB  t={time.perf_counter()-T0:6.1f}s", flush=True)
    if SAMPLER is not None:
        b, st = SAMPLER.take()
        if st and b > rss + 30:
            for fr in st:
                print(f"        {b:6.0f} {fr.filename.split('site-packages/')[-1]}:{fr.lineno} {fr.name}: {fr.line}")
    last[0] = name; reset()
config, variant, out = sys.argv[1], sys.argv[2], sys.argv[3]
copies = "--copies" in sys.argv   # the old bench flow: deepcopy per method
import torch, opforge.export, opforge.quantize
import opforge.quantize.api as qapi
from opforge.program import save
from opforge.quantize.packing import pack_4bit_weights
from llm_models import build, prompt, parameter_count
mark("build")
model = build(config)
wbytes = 4 * parameter_count(model)
mark("quantize")
for name in ("prepare_pt2e", "convert_pt2e"):
    f = getattr(qapi, name)
    def g(*a, _f=f, _n=name, **k):
        mark(_n); r = _f(*a, **k); mark(f"after {_n}"); return r
    setattr(qapi, name, g)
seq = torch.export.Dim("seq", min=1, max=model.max_len)
dynamic = ({0: seq}, {0: seq})
ids = prompt(config)
example = (torch.tensor(ids[:3]), torch.arange(3))
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    if variant in ("8da4w", "8da8w"):
        from opforge.quantize.dynamic import quantize_dynamic
        kw = {} if copies else {"inplace": True}
        converted = quantize_dynamic(model, variant, **kw)
    elif variant != "float32":
        calibration = [(torch.tensor(ids[:64]), torch.arange(64))]
        kw = {} if copies else {"keep_float_model": False}
        result = opforge.quantize.quantize(model, example, variant, calibration=calibration,
                                           dynamic_shapes=dynamic, **kw)
        converted = result.model
        del result
    else:
        converted = model
if not copies:
    del model
import gc; gc.collect()
mark("export")
if copies:
    import copy
    prefill, decode = copy.deepcopy(converted), copy.deepcopy(converted)
else:
    prefill = decode = converted
def step(s, m):
    if s in ("capture", "Delegate", "emit") or os.environ.get("ALLSTEPS"):
        mark(f"export {s} {m}")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    program = opforge.export.export(None, methods={
        "prefill": (prefill, example, dynamic),
        "decode": (decode, (torch.tensor([0]), torch.tensor([0])))},
        kernels="portable", backends=["cpu"], on_step=step)
mark("pack")
program = pack_4bit_weights(program)
mark("save")
save(program, out)
mark("end")
import hashlib
h = hashlib.sha256(pathlib.Path(out).read_bytes()).hexdigest()[:16]
top = max(peaks.values())
print(f"RESULT {config} {variant} copies={copies} weights {wbytes/2**20:.0f} MiB peak {top:.0f} MB = {top*2**20/wbytes:.2f}x  file {h}", flush=True)
